"""The daemon's diagnosis loop: tick the rules, persist what changed, tell listeners.

It joins the rule service (moptd.diagnose) to the findings database and the API's event
stream. Rules are evaluated every `interval` and when an event arrives, so an Xid written
to the kernel log shows as a finding within milliseconds, whatever the interval. That
evaluation is the whole rule set, but the engine's reuse (moptd.diagnose.engine.Reuse)
walks again only the rules whose reads changed: in effect, the rules the event can change.
A burst of events costs one evaluation per EVENT_GAP, not one per slice of records.

The evaluation runs in a worker thread, so the event loop goes on serving /metrics and
the API while it runs. Meanwhile the store is held (SignalStore.hold: the collectors'
writes wait, in order, and apply when it ends), and everything that changes what the API
reads (the lifecycle, the links, the findings database, the event stream, the listeners)
happens back on the loop. One tick or one reload is in force at a time (`_tick_lock`), so
a reload never swaps the rules under an evaluation. The evaluation has a time budget
(rules.tick_budget, RuleService.compute): past it, the rest waits for the next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from moptd.clock import Clock, SystemClock, next_on_grid
from moptd.diagnose.codes import Severity
from moptd.diagnose.engine import Result, fmt
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.model import Finding, Transition
from moptd.diagnose.service import RuleService
from moptd.findings import boards
from moptd.findings.db import FILE_NAME, FindingsDB, Retention, transition_record
from moptd.located import LocatedError
from moptd.observations import NODE, Batch, Event
from moptd.store import SignalStore

log = logging.getLogger(__name__)

STORE_SIGNAL = "findings.store_ok"
SUBSCRIBER_QUEUE = 256
# Least time between two evaluations that events asked for. The first event after a quiet
# spell is evaluated at once; a flood of kernel records (parsed and published in slices)
# costs at most 1 / EVENT_GAP evaluations a second instead of one per slice, and the
# finding of a record inside a burst waits EVENT_GAP at most.
EVENT_GAP = 0.05
# An event whose time is still ahead of the clock (a log line's own stamp) is counted by the
# rules only from that time on: the evaluation it asks for waits until then, and this long.
AHEAD_MARGIN = 0.001
AHEAD_TRIES = 5  # then the grid: a clock that does not move must not spin the loop
# The boards' history (moptd.findings.boards) is read again when a kernel.xid event or a
# hardware finding came, and at least this often (the window slides, GPUs appear).
BOARDS_EVERY = 60.0
# ... but after a kernel.xid event not sooner than this after the last read: a flood of Xid
# lines (hundreds of thousands of Xid 95 are seen on one bad node) must not make the
# grouped read of a week of events run at every evaluation.
BOARDS_GAP = 5.0


def steps_of(result: Result | None) -> list[dict[str, Any]]:
    """The decision path as `explain` prints it: every condition tried, with what it saw."""
    if result is None:
        return []
    return [
        {
            "node": s.node,
            "cond": s.cond,
            "value": s.value,
            "seen": [{"name": n, "value": v, "text": fmt(v)} for n, v in s.seen],
        }
        for s in result.steps
    ]


def finding_of_row(row: Mapping[str, Any], now: float) -> Finding:
    """A firing finding as the database kept it, to put back in force after a restart."""
    return Finding(
        rule=str(row["rule"]),
        subject=str(row["subject"]),
        code=str(row["code"]),
        severity=cast(Severity, row["severity"]),
        state="firing",
        summary=str(row.get("summary", "")),
        pending_since=float(row.get("pending_since") or now),
        first_seen=row.get("first_seen"),
        last_seen=float(row.get("last_seen") or now),
        pci_bus_id=row.get("pci_bus_id"),
        evidence=dict(row.get("evidence") or {}),
        path=list(row.get("path") or []),
        actions=list(row.get("actions") or []),
        runbook=str(row.get("runbook") or ""),
        caused_by=dict(row["caused_by"]) if isinstance(row.get("caused_by"), dict) else None,
        consequences=[dict(c) for c in row.get("consequences") or [] if isinstance(c, dict)],
    )


class Diagnosis:
    def __init__(
        self,
        store: SignalStore,
        rules: RuleService,
        db: FindingsDB,
        interval: float = 1.0,
        prune_interval: float = 3600.0,
        before_tick: Callable[[], None] | None = None,
        listeners: list[Callable[[list[Transition]], None]] | None = None,
    ) -> None:
        """`before_tick` runs before each evaluation (the daemon sets the rule service's
        missing namespaces there); `listeners` get each non-empty list of transitions."""
        self.store = store
        self.rules = rules
        self.db = db
        self.interval = interval
        self.prune_interval = prune_interval
        self.before_tick = before_tick
        self.listeners = listeners if listeners is not None else []
        self._wake = asyncio.Event()
        self._reload_lock = asyncio.Lock()
        # a tick (evaluation and apply) or a reload's put-in-force, never both at once
        self._tick_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self.ticks = 0
        self.event_ticks = 0  # evaluations that events (or a reload) asked for, in `ticks`
        self.board_policy: boards.BoardPolicy | None = None
        try:
            self.board_policy = boards.load_policy()
        except (OSError, LocatedError) as exc:
            # the shipped file is checked by the tests; a broken copy costs this one feature
            log.error("board history off: %s", exc)
        self._boards_due = -math.inf  # rule-clock time of the next board refresh
        self._boards_seen: dict[str, boards.Board] = {}
        self._boards_read = -math.inf  # rule-clock time of the last board refresh
        # the boards as of a store layout (the GPUs' attributes change it); worked out every
        # tick they were a twentieth of the tick (issue 32)
        self._boards_of: tuple[tuple[int, int], dict[str, boards.Board]] | None = None
        self._ahead: float | None = None  # the latest event time still ahead of the clock

    # --- lifecycle ---

    async def start(self) -> None:
        await asyncio.to_thread(self.db.open)
        await self._restore()
        self.store.event_listeners.append(self._on_events)
        self.publish_health()
        self._task = asyncio.create_task(self._loop(), name="diagnosis")

    async def stop(self) -> None:
        if self._on_events in self.store.event_listeners:
            self.store.event_listeners.remove(self._on_events)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.to_thread(self.db.close)

    async def _restore(self) -> None:
        """Firing findings come back as they were; a pending one starts its `for:` again."""
        open_rows = await asyncio.to_thread(self.db.history, state="firing", limit=10000)
        now = self.rules.clock.now()
        self.rules.restore(finding_of_row(row, now) for row in open_rows)
        pending = await asyncio.to_thread(self.db.history, state="pending", limit=10000)
        for row in pending:
            self.db.record_transition(
                transition_record(
                    now,
                    row["rule"],
                    row["subject"],
                    row["code"],
                    row["severity"],
                    "pending",
                    "inactive",
                    "moptd restarted before the finding fired",
                )
            )
        if open_rows:
            log.info("resumed %d firing findings from %s", len(open_rows), self.db.path)

    # --- the loop ---

    def _on_events(self, events: list[Event]) -> None:
        self.db.record_events(events)
        if any(ev.stream == "kernel.xid" for ev in events):
            self._boards_due = min(self._boards_due, self._boards_read + BOARDS_GAP)
        latest = max(ev.t for ev in events)
        if latest > self.rules.clock.now():
            self._ahead = latest if self._ahead is None else max(self._ahead, latest)
        self._wake.set()

    def _deadline(self, loop_now: float) -> tuple[float, bool]:
        """When to evaluate if no event comes: the next point of the interval's grid, or
        sooner when an event's time is still ahead of the rule clock (its count starts
        then); and whether it is that sooner time."""
        grid = next_on_grid(loop_now, self.interval)
        if self._ahead is None:
            return grid, False
        at = loop_now + max(0.0, self._ahead - self.rules.clock.now()) + AHEAD_MARGIN
        return (at, True) if at < grid else (grid, False)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_prune = loop.time() + 60.0
        last_event_tick = -math.inf  # loop time of the last evaluation an event asked for
        ahead_tries = 0  # evaluations at an event's time that came before the wall clock did
        while True:
            woken = False
            deadline, for_ahead = self._deadline(loop.time())
            with contextlib.suppress(TimeoutError):
                # on the collectors' grid: one wake-up of the loop a second, not several
                async with asyncio.timeout_at(deadline):
                    await self._wake.wait()
                    woken = True
            if woken:
                # Bursts coalesce: the events that arrive meanwhile join this evaluation.
                rest = last_event_tick + EVENT_GAP - loop.time()
                if rest > 0:
                    await asyncio.sleep(rest)
                last_event_tick = loop.time()
                self.event_ticks += 1
            elif for_ahead:
                # An evaluation at an event's own time. The rule clock is the wall clock and
                # the timer the monotonic one; a slewing clock (NTP, a VM) can make the wall
                # lag, so the event may still be ahead: try again a few times, then the grid
                # (a clock that does not move, as in a test, must not make a busy loop).
                ahead_tries += 1
                if ahead_tries > AHEAD_TRIES:
                    self._ahead = None
            self._wake.clear()
            try:
                await self.tick_off_loop()
            except Exception:
                log.exception("rule evaluation failed")
            if self._ahead is not None and self._ahead <= self.rules.clock.now():
                self._ahead = None  # that evaluation counted it
            if self._ahead is None:
                ahead_tries = 0
            if loop.time() >= next_prune:
                next_prune = loop.time() + self.prune_interval
                self.db.prune()

    async def tick_off_loop(self, now: float | None = None) -> list[dict[str, Any]]:
        """One evaluation as the daemon runs it: the rules are evaluated in a worker thread
        over the held store, the rest on the loop; returns the transitions as stored."""
        async with self._tick_lock:
            if self.before_tick is not None:
                self.before_tick()
            t = self.rules.clock.now() if now is None else now
            wanted = self._boards_wanted(t)
            if wanted is not None:
                facts = await asyncio.to_thread(self._board_facts, t, wanted)
                self._publish_boards(facts, t)
            with self.store.hold():
                ev = await _in_thread(self.rules.compute, t, self.rules.open_keys())
                # on the loop, still over the store the evaluation saw (links read it)
                transitions = self.rules.apply(ev)
            # the writes held meanwhile are in now; then the rules' own samples
            return self._after(transitions)[1]

    def tick(self, now: float | None = None) -> list[dict[str, Any]]:
        """One evaluation, all on the calling thread (tests); returns the transitions as
        stored (plain records)."""
        return self._step(now)[1]

    def evaluate(self, now: float | None = None) -> list[Transition]:
        """One evaluation; returns the rule service's transitions."""
        return self._step(now)[0]

    def _step(self, now: float | None) -> tuple[list[Transition], list[dict[str, Any]]]:
        if self.before_tick is not None:
            self.before_tick()
        t = self.rules.clock.now() if now is None else now
        wanted = self._boards_wanted(t)
        if wanted is not None:
            self._publish_boards(self._board_facts(t, wanted), t)
        return self._after(self.rules.tick(now))

    # --- each board's history (moptd.findings.boards) ---

    def _boards(self) -> dict[str, boards.Board]:
        layout = self.store.layout_key()
        if self._boards_of is not None and self._boards_of[0] == layout:
            return self._boards_of[1]
        attrs = {s: self.store.attrs(s) for s in self.store.subjects("gpu")}
        indexed = {
            a["pci_bus_id"].lower()
            for s, a in attrs.items()
            if s[4:].isdigit() and a.get("pci_bus_id")
        }
        out = {}
        for subject in attrs:
            if not subject[4:].isdigit() and subject[4:].lower() in indexed:
                continue  # the kernel's gpu:<bus> of a GPU NVML names by index: one board
            board = boards.board_of(subject, attrs)
            if board is not None:
                out[subject] = board
        self._boards_of = (layout, out)
        return out

    def _boards_wanted(self, t: float) -> dict[str, boards.Board] | None:
        """The GPU subjects' boards when their history is due to be read again (on the
        loop: the store is read here, the database in a thread): after a kernel.xid event
        or a hardware finding, when the GPUs changed, and every BOARDS_EVERY."""
        if self.board_policy is None:
            return None
        now_boards = self._boards()
        if t < self._boards_due and now_boards == self._boards_seen:
            return None
        self._boards_due = t + BOARDS_EVERY
        self._boards_read = t
        self._boards_seen = now_boards
        return now_boards

    def _board_facts(self, t: float, wanted: dict[str, boards.Board]) -> dict[str, boards.Facts]:
        assert self.board_policy is not None
        try:
            return self.db.board_facts(t, self.board_policy, wanted)
        except Exception:
            log.exception("reading the boards' history failed")
            return {}

    def _publish_boards(self, facts: dict[str, boards.Facts], t: float) -> None:
        if facts:
            # a source of its own: "findings" (the store's health) is replaced every tick
            self.store.ingest("boards", boards.facts_batch(facts), t)

    def _after(
        self, transitions: list[Transition]
    ) -> tuple[list[Transition], list[dict[str, Any]]]:
        """What follows an evaluation, on the loop: persist, publish, tell listeners."""
        self.ticks += 1
        records = self._persist(transitions)
        self.store.ingest("rules", self.rules.findings_batch())
        self.publish_health()
        if transitions:
            for listener in self.listeners:
                listener(transitions)
        return transitions, records

    def _record(self, tr: Transition) -> dict[str, Any]:
        f = self.rules.open_finding(tr.rule, tr.subject)
        if f is None and tr.new == "resolved":
            f = self.rules.last_resolved(tr.rule, tr.subject)
        detail: dict[str, Any] = f.to_json() if f is not None else {}
        if f is not None:  # the evidence's time when older than the transition (Xids at start)
            detail["pending_since"] = f.pending_since
        if f is not None and tr.new in ("pending", "firing"):
            detail["steps"] = steps_of(self.rules.result(tr.rule, tr.subject))
        rec = transition_record(
            tr.t, tr.rule, tr.subject, tr.code, tr.severity, tr.old, tr.new, tr.summary, detail
        )
        policy = self.board_policy
        if tr.new == "firing" and policy is not None and policy.counts(tr.code, tr.severity):
            board = self._boards().get(tr.subject)
            if board is None:
                board = boards.board_of(tr.subject, {tr.subject: self.store.attrs(tr.subject)})
            if board is not None:
                rec["board"] = boards.board_row(board, detail)
                self._boards_due = -math.inf  # the repeat shows at the next evaluation
        return rec

    def _persist(self, transitions: list[Transition]) -> list[dict[str, Any]]:
        """Record each transition and tell the event stream; returns the records."""
        records = [self._record(tr) for tr in transitions]
        for rec in records:
            self.db.record_transition(rec)
            self._broadcast(rec)
        return records

    async def reload(self) -> list[str]:
        """The one rule reload (SIGHUP and POST /v1/rules/reload): the files are read and
        compiled off the loop and put in force on it, so a tick never sees half a rule set.
        A set with errors is refused whole and its errors returned; the rules in force
        stay. Findings of rules that went away resolve, recorded like any other change."""
        # One at a time: reads run off the loop, and two at once could finish out of order,
        # putting an older version of the files in force after a newer one.
        async with self._reload_lock:
            loaded = await asyncio.to_thread(load_rules, list(self.rules.rule_paths))
            async with self._tick_lock:  # not under an evaluation that reads the rules
                dropped = self.rules.put_in_force(loaded)
                if loaded.errors:
                    return [str(e) for e in loaded.errors]
                self._persist(dropped)
            log.info(
                "reloaded %d rules from %d files",
                len(loaded.ruleset.rules),
                len(loaded.ruleset.files),
            )
            self._wake.set()
            return []

    def publish_health(self) -> None:
        batch = Batch()
        batch.add(STORE_SIGNAL, NODE, 1.0 if self.db.health.state == "ok" else 0.0)
        self.store.ingest("findings", batch)

    # --- views for the API ---

    def active(self) -> list[dict[str, Any]]:
        """Firing findings, live from the rule service, with their decision steps."""
        out = []
        for f in self.rules.active():
            d = f.to_json()
            d["pending_since"] = f.pending_since
            d["steps"] = steps_of(self.rules.result(f.rule, f.subject))
            out.append(d)
        return sorted(out, key=lambda d: (str(d["subject"]), str(d["code"])))

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(SUBSCRIBER_QUEUE)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[dict[str, Any]]) -> None:
        self._subscribers.discard(q)

    def _broadcast(self, rec: dict[str, Any]) -> None:
        for q in list(self._subscribers):
            try:
                q.put_nowait(rec)
            except asyncio.QueueFull:
                # a reader that does not keep up is cut off rather than slowing the loop
                self._subscribers.discard(q)

    def subscribed(self, q: asyncio.Queue[dict[str, Any]]) -> bool:
        return q in self._subscribers

    def close_subscribers(self) -> None:
        """Wake every stream reader so a shutdown does not wait on open streams."""
        for q in list(self._subscribers):
            self._subscribers.discard(q)
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait({})


# No sys.setswitchinterval here. The evaluation thread holds the GIL up to the switch
# interval (5 ms) before the loop gets it back, so a shorter one could cut a /metrics that
# arrives mid-tick; measured side by side (BENCHMARKS.md, "The rule tick off the event
# loop"), 1 ms left the p99 after the first 10 s where it was under the hostile endpoint
# (9.2 against 8.6 ms) and under the costliest rule set (7.1 against 6.7 ms), and costs
# every thread more switches. Kept out until a quiet host shows it helps.
async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a worker thread. A cancelled caller (the daemon stopping) still waits
    for the thread to end: it reads the store, which must stay held until it has."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise


def build_diagnosis(
    store: SignalStore,
    state_dir: Path,
    rule_paths: Sequence[str | Path] | None = None,
    clock: Clock | None = None,
    retention: Retention | None = None,
) -> Diagnosis:
    """The daemon's diagnosis: the shipped rules (or `rule_paths`) over `store`, with the
    findings database in the state directory."""
    rules = RuleService(store, clock or SystemClock(), list(rule_paths or [default_rules_dir()]))
    return Diagnosis(store, rules, FindingsDB(state_dir / FILE_NAME, retention))
