#!/usr/bin/env python3
"""Memory and ingest cost of the signal store at the default retention.

Feeds the store, on virtual time, what 8 GPUs' worth of the NVML collector's signals
plus the host collector produce at a 1 s interval for --hours of retention: half the
signals change every sample (utilisation, power, clocks), the rest are steady (limits,
modes, counters that rarely move). Reports traced memory and ingest time per pass.

    python bench/store_memory.py --gpus 8 --hours 1
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from moptd.catalog import CATALOG
from moptd.clock import VirtualClock
from moptd.observations import Batch, Sample
from moptd.store import SignalStore


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    gpu_signals = [s.name for s in CATALOG.values()
                   if s.subject == "gpu" and s.kind in ("gauge", "counter") and not s.labels]
    node_signals = [s.name for s in CATALOG.values()
                    if s.subject == "node" and s.kind in ("gauge", "counter") and not s.labels]
    rng = random.Random(0)
    varying = set(gpu_signals[::2])
    steps = int(args.hours * 3600)
    # Timing and memory are measured in separate runs: tracemalloc slows allocation.
    ingest_us = fill(args, gpu_signals, node_signals, varying, rng, steps, None)
    rng = random.Random(0)
    tracemalloc.start()
    store_box: list[SignalStore] = []
    fill(args, gpu_signals, node_signals, varying, rng, steps, store_box)
    store = store_box[0]
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    stats = store.stats()
    result = {
        "gpus": args.gpus, "retention_hours": args.hours, "passes": steps,
        "series": stats["series"], "points": stats["points"],
        "traced_mb": round(current / 2**20, 1), "traced_peak_mb": round(peak / 2**20, 1),
        "bytes_per_point": round(current / max(1, stats["points"]), 1),
        "ingest_us_per_pass_p50": round(statistics.median(ingest_us), 1),
        "samples_per_pass": args.gpus * len(gpu_signals) + len(node_signals),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


def fill(args, gpu_signals, node_signals, varying, rng, steps, keep):
    clock = VirtualClock(1_800_000_000)
    store = SignalStore(clock, retention=args.hours * 3600)
    ingest_us: list[float] = []
    for _ in range(steps):
        batch = Batch()
        for g in range(args.gpus):
            subject = f"gpu:{g}"
            for name in gpu_signals:
                value = rng.random() * 100 if name in varying else 42.0
                batch.samples.append(Sample(name, subject, value))
        for name in node_signals:
            batch.samples.append(Sample(name, "node", rng.random()))
        t0 = time.perf_counter()
        store.ingest("bench", batch)
        ingest_us.append((time.perf_counter() - t0) * 1e6)
        clock.advance(1.0)
    if keep is not None:
        keep.append(store)
    return ingest_us


if __name__ == "__main__":
    raise SystemExit(main())
