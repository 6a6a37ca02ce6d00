"""Finding lifecycle, after Prometheus alerts: pending -> firing -> resolved.

A finding is keyed by (rule, subject). Its condition must hold for the rule's ``for:``
before it fires; once firing it stays until the condition has been false for
``keep_firing_for``. *Unknown* (missing evidence) neither promotes a pending finding nor
resolves a firing one: a GPU that vanished takes its evidence with it, and that must not
read as recovery. Flap damping: a finding that started firing ``flap_threshold`` times
within ``flap_window`` holds for at least ``flap_hold`` after its condition clears.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from moptd.diagnose.engine import Result
from moptd.diagnose.model import Finding, Transition

Key = tuple[str, str]


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

    def update(self, results: Iterable[Result], now: float) -> list[Transition]:
        out: list[Transition] = []
        seen: set[Key] = set()
        for res in results:
            key = (res.rule.id, res.subject)
            seen.add(key)
            f = self.findings.get(key)
            if res.status == "match":
                out.extend(self._holds(key, f, res, now))
            elif res.status == "ok" and f is not None:
                out.extend(self._clears(key, f, res.rule.keep_firing_for, now))
        for key in [k for k in self.findings if k not in seen]:
            f = self.findings[key]
            if f.state == "pending":
                out.append(self._end(key, f, "inactive", now))
        return out

    def drop_rules(self, keep: set[str], now: float) -> list[Transition]:
        """Resolve findings of rules no longer in force (after a reload)."""
        return [
            self._end(k, f, "resolved" if f.state == "firing" else "inactive", now)
            for k, f in list(self.findings.items())
            if k[0] not in keep
        ]

    def _holds(self, key: Key, f: Finding | None, res: Result, now: float) -> list[Transition]:
        v = res.verdict
        assert v is not None
        out = []
        if f is None:
            f = Finding(res.rule.id, res.subject, v.code, v.severity, "pending", pending_since=now)
            self.findings[key] = f
            out.append(self._tr(f, now, "inactive", "pending"))
        f.code, f.severity, f.summary = v.code, v.severity, res.summary
        f.last_seen = now
        f.pci_bus_id = res.pci_bus_id
        f.evidence = dict(res.evidence)
        f.path = list(res.path)
        f.actions = list(res.actions)
        f.runbook = v.runbook
        if f.state == "pending" and now - f.pending_since >= res.rule.for_:
            f.state = "firing"
            f.first_seen = now
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
