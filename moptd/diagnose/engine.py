"""Evaluate a rule set: a pure function of the signal store, the time and the rules.

Each rule runs once per subject of its scope. Its ``decide`` tree is walked top-down; the
first branch whose condition is true is taken. A condition that cannot be decided (missing
evidence) does not count as false-and-healthy: it is recorded as *unknown*, the walk goes on
to the next branch, and a rule that reaches no verdict with unknowns on the way reports
``unknown`` rather than ``ok``.

A rule that raises while it runs on a subject (an integer operation on an infinite number,
a recursion too deep) is *error* on that subject, with the exception in ``Result.error``;
the other rules and subjects run as usual, so one bad rule never switches the diagnosis off.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from moptd.diagnose.expr import Compiled, Env, Expr, Stamp, held_name, truth
from moptd.diagnose.loader import PLACEHOLDER
from moptd.diagnose.model import Branch, Rule, RuleSet, Verdict
from moptd.diagnose.wording import fmt as fmt  # moved there: the CLI's renderers use it
from moptd.observations import subject_id, subject_kind
from moptd.proc.pci import normalize_pci
from moptd.store import SignalStore

Status = Literal["match", "ok", "unknown", "error"]
ERROR_CHARS = 200  # of an exception's text kept in Result.error


@dataclass(slots=True)
class Step:
    node: str
    cond: str
    value: bool | None
    seen: list[tuple[str, object]]


@dataclass(slots=True)
class Result:
    rule: Rule
    subject: str
    status: Status
    verdict: Verdict | None = None
    path: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    evidence: dict[str, object] = field(default_factory=dict)
    summary: str = ""
    pci_bus_id: str | None = None
    actions: list[str] = field(default_factory=list)
    error: str = ""  # status "error": the exception, "Type: message", truncated
    resolves: bool = False  # status "ok" at a `resolve: true` leaf: the fault was taken back
    # a traced match: the oldest event the conditions on its path counted (the evidence's
    # time, for a finding on events older than the evaluation); None when they read none
    since: float | None = None


def gpu_subjects(store: SignalStore) -> list[tuple[str, str | None]]:
    """GPU subjects with their normalised PCI address. A GPU named only by its PCI address
    (a kernel line, no NVML) is a subject ``gpu:<pci>``, unless a GPU index carries it."""
    by_pci: dict[str, str] = {}
    out: list[tuple[str, str | None]] = []
    for s in store.subjects("gpu"):
        pci = store.attr(s, "pci_bus_id")
        norm = normalize_pci(pci) if pci else None
        if norm is None and normalize_pci(subject_id(s)):
            norm = normalize_pci(subject_id(s))
        out.append((s, norm))
        if norm and subject_id(s).isdigit():
            by_pci[norm] = s
    seen = {s for s, _ in out}
    for log_name in store.streams():
        for subject in store.events(log_name).subjects():
            if subject_kind(subject) != "gpu" or subject in seen:
                continue
            seen.add(subject)
            norm = normalize_pci(subject_id(subject))
            if norm is not None and norm in by_pci:
                continue
            out.append((subject, norm))
    result: dict[str, str | None] = {}
    for s, pci in out:
        if pci is not None and not subject_id(s).isdigit() and pci in by_pci:
            continue
        result[s] = pci
    return sorted(result.items(), key=lambda x: _subject_order(x[0]))


def _subject_order(s: str) -> tuple[int, str]:
    ident = subject_id(s)
    return (int(ident), "") if ident.isdigit() else (1 << 30, ident)


def subjects_for(scope: str, store: SignalStore) -> list[tuple[str, str | None]]:
    if scope == "node":
        return [("node", None)]
    if scope == "gpu":
        return gpu_subjects(store)
    # A serving endpoint known only from its log (a pasted log, no scrape) is a subject too.
    subjects = set(store.subjects(scope))
    for stream in store.streams():
        if stream.split(".", 1)[0] == scope:
            subjects.update(s for s in store.events(stream).subjects() if subject_kind(s) == scope)
    return [(s, None) for s in sorted(subjects)]


Reads = list[tuple[Compiled, object]]


@dataclass(slots=True)
class Kept:
    """One result of the last pass, with what its walk read."""

    result: Result
    reads: Reads
    stamp: Stamp  # what those reads depended on
    missing: frozenset[str]
    traced: bool  # the result carries its decision path and evidence
    checked: int = 0  # the Reuse pass in which it was made or last held


class Reuse:
    """The results of the last pass, each with every signal read it made and what the read
    returned, to be handed to the next pass.

    A rule's walk is a function of the values its reads return and of nothing else (the
    time, the store and the missing namespaces reach it only through reads). So when each
    read the last walk made returns the same value now, the walk would take the same
    branches and make the same reads: its result is the last one. In a steady daemon
    nearly every rule on every subject is such a case. Cheapest first: where the store
    generations the reads depended on are the same and the clock has not passed the time
    until which they hold (expr.Stamp), the reads are not even made again; else they are
    made again (memoised across rules) and compared, which still costs far less than
    walking the conditions."""

    def __init__(self) -> None:
        self.kept: dict[tuple[int, str], Kept] = {}
        self.reused = 0  # results taken from the last pass, for tests and benchmarks
        self.unread = 0  # of those, taken without reading again (the stamp held)
        # What changed since the last pass: with it, an entry made or held in that pass
        # is checked against the few names that changed (Stamp.seal names its own) rather
        # than against every generation it read (Stamp.holds)
        self.passes = 0
        self._store: SignalStore | None = None
        self._mark = 0  # the store's change count when the last pass began
        self._evidence: dict[str, float] = {}  # evidence_at when the last pass began
        self.changed: set[str] | None = None  # this pass's: None when unknown
        self.moved: set[str] = set()
        # scope -> its subjects (subjects_for), kept while the store's layout_key stands
        self.subjects: dict[str, list[tuple[str, str | None]]] = {}
        self._layout: tuple[int, int] | None = None

    def begin(
        self, store: SignalStore, now: float, evidence_at: Mapping[str, float] | None
    ) -> None:
        """A pass starts: what changed in the store and the evidence times since the last."""
        self.passes += 1
        layout = store.layout_key()
        if store is not self._store or layout != self._layout:
            self.subjects = {}
        self._layout = layout
        self.changed = store.changed_since(self._mark) if store is self._store else None
        self._store, self._mark = store, store.changes
        evidence = dict(evidence_at) if evidence_at else {}
        last = self._evidence
        # an evidence time ahead of the clock counts as moved: reads follow the clock then
        self.moved = {held_name(ns) for ns, t in evidence.items() if t > now or last.get(ns) != t}
        self.moved.update(held_name(ns) for ns in last if ns not in evidence)
        self._evidence = evidence


def _unchanged(reads: Reads, env: Env) -> bool:
    for read, old in reads:
        new = read(env)
        if new is not old and new != old:  # NaN never reaches here: reads drop it
            return False
    return True


@dataclass(slots=True)
class Budget:
    """A time budget for one pass (the daemon's `rules.tick_budget`), and where the pass
    after it starts.

    The pass walks its (rule, subject) pairs from `start` on, wrapping round, and stops
    once `seconds` have gone by `clock` (at least one pair is evaluated, so every pass
    makes progress). The pairs it did not reach are `deferred`: they keep the last pass's
    result (the caller's to keep; their reuse entries are carried over) and `next_start`
    is where the next pass begins, so every rule runs in turn however long one pass
    would take. Positions count pairs in the pass's order; a subject that comes or goes
    shifts them by one, which moves a turn, not a rule out of it."""

    seconds: float
    start: int = 0
    clock: Callable[[], float] = time.perf_counter
    deferred: list[tuple[str, str]] = field(default_factory=list)  # (rule id, subject)
    evaluated: int = 0
    next_start: int = 0

    @property
    def over(self) -> bool:
        """The last pass ran out of time and deferred some pairs."""
        return bool(self.deferred)


def evaluate(
    rules: RuleSet | Iterable[Rule],
    store: SignalStore,
    now: float,
    missing: frozenset[str] = frozenset(),
    traced: Callable[[str, str], bool] | Collection[tuple[str, str]] | None = None,
    reuse: Reuse | None = None,
    evidence_at: Mapping[str, float] | None = None,
    budget: Budget | None = None,
) -> list[Result]:
    """Every enabled rule on every subject of its scope. A match carries its decision path
    (res.steps); so does a result whose (rule id, subject) is in `traced`, or for which
    `traced(rule id, subject)` is true (a finding still open after its rule stopped
    matching). The others carry none: recording every
    condition of every rule on every tick cost a third of the tick, and only `explain`
    and the findings read it. With `reuse`, an untraced result whose reads all return what
    they returned in the last pass is that pass's result (see Reuse); the results are the
    same as without. `evidence_at` (replay) reads each namespace's series as of its newest
    evidence (moptd.diagnose.expr.Env). With `budget`, the pass stops when its time is up
    (see Budget): the results are those of the pairs it reached, in the usual order."""
    rule_list = rules.rules if isinstance(rules, RuleSet) else tuple(rules)
    memo: dict[tuple[object, ...], object] = {}
    envs: dict[str, list[Env]] = {}  # one Env per subject, shared by the scope's rules
    subjects: dict[str, list[tuple[str, str | None]]] = {}  # scope -> subjects_for
    kept = reuse.kept if reuse is not None else {}
    keep: dict[tuple[int, str], Kept] = {}
    changed: set[str] | None = None
    moved: set[str] = set()
    this_pass = 0
    if reuse is not None:
        reuse.begin(store, now, evidence_at)
        changed, moved, this_pass = reuse.changed, reuse.moved, reuse.passes
        subjects = reuse.subjects
    held_last = this_pass - 1  # an entry made or held in the last pass: checked since then
    reused = unread = 0  # added to reuse's counts at the end (this loop is the hot path)

    timed = budget is not None
    clock = time.perf_counter if budget is None else budget.clock
    first = pos = done = total = 0
    deadline = 0.0
    stopped = False  # the budget ran out
    if budget is not None:
        total = sum(
            len(_envs(envs, rule.scope, store, now, missing, memo, evidence_at, subjects))
            for rule in rule_list
            if rule.enabled
        )
        first = budget.start % total if total else 0
        deadline = clock() + budget.seconds
    traced_subjects = _traced_subjects(traced)
    laps: list[list[Result]] = [[], []]
    for lap in (0, 1) if timed and first else (0,):
        out = laps[lap]
        pos = -1
        for rule in rule_list:
            if not rule.enabled:
                continue
            rule_key = id(rule)
            # the subjects whose result carries its path although it is no match: asked
            # of each pair, every pass (a set lookup here, not a call and a tuple)
            traced_here = traced_subjects(rule.id)
            scope_envs = envs.get(rule.scope)
            if scope_envs is None:
                scope_envs = _envs(
                    envs, rule.scope, store, now, missing, memo, evidence_at, subjects
                )
            for env in scope_envs:
                if timed:
                    pos += 1
                    if pos < first if lap == 0 else pos >= first:
                        continue  # lap 0 walks [first, n), lap 1 [0, first)
                    if done and clock() >= deadline:
                        stopped = True
                        break
                    done += 1
                key = (rule_key, env.subject)
                last = kept.get(key)
                reads: Reads | None = None
                stamp: Stamp | None = None
                res: Result | None = None
                was_traced = False
                if (
                    last is not None
                    and last.result.rule is rule  # an id can be reused after a reload
                    and last.result.pci_bus_id == env.pci_bus_id
                    and (last.missing is missing or last.missing == missing)
                    # a result with its path where one is wanted, and without where not: the
                    # same as a full walk gives (a finding that closed drops its trace)
                    and last.traced
                    == (
                        last.result.status == "match"
                        or (traced_here is not None and env.subject in traced_here)
                    )
                ):
                    st = last.stamp
                    if (
                        # holds(), for an entry made or held in the last pass, from what
                        # changed since (the store's log, the evidence times that moved);
                        # a held read's bound is in the terms of the time it is read as
                        # of, never later than the clock. Inlined: most pairs end here.
                        now <= st.until
                        and changed.isdisjoint(st.deps)
                        and (now <= st.held_until or moved.isdisjoint(st.held_deps))
                        if changed is not None and last.checked == held_last
                        else st.holds(store, now, evidence_at)
                    ):
                        # nothing it read can have changed: the entry stands as it is
                        reused += 1
                        unread += 1
                        last.checked = this_pass
                        keep[key] = last
                        out.append(last.result)
                        continue
                    env.stamp = Stamp()
                    try:
                        if _unchanged(last.reads, env):
                            res, reads, stamp = last.result, last.reads, env.stamp
                            was_traced = last.traced
                            reused += 1
                    finally:
                        env.stamp = None
                if res is None:
                    if reuse is not None:
                        reads = env.reads = []
                        stamp = env.stamp = Stamp()
                    try:
                        res = _isolated(rule, env, trace=False)
                    finally:
                        env.reads = None
                        env.stamp = None
                if res.status == "error":
                    # Never kept for reuse: it runs again each pass, so a recovery shows at once
                    # and an exception that does not follow from the reads (RecursionError at
                    # another stack depth) is not frozen in.
                    out.append(res)
                    continue
                if not was_traced and (
                    res.status == "match"
                    or (traced_here is not None and env.subject in traced_here)
                ):
                    # again, recording the path and the evidence (reads are memoised), and what
                    # that read too: a match whose reads stand is taken whole next pass
                    if reuse is not None:
                        reads = env.reads = []
                        stamp = env.stamp = Stamp()
                    try:
                        res = _isolated(rule, env)
                    finally:
                        env.reads = None
                        env.stamp = None
                    was_traced = True
                    if res.status == "error":
                        out.append(res)
                        continue
                if reads is not None and stamp is not None:
                    keep[key] = Kept(res, reads, stamp.seal(), missing, was_traced, this_pass)
                out.append(res)
            if stopped:
                break
        if stopped:
            break
    out = laps[1] + laps[0] if timed else laps[0]
    if budget is not None:
        _account(budget, rule_list, envs, first, done, total, kept, keep)
    if reuse is not None:
        reuse.kept = keep  # departed subjects and removed rules fall out here
        reuse.reused += reused
        reuse.unread += unread
    return out


class _Asks:
    """A `traced` function, asked of one rule's subjects by `in`."""

    __slots__ = ("_ask", "_rule")

    def __init__(self, ask: Callable[[str, str], bool], rule: str) -> None:
        self._ask, self._rule = ask, rule

    def __contains__(self, subject: object) -> bool:
        return isinstance(subject, str) and self._ask(self._rule, subject)


def _traced_subjects(
    traced: Callable[[str, str], bool] | Collection[tuple[str, str]] | None,
) -> Callable[[str], Container[str] | None]:
    """`traced` as evaluate asks it: a rule id -> the subjects traced for it (None: none).
    Pairs are grouped by rule id once a pass; a function is asked subject by subject."""
    if traced is None:
        return lambda rule_id: None
    if callable(traced):
        ask = traced
        return lambda rule_id: _Asks(ask, rule_id)
    by_rule: dict[str, set[str]] = {}
    for rule_id, subject in traced:
        by_rule.setdefault(rule_id, set()).add(subject)
    return by_rule.get


def _envs(
    envs: dict[str, list[Env]],
    scope: str,
    store: SignalStore,
    now: float,
    missing: frozenset[str],
    memo: dict[tuple[object, ...], object],
    evidence_at: Mapping[str, float] | None,
    subjects: dict[str, list[tuple[str, str | None]]],
) -> list[Env]:
    """One Env per subject of the scope, made once a pass and shared by its rules; the
    subjects are found once while the store's layout stands (`subjects`, Reuse's)."""
    scope_envs = envs.get(scope)
    if scope_envs is None:
        found = subjects.get(scope)
        if found is None:
            found = subjects[scope] = subjects_for(scope, store)
        scope_envs = envs[scope] = [
            Env(store, subject, now, pci, missing, memo=memo, evidence_at=evidence_at)
            for subject, pci in found
        ]
    return scope_envs


def _account(
    budget: Budget,
    rule_list: Iterable[Rule],
    envs: dict[str, list[Env]],
    first: int,
    done: int,
    total: int,
    kept: Mapping[tuple[int, str], Kept],
    keep: dict[tuple[int, str], Kept],
) -> None:
    """After a budgeted pass: what it reached, where the next starts, the pairs it left
    (their reuse entries carried over for the next pass)."""
    budget.evaluated = done
    budget.deferred = []
    if done >= total:  # the whole pass (nearly every tick): no pair left to list
        budget.next_start = first
        return
    pairs = [(rule, env) for rule in rule_list if rule.enabled for env in envs[rule.scope]]
    n = len(pairs)
    budget.next_start = (first + done) % n if n else 0
    for k in range(done, n):
        rule, env = pairs[(first + k) % n]
        budget.deferred.append((rule.id, env.subject))
        key = (id(rule), env.subject)
        last = kept.get(key)
        if last is not None and last.result.rule is rule:
            keep[key] = last  # not reached: its entry stands for the next pass


def _isolated(rule: Rule, env: Env, trace: bool = True) -> Result:
    """evaluate_one, with what the rule raised as an "error" result instead of raised."""
    try:
        return evaluate_one(rule, env, trace)
    except Exception as exc:  # noqa: BLE001 - one rule must not switch the diagnosis off
        env.trace = None
        return Result(
            rule, env.subject, "error", pci_bus_id=env.pci_bus_id, error=describe_error(exc)
        )


def describe_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def evaluate_one(rule: Rule, env: Env, trace: bool = True) -> Result:
    """One rule on one subject; without `trace`, a result without steps, and a match
    without its evidence, summary and actions."""
    res = Result(rule, env.subject, "ok", pci_bus_id=env.pci_bus_id)
    try:
        verdict = _walk(rule.branches, env, res, rule.id, trace)
    except _Healthy as healthy:
        env.trace = None
        res.resolves = healthy.resolves
        return res  # an explicit "healthy" leaf outweighs earlier unknowns
    if verdict is None:
        res.status = "unknown" if res.unknown else "ok"
        return res
    res.status = "match"
    res.verdict = verdict
    if not trace:
        return res
    env.trace = None
    for name, ex in (*rule.evidence, *verdict.evidence):
        res.evidence[name] = _value(ex, env)
    res.summary = render(verdict.summary, res)
    res.actions = [render(a.render(), res) for a in verdict.actions]
    return res


class _Healthy(Exception):
    """An ``ok:`` leaf was reached: the walk stops with no verdict."""

    def __init__(self, resolves: bool = False) -> None:
        super().__init__()
        self.resolves = resolves


def _walk(
    branches: tuple[Branch, ...], env: Env, res: Result, prefix: str, trace: bool = True
) -> Verdict | None:
    """The first verdict along the branches taken; res.path is the way there, res.unknown
    the conditions that could not be decided. With `trace`, every condition tried also
    goes into res.steps with what it read."""
    for b in branches:
        if b.cond is None:
            value: bool | None = True
            if trace:
                res.steps.append(Step(f"{prefix}/{b.id}", "else", True, []))
        else:
            seen: list[tuple[str, object]] | None = [] if trace else None
            env.trace = seen
            env.oldest = [] if trace else None
            value = truth(b.cond(env))
            env.trace = None
            if value and env.oldest:
                res.since = min(env.oldest if res.since is None else [*env.oldest, res.since])
            env.oldest = None
            if seen is not None:
                res.steps.append(Step(f"{prefix}/{b.id}", b.cond.text, value, seen))
            if value is None:
                res.unknown.append(f"{prefix}/{b.id}: {b.cond.text}")
                continue
        if not value:
            continue
        node = f"{prefix}/{b.id}"
        res.path.append(node)
        if b.verdict is not None:
            return b.verdict
        if b.ok is not None:
            raise _Healthy(b.resolves)
        found = _walk(b.children, env, res, node, trace)
        if found is not None:
            return found
        res.path.pop()
    return None


def _value(ex: Expr, env: Env) -> object:
    v = ex(env)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def render(template: str, res: Result) -> str:
    values: dict[str, object] = {
        "subject": res.subject,
        "index": subject_id(res.subject),
        "pci_bus_id": res.pci_bus_id,
        "rule": res.rule.id,
        **res.evidence,
    }
    return "".join(
        part if i % 2 == 0 else fmt(values.get(part)) for i, part in enumerate(_template(template))
    )


@functools.lru_cache(maxsize=4096)
def _template(template: str) -> list[str]:
    """Literal text and placeholder names, alternating (split once per distinct text)."""
    return PLACEHOLDER.split(template)
