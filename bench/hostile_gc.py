#!/usr/bin/env python3
"""In-process: where a hostile serving page's time goes, and what a full collection costs.

Feeds the captured vLLM page plus ``--rotating`` new `finished_reason` values a page
(bench/hostile_endpoint.py's shape) through the serving collector's parse and mapping and
into a signal store with ``--max-series``, and times each step and every garbage
collection by generation (gc.callbacks). ``--freeze`` freezes the heap first, as the daemon
does after its first collection pass (moptd/daemon/heap.py).

    python bench/hostile_gc.py --pages 200 [--freeze] [--max-series 20000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moptd.collectors.serving import _engine_view
from moptd.observations import Batch
from moptd.serving.promtext import ScrapeLimits
from moptd.serving.signals import HistogramWindow, fill_view
from moptd.serving.spec import parse_endpoints
from moptd.store import SignalStore

PAGE = (
    Path(__file__).resolve().parent.parent / "tests/fixtures/vllm-cpu/vllm_cpu_metrics_idle.txt"
).read_text()


def stats(xs: list[float]) -> str:
    ms = sorted(x * 1000 for x in xs)
    return (
        f"n {len(ms)}, median {statistics.median(ms):.2f} ms, "
        f"p99 {ms[max(0, int(len(ms) * 0.99) - 1)]:.2f} ms, max {ms[-1]:.2f} ms"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=200)
    ap.add_argument("--rotating", type=int, default=1000)
    ap.add_argument("--max-series", type=int, default=20000)
    ap.add_argument("--freeze", action="store_true")
    args = ap.parse_args()
    ep = parse_endpoints([{"name": "h", "url": "http://127.0.0.1:1", "engine": "vllm"}], "")[0]
    store = SignalStore(max_series=args.max_series)
    window = HistogramWindow(300)
    if args.freeze:
        gc.collect()
        gc.freeze()
    print(f"frozen {gc.get_freeze_count()} objects, tracked {len(gc.get_objects())}")
    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def clock(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0]))

    gc.callbacks.append(clock)
    parse_t, fill_t, ingest_t = [], [], []
    now = 1000.0
    for n in range(args.pages):
        body = (
            PAGE
            + "".join(
                f'vllm:request_success_total{{engine="0",finished_reason="r{n}-{i}",'
                f'model_name="tinyllama"}} 1.0\n'
                for i in range(args.rotating)
            )
        ).encode()
        t0 = time.perf_counter()
        view = _engine_view(ep, body, ScrapeLimits())
        t1 = time.perf_counter()
        b = Batch()
        fill_view(b, "serving:h", view, window, now)
        t2 = time.perf_counter()
        store.ingest("serving", b, now)
        t3 = time.perf_counter()
        parse_t.append(t1 - t0)
        fill_t.append(t2 - t1)
        ingest_t.append(t3 - t2)
        now += 0.5
    gc.callbacks.remove(clock)
    print("parse ", stats(parse_t))
    print("map   ", stats(fill_t))
    print("ingest", stats(ingest_t))
    for g in (0, 1, 2):
        d = [x for gen, x in pauses if gen == g]
        if d:
            print(f"gc gen {g}", stats(d))
    print("series held", store._held)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
