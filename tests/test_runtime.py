"""The collector runtime isolates collectors from each other."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from moptd.collector import Collector, CollectorContext, Unavailable
from moptd.daemon.runtime import CollectorRuntime
from moptd.observations import NODE, Batch
from moptd.store import SignalStore


class Ticker(Collector):
    name = "ticker"

    def __init__(self) -> None:
        super().__init__(CollectorContext())
        self.n = 0

    async def collect(self) -> Batch:
        self.n += 1
        b = Batch()
        b.add("node.load1", NODE, float(self.n))
        return b


class Broken(Collector):
    name = "broken"

    async def collect(self) -> Batch:
        raise RuntimeError("sensor on fire")


class Absent(Collector):
    name = "absent"

    async def collect(self) -> Batch:
        raise Unavailable("no NVIDIA driver")


class Hanging(Collector):
    """Blocks in its thread the way an NVML call on a GPU in recovery does."""

    name = "hanging"

    def __init__(self, release: threading.Event) -> None:
        super().__init__(CollectorContext())
        self.release = release

    async def collect(self) -> Batch:
        await self.blocking(self.release.wait)
        return Batch()


async def test_a_failing_hanging_or_absent_collector_leaves_the_others_running(caplog):
    release = threading.Event()
    store = SignalStore()
    ticker = Ticker()
    rt = CollectorRuntime(store, {
        "ticker": (ticker, 0.05, 1.0),
        "broken": (Broken(CollectorContext()), 0.05, 1.0),
        "absent": (Absent(CollectorContext()), 0.05, 1.0),
        "hanging": (Hanging(release), 0.05, 0.1),
    })
    caplog.set_level(logging.INFO, logger="moptd.daemon.runtime")
    await rt.start()
    try:
        await asyncio.sleep(0.6)
    finally:
        release.set()
        await rt.stop()
    assert ticker.n >= 8, "the healthy collector kept its pace"
    h = rt.health
    assert h["ticker"].state == "ok"
    assert h["broken"].state == "failed"
    assert "sensor on fire" in h["broken"].reason
    assert h["absent"].state == "unavailable"
    assert h["absent"].failures == 0
    assert h["hanging"].state == "failed"
    assert h["hanging"].failures >= 2
    # "unavailable" and a repeated failure are logged once, not every run
    assert sum("absent unavailable" in r.message for r in caplog.records) == 1
    assert sum("broken failed" in r.message for r in caplog.records) == 1
    assert store.latest("collector.success", "collector:ticker") == 1.0
    assert store.latest("collector.success", "collector:broken") == 0.0
    assert store.latest("collector.unavailable", "collector:absent") == 1.0


async def test_hang_does_not_pile_up_threads():
    release = threading.Event()
    c = Hanging(release)
    rt = CollectorRuntime(SignalStore(), {"hanging": (c, 0.02, 0.05)})
    before = threading.active_count()
    await rt.start()
    await asyncio.sleep(0.5)
    during = threading.active_count()
    release.set()
    await rt.stop()
    assert during - before <= 1, "one stuck thread, not one per run"
    assert "still running" in rt.health["hanging"].reason


async def test_event_loop_stays_responsive_while_a_collector_blocks():
    release = threading.Event()
    rt = CollectorRuntime(SignalStore(), {"hanging": (Hanging(release), 0.05, 5.0)})
    await rt.start()
    t0 = time.monotonic()
    await asyncio.sleep(0.05)
    lag = time.monotonic() - t0
    release.set()
    await rt.stop()
    assert lag < 0.5
