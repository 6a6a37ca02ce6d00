"""The rule service the daemon runs: rules in force, a tick per evaluation, hot reload."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from moptd.clock import Clock
from moptd.diagnose.engine import Result, Reuse, evaluate
from moptd.diagnose.lifecycle import Damping, Lifecycle
from moptd.diagnose.loader import RuleError, load_rules
from moptd.diagnose.model import Finding, RuleSet, Transition
from moptd.observations import NODE, Batch, labels_of
from moptd.store import SignalStore

log = logging.getLogger(__name__)


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
        self.last_results: list[Result] = []
        self.reuse = Reuse()
        self.errors = self.reload(self.rule_paths)

    def reload(self, paths: Sequence[str | Path] | None = None) -> list[RuleError]:
        """Load a new rule set atomically. On any error it is refused whole, the errors are
        returned (and logged) and the rules in force stay."""
        paths = self.rule_paths if paths is None else list(paths)
        loaded = load_rules(paths)
        if loaded.errors:
            for e in loaded.errors:
                log.error("rules not reloaded: %s", e)
            return loaded.errors
        self.ruleset = loaded.ruleset
        self.reuse = Reuse()
        self.rule_paths = list(paths)
        self.lifecycle.drop_rules({r.id for r in self.ruleset.rules}, self.clock.now())
        log.info("loaded %d rules from %d files", len(self.ruleset.rules), len(self.ruleset.files))
        return []

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
        transitions = self.lifecycle.update(self.last_results, t)
        for tr in transitions:
            log.info("finding %s %s on %s: %s -> %s", tr.rule, tr.code, tr.subject, tr.old, tr.new)
        return transitions

    def active(self) -> list[Finding]:
        return self.lifecycle.active()

    def history(self) -> list[Finding]:
        return list(self.lifecycle.history)

    def findings_batch(self) -> Batch:
        """moptd_finding_active / moptd_finding_pending samples, for store.ingest("rules", ...)."""
        batch = Batch()
        for f in self.lifecycle.findings.values():
            signal = "finding.active" if f.state == "firing" else "finding.pending"
            labels = labels_of(rule=f.rule, code=f.code, severity=f.severity, subject=f.subject)
            batch.add(signal, NODE, 1.0, labels)
        return batch
