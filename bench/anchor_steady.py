#!/usr/bin/env python3
"""Steady-state cost of the tools operators run today, polled once a second like moptd.

Each anchor runs in a fresh Python process for --seconds, sampling every GPU once a second:
- `nvidia-smi --query-gpu=<fields> --format=csv` spawned every second (what
  nvidia_gpu_exporter does on each scrape, and Netdata's nvidia-smi collector);
- gpustat's `GPUStatCollection.new_query()` in-process (what `gpustat -i 1` does);
- nvitop's `Device.all()` and its per-device fields in-process.
Reported: CPU % of one core (the process and its children) and peak RSS, to set next to
bench/daemon_steady.py's figures for `moptd run`. Reads only; no GPU setting is changed.

    python bench/anchor_steady.py --seconds 60 --out anchors.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

FIELDS = (
    "index,uuid,utilization.gpu,utilization.memory,memory.total,memory.used,memory.free,"
    "temperature.gpu,power.draw,power.limit,clocks.sm,clocks.mem,pstate,"
    "clocks_event_reasons.active,pcie.link.gen.current,pcie.link.width.current"
)


# What nvitop reads per device in its main view, as bench/nvml_cost.py measures it too.
NVITOP_FIELDS = (
    "gpu_utilization",
    "memory_utilization",
    "memory_total",
    "memory_used",
    "memory_free",
    "temperature",
    "power_usage",
    "sm_clock",
    "memory_clock",
    "performance_state",
)


def read_nvitop_fields(device: object) -> None:
    for name in NVITOP_FIELDS:
        getattr(device, name)()


def poll(kind: str, seconds: float) -> None:
    """Runs in the child: sample every GPU once a second for `seconds`."""
    if kind == "nvidia-smi":

        def once() -> None:
            subprocess.run(
                ["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv"],
                capture_output=True,
                check=True,
            )
    elif kind == "gpustat":
        from gpustat import GPUStatCollection

        def once() -> None:
            GPUStatCollection.new_query()
    else:
        from nvitop import Device

        def once() -> None:
            for d in Device.all():
                read_nvitop_fields(d)

    end = time.monotonic() + seconds
    next_at = time.monotonic()
    while next_at < end:
        once()
        next_at += 1.0
        time.sleep(max(0.0, next_at - time.monotonic()))


def child(kind: str, seconds: float) -> tuple[dict[str, float], float] | str:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--seconds", str(seconds)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"
    return json.loads(proc.stdout), time.monotonic() - t0


def measure(kind: str, seconds: float) -> dict[str, object]:
    # one sample and exit first: its CPU (interpreter and import start-up) is taken off
    start = child(kind, 0)
    run = child(kind, seconds)
    if isinstance(start, str) or isinstance(run, str):
        return {"skipped": start if isinstance(start, str) else run}
    (base, base_wall), (figures, wall) = start, run
    return {
        "cpu_percent": round(100 * (figures["cpu"] - base["cpu"]) / (wall - base_wall), 2),
        "rss_mb": round(figures["rss_kb"] / 1024, 1),
        "seconds": round(wall, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        poll(args.child, args.seconds)
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
        print(json.dumps({"cpu": cpu, "rss_kb": me.ru_maxrss, "pid": os.getpid()}))
        return 0
    results = {kind: measure(kind, args.seconds) for kind in ("nvidia-smi", "gpustat", "nvitop")}
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
