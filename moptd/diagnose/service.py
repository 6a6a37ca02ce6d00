"""The rule service the daemon runs: rules in force, a tick per evaluation, hot swap.

It owns the lifecycle of findings in memory; whoever persists them (moptd.findings) goes
through the methods here, never into the lifecycle itself. Reading rule files for a reload
is the caller's (off the event loop); `put_in_force` only swaps what was read.

A tick is two halves: `compute` (the evaluation: reads the store, the rules and the
lifecycle, changes only the engine's reuse entries) and `apply` (the lifecycle, the links,
the counters). The daemon runs `compute` in a worker thread over a held store and `apply`
on the event loop, one tick at a time and never during `put_in_force`; replay and the
tests call `tick`, both at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from moptd.clock import Clock
from moptd.diagnose.engine import Budget, Result, Reuse, evaluate
from moptd.diagnose.lifecycle import Damping, Lifecycle
from moptd.diagnose.links import link_findings
from moptd.diagnose.loader import Loaded, RuleError, default_rules_dir, load_rules
from moptd.diagnose.model import Finding, RuleSet, Transition
from moptd.observations import NODE, Batch, labels_of
from moptd.store import SignalStore

log = logging.getLogger(__name__)


# moptd_finding_first_action_info's action label: a command line fits; a page of text does not
FIRST_ACTION_CHARS = 200


@dataclass(slots=True)
class Evaluation:
    """What `compute` found at time `t`: the results of the pairs it reached and the
    (rule id, subject) pairs its budget left for the next tick."""

    t: float
    results: list[Result]
    deferred: list[tuple[str, str]] = field(default_factory=list)


class RuleService:
    def __init__(
        self,
        store: SignalStore,
        clock: Clock,
        rule_paths: Sequence[str | Path],
        damping: Damping | None = None,
        missing: frozenset[str] = frozenset(),
        tick_budget: float | None = None,
    ) -> None:
        """`tick_budget`: seconds one evaluation may take before the pairs it has not
        reached wait for the next tick (engine.Budget); None: no limit (replay, tests)."""
        self.store = store
        self.clock = clock
        self.rule_paths = list(rule_paths)
        self.missing = missing
        self.lifecycle = Lifecycle(damping)
        self.ruleset = RuleSet(())
        # why the last load was refused, shown by /v1/rules until one succeeds
        self.errors: list[RuleError] = []
        self.last_results: list[Result] = []
        self.reuse = Reuse()
        # rule id -> evaluations (rule x subject) that raised, since start: a counter
        self.evaluation_errors: dict[str, int] = {}
        self._failing: set[str] = set()  # rules that raised last tick, logged once each
        self.tick_budget = tick_budget
        # what the budget measures time by (engine.Budget.clock); a test slows it down
        self.budget_clock: Callable[[], float] = time.perf_counter
        self._next_start = 0  # where the next budgeted evaluation begins
        self.ticks_over_budget = 0  # evaluations that ran out of time, since start
        self.evaluations_deferred = 0  # (rule, subject) evaluations they left, since start
        self.last_deferred = 0  # of the last evaluation
        self.put_in_force(load_rules(self.rule_paths))
        if self.errors:
            self._start_with_shipped_rules()
        else:
            log.info(
                "loaded %d rules from %d files", len(self.ruleset.rules), len(self.ruleset.files)
            )

    def _start_with_shipped_rules(self) -> None:
        """At start there is no earlier set to keep: one broken local file must not leave
        the host with no diagnosis at all. When the shipped rules are among the paths and
        load whole on their own, they run; the errors stay reported (/v1/rules,
        moptd_rules_load_errors) until the files are fixed and reloaded."""
        shipped = default_rules_dir().resolve()
        paths = [Path(p).resolve() for p in self.rule_paths]
        if shipped not in paths or len(paths) == 1:
            return
        alone = load_rules([shipped])
        if alone.errors:
            return
        errors = self.errors
        self.put_in_force(alone)
        self.errors = errors
        log.error(
            "running with the %d shipped rules only: the other rule files have %d errors; "
            "fix them and reload with SIGHUP",
            len(self.ruleset.rules),
            len(errors),
        )

    def put_in_force(self, loaded: Loaded) -> list[Transition]:
        """Put a loaded rule set in force at once, so a tick never sees half of one. A set
        with errors is refused whole: its errors are kept in `errors` (and logged) and the
        rules in force stay. Returns the transitions of the open findings whose rule is no
        longer in force (resolved, or inactive if still pending)."""
        if loaded.errors:
            for e in loaded.errors:
                log.error("rules not reloaded: %s", e)
            self.errors = list(loaded.errors)
            return []
        self.ruleset = loaded.ruleset
        self.errors = []
        self.reuse = Reuse()
        self._next_start = 0
        return self.lifecycle.drop_rules({r.id for r in self.ruleset.rules}, self.clock.now())

    def tick(self, now: float | None = None) -> list[Transition]:
        return self.apply(self.compute(now))

    def open_keys(self) -> frozenset[tuple[str, str]]:
        """The (rule, subject) pairs with an open finding: what `compute` traces."""
        return frozenset(self.lifecycle.findings)

    def compute(
        self, now: float | None = None, open_keys: frozenset[tuple[str, str]] | None = None
    ) -> Evaluation:
        """The evaluation at `now`, within the tick budget if there is one. Safe in another
        thread while nothing writes the store (SignalStore.hold) and nothing changes the
        rule set: it reads them and changes only the engine's reuse entries and where the
        next budgeted pass starts. In a thread, pass `open_keys` taken on the loop (the
        remediation's breaker finding may come and go on it meanwhile)."""
        t = self.clock.now() if now is None else now
        open_findings = self.open_keys() if open_keys is None else open_keys
        budget = (
            None
            if self.tick_budget is None
            else Budget(self.tick_budget, self._next_start, self.budget_clock)
        )
        results = evaluate(
            self.ruleset,
            self.store,
            t,
            self.missing,
            traced=open_findings,
            reuse=self.reuse,
            budget=budget,
        )
        if budget is None:
            return Evaluation(t, results)
        self._next_start = budget.next_start
        return Evaluation(t, results, budget.deferred)

    def apply(self, ev: Evaluation) -> list[Transition]:
        """Take an evaluation into the lifecycle: the transitions, links and counters. A
        deferred pair keeps its last result and its finding as it stands (no fire, no
        resolve, no end of a pending one) until an evaluation reaches it."""
        t = ev.t
        self._count_errors(ev.results, {rule for rule, _ in ev.deferred})
        if ev.deferred:
            by_key = {(r.rule.id, r.subject): r for r in self.last_results}
            kept = [r for k in ev.deferred if (r := by_key.get(k)) is not None]
            self.last_results = ev.results + kept
        else:
            self.last_results = ev.results
        self._count_deferred(len(ev.deferred))
        transitions = self.lifecycle.update(ev.results, t, deferred=set(ev.deferred))
        life = self.lifecycle
        link_findings(self.ruleset.links, life.findings, life.history, self.store, t, self.missing)
        for tr in transitions:
            log.info("finding %s %s on %s: %s -> %s", tr.rule, tr.code, tr.subject, tr.old, tr.new)
        return transitions

    def _count_deferred(self, deferred: int) -> None:
        if deferred:
            if not self.last_deferred:  # once until it fits again, not every tick
                log.warning(
                    "rule evaluation took longer than rules.tick_budget (%g s): %d of its "
                    "evaluations wait for the next tick (moptd_rule_ticks_over_budget_total)",
                    self.tick_budget,
                    deferred,
                )
            self.ticks_over_budget += 1
            self.evaluations_deferred += deferred
        elif self.last_deferred:
            log.info("rule evaluation fits rules.tick_budget again")
        self.last_deferred = deferred

    def _count_errors(
        self, results: list[Result], deferred: AbstractSet[str] = frozenset()
    ) -> None:
        # a rule with pairs not reached this tick stays failing until they are
        failing: set[str] = set(self._failing & deferred)
        for r in results:
            if r.status != "error":
                continue
            failing.add(r.rule.id)
            self.evaluation_errors[r.rule.id] = self.evaluation_errors.get(r.rule.id, 0) + 1
            if r.rule.id not in self._failing:
                self._failing.add(r.rule.id)  # once until it recovers, not every tick
                log.error(
                    "rule %s (%s:%d) failed on %s: %s; the other rules run on",
                    r.rule.id,
                    r.rule.file,
                    r.rule.line,
                    r.subject,
                    r.error,
                )
        for rid in sorted(self._failing - failing):
            log.info("rule %s evaluates again", rid)
        self._failing = failing

    def failing(self) -> list[str]:
        """The ids of the rules that raised in the last evaluation."""
        return sorted(self._failing)

    def restore(self, findings: Iterable[Finding]) -> None:
        """Take back open findings kept across a restart (before the first tick)."""
        for f in findings:
            self.lifecycle.findings[(f.rule, f.subject)] = f

    def active(self) -> list[Finding]:
        return self.lifecycle.active()

    def history(self) -> list[Finding]:
        """Resolved findings, oldest first."""
        return list(self.lifecycle.history)

    def open_finding(self, rule: str, subject: str) -> Finding | None:
        """The pending or firing finding of `rule` on `subject`."""
        return self.lifecycle.findings.get((rule, subject))

    def last_resolved(self, rule: str, subject: str) -> Finding | None:
        resolved = reversed(self.lifecycle.history)
        return next((h for h in resolved if h.rule == rule and h.subject == subject), None)

    def result(self, rule: str, subject: str) -> Result | None:
        """The last evaluation's result of `rule` on `subject`."""
        return next(
            (r for r in self.last_results if r.rule.id == rule and r.subject == subject), None
        )

    def findings_batch(self) -> Batch:
        """moptd_finding_active / moptd_finding_pending, moptd_rule_failing,
        moptd_rule_evaluation_errors_total, moptd_rules_loaded, moptd_rules_load_errors and
        the tick budget's counters: samples, for store.ingest("rules", ...)."""
        batch = Batch()
        for f in self.lifecycle.findings.values():
            signal = "finding.active" if f.state == "firing" else "finding.pending"
            labels = labels_of(rule=f.rule, code=f.code, severity=f.severity, subject=f.subject)
            batch.add(signal, NODE, 1.0, labels)
            if f.state == "firing" and f.actions:
                action = f.actions[0][:FIRST_ACTION_CHARS]
                first = labels_of(rule=f.rule, subject=f.subject, action=action)
                batch.add("finding.first_action", NODE, 1.0, first)
        for rid in self._failing:
            batch.add("rules.failing", NODE, 1.0, labels_of(rule=rid))
        for rid, n in self.evaluation_errors.items():
            batch.add("rules.evaluation_errors", NODE, float(n), labels_of(rule=rid))
        # a refused reload keeps the old set: the count says what runs, the errors why not
        batch.add("rules.loaded", NODE, float(len(self.ruleset.rules)))
        batch.add("rules.load_errors", NODE, float(len(self.errors)))
        batch.add("rules.ticks_over_budget", NODE, float(self.ticks_over_budget))
        batch.add("rules.evaluations_deferred", NODE, float(self.evaluations_deferred))
        return batch
