#!/usr/bin/env python3
"""An older NVML collector against the current one, side by side, on a GPU host.

Extract the older collector from git first, then pass its file:

    git show 3426b45:moptd/collectors/nvml.py | sed 's/^@register$//' > .whl/_nvml_prev.py
    python bench/nvml_collector_compare.py --old .whl/_nvml_prev.py [--label-old ...]

(3426b45 is the shared reader thread started at each tick; 81357b0, a thread per GPU,
extracts the same way.) Both collectors run on the same grid of ticks, 50 ms, 200 ms and
1 s apart (bench/nvml_ticks.py). CPU seconds per GPU per tick (process time, all threads),
medians of the rounds; the grid's own wake-ups are measured and taken off.
Reads only; no GPU setting is changed.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nvml_ticks import tick_cost

import moptd.collectors.nvml as new


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("nvml_old", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main() -> None:
    import pynvml

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--old", required=True, help="file of the older collector module")
    ap.add_argument("--label-old", default="previous")
    ap.add_argument("--label-new", default="current")
    ap.add_argument("--recording", help="a smoke run off the GPU host: this NVML recording, 8 GPUs")
    args = ap.parse_args()
    old = load(args.old)
    options: dict[str, Any] = {}
    if args.recording:
        n = 8
        options = {"backend": "recorded", "recording": args.recording, "replicate": n}
    else:
        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
    print(f"{n} GPUs; CPU µs per GPU per tick, median of the rounds")
    runs = ((args.label_old, old.NvmlCollector), (args.label_new, new.NvmlCollector))
    plan = ((0.05, 40, 5), (0.2, 15, 5), (1.0, 5, 3))
    for spacing, ticks, rounds in plan:
        for fast_only in (True, False):
            if spacing != 0.2 and not fast_only:
                continue  # one grid is enough to see the slower tiers
            r = {
                label: statistics.median(
                    tick_cost(
                        cls,
                        fast_only=fast_only,
                        spacing=spacing,
                        ticks=ticks,
                        rounds=rounds,
                        options=options,
                    )
                )
                / n
                * 1e6
                for label, cls in runs
            }
            what = "fast only" if fast_only else "amortised"
            first = next(iter(r.values()))
            print(
                f"ticks {spacing * 1000:.0f} ms apart, {what}: "
                + ", ".join(f"{k} {v:.1f} ({v / first:.2f})" for k, v in r.items()),
                flush=True,
            )


if __name__ == "__main__":
    main()
