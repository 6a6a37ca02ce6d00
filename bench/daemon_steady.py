#!/usr/bin/env python3
"""Steady-state cost of `moptd run`: CPU share, RSS and /metrics scrape latency.

Starts a real daemon (1 s collection interval), waits for warm-up, then for --seconds
samples its CPU time and RSS and scrapes /metrics every --scrape-every seconds. With
--recording the NVML collector replays a real NVML recording, replicated to --gpus GPUs,
so an 8-GPU host can be measured on a CPU machine.

    python bench/daemon_steady.py --seconds 60 --out .out/steady.json
    python bench/daemon_steady.py --recording tests/fixtures/h200/nvml_recording_h200.jsonl --gpus 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from percentile import pct

from tests.daemon_proc import DaemonProcess


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--scrape-every", type=float, default=1.0)
    ap.add_argument("--recording", help="NVML recording for the recorded backend")
    ap.add_argument("--gpus", type=int, default=1, help="replicate the recording to N GPUs")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()

    extra: dict[str, object] = {"collectors": {"nvml": {"interval": "1s"},
                                               "host": {"interval": "1s"}}}
    if args.recording:
        extra["collectors"]["nvml"].update(  # type: ignore[index]
            {"backend": "recorded", "recording": str(Path(args.recording).resolve()),
             "replicate": args.gpus})
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp), extra)
        d.start()
        try:
            d.wait_metrics(timeout=30)
            proc = psutil.Process(d.proc.pid)  # type: ignore[union-attr]
            time.sleep(args.warmup)
            cpu0 = proc.cpu_times()
            rss_start = proc.memory_info().rss
            t0 = time.monotonic()
            scrape_ms: list[float] = []
            rss: list[int] = []
            series = 0
            while time.monotonic() - t0 < args.seconds:
                s0 = time.perf_counter()
                with urllib.request.urlopen(d.url + "/metrics", timeout=5) as resp:
                    body = resp.read()
                scrape_ms.append((time.perf_counter() - s0) * 1000)
                series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
                rss.append(proc.memory_info().rss)
                time.sleep(args.scrape_every)
            elapsed = time.monotonic() - t0
            cpu1 = proc.cpu_times()
        finally:
            d.stop()
    cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    result = {
        "gpus": args.gpus if args.recording else "live",
        "seconds": round(elapsed, 1),
        "cpu_percent_of_one_core": round(100 * cpu_s / elapsed, 3),
        "rss_mb_start": round(rss_start / 2**20, 1),
        "rss_mb_max": round(max(rss) / 2**20, 1),
        "rss_mb_end": round(rss[-1] / 2**20, 1),
        "scrapes": len(scrape_ms),
        "scrape_ms_p50": round(statistics.median(scrape_ms), 2),
        "scrape_ms_p99": round(pct(scrape_ms, 0.99), 2),
        "series": series,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
