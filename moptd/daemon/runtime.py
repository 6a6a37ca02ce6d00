"""Runs every enabled collector on its own interval with a timeout.

One task per collector: a collector that fails, hangs or is slow only affects its own
signals. Every outcome becomes collector.* samples in the store, and an "unavailable"
source is logged once when it turns so, not on every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from moptd.clock import next_on_grid
from moptd.collector import Collector, CollectorBusy, Unavailable
from moptd.observations import Batch, Event, Sample
from moptd.store import SignalStore

log = logging.getLogger(__name__)


# moptd_collector_success by state; "pending": started, not run yet (unknown, not a failure)
_SUCCESS = {"ok": 1.0, "pending": math.nan}


@dataclass
class CollectorHealth:
    name: str
    interval: float
    timeout: float
    state: str = "pending"  # pending | ok | failed | unavailable
    reason: str = ""
    since: float = 0.0  # when the state last changed
    last_run: float = 0.0
    last_success: float = 0.0
    duration: float = 0.0
    runs: int = 0
    failures: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "state": self.state,
            "reason": self.reason,
            "since": self.since,
            "last_run": self.last_run,
            "last_success": self.last_success,
            "duration_seconds": self.duration,
            "interval_seconds": self.interval,
            "runs": self.runs,
            "failures": self.failures,
        }


class CollectorRuntime:
    def __init__(
        self,
        store: SignalStore,
        collectors: Mapping[str, tuple[Collector, float, float]],
    ) -> None:
        """collectors: name -> (collector, interval, timeout)."""
        self.store = store
        self.collectors = dict(collectors)
        self.health = {
            name: CollectorHealth(name, interval, timeout)
            for name, (_, interval, timeout) in self.collectors.items()
        }
        self._tasks: list[asyncio.Task[None]] = []
        self.first_pass = asyncio.Event()

    def publish(self, events: list[Event]) -> None:
        """For collectors that push events as they arrive (kernel log, NVML Xid thread, the
        managed process's log). What arrives now happened no later than now, so a time ahead
        of the store's clock is taken back to now. The kernel stamps a record with its own
        clock (local_clock), which NTP does not steer as it steers CLOCK_MONOTONIC: the stamp
        was 1.9 ms ahead of the write on the CPU VM. A record from the "future" is left out
        of every count() until the clock reaches its time, so the evaluation its arrival
        asked for missed it and the finding waited for a later rule tick."""
        now = self.store.clock.now()
        self.store.add_events([ev if ev.t <= now else replace(ev, t=now) for ev in events])

    def register(self) -> None:
        """Put every collector in the store with its state so far ("pending" before it
        has started), so that /metrics names every one of them from its first answer: one
        that has not run shows moptd_collector_success NaN (no `== 0` alert matches it),
        not an absence that reads like a broken exporter. The daemon calls it before it
        listens; start() calls it again once the collectors have started."""
        now = time.time()
        for health in self.health.values():
            self._record_health(health, now)

    async def start(self, loops: bool = True) -> None:
        """Start every collector; with loops, also schedule each on its interval."""
        for name, (collector, _, _) in self.collectors.items():
            try:
                await collector.start()
            except Unavailable as exc:
                self._set_state(self.health[name], "unavailable", str(exc), time.time())
            except Exception as exc:  # noqa: BLE001 - one collector must not stop the daemon
                log.warning("collector %s failed to start: %s", name, exc)
                self._set_state(self.health[name], "failed", f"start: {exc}", time.time())
        self.register()  # the states start() found: unavailable, failed, still pending
        if not loops:
            return
        for name in self.collectors:
            self._tasks.append(asyncio.create_task(self._loop(name), name=f"collector-{name}"))
        if not self.collectors:
            self.first_pass.set()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for collector, _, _ in self.collectors.values():
            try:
                await collector.stop()
            except Exception as exc:  # noqa: BLE001 - shutting down: log and go on
                log.warning("collector %s did not stop cleanly: %s", collector.name, exc)

    async def run_once(self) -> None:
        """One pass of every collector, concurrently."""
        await asyncio.gather(*(self.run_collector(name) for name in self.collectors))

    async def collect_once(self, again: tuple[str, ...] = (), gap: float = 0.2) -> None:
        """Start, collect once and stop, without a daemon (`status --offline`, doctor,
        `explain --offline`). Collectors named in `again` get a second pass after `gap`
        (the host's CPU share needs two readings)."""
        await self.start(loops=False)
        try:
            await self.run_once()
            second = [name for name in again if name in self.collectors]
            if second:
                # `gap` after the first readings ended, not after the whole pass: the pass's
                # slower collectors already spent part of it
                done = max(self.health[n].last_run + self.health[n].duration for n in second)
                await asyncio.sleep(max(0.0, done + gap - time.time()))
                await asyncio.gather(*(self.run_collector(name) for name in second))
        finally:
            await self.stop()

    async def _loop(self, name: str) -> None:
        interval = self.health[name].interval
        while True:
            await self.run_collector(name)
            if all(h.runs for h in self.health.values()):
                self.first_pass.set()
            # The next run is on the interval's grid (an overrun skips the missed slots),
            # so collectors, and the rules, that share a grid point share a wake-up.
            await asyncio.sleep(next_on_grid(time.monotonic(), interval) - time.monotonic())

    async def run_collector(self, name: str) -> None:
        collector, _, timeout = self.collectors[name]
        health = self.health[name]
        t0 = time.monotonic()
        wall = time.time()
        batch: Batch | None = None
        try:
            async with asyncio.timeout(timeout):
                batch = await collector.collect()
        except Unavailable as exc:
            self._set_state(health, "unavailable", str(exc), wall)
        except TimeoutError:
            self._fail(health, f"timed out after {timeout:g}s", wall)
        except CollectorBusy as exc:
            self._fail(health, f"{exc} (hanging since an earlier run)", wall)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(health, f"{type(exc).__name__}: {exc}", wall)
            log.debug("collector %s failed", name, exc_info=True)
        health.duration = time.monotonic() - t0
        health.last_run = wall
        health.runs += 1
        if batch is not None:
            health.last_success = wall
            self._set_state(health, "ok", "", wall)
            self.store.ingest(name, batch, wall)
        else:
            self.store.drop_source(name)
        self._record_health(health, wall)

    def _fail(self, health: CollectorHealth, reason: str, t: float) -> None:
        health.failures += 1
        self._set_state(health, "failed", reason, t)

    def _set_state(self, health: CollectorHealth, state: str, reason: str, t: float) -> None:
        if health.state == state and health.reason == reason:
            return
        previous = health.state
        health.state, health.reason, health.since = state, reason, t
        if state == "unavailable":
            log.info("collector %s unavailable: %s", health.name, reason)
        elif state == "failed":
            log.warning("collector %s failed: %s", health.name, reason)
        elif previous in ("failed", "unavailable"):
            log.info("collector %s recovered", health.name)

    def _record_health(self, h: CollectorHealth, t: float) -> None:
        subject = f"collector:{h.name}"
        batch = Batch(
            samples=[
                Sample("collector.success", subject, _SUCCESS.get(h.state, 0.0)),
                Sample("collector.duration", subject, h.duration if h.runs else math.nan),
                Sample("collector.unavailable", subject, 1.0 if h.state == "unavailable" else 0.0),
                Sample("collector.failures", subject, float(h.failures)),
                Sample(
                    "store.series_dropped", subject, float(self.store.series_dropped.get(h.name, 0))
                ),
            ]
        )
        if h.last_success:
            batch.add("collector.last_success", subject, h.last_success)
        batch.describe(subject, state=h.state, reason=h.reason)
        self.store.ingest(f"health:{h.name}", batch, t)
