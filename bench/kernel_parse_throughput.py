#!/usr/bin/env python3
"""Parser throughput on a burst of 100,000 kernel records.

The burst is the real H200 boot log (tests/fixtures/h200/kmsg_raw.txt) repeated, with
one record in a hundred replaced by an Xid line (a mix of the variants the parsers
accept), renumbered as one ring. Measured: the replay path (parse_kernel_log +
records_to_events on the whole text) and the live path (one raw record at a time through
parse_raw_record and the attributor, as the follower hands them over).

    python bench/kernel_parse_throughput.py --records 100000 --out .out/parse.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moptd.kernel.attribution import Attributor, records_to_events
from moptd.kernel.logparse import parse_kernel_log, parse_raw_record

FIXTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/h200/kmsg_raw.txt"
XIDS = [
    "NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception",
    "NVRM: Xid (PCI:0000:3b:00): 45, pid=1818990, name=python3, Ch 1 caused by previous Xid 13",
    "NVRM: Xid (PCI:0000:3b:00 GPU-I:05 GPU-CI:01): 31, pid=42, name=python3, MMU Fault",
    "NVRM: Xid (PCI:0000:3b:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000)",
]


def burst(n: int) -> list[str]:
    base: list[str] = []
    for line in FIXTURE.read_text().splitlines():
        if line.startswith(" ") and base:
            base[-1] += "\n" + line
        else:
            base.append(line)
    out = []
    for seq in range(n):
        msg = base[seq % len(base)].split(";", 1)[1]
        if seq % 100 == 0:
            msg = XIDS[(seq // 100) % len(XIDS)]
        out.append(f"6,{seq},{seq * 10},-;{msg}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    records = burst(args.records)
    text = "\n".join(records) + "\n"

    t0 = time.perf_counter()
    parsed = parse_kernel_log(text, boot_time=0.0)
    events = records_to_events(parsed, {"0000:3b:00.0": 0})
    replay_s = time.perf_counter() - t0

    attributor = Attributor({"0000:3b:00.0": 0})
    live_events = 0
    t0 = time.perf_counter()
    for raw in records:
        live_events += len(attributor.events(parse_raw_record(raw, 0.0), 0.0))
    live_s = time.perf_counter() - t0

    result = {
        "records": len(parsed),
        "events": len(events),
        "replay_seconds": round(replay_s, 3),
        "replay_records_per_second": round(len(parsed) / replay_s),
        "live_seconds": round(live_s, 3),
        "live_records_per_second": round(len(records) / live_s),
        "live_events": live_events,
    }
    print(json.dumps(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
