"""Where the NVML collector's fast tick goes, against the floor of any threaded read.

Run on the GPU host (read-only NVML calls):

    python bench/nvml_overhead.py

Side by side on the 20 ms tick grid of bench/nvml_ticks.py, CPU µs per tick (1 GPU) or per
GPU, medians of 7 rounds of 50 ticks, each row twice (machines are noisy):

- the collector's fast tier as the daemon runs it;
- the bare fast-tier reads on the event loop's thread (issue 23's floor);
- a hand-off of an empty call to a worker thread (moptd.worker.Worker.post);
- the bare fast-tier reads handed to a worker thread: the floor of any design that keeps
  NVML off the event loop, as the house style and a hung GPU require;
- the collector with its batch building (_report) taken out, and with the NVML reads
  taken out (what is left is the collector's own bookkeeping and hand-off).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nvml_ticks import spaced_cost, tick_cost

from moptd.collectors import nvml
from moptd.gpu.backend import NvmlBackend
from moptd.worker import Worker

ROUNDS, TICKS, SPACING = 7, 50, 0.02


def median_us(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e6, 1)


def collector(**patch: Callable[..., Any]) -> float:
    saved = {k: getattr(nvml.NvmlCollector, k) for k in patch}
    for k, v in patch.items():
        setattr(nvml.NvmlCollector, k, v)
    try:
        return median_us(
            tick_cost(
                nvml.NvmlCollector, fast_only=True, spacing=SPACING, ticks=TICKS, rounds=ROUNDS
            )
        )
    finally:
        for k, v in saved.items():
            setattr(nvml.NvmlCollector, k, v)


def spaced(fn: Callable[[], object], per: int) -> float:
    return median_us(
        [c / per for c in spaced_cost(fn, spacing=SPACING, ticks=TICKS, rounds=ROUNDS)]
    )


def main() -> int:
    backend = NvmlBackend()
    backend.init()
    n = backend.device_count()
    worker = Worker("moptd-bench")

    def fast() -> None:
        for i in range(n):
            backend.read_fast(i)

    def noop() -> None:
        pass

    rows: dict[str, list[float]] = {}
    for _ in range(2):
        for name, value in (
            ("collector, fast tier (per tick / GPUs)", collector() / n),
            ("bare fast reads on the loop's thread (per GPU)", spaced(fast, n)),
            (
                "hand-off of an empty call to a worker thread (per tick)",
                spaced(lambda: worker.post(noop), 1),
            ),
            ("bare fast reads on a worker thread (per GPU)", spaced(lambda: worker.post(fast), n)),
            (
                "collector without _report (per tick / GPUs)",
                collector(_report=lambda self, *a: None) / n,
            ),
            (
                "collector without the NVML reads (per tick / GPUs)",
                collector(_read_gpu=lambda self, b, i, t: nvml._Pass()) / n,
            ),
        ):
            rows.setdefault(name, []).append(value)
            print(f"{name:60} {value:8.1f}", flush=True)
    floor = statistics.median(rows["bare fast reads on the loop's thread (per GPU)"])
    print(f"\n{n} GPU(s); CPU µs, medians; ratio to the bare reads on the loop's thread")
    for name, vs in rows.items():
        m = statistics.median(vs)
        print(f"{name:60} {m:8.1f} {m / floor:6.2f}x")
    print(json.dumps({k: statistics.median(v) for k, v in rows.items()}))
    backend.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
