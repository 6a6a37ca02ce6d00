#!/usr/bin/env python3
"""The waiting NVML collector against the pipelined one, side by side, on a GPU host.

The waiting version is the collector as it was at commit 745dd46; extract it first:

    git show 745dd46:moptd/collectors/nvml.py | sed 's/^@register$//' > bench/_nvml_old.py
    python bench/nvml_pipelining_compare.py

CPU seconds per GPU per tick (process time, all threads), ticks 0, 5 and 50 ms apart;
the sleeps' own cost is measured and taken off. Reads only; no GPU setting is changed.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _nvml_old as old  # type: ignore[import-not-found]

import moptd.collectors.nvml as new
from moptd.clock import VirtualClock
from moptd.collectors.base import CollectorContext


def cost(mod: ModuleType, fast_only: bool, spacing: float, ticks: int, rounds: int = 5) -> float:
    opts: dict[str, object] = {"backend": "live", "xid_events": False}
    if fast_only:
        opts.update(slow_interval=1e12, costly_interval=1e12, static_interval=1e12)
    clock = VirtualClock(time.time())
    c = mod.NvmlCollector(CollectorContext(options=opts, clock=clock))

    async def run() -> float:
        await c.start()
        await c.collect()
        c0 = time.process_time()
        for _ in range(ticks):
            if spacing:
                await asyncio.sleep(spacing)
        base = time.process_time() - c0
        out = []
        for _ in range(rounds):
            c0 = time.process_time()
            for _ in range(ticks):
                clock.advance(1.0)
                await c.collect()
                if spacing:
                    await asyncio.sleep(spacing)
            out.append((time.process_time() - c0 - base) / ticks)
        await c.stop()
        return statistics.median(out)

    return asyncio.run(run())


def main() -> None:
    import pynvml

    pynvml.nvmlInit()
    n = pynvml.nvmlDeviceGetCount()
    for spacing in (0.0, 0.005, 0.05):
        ticks = 100 if spacing < 0.05 else 20
        for fast_only in (True, False):
            r = {name: cost(mod, fast_only, spacing, ticks) / n * 1e6
                 for name, mod in (("old", old), ("new", new))}
            what = "fast only" if fast_only else "amortised"
            print(f"spacing {spacing * 1000:.0f} ms, {what}: old {r['old']:.1f} us/GPU, "
                  f"new {r['new']:.1f} us/GPU")


if __name__ == "__main__":
    main()
