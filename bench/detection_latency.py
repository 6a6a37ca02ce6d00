#!/usr/bin/env python3
"""Detection latency: a kernel record written to /dev/kmsg -> the finding in the API and in
/metrics, on a real `moptd run` (as root: it writes the real kernel log).

Each round writes an Xid 79 ("GPU has fallen off the bus") for a PCI address no real GPU
has, a new one each round so that each is a new finding, then polls `GET /v1/findings` on
the API socket and `/metrics` every 10 ms until GPU_LOST for that address shows in each.
The rules run every second (the default), so the latency is mostly the wait for the next
rule tick: expect it spread between 0 and 1 s.

    python bench/detection_latency.py --rounds 30 --out latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchenv import add_ports_arg, use_ports, write_xid79
from percentile import pct

from tests.api_helpers import get as api_get
from tests.daemon_proc import DaemonProcess


def one_round(d: DaemonProcess, timeout: float = 10.0) -> tuple[float, float]:
    subject = f"gpu:{write_xid79()[1]}"
    t0 = time.monotonic()
    in_api = in_metrics = None
    while (in_api is None or in_metrics is None) and time.monotonic() - t0 < timeout:
        if in_api is None:
            status, body = api_get(d.socket, "/v1/findings")
            if status == 200 and any(
                f["subject"] == subject and f["code"] == "GPU_LOST" for f in body["active"]
            ):
                in_api = time.monotonic() - t0
        if in_metrics is None:
            text = urllib.request.urlopen(d.url + "/metrics", timeout=5).read().decode()
            if f'subject="{subject}"' in text and 'code="GPU_LOST"' in text:
                in_metrics = time.monotonic() - t0
        time.sleep(0.01)
    if in_api is None or in_metrics is None:
        raise SystemExit(f"GPU_LOST for {subject} did not show within {timeout} s")
    return in_api, in_metrics


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=Path)
    add_ports_arg(ap)
    args = ap.parse_args()
    use_ports(args.ports)
    if not os.access("/dev/kmsg", os.W_OK):
        raise SystemExit("needs a writable /dev/kmsg (root)")
    api: list[float] = []
    metrics: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp))
        d.start()
        try:
            d.wait_metrics(timeout=30)
            time.sleep(2)  # first collection passes and rule ticks done
            for _ in range(args.rounds):
                a, m = one_round(d)
                api.append(a)
                metrics.append(m)
                time.sleep(random.uniform(0.0, 1.0))  # land anywhere in the rule tick
        finally:
            d.stop()
    result: dict[str, Any] = {"rounds": args.rounds}
    for name, values in (("api", api), ("metrics", metrics)):
        result[name] = {
            "p50_ms": round(1000 * statistics.median(values), 1),
            "p99_ms": round(1000 * pct(values, 0.99), 1),
            "max_ms": round(1000 * max(values), 1),
        }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
