#!/usr/bin/env python3
"""An older NVML collector against the current one, side by side, on a GPU host.

Extract the older collector from git first, then pass its file:

    git show 81357b0:moptd/collectors/nvml.py | sed 's/^@register$//' > .whl/_nvml_old.py
    python bench/nvml_collector_compare.py --old .whl/_nvml_old.py [--label-old per-GPU threads]

(745dd46 is the waiting collector, 81357b0 the pipelined one with a thread per GPU.)
CPU seconds per GPU per tick (process time, all threads), with ticks 5, 50 and 200 ms
apart; the sleeps' own cost is measured and taken off. Reads only; no GPU setting is
changed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import moptd.collectors.nvml as new
from moptd.clock import VirtualClock
from moptd.collectors.base import CollectorContext


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("nvml_old", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def cost(mod: ModuleType, fast_only: bool, spacing: float, ticks: int, rounds: int = 5) -> float:
    # virtual clock, 1 s a tick: no deadline, or a slow multi-tier read would count as hung
    opts: dict[str, object] = {"backend": "live", "xid_events": False, "gpu_deadline": 1e9}
    if fast_only:
        opts.update(slow_interval=1e12, costly_interval=1e12, static_interval=1e12)
    else:  # the same cadence for both, whatever each version's defaults were
        opts.update(slow_interval=5.0, costly_interval=10.0, static_interval=300.0)
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

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--old", required=True, help="file of the older collector module")
    ap.add_argument("--label-old", default="old")
    ap.add_argument("--label-new", default="current")
    args = ap.parse_args()
    old = load(args.old)
    pynvml.nvmlInit()
    n = pynvml.nvmlDeviceGetCount()
    print(f"{n} GPUs; CPU us per GPU per tick, median of 5 rounds")
    for spacing in (0.005, 0.05, 0.2):
        ticks = {0.005: 100, 0.05: 40, 0.2: 15}[spacing]
        for fast_only in (True, False):
            r = {
                name: cost(mod, fast_only, spacing, ticks) / n * 1e6
                for name, mod in ((args.label_old, old), (args.label_new, new))
            }
            what = "fast only" if fast_only else "amortised"
            print(
                f"ticks {spacing * 1000:.0f} ms apart, {what}: "
                + ", ".join(f"{k} {v:.1f}" for k, v in r.items())
                + f"  (ratio {r[args.label_new] / r[args.label_old]:.2f})"
            )


if __name__ == "__main__":
    main()
