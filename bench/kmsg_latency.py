#!/usr/bin/env python3
"""Kernel record written -> parsed, attributed event in the signal store: latency.

Starts the real kernel collector on /dev/kmsg (root, writable), writes --records Xid
records from another thread (tagged moptd-bench-<uuid>, a PCI address of the reserved
range, bench/benchenv.py, so
they are harmless in the host's kernel log) and times each from just before write(2) to
its event landing in a SignalStore. The kernel rate-limits writes per open file (10 per
5 s), so each write opens /dev/kmsg afresh.

    sudo python bench/kmsg_latency.py --records 1000 --out .out/kmsg_latency.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchenv import bench_pci

from moptd.collector import CollectorContext
from moptd.collectors.kernel_log import KernelLogCollector
from moptd.observations import Event
from moptd.store import SignalStore

PCI = bench_pci()  # one address of the reserved range for this run


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--gap", type=float, default=0.002, help="seconds between writes")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    kmsg = Path("/dev/kmsg")
    if not os.access(kmsg, os.R_OK | os.W_OK):
        sys.exit(f"{kmsg} must be readable and writable (run as root)")
    tag = f"moptd-bench-{uuid.uuid4()}"
    store = SignalStore(max_events=args.records + 100)
    written: dict[int, float] = {}
    arrived: dict[int, float] = {}

    def publish(events: list[Event]) -> None:
        store.add_events(events)
        now = time.perf_counter()
        for ev in events:
            if tag in ev.text:
                arrived[int(ev.text.rsplit(" ", 1)[-1])] = now

    with tempfile.TemporaryDirectory() as state:
        collector = KernelLogCollector(
            CollectorContext(
                options={"kmsg_path": str(kmsg)}, state_dir=Path(state), publish=publish
            )
        )
        await collector.start()

        def writer() -> None:
            for i in range(args.records):
                line = (
                    f"NVRM: Xid (PCI:{PCI}): 13, pid='<unknown>', name=<unknown>, {tag} {i}\n"
                )
                fd = os.open(kmsg, os.O_WRONLY)
                written[i] = time.perf_counter()
                os.write(fd, line.encode())
                os.close(fd)
                time.sleep(args.gap)

        thread = threading.Thread(target=writer)
        thread.start()
        while thread.is_alive() or len(arrived) < len(written):
            await asyncio.sleep(0.01)
            if not thread.is_alive() and time.perf_counter() - max(written.values()) > 2:
                break
        thread.join()
        await collector.stop()
    lat = [(arrived[i] - written[i]) * 1000 for i in written if i in arrived]
    result = {
        "records": args.records,
        "arrived": len(lat),
        "in_store": len(store.events("kernel.xid")),
        "p50_ms": round(statistics.median(lat), 3),
        "p99_ms": round(pct(lat, 0.99), 3),
        "max_ms": round(max(lat), 3),
        "target_p99_ms": 20.0,
    }
    print(json.dumps(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
