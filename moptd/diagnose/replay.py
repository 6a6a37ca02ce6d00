"""Replay a bundle: the live engine on a virtual clock over every time stamp in the bundle.

Replay consumes a Timeline; the caller passes the reader that builds one (moptd.bundle's
``read_bundle``), so diagnosis stays free of collectors and GPU bindings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from moptd.clock import VirtualClock
from moptd.diagnose.engine import Result, Reuse, evaluate
from moptd.diagnose.lifecycle import Lifecycle
from moptd.diagnose.loader import RuleError, load_rules
from moptd.diagnose.model import RuleSet
from moptd.diagnose.timeline import Timeline
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

    def to_json(self) -> dict[str, object]:
        return {
            "bundle": self.bundle,
            "steps": self.steps,
            "missing_evidence": self.missing_evidence,
            "findings": self.findings,
            "unknown": self.unknown,
            "read": self.read,
        }


def replay(
    bundle: Path,
    rule_paths: Sequence[str | Path],
    read_bundle: Callable[[Path], Timeline],
) -> ReplayReport:
    """Raises RulesInvalid for a bad rule set (checked first), and whatever ``read_bundle``
    raises for an unreadable bundle (moptd.bundle.BundleError)."""
    loaded = load_rules(rule_paths)
    if loaded.errors:
        raise RulesInvalid(loaded.errors)
    return replay_timeline(read_bundle(bundle), loaded.ruleset)


def replay_timeline(tl: Timeline, ruleset: RuleSet) -> ReplayReport:
    steps = tl.steps()
    clock = VirtualClock(steps[0] if steps else 0.0)
    store = SignalStore(clock=clock)
    life = Lifecycle()
    missing = frozenset(tl.missing_namespaces)
    seen: dict[tuple[str, str, str], dict[str, object]] = {}
    obs = iter(tl.observations)
    events = iter(tl.events)
    next_obs = next(obs, None)
    next_ev = next(events, None)
    results: list[Result] = []
    reuse = Reuse()  # as the daemon evaluates
    for t in steps:
        clock.set(t)
        while next_obs is not None and next_obs[0] <= t:
            store.ingest(next_obs[1], next_obs[2], next_obs[0])
            next_obs = next(obs, None)
        batch = []
        while next_ev is not None and next_ev.t <= t:
            batch.append(next_ev)
            next_ev = next(events, None)
        store.add_events(batch)
        results = evaluate(ruleset, store, t, missing, reuse=reuse)
        life.update(results, t)
        for f in life.findings.values():
            if f.state != "firing":
                continue
            key = (f.rule, f.subject, f.code)
            entry = f.to_json()
            entry.pop("state", None)
            if key in seen:
                entry["first_seen"] = seen[key]["first_seen"]
            seen[key] = entry
    # Findings that resolved during the replay carry resolved_at.
    for f in life.history:
        key = (f.rule, f.subject, f.code)
        if key in seen:
            seen[key]["resolved_at"] = f.resolved_at
    unknown: list[dict[str, object]] = [
        {"rule": r.rule.id, "subject": r.subject, "conditions": r.unknown}
        for r in results
        if r.status == "unknown"
    ]
    findings = sorted(
        seen.values(), key=lambda e: (str(e["subject"]), str(e["code"]), str(e["rule"]))
    )
    return ReplayReport(
        str(tl.path), len(steps), sorted(tl.missing), findings, unknown, dict(tl.meta), read=tl.read
    )
