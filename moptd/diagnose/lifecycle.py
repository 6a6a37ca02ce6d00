"""Finding lifecycle, after Prometheus alerts: pending -> firing -> resolved.

A finding is keyed by (rule, subject). Its condition must hold for the rule's ``for:``
before it fires; once firing it stays until the condition has been false for
``keep_firing_for``. *Unknown* (missing evidence) neither promotes a pending finding nor
resolves a firing one: a GPU that vanished takes its evidence with it, and that must not
read as recovery. Flap damping: a finding that started firing ``flap_threshold`` times
within ``flap_window`` holds for at least ``flap_hold`` after its condition clears.

A rule that raised on a subject (an *error* result) is like unknown for its own finding; it
opens a finding of moptd's own instead: RULE_EVALUATION_FAILED on ``node``, one per failing
rule, keyed ``rule-evaluation:<rule id>`` (no rule id holds a colon). It fires at once and
resolves on the first evaluation in which the rule raises nowhere (flap damping holds one
that keeps coming back, as it holds any finding).

Two declarations of a rule act here. An ``ok`` leaf with ``resolve: true`` says the fault
was taken back (the driver's recovery action back to None): a firing finding resolves at
once, not after ``keep_firing_for`` (flap damping still holds one that keeps coming back).
``inhibited_by: [CODE, ...]``: while a finding of one of those codes is open on the same
subject, a match of this rule opens no finding and resolves the one open (a GPU that is
lost takes no application-fault finding: GPU_LOST is the diagnosis). The open findings
decide, so it holds across restarts (they are restored) and beyond the rule's window;
results of rules without ``inhibited_by`` are applied first, so a cause that fires in the
same evaluation inhibits already.

Replay may pass ``evidence_until``: the time of the newest evidence a match rests on. A
``for:`` is then counted up to that time, not the clock's: a snapshot held over until
newer evidence of its kind comes says nothing about how long its state lasted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from moptd.diagnose.codes import CODES
from moptd.diagnose.engine import Result
from moptd.diagnose.model import Action, Finding, Rule, Transition, Verdict

Key = tuple[str, str]
FAILED = "RULE_EVALUATION_FAILED"
FAILED_PREFIX = "rule-evaluation:"  # + the failing rule's id: the self-finding's rule
FAILED_RUNBOOK = "docs/runbooks/RULE_EVALUATION_FAILED.md"
_SUBJECTS_SHOWN = 8


@dataclass(frozen=True, slots=True)
class Damping:
    flap_window: float = 3600.0
    flap_threshold: int = 4
    flap_hold: float = 600.0


class Lifecycle:
    def __init__(self, damping: Damping | None = None, history: int = 1000) -> None:
        self.damping = damping or Damping()
        self.findings: dict[Key, Finding] = {}
        self.history: deque[Finding] = deque(maxlen=history)  # resolved findings
        self._fires: dict[Key, deque[float]] = {}

    def update(
        self,
        results: Iterable[Result],
        now: float,
        evidence_until: Callable[[Result], float] | None = None,
        deferred: AbstractSet[Key] = frozenset(),
    ) -> list[Transition]:
        """`deferred`: (rule, subject) pairs this evaluation did not reach (its time budget
        ran out): their findings stay as they are, and a rule with such a pair keeps its
        RULE_EVALUATION_FAILED finding unless it raised again."""
        out: list[Transition] = []
        seen: set[Key] = set(deferred)
        deferred_rules = {rule for rule, _ in deferred}
        failing: dict[str, list[Result]] = {}
        # causes first: a rule that others name in inhibited_by is applied before them
        # (in their order, as a stable sort on it would put them; without a key call each)
        given = results if isinstance(results, list) else list(results)
        ordered = [r for r in given if not r.rule.inhibited_by]
        ordered += [r for r in given if r.rule.inhibited_by]
        for res in ordered:
            key = (res.rule.id, res.subject)
            seen.add(key)
            f = self.findings.get(key)
            if res.status == "match" and self._inhibited(res):
                if f is not None:
                    out.extend(self._clears(key, f, 0.0, now))
            elif res.status == "match":
                held = None if evidence_until is None else min(now, evidence_until(res))
                out.extend(self._holds(key, f, res, now, held))
            elif res.status == "ok" and f is not None:
                keep = 0.0 if res.resolves else res.rule.keep_firing_for
                out.extend(self._clears(key, f, keep, now))
            elif res.status == "error":
                failing.setdefault(res.rule.id, []).append(res)
        for errors in failing.values():
            res = evaluation_failure(errors)
            key = (res.rule.id, res.subject)
            seen.add(key)
            out.extend(self._holds(key, self.findings.get(key), res, now))
        for key, f in list(self.findings.items()):
            rid = key[0][len(FAILED_PREFIX) :]
            if key[0].startswith(FAILED_PREFIX) and rid not in failing:
                seen.add(key)
                if rid not in deferred_rules:
                    out.extend(self._clears(key, f, 0.0, now))
        for key in [k for k in self.findings if k not in seen]:
            f = self.findings[key]
            if f.state == "pending":
                out.append(self._end(key, f, "inactive", now))
        return out

    def _inhibited(self, res: Result) -> bool:
        """A finding of one of the rule's inhibited_by codes is open on the subject."""
        codes = res.rule.inhibited_by
        return bool(codes) and any(
            f.subject == res.subject and f.code in codes and f.state == "firing"
            for f in self.findings.values()
        )

    def failing(self) -> list[Finding]:
        """The open RULE_EVALUATION_FAILED findings: the rules that raised last time."""
        return [f for k, f in self.findings.items() if k[0].startswith(FAILED_PREFIX)]

    def drop_rules(self, keep: set[str], now: float) -> list[Transition]:
        """Resolve findings of rules no longer in force (after a reload). A rule still in
        force keeps its RULE_EVALUATION_FAILED finding until its next evaluation says."""
        return [
            self._end(k, f, "resolved" if f.state == "firing" else "inactive", now)
            for k, f in list(self.findings.items())
            if k[0] not in keep and k[0].removeprefix(FAILED_PREFIX) not in keep
        ]

    def _holds(
        self, key: Key, f: Finding | None, res: Result, now: float, held: float | None = None
    ) -> list[Transition]:
        """`held`: the condition is known to hold up to then (replay; the clock's now live)."""
        v = res.verdict
        assert v is not None
        out = []
        fresh = f is None
        if f is None:
            # A rule that fires on its evidence itself (for: 0s), on events older than
            # this evaluation (read at start, after a restart): it holds since the oldest
            # of them, not since the clock. With a for:, the condition's own start is not
            # known from its events (a count crossing 5 at the 6th), so: since now.
            since = now
            if res.since is not None and res.rule.for_ == 0:
                since = min(now, res.since)
            f = Finding(res.rule.id, res.subject, v.code, v.severity, "pending")
            f.pending_since = since
            self.findings[key] = f
            out.append(self._tr(f, now, "inactive", "pending"))
        f.code, f.severity, f.summary = v.code, v.severity, res.summary
        f.last_seen = now
        f.pci_bus_id = res.pci_bus_id
        f.evidence = dict(res.evidence)
        f.path = list(res.path)
        f.actions = list(res.actions)
        f.runbook = v.runbook
        # held before pending_since: the match rests on evidence older than the step it
        # first showed at (a snapshot held over): it has held for no time we know of
        elapsed = now - f.pending_since if held is None else max(0.0, held - f.pending_since)
        if f.state == "pending" and elapsed >= res.rule.for_:
            f.state = "firing"
            # fresh: firing since its evidence (the Xid's time), not since this evaluation
            f.first_seen = f.pending_since if fresh else now
            fires = self._fires.setdefault(key, deque(maxlen=self.damping.flap_threshold))
            fires.append(now)
            out.append(self._tr(f, now, "pending", "firing"))
        return out

    def _clears(self, key: Key, f: Finding, keep_for: float, now: float) -> list[Transition]:
        if f.state == "pending":
            return [self._end(key, f, "inactive", now)]
        hold = keep_for
        if self.flapping(key, now):
            hold = max(hold, self.damping.flap_hold)
        if now - f.last_seen >= hold:
            return [self._end(key, f, "resolved", now)]
        return []

    def flapping(self, key: Key, now: float) -> bool:
        fires = self._fires.get(key)
        d = self.damping
        return (
            fires is not None and len(fires) >= d.flap_threshold and now - fires[0] <= d.flap_window
        )

    def _end(self, key: Key, f: Finding, new: str, now: float) -> Transition:
        del self.findings[key]
        old = f.state
        if new == "resolved":
            f.state = "resolved"
            f.resolved_at = now
            self.history.append(f)
        return self._tr(f, now, old, new)

    @staticmethod
    def _tr(f: Finding, now: float, old: str, new: str) -> Transition:
        return Transition(now, f.rule, f.subject, f.code, f.severity, old, new, f.summary)

    def active(self) -> list[Finding]:
        return [f for f in self.findings.values() if f.state == "firing"]

    def pending(self) -> list[Finding]:
        return [f for f in self.findings.values() if f.state == "pending"]


def evaluation_failure(errors: list[Result]) -> Result:
    """The RULE_EVALUATION_FAILED match for one rule's error results (one per subject)."""
    rule = errors[0].rule
    subjects = [e.subject for e in errors]
    shown = ", ".join(subjects[:_SUBJECTS_SHOWN])
    if len(subjects) > _SUBJECTS_SHOWN:
        shown += f" and {len(subjects) - _SUBJECTS_SHOWN} more"
    error = errors[0].error
    summary = f"rule {rule.id} raised on {shown} ({error}): it diagnoses nothing there"
    actions = (
        Action("inspect", f"moptd rules check {rule.file}"),
        Action("change_config", f"fix or disable rule {rule.id} at {rule.file}:{rule.line}"),
    )
    info = CODES[FAILED]
    verdict = Verdict(FAILED, info.severity, summary, actions, FAILED_RUNBOOK)
    own = Rule(
        id=FAILED_PREFIX + rule.id,
        title=f"rule {rule.id} evaluates",
        layer=info.layer,
        scope="node",
        status="stable",
        for_=0.0,
        keep_firing_for=0.0,
        branches=(),
        evidence=(),
        file=rule.file,
        line=rule.line,
    )
    return Result(
        own,
        "node",
        "match",
        verdict=verdict,
        path=[own.id],
        evidence={"rule": rule.id, "subject": shown, "error": error},
        summary=summary,
        actions=[a.render() for a in actions],
    )
