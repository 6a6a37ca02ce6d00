"""The actuator: the daemon acts on a finding as the remediation policy says.

It listens to the diagnosis loop's transitions. When a finding on the managed engine starts
firing and the policy has a remedy for its code, the guards decide (circuit breaker, time
since the engine started, rate limit, a remedy already in flight); then the remedy runs
(or, in dry-run, is only recorded), and the finding must resolve within verify_timeout or
the remedy counts as failed. Every decision is a row of the audit trail in the findings
database, a count in moptd_remediations_total and a log line. Only the daemon builds one:
no CLI path reaches it. The work on the event loop is bookkeeping; the restart itself is
the supervisor's (asynchronous), the writes go to the database's own thread.

After ``breaker_count`` remedies within ``breaker_window`` the next one trips the breaker:
moptd stops acting on that engine and raises REMEDIATION_SUSPENDED (layer moptd) until an
operator restarts the engine (``moptd serving restart``).

The guards' state lives in the findings database, not in memory alone: the open breaker
(table remediation_state) and the remedies that ran (the audit rows, for the breaker and
the rate limit) are read back at start, so a restart of moptd, or a crash under
Restart=on-failure, neither closes the breaker nor resets the rate limit. A remedy that was
still being verified when moptd died is reconciled at start: its row becomes `interrupted`,
with why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from moptd.daemon.managed import ManagedProcess
from moptd.diagnose.codes import CODES
from moptd.diagnose.model import Finding, Transition
from moptd.durations import format_duration
from moptd.findings.db import transition_record
from moptd.findings.service import Diagnosis
from moptd.observations import NODE, Batch, labels_of
from moptd.remediation.policy import RESTARTS, Entry, Policy
from moptd.store import SignalStore

log = logging.getLogger(__name__)

ACTOR = "moptd"
SUSPENDED = "REMEDIATION_SUSPENDED"
BREAKER_RULE = "remediation-breaker"
RUNBOOK = "docs/runbooks/REMEDIATION_SUSPENDED.md"
OUTCOMES = ("done", "dry-run", "failed", "interrupted", "suppressed-by-guard")
INTERRUPTED = (
    "moptd stopped (killed, crashed or restarted) while it verified this remedy; the "
    "finding it answered is judged afresh from the evidence after the restart"
)
KEEP_EVERY = 5.0  # seconds between checks that the breaker's finding is still in force


@dataclass
class Audit:
    """One remedy the policy chose, as the database keeps it."""

    rule: str
    subject: str
    code: str
    remedy: str
    entry: str
    t: float
    outcome: str = "verifying"
    reason: str = ""
    finished_at: float | None = None
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    detail: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "t": self.t,
            "finished_at": self.finished_at,
            "rule": self.rule,
            "subject": self.subject,
            "code": self.code,
            "remedy": self.remedy,
            "entry": self.entry,
            "actor": ACTOR,
            "outcome": self.outcome,
            "reason": self.reason,
            "detail": self.detail,
        }


class Remediator:
    def __init__(
        self,
        policy: Policy,
        managed: ManagedProcess | None,
        diagnosis: Diagnosis,
        store: SignalStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.managed = managed
        self.diagnosis = diagnosis
        self.store = store
        self.clock = clock
        self.acted: deque[float] = deque(maxlen=1000)  # when each remedy ran (dry-run too)
        self.suspended: dict[str, Any] | None = None  # the open breaker: since, reason
        self.reset_at: float | None = None  # when an operator last closed the breaker
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.in_flight: Audit | None = None
        self.readiness_for: tuple[str, str] | None = None  # the finding readiness is off for
        self._cleared: dict[tuple[str, str], asyncio.Event] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def subject(self) -> str | None:
        return self.managed.supervisor.subject if self.managed is not None else None

    # --- lifecycle ---

    async def start(self) -> None:
        await self._resume()
        self.diagnosis.listeners.append(self.on_transitions)
        self._publish()
        self._spawn(self._keep_raised())
        if self.policy.enabled:
            log.info(
                "remediation on%s: %d entries",
                " (dry run)" if self.policy.guards.dry_run else "",
                len(self.policy.entries),
            )

    async def stop(self) -> None:
        if self.on_transitions in self.diagnosis.listeners:
            self.diagnosis.listeners.remove(self.on_transitions)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _resume(self) -> None:
        """The guards as the last moptd left them (the database's own thread reads them)."""
        now = self.clock()
        subject = self.subject
        if subject is None:
            return
        g = self.policy.guards
        since = now - max(g.breaker_window, g.min_interval)
        state = await asyncio.wrap_future(
            self.diagnosis.db.resume_remediation(subject, since, INTERRUPTED, now)
        )
        for row in state.interrupted:
            log.warning(
                "remediation %s interrupted on %s (%s, decided %s): %s",
                row["remedy"],
                row["subject"],
                row["code"],
                _when(float(row["t"])),
                INTERRUPTED,
            )
        self.acted.extend(state.acted)
        self.suspended = state.suspended
        self.reset_at = state.reset_at
        breaker = self._breaker_finding()
        if self.suspended is None:
            if breaker is not None:  # a breaker finding whose state did not survive
                self._resolve_breaker(breaker, "the circuit breaker is closed")
        else:
            log.error(
                "remediation on %s stays suspended (since %s): %s",
                subject,
                _when(self.suspended["since"]),
                self.suspended["reason"],
            )
            if breaker is None:
                self._raise_breaker(now)

    def set_policy(self, policy: Policy) -> None:
        """A policy read again (SIGHUP), already checked whole: in force from now on."""
        self.policy = policy
        log.info(
            "remediation policy reloaded: %s, %d entries",
            ("dry run" if policy.guards.dry_run else "acting") if policy.enabled else "off",
            len(policy.entries),
        )

    def reset(self, why: str) -> None:
        """An operator restarted the engine: the breaker closes, its finding resolves."""
        if self.suspended is None:
            return
        self.suspended = None
        self.acted.clear()
        self.reset_at = self.clock()
        self._save_state()
        f = self._breaker_finding()
        if f is not None:
            self._resolve_breaker(f, why)
        log.warning("remediation resumed on %s: %s", self.subject, why)

    # --- what the diagnosis loop tells ---

    def on_transitions(self, transitions: list[Transition]) -> None:
        """On the event loop, from the diagnosis tick: bookkeeping only."""
        for tr in transitions:
            key = (tr.rule, tr.subject)
            if tr.new in ("resolved", "inactive"):
                cleared = self._cleared.get(key)
                if cleared is not None:
                    cleared.set()
                if self.managed is not None and self.readiness_for == key:
                    self.readiness_for = None
                    self.managed.readiness_on()
                    log.info("readiness of %s on again: %s resolved", tr.subject, tr.code)
                continue
            if tr.new != "firing" or tr.subject != self.subject or tr.rule == BREAKER_RULE:
                continue
            entry = self.policy.entry_for(tr.code)
            if entry is None or entry.remedy == "none":
                continue
            self._spawn(self._answer(tr, entry, retry=False))

    # --- the guards, then the remedy ---

    def _guard(self, now: float, entry: Entry) -> tuple[str, float | None]:
        """Why no remedy may run now ("" when one may), and when it could, for the guards
        that pass with time (the engine's uptime, the rate limit). readiness_off touches no
        process: it needs no uptime (SERVING_DOWN is when it matters)."""
        g = self.policy.guards
        if self.suspended is not None:
            return f"circuit breaker open since {_when(self.suspended['since'])}", None
        if self.in_flight is not None:
            flight = self.in_flight
            return f"a remedy is in flight ({flight.remedy} for {flight.code})", None
        started = self.managed.started_at if self.managed is not None else None
        if entry.remedy == "readiness_off":
            started = -math.inf
        if started is None:
            return "the engine is not running (or its start time is unknown)", None
        up = now - started
        if up < g.min_uptime:
            wait = format_duration(g.min_uptime)
            why = f"the engine started {up:.0f}s ago, under min_uptime {wait}"
            return why, started + g.min_uptime
        window = [t for t in self.acted if now - t <= g.breaker_window]
        if len(window) >= g.breaker_count:
            return "", None  # the breaker's decision, taken by the caller
        if self.acted and now - self.acted[-1] < g.min_interval:
            last = self.acted[-1]
            wait = format_duration(g.min_interval)
            why = f"rate limit: the last remedy was {now - last:.0f}s ago (min_interval {wait})"
            return why, last + g.min_interval
        return "", None

    def _breaker_due(self, now: float) -> bool:
        g = self.policy.guards
        return len([t for t in self.acted if now - t <= g.breaker_window]) >= g.breaker_count

    async def _answer(self, tr: Transition, entry: Entry, retry: bool) -> None:
        now = self.clock()
        audit = Audit(tr.rule, tr.subject, tr.code, entry.remedy, entry.name, now)
        f = self.diagnosis.rules.open_finding(tr.rule, tr.subject)
        audit.detail = {
            "why": f"{tr.code} fired on {tr.subject}: {tr.summary or (f.summary if f else '')}",
            "what": _what(entry),
            "args": list(entry.args),
            "env": dict(entry.env),
            "dry_run": self.policy.guards.dry_run,
            "finding_first_seen": f.first_seen if f is not None else tr.t,
        }
        reason, retry_at = self._guard(now, entry)
        if not reason and self._breaker_due(now):
            reason = self._trip(now, tr)
        if reason:
            self._finish(audit, "suppressed-by-guard", reason)
            if retry_at is not None and not retry:
                self._spawn(self._retry(tr, entry, retry_at))
            return
        self.acted.append(now)
        if self.policy.guards.dry_run:
            self._finish(audit, "dry-run", f"dry run: would {_what(entry)}")
            return
        await self._act(audit, entry)

    async def _retry(self, tr: Transition, entry: Entry, at: float) -> None:
        """Once, when a guard that passes with time passes: if the finding still fires."""
        await asyncio.sleep(max(0.0, at - self.clock()) + 0.05)
        f = self.diagnosis.rules.open_finding(tr.rule, tr.subject)
        if f is not None and f.state == "firing" and self.policy.entry_for(tr.code) == entry:
            await self._answer(tr, entry, retry=True)

    async def _act(self, audit: Audit, entry: Entry) -> None:
        assert self.managed is not None
        key = (audit.rule, audit.subject)
        cleared = self._cleared[key] = asyncio.Event()
        self.in_flight = audit
        pid_before = self.managed.supervisor.pid
        self._write(audit)
        try:
            if entry.remedy in RESTARTS:
                log.warning("remediation: %s (%s, %s)", _what(entry), audit.code, entry.name)
                audit.detail["changed"] = await self.managed.restart_with(entry.args, entry.env)
                audit.detail["pid_before"] = pid_before
            elif entry.remedy == "readiness_off":
                log.warning("remediation: readiness of %s off (%s)", audit.subject, audit.code)
                self.readiness_for = key
                self.managed.readiness_off(f"{audit.code}: {audit.detail['why']}")
            audit.detail["acted_at"] = self.clock()
            self._write(audit)
            timeout = self.policy.guards.verify_timeout
            try:
                async with asyncio.timeout(timeout):
                    await cleared.wait()
            except TimeoutError:
                self._finish(
                    audit,
                    "failed",
                    f"{audit.code} did not resolve within verify_timeout "
                    f"{format_duration(timeout)}",
                )
            else:
                self._finish(audit, "done", f"{audit.code} resolved after {_what(entry)}")
        except asyncio.CancelledError:
            self._finish(audit, "interrupted", "moptd stopped before the remedy was verified")
            raise
        except Exception as exc:  # a remedy that fails is recorded, never fatal to moptd
            log.exception("remediation %s failed", entry.name)
            self._finish(audit, "failed", f"{type(exc).__name__}: {exc}")
        finally:
            self.in_flight = None
            self._cleared.pop(key, None)

    # --- the circuit breaker's finding ---

    def _trip(self, now: float, tr: Transition) -> str:
        g = self.policy.guards
        reason = (
            f"circuit breaker: {g.breaker_count} remedies within "
            f"{format_duration(g.breaker_window)}; moptd stops acting on {tr.subject} until "
            "`moptd serving restart`"
        )
        self.suspended = {"since": now, "reason": reason, "code": tr.code}
        self._save_state()
        log.error("remediation suspended: %s", reason)
        self._raise_breaker(now)
        return reason

    def _raise_breaker(self, now: float) -> None:
        assert self.suspended is not None
        assert self.subject is not None
        info = CODES[SUSPENDED]
        summary = (
            f"moptd stopped remedying {self.subject}: {self.suspended['reason']} "
            f"(last trigger {self.suspended['code']})"
        )
        f = Finding(
            rule=BREAKER_RULE,
            subject=self.subject,
            code=SUSPENDED,
            severity=info.severity,
            state="firing",
            summary=summary,
            pending_since=now,
            first_seen=now,
            last_seen=now,
            evidence={
                "remedies": len(self.acted),
                "breaker_count": self.policy.guards.breaker_count,
                "breaker_window": self.policy.guards.breaker_window,
                "trigger": self.suspended["code"],
            },
            path=[BREAKER_RULE],
            actions=[
                f"moptd explain {self.subject}",
                "moptd serving logs",
                "moptd serving restart",
            ],
            runbook=RUNBOOK,
        )
        self.diagnosis.rules.restore([f])
        self.diagnosis.db.record_transition(
            transition_record(
                now,
                f.rule,
                f.subject,
                f.code,
                f.severity,
                "inactive",
                "firing",
                summary,
                f.to_json(),
            )
        )

    def _breaker_finding(self) -> Finding | None:
        if self.subject is None:
            return None
        return self.diagnosis.rules.open_finding(BREAKER_RULE, self.subject)

    def _resolve_breaker(self, f: Finding, why: str) -> None:
        now = self.clock()
        self.diagnosis.rules.lifecycle.findings.pop((f.rule, f.subject), None)
        f.state, f.resolved_at = "resolved", now
        self.diagnosis.db.record_transition(
            transition_record(
                now, f.rule, f.subject, f.code, f.severity, "firing", "resolved", why, f.to_json()
            )
        )

    async def _keep_raised(self) -> None:
        """A rule reload resolves findings of rules not in the rule files, this one too:
        while the breaker is open its finding is raised again."""
        while True:
            await asyncio.sleep(KEEP_EVERY)
            if self.suspended is not None and self._breaker_finding() is None:
                self._raise_breaker(self.clock())

    # --- the audit trail ---

    def _finish(self, audit: Audit, outcome: str, reason: str) -> None:
        audit.outcome, audit.reason, audit.finished_at = outcome, reason, self.clock()
        self.counts[(audit.code, audit.remedy, outcome)] += 1
        line = "remediation %s %s on %s: %s (%s)"
        level = logging.WARNING if outcome == "failed" else logging.INFO
        log.log(level, line, audit.remedy, outcome, audit.subject, reason, audit.entry)
        self._write(audit)
        self._publish()

    def _write(self, audit: Audit) -> None:
        self.diagnosis.db.record_remediation(audit.record())

    def _save_state(self) -> None:
        if self.subject is not None:
            self.diagnosis.db.save_remediation_state(self.subject, self.suspended, self.reset_at)

    def _publish(self) -> None:
        batch = Batch()
        for (code, remedy, outcome), n in sorted(self.counts.items()):
            labels = labels_of(code=code, remedy=remedy, outcome=outcome)
            batch.add("remediation.total", NODE, float(n), labels)
        self.store.ingest("remediation", batch)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def view(self) -> dict[str, Any]:
        return {
            "policy": self.policy.as_dict(),
            "suspended": self.suspended,
            "in_flight": self.in_flight.record() if self.in_flight is not None else None,
            "ready": self.managed.ready()[0] if self.managed is not None else None,
        }


def _what(entry: Entry) -> str:
    if entry.remedy == "restart_engine":
        return "restart the engine"
    if entry.remedy == "restart_with":
        setting = [*entry.args, *(f"{k}={v}" for k, v in entry.env.items())]
        return f"restart the engine with {' '.join(setting)}"
    if entry.remedy == "readiness_off":
        return "fail the engine's readiness (/v1/serving/<name>/ready) until the finding resolves"
    return "nothing"


def _when(t: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(t))
