"""The rule tick runs off the event loop, within a time budget (issue 18, the last item).

Before, `Diagnosis._loop` evaluated the rule set on the event loop: while a costly tick ran
(the costliest set the load bound accepts, a big store, a starved machine) nothing else
did, /metrics and the API included. Now the evaluation runs in a worker thread over a held
store (moptd.store.SignalStore.hold) and the rest of the tick on the loop, one tick or one
reload at a time, and `rules.tick_budget` bounds it: the pairs an evaluation does not reach
keep their last result and the next evaluation starts with them.

The evaluation is held open through the budget's clock (`RuleService.budget_clock`, the one
seam: the store, the rules and the API are the real ones), so each test says what happened
while it was still running by order, never by how long anything took.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import aiohttp
import yaml

from moptd.clock import VirtualClock
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.rule_cost import MAX_TICK_READS, SUBJECTS, rule_reads
from moptd.diagnose.service import RuleService
from moptd.findings.db import FILE_NAME, FindingsDB
from moptd.findings.service import Diagnosis, build_diagnosis
from moptd.observations import Batch, Event
from moptd.store import SignalStore
from tests.faults.test_rule_cost import SIGNALS as COSTLY_SIGNALS
from tests.faults.test_rule_cost import write as write_costly
from tests.test_diagnosis_service import serve

T0 = 1000.0


def node_rule(rid: str, signal: str, for_: str = "0s") -> dict[str, object]:
    return {
        "id": rid,
        "title": f"{signal} high (test rule)",
        "layer": "host",
        "scope": "node",
        "status": "stable",
        "for": for_,
        "keep_firing_for": "0s",
        "decide": [
            {
                "id": "high",
                "if": f"{signal} > 10",
                "verdict": {
                    "code": "SWAP_ACTIVE",
                    "summary": "{{subject}} is high",
                    "actions": [{"kind": "inspect", "command": "true"}],
                    "runbook": "https://docs.kernel.org/admin-guide/sysctl/vm.html",
                },
            }
        ],
    }


SIGNALS = ("node.swappiness", "node.load1", "node.load5", "node.cpu_util")


def write_rules(d: Path, rules: list[dict[str, object]]) -> Path:
    d.mkdir(exist_ok=True)
    (d / "test.rules.yaml").write_text(
        yaml.safe_dump({"schema": "moptd.rules/v1", "rules": rules}, sort_keys=False)
    )
    return d


def ingest(store: SignalStore, t: float, **values: float) -> None:
    b = Batch()
    for signal, v in values.items():
        b.add(signal.replace("_", ".", 1), "node", v)
    store.ingest("host", b, t)


class Gate:
    """A budget clock that stops the evaluation, in its thread, at its first reading of the
    clock until `open()`: the evaluation is running all that while."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            assert self.released.wait(30), "the test never opened the gate"
        return time.perf_counter()

    async def wait_entered(self) -> None:
        await asyncio.to_thread(self.entered.wait, 30)
        assert self.entered.is_set()

    def open(self) -> None:
        self.released.set()


def gated(tmp: Path, clock: VirtualClock, store: SignalStore) -> tuple[Diagnosis, Gate]:
    rule = node_rule("test-swappiness", "node.swappiness", for_="10s")
    rules = write_rules(tmp / "rules", [rule])
    d = build_diagnosis(store, tmp / "state", [rules], clock=clock)
    d.rules.tick_budget = 3600.0  # a budget, so its clock is read; never reached
    gate = Gate()
    d.rules.budget_clock = gate
    return d, gate


async def opened(d: Diagnosis) -> None:
    """The findings database open, the daemon's own loop not started: each test runs the
    ticks it means to, and no other tick is in between."""
    await asyncio.to_thread(d.db.open)


async def test_the_api_answers_while_an_evaluation_is_still_running(tmp_path):
    clock = VirtualClock(T0)
    store = SignalStore(clock=clock)
    d, gate = gated(tmp_path, clock, store)
    ingest(store, T0, node_swappiness=60)
    await opened(d)
    sock = tmp_path / "api.sock"
    runner = await serve(d, store, sock)
    order: list[str] = []
    try:
        tick = asyncio.create_task(d.tick_off_loop(T0))
        tick.add_done_callback(lambda _t: order.append("tick done"))
        await gate.wait_entered()
        assert store.held  # the tick is still in its evaluation (the gate is shut)
        conn = aiohttp.UnixConnector(path=str(sock))
        async with aiohttp.ClientSession(connector=conn) as s:
            async with s.get("http://moptd/v1/health") as r:
                assert r.status == 200
                health = await r.json()
                order.append("health answered")
            async with s.get("http://moptd/v1/findings") as r:
                assert r.status == 200
                order.append("findings answered")
        assert store.held  # the tick is still in its evaluation (the gate is shut)
        assert not tick.done()
        assert health["diagnosis"]["ticks"] == 0
        gate.open()
        records = await tick
        assert [r["new"] for r in records] == ["pending"]
        assert order == ["health answered", "findings answered", "tick done"]
    finally:
        gate.open()
        await runner.cleanup()
        await d.stop()


async def test_the_loop_runs_callbacks_during_a_real_costly_evaluation(tmp_path):
    # No gate: the costliest set the load bound accepts (bench/rule_cost.py's shape) over 8
    # GPUs with ten minutes of history, its first (cold) tick. The evaluation notes how many
    # loop callbacks had run each time it reads the budget clock (at its start and after each
    # rule and subject): some ran between its first pair and its last. Before, the tick ran
    # on the loop and none could.
    shipped = load_rules([default_rules_dir()])
    held: dict[str, set[str]] = {}
    for r in shipped.ruleset.rules:
        held.setdefault(r.scope, set()).update(rule_reads(r))
    used = sum(len(v) * SUBJECTS.get(k, 1) for k, v in held.items())
    costly = write_costly(tmp_path / "costly", (MAX_TICK_READS - used) // SUBJECTS["gpu"])
    clock = VirtualClock(T0)
    store = SignalStore(clock=clock)
    for t in range(600):
        b = Batch()
        for g in range(8):
            for k, sig in enumerate(COSTLY_SIGNALS):
                b.add(sig, f"gpu:{g}", float((t * (k + 3) + g) % 97))
            b.attrs[f"gpu:{g}"] = {"pci_bus_id": f"00000000:{g + 1:02X}:00.0"}
        store.ingest("nvml", b, T0 + t)
    clock.set(T0 + 600)
    rules = RuleService(store, clock, [default_rules_dir(), costly.parent], tick_budget=3600.0)
    assert not rules.errors, rules.errors
    beats: list[int] = [0]
    seen_at: list[int] = []  # callbacks run so far, at each reading of the budget clock

    def budget_clock() -> float:
        seen_at.append(beats[0])
        return time.perf_counter()

    rules.budget_clock = budget_clock
    d = Diagnosis(store, rules, FindingsDB(tmp_path / "state" / FILE_NAME))
    await opened(d)
    stop = False

    def beat() -> None:
        beats[0] += 1
        if not stop:
            asyncio.get_running_loop().call_soon(beat)

    try:
        asyncio.get_running_loop().call_soon(beat)
        await d.tick_off_loop(T0 + 600)
        stop = True
        assert d.ticks == 1
        assert len(seen_at) > 8 * 3
        assert seen_at[-1] > seen_at[0], "no loop callback ran while the evaluation did"
    finally:
        stop = True
        await d.stop()


async def test_writes_during_an_evaluation_apply_after_it_in_order_none_lost(tmp_path):
    clock = VirtualClock(T0)
    store = SignalStore(clock=clock)
    d, gate = gated(tmp_path, clock, store)
    ingest(store, T0, node_swappiness=5)
    heard: list[list[str]] = []
    store.event_listeners.append(lambda evs: heard.append([e.fields["n"] for e in evs]))
    await opened(d)
    try:
        tick = asyncio.create_task(d.tick_off_loop(T0))
        await gate.wait_entered()
        version = store.version
        for i, v in enumerate((20.0, 30.0, 40.0)):  # a collector's passes meanwhile
            ingest(store, T0 + 1 + i, node_swappiness=v)
            ev = Event("kernel.xid", "gpu:0", T0 + 1 + i, {"n": str(i)})
            store.add_events([ev])
        b = Batch()  # events inside a collector's batch too
        b.events.append(Event("kernel.xid", "gpu:0", T0 + 4, {"n": "3"}))
        store.ingest("kernel", b, T0 + 4)
        # held: the evaluation's store is the one it began with
        assert store.version == version
        assert store.latest("node.swappiness", "node") == 5.0
        assert store.stream_appended("kernel.xid") == 0
        # listeners are told at once (the database queues each event's row before the
        # kernel log queues its position), and only once, below
        assert heard == [["0"], ["1"], ["2"], ["3"]]
        assert store.queued() == 7
        gate.open()
        assert [r["new"] for r in await tick] == []  # 5 is not high: it saw the store before
        points = store.series("node.swappiness", "node").points()
        assert points == [(T0, 5.0), (T0 + 1, 20.0), (T0 + 2, 30.0), (T0 + 3, 40.0)]
        assert [e.fields["n"] for e in store.events("kernel.xid")] == ["0", "1", "2", "3"]
        assert heard == [["0"], ["1"], ["2"], ["3"]]
        assert not store.held
        assert store.queued() == 0
        # the next tick sees them
        assert [r["new"] for r in await _ungated(d, T0 + 3)] == ["pending"]
    finally:
        gate.open()
        await d.stop()


async def _ungated(d: Diagnosis, t: float) -> list[dict[str, object]]:
    d.rules.budget_clock = time.perf_counter
    return await d.tick_off_loop(t)


async def test_a_reload_during_an_evaluation_waits_for_it(tmp_path):
    clock = VirtualClock(T0)
    store = SignalStore(clock=clock)
    d, gate = gated(tmp_path, clock, store)
    ingest(store, T0, node_swappiness=60)
    await opened(d)
    order: list[str] = []
    try:
        before = d.rules.ruleset
        async def tick_then_note() -> list[dict[str, object]]:
            records = await d.tick_off_loop(T0)
            order.append("tick")
            return records

        async def reload_then_note() -> list[str]:
            errors = await d.reload()
            order.append("reload")
            return errors

        tick = asyncio.create_task(tick_then_note())
        await gate.wait_entered()
        write_rules(tmp_path / "rules", [node_rule("test-other", "node.load1")])
        reload = asyncio.create_task(reload_then_note())
        # the files are read (in a thread); then the reload waits for the tick's lock
        for _ in range(6000):
            if d._tick_lock._waiters:  # the reload, waiting
                break
            assert not reload.done()
            await asyncio.sleep(0.005)
        assert d._tick_lock._waiters, "the reload never came to wait for the tick"
        assert not reload.done()
        assert d.rules.ruleset is before
        gate.open()
        records = await tick
        assert [r["rule"] for r in records] == ["test-swappiness"]
        assert await reload == []
        assert order == ["tick", "reload"]
        assert [r.id for r in d.rules.ruleset.rules] == ["test-other"]
    finally:
        gate.open()
        await d.stop()


class Steps:
    """A budget clock that moves one second each time it is read: a budget of 2.5 s lets
    an evaluation reach three pairs (read at the start, then after each pair)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def rule_id(i: int, signal: str) -> str:
    return f"r{i}-{signal.split('.')[1].replace('_', '-')}"


def budgeted(tmp: Path, clock: VirtualClock, store: SignalStore) -> RuleService:
    rules = write_rules(
        tmp / "rules",
        [node_rule(rule_id(i, sig), sig, for_="5s") for i, sig in enumerate(SIGNALS)],
    )
    svc = RuleService(store, clock, [rules], tick_budget=2.5)
    svc.budget_clock = Steps()
    return svc


def test_the_budget_defers_the_rest_and_the_next_tick_starts_there(tmp_path):
    clock = VirtualClock(T0)
    store = SignalStore(clock=clock)
    svc = budgeted(tmp_path, clock, store)
    high = {s.replace(".", "_"): 60.0 for s in SIGNALS}
    ingest(store, T0, **high)
    ev = svc.compute(T0)
    assert [r.rule.id for r in ev.results] == ["r0-swappiness", "r1-load1",
                                               "r2-load5"]
    assert ev.deferred == [("r3-cpu-util", "node")]
    assert [tr.new for tr in svc.apply(ev)] == ["pending"] * 3
    assert svc.ticks_over_budget == 1
    assert svc.evaluations_deferred == 1
    # the next starts with the one left, then wraps round
    ev = svc.compute(T0 + 1)
    assert [r.rule.id for r in ev.results] == ["r0-swappiness", "r1-load1",
                                               "r3-cpu-util"]
    assert ev.deferred == [("r2-load5", "node")]
    assert [(tr.rule, tr.new) for tr in svc.apply(ev)] == [("r3-cpu-util", "pending")]
    batch = svc.findings_batch()
    counters = {s.signal: s.value for s in batch.samples if s.signal.startswith("rules.")}
    assert counters["rules.ticks_over_budget"] == 2.0
    assert counters["rules.evaluations_deferred"] == 2.0


def test_a_deferred_pair_neither_fires_nor_resolves_nor_ends_pending(tmp_path):
    clock = VirtualClock(T0)
    store = SignalStore(clock=clock)
    svc = budgeted(tmp_path, clock, store)
    svc.tick_budget = None  # a whole evaluation first: four pending findings
    ingest(store, T0, **{s.replace(".", "_"): 60.0 for s in SIGNALS})
    assert [tr.new for tr in svc.tick(T0)] == ["pending"] * 4
    # the condition is gone everywhere, and the for: of 5 s has passed
    ingest(store, T0 + 6, **{s.replace(".", "_"): 0.0 for s in SIGNALS})
    svc.tick_budget = 2.5
    ev = svc.compute(T0 + 6)
    assert ev.deferred == [("r3-cpu-util", "node")]
    trs = svc.apply(ev)
    # the three reached end; the deferred one stays pending (no "inactive" for a pair not
    # evaluated), and keeps its last result for the API
    assert sorted((tr.rule, tr.new) for tr in trs) == [
        ("r0-swappiness", "inactive"),
        ("r1-load1", "inactive"),
        ("r2-load5", "inactive"),
    ]
    assert svc.open_finding("r3-cpu-util", "node").state == "pending"
    assert svc.result("r3-cpu-util", "node").status == "match"
    # a firing one past for: is not made to fire by a deferral either: high again
    ingest(store, T0 + 7, **{s.replace(".", "_"): 60.0 for s in SIGNALS})
    svc.tick_budget = None
    svc.tick(T0 + 7)
    svc.tick(T0 + 13)
    assert {f.rule for f in svc.active()} == {rule_id(i, s) for i, s in enumerate(SIGNALS)}
    ingest(store, T0 + 14, **{s.replace(".", "_"): 0.0 for s in SIGNALS})
    svc.tick_budget = 2.5
    ev = svc.compute(T0 + 14)
    deferred = {rule for rule, _ in ev.deferred}
    resolved = {tr.rule for tr in svc.apply(ev) if tr.new == "resolved"}
    assert deferred
    assert not deferred & resolved
    assert deferred <= {f.rule for f in svc.active()}
    # the next evaluation reaches them and they resolve then
    svc.tick_budget = None
    assert {tr.rule for tr in svc.tick(T0 + 15) if tr.new == "resolved"} == deferred
