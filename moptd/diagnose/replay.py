"""Replay a bundle: the live engine on a virtual clock over every time stamp in the bundle.

Replay consumes a Timeline; the caller passes the reader that builds one (moptd.bundle's
``read_bundle``), so diagnosis stays free of collectors and GPU bindings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from moptd.catalog import CATALOG
from moptd.clock import VirtualClock
from moptd.diagnose.engine import Result, Reuse, evaluate
from moptd.diagnose.lifecycle import Lifecycle
from moptd.diagnose.links import link_findings
from moptd.diagnose.loader import RuleError, load_rules
from moptd.diagnose.model import Branch, RuleSet
from moptd.diagnose.timeline import Timeline
from moptd.observations import Batch
from moptd.store import SignalStore


class RulesInvalid(Exception):
    def __init__(self, errors: list[RuleError]) -> None:
        super().__init__("\n".join(map(str, errors)))
        self.errors = errors


@dataclass
class ReplayReport:
    bundle: str
    steps: int
    missing_evidence: list[str]
    findings: list[dict[str, object]]
    unknown: list[dict[str, object]] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)
    read: list[dict[str, object]] = field(default_factory=list)
    untimed: bool = False  # no wall-clock time in the evidence (Timeline.untimed)
    relative_to: str = ""  # what the findings' "relative" times count from, if anything
    notes: list[str] = field(default_factory=list)  # what a person must know of the times

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "bundle": self.bundle,
            "steps": self.steps,
            "missing_evidence": self.missing_evidence,
            "findings": self.findings,
            "unknown": self.unknown,
            "read": self.read,
        }
        if self.untimed:
            out["untimed"] = True
            out["relative_to"] = self.relative_to or None
        return out

    def time_note(self) -> str:
        """What the times of an untimed replay mean ("" when they are wall-clock times)."""
        if not self.untimed:
            return ""
        if self.relative_to:
            return f"No date in the evidence: times are seconds since {self.relative_to}."
        return "No time in the evidence: findings are in the order the evidence gave them."


def replay(
    bundle: Path,
    rule_paths: Sequence[str | Path],
    read_bundle: Callable[[Path], Timeline],
    progress: Callable[[Timeline], Callable[[float], None] | None] | None = None,
) -> ReplayReport:
    """Raises RulesInvalid for a bad rule set (checked first), and whatever ``read_bundle``
    raises for an unreadable bundle (moptd.bundle.BundleError), also while the replay
    reads a lazy stream. ``progress`` makes replay_timeline's callback for the timeline."""
    loaded = load_rules(rule_paths)
    if loaded.errors:
        raise RulesInvalid(loaded.errors)
    tl = read_bundle(bundle)
    return replay_timeline(tl, loaded.ruleset, progress(tl) if progress is not None else None)


UNCONFIRMED = "seen once; how long it has held is unknown"
_PROGRESS_EVERY = 2000  # steps between progress calls


class Evidence:
    """When each namespace's evidence (samples, not events) came first and last, as replay
    feeds it: a series is read as of its namespace's newest evidence, and a ``for:`` is
    counted only over evidence that was there (moptd.diagnose.lifecycle)."""

    def __init__(self, ruleset: RuleSet) -> None:
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self._events = {name for name, spec in CATALOG.items() if spec.kind == "event"}
        self._branches: dict[str, dict[str, Branch]] = {}
        for rule in ruleset.rules:
            nodes: dict[str, Branch] = {}
            stack = [(rule.id, b) for b in rule.branches]
            while stack:
                prefix, b = stack.pop()
                node = f"{prefix}/{b.id}"
                nodes[node] = b
                stack.extend((node, c) for c in b.children)
            self._branches[rule.id] = nodes
        self._kinds: dict[tuple[str, tuple[str, ...]], frozenset[str]] = {}

    def saw(self, batch: Batch, t: float) -> None:
        for ns in {s.signal.partition(".")[0] for s in batch.samples}:
            self.first.setdefault(ns, t)
            self.last[ns] = t

    def kinds(self, res: Result) -> frozenset[str]:
        """The namespaces of the series the conditions on a match's path read."""
        key = (res.rule.id, tuple(res.path))
        kinds = self._kinds.get(key)
        if kinds is None:
            nodes = self._branches.get(res.rule.id, {})
            signals: set[str] = set()
            for node in res.path:
                b = nodes.get(node)
                if b is not None and b.cond is not None:
                    signals.update(b.cond.signals)
            kinds = self._kinds[key] = frozenset(
                sig.partition(".")[0] for sig in signals if sig not in self._events
            )
        return kinds

    def until(self, res: Result) -> float:
        """The newest time the evidence of every kind a match rests on was seen."""
        seen = [self.last[k] for k in self.kinds(res) if k in self.last]
        return min(seen) if seen else math.inf

    def since_start(self, res: Result, pending_since: float) -> bool:
        """Whether a match has held since the first evidence of the kinds it rests on (so
        how long it held before that is unknown)."""
        seen = [self.first[k] for k in self.kinds(res) if k in self.first]
        return bool(seen) and pending_since <= max(seen)


def replay_timeline(
    tl: Timeline, ruleset: RuleSet, progress: Callable[[float], None] | None = None
) -> ReplayReport:
    """``progress`` is called now and then with the time replayed up to (for a terminal)."""
    obs = tl.iter_observations()
    events = iter(tl.events)
    next_obs = next(obs, None)
    next_ev = next(events, None)
    start = min(
        next_obs[0] if next_obs is not None else math.inf,
        next_ev.t if next_ev is not None else math.inf,
    )
    clock = VirtualClock(start if math.isfinite(start) else 0.0)
    store = SignalStore(clock=clock)
    life = Lifecycle()
    evidence = Evidence(ruleset)
    missing = frozenset(tl.missing_namespaces)
    seen: dict[tuple[str, str, str], dict[str, object]] = {}
    results: list[Result] = []
    reuse = Reuse()  # as the daemon evaluates
    steps = 0
    while next_obs is not None or next_ev is not None:
        # the next time stamp of either (the steps are every distinct one, in order)
        t = next_obs[0] if next_obs is not None else math.inf
        if next_ev is not None and next_ev.t < t:
            t = next_ev.t
        steps += 1
        clock.set(t)
        while next_obs is not None and next_obs[0] <= t:
            store.ingest(next_obs[1], next_obs[2], next_obs[0])
            evidence.saw(next_obs[2], next_obs[0])
            next_obs = next(obs, None)
        batch = []
        while next_ev is not None and next_ev.t <= t:
            batch.append(next_ev)
            next_ev = next(events, None)
        store.add_events(batch)
        results = evaluate(ruleset, store, t, missing, reuse=reuse, evidence_at=evidence.last)
        life.update(results, t, evidence.until)
        link_findings(ruleset.links, life.findings, life.history, store, t, missing, evidence.last)
        for f in life.findings.values():
            if f.state != "firing":
                continue
            key = (f.rule, f.subject, f.code)
            entry = f.to_json()
            entry.pop("state", None)
            if key in seen:
                entry["first_seen"] = seen[key]["first_seen"]
            seen[key] = entry
        if progress is not None and steps % _PROGRESS_EVERY == 0:
            progress(t)
    # Findings that resolved during the replay carry resolved_at.
    for f in life.history:
        key = (f.rule, f.subject, f.code)
        if key in seen:
            seen[key]["resolved_at"] = f.resolved_at
    _unconfirmed(life, results, evidence, seen)
    _consequences(seen)
    unknown: list[dict[str, object]] = [
        {"rule": r.rule.id, "subject": r.subject, "conditions": r.unknown}
        for r in results
        if r.status == "unknown"
    ]
    findings = sorted(
        seen.values(), key=lambda e: (str(e["subject"]), str(e["code"]), str(e["rule"]))
    )
    for entry in findings:
        if tl.untimed:
            _undate(entry, tl.relative_to)
        elif any(entry.get(name) == 0.0 for name in _TIMES):
            _undate(entry, "", only_zero=True)  # decided by lines without a time of their own
    return ReplayReport(
        str(tl.path),
        steps,
        sorted(tl.missing),
        findings,
        unknown,
        dict(tl.meta),
        untimed=tl.untimed,
        relative_to=tl.relative_to,
        read=tl.read,
        notes=list(tl.notes),
    )


_TIMES = ("first_seen", "last_seen", "resolved_at")


def _consequences(seen: dict[tuple[str, str, str], dict[str, object]]) -> None:
    """Each cause lists every finding of the replay that follows from it, also those that
    began after it resolved (the lifecycle lists only the open ones)."""
    for entry in seen.values():
        entry.pop("consequences", None)
    for entry in seen.values():
        by = entry.get("caused_by")
        if not isinstance(by, dict):
            continue
        cause = seen.get((str(by["rule"]), str(by["subject"]), str(by["code"])))
        if cause is None:
            continue
        listed = cause.setdefault("consequences", [])
        assert isinstance(listed, list)
        listed.append(
            {
                "code": entry["code"],
                "subject": entry["subject"],
                "rule": entry["rule"],
                "link": by.get("link"),
            }
        )


def _undate(entry: dict[str, object], relative_to: str, only_zero: bool = False) -> None:
    """Times that are no Unix times become null: all of an untimed replay's (the relative
    ones, seconds since the kernel's boot, go under "relative" where the evidence gave
    those), or the zeros that lines without a time of their own left (``only_zero``: the
    finding is marked "untimed")."""
    relative: dict[str, object] = {"to": relative_to}
    for name in _TIMES:
        if name in entry and (not only_zero or entry[name] == 0.0):
            relative[name] = entry[name]
            entry[name] = None
    if relative_to:
        entry["relative"] = relative
    if only_zero:
        entry["untimed"] = True
    by = entry.get("caused_by")
    if isinstance(by, dict) and (not only_zero or by.get("since") == 0.0):
        by["since"] = None  # when the cause fired is no Unix time either


def _unconfirmed(
    life: Lifecycle,
    results: list[Result],
    evidence: Evidence,
    seen: dict[tuple[str, str, str], dict[str, object]],
) -> None:
    """A match still pending at the end, held since the first evidence of its kinds: one
    snapshot (or a stretch shorter than the ``for:``) cannot say how long it has held, so
    it is reported as such rather than dropped."""
    last = {(r.rule.id, r.subject): r for r in results if r.status == "match"}
    for key, f in life.findings.items():
        res = last.get(key)
        if f.state != "pending" or res is None:
            continue
        if not evidence.since_start(res, f.pending_since):
            continue
        entry = f.to_json()
        entry.update(state="unconfirmed", first_seen=f.pending_since, note=UNCONFIRMED)
        seen.setdefault((f.rule, f.subject, f.code), entry)
