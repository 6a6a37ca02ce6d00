"""CPU cost per tick, measured the way the daemon ticks: spaced out, not back to back.

Shared by nvml_cost.py and nvml_collector_compare.py. Ticks fall on a real-time grid
`spacing` apart, as the daemon's runtime schedules them. Spacing matters on the VMs GPU
hosts run in: code that runs once after an idle gap finds cold caches and costs several
times what the same code costs in a tight loop (BENCHMARKS.md), so a fair comparison runs
every contender on the same grid. The cost of the grid's own wake-ups with no work is
measured first and taken off.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from moptd.clock import VirtualClock, next_on_grid
from moptd.collector import CollectorContext


async def _grid(spacing: float, ticks: int, work: Callable[[], Awaitable[None]] | None) -> float:
    c0 = time.process_time()  # this process, every thread
    for _ in range(ticks):
        await asyncio.sleep(next_on_grid(time.monotonic(), spacing) - time.monotonic())
        if work is not None:
            await work()
    return time.process_time() - c0


async def _per_tick(
    work: Callable[[], Awaitable[None]], spacing: float, ticks: int, rounds: int
) -> list[float]:
    base = statistics.median([await _grid(spacing, ticks, None) for _ in range(2)])
    return [(await _grid(spacing, ticks, work) - base) / ticks for _ in range(rounds)]


def spaced_cost(
    fn: Callable[[], object], *, spacing: float, ticks: int, rounds: int
) -> list[float]:
    """CPU seconds per call of fn, one call per tick, one figure per round."""

    async def work() -> None:
        fn()

    return asyncio.run(_per_tick(work, spacing, ticks, rounds))


def tick_cost(
    collector_cls: Any,
    *,
    fast_only: bool,
    spacing: float,
    ticks: int,
    rounds: int,
    options: dict[str, Any] | None = None,
) -> list[float]:
    """CPU seconds per collector tick (all GPUs), one figure per round. The collector's
    clock is virtual and moves 1 s a tick, so its tiers come due as at one tick a second.
    `options` override the collector's (a recorded backend for a run off the GPU host)."""
    # no deadline on the virtual clock, or a multi-tier read still running a few ticks
    # later would count as a hang
    opts: dict[str, Any] = {"backend": "live", "xid_events": False, "gpu_deadline": 1e9}
    if fast_only:
        opts.update(
            slow_interval=1e12,
            costly_interval=1e12,
            energy_interval=1e12,
            profile_interval=1e12,
            static_interval=1e12,
        )
    else:  # the daemon's cadence, whatever a version's defaults were
        opts.update(
            slow_interval=5.0,
            costly_interval=10.0,
            energy_interval=60.0,
            profile_interval=5.0,
            static_interval=300.0,
        )
    opts.update(options or {})
    clock = VirtualClock(time.time())
    c = collector_cls(CollectorContext(options=opts, clock=clock))

    async def tick() -> None:
        clock.advance(1.0)
        await c.collect()

    async def run() -> list[float]:
        await c.start()
        await c.collect()  # the first tick reads every tier; not counted
        out = await _per_tick(tick, spacing, ticks, rounds)
        await c.stop()
        return out

    return asyncio.run(run())
