"""The rule service the daemon runs: rules in force, a tick per evaluation, hot swap.

It owns the lifecycle of findings in memory; whoever persists them (moptd.findings) goes
through the methods here, never into the lifecycle itself. Reading rule files for a reload
is the caller's (off the event loop); `put_in_force` only swaps what was read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from moptd.clock import Clock
from moptd.diagnose.engine import Result, Reuse, evaluate
from moptd.diagnose.lifecycle import Damping, Lifecycle
from moptd.diagnose.links import link_findings
from moptd.diagnose.loader import Loaded, RuleError, default_rules_dir, load_rules
from moptd.diagnose.model import Finding, RuleSet, Transition
from moptd.observations import NODE, Batch, labels_of
from moptd.store import SignalStore

log = logging.getLogger(__name__)


# moptd_finding_first_action_info's action label: a command line fits; a page of text does not
FIRST_ACTION_CHARS = 200


class RuleService:
    def __init__(
        self,
        store: SignalStore,
        clock: Clock,
        rule_paths: Sequence[str | Path],
        damping: Damping | None = None,
        missing: frozenset[str] = frozenset(),
    ) -> None:
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
        return self.lifecycle.drop_rules({r.id for r in self.ruleset.rules}, self.clock.now())

    def tick(self, now: float | None = None) -> list[Transition]:
        t = self.clock.now() if now is None else now
        open_findings = self.lifecycle.findings
        self.last_results = evaluate(
            self.ruleset,
            self.store,
            t,
            self.missing,
            traced=lambda rule, subject: (rule, subject) in open_findings,
            reuse=self.reuse,
        )
        self._count_errors(self.last_results)
        transitions = self.lifecycle.update(self.last_results, t)
        life = self.lifecycle
        link_findings(self.ruleset.links, life.findings, life.history, self.store, t, self.missing)
        for tr in transitions:
            log.info("finding %s %s on %s: %s -> %s", tr.rule, tr.code, tr.subject, tr.old, tr.new)
        return transitions

    def _count_errors(self, results: list[Result]) -> None:
        failing: set[str] = set()
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
        moptd_rule_evaluation_errors_total, moptd_rules_loaded and moptd_rules_load_errors
        samples, for store.ingest("rules", ...)."""
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
        return batch
