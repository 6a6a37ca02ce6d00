#!/usr/bin/env python3
"""First start on a full kernel ring: how long until the backlog is read and diagnosed.

A daemon's kernel collector with no committed position reads this boot's whole ring. This
starts the daemon's own pieces in one process, as `moptd run` wires them (signal store,
findings database in a fresh state directory, rule service and diagnosis loop on the
shipped rules, the kernel collector on the real /dev/kmsg), and times from the collector's
start to

- *read*: the newest record that was in the ring at start has been parsed, attributed
  and its events published (to the store and the findings database);
- *diagnosed*: the first rule evaluation that began after that has finished (the findings
  of the whole backlog are in force, in the API's view and in /metrics' snapshot); the
  diagnosis loop runs it at once, woken by those events.

`--fill N` first writes N real kernel lines (Xid lines of public incident reports, see
bench/kmsg_first_start_lines.txt, moved to PCI domain fe00+ so no GPU has them, each with a
moptd-bench tag) so that the ring is full of diagnosable records. That overwrites the
host's whole kernel log: only on a machine of your own (the GPU host, a CI VM), as root.

    sudo python bench/kmsg_first_start.py --fill 20000 --runs 5 --out .out/first_start.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moptd.clock import SystemClock
from moptd.collector import CollectorContext
from moptd.collectors.kernel_log import KernelLogCollector
from moptd.diagnose.loader import default_rules_dir
from moptd.diagnose.service import RuleService
from moptd.findings.db import FILE_NAME, FindingsDB
from moptd.findings.service import Diagnosis
from moptd.kernel.kmsg import KmsgFollower
from moptd.kernel.logparse import KernelRecord
from moptd.store import SignalStore

KMSG = Path("/dev/kmsg")
LINES = Path(__file__).with_name("kmsg_first_start_lines.txt")


def ring() -> tuple[int, int, int]:
    """(records, bytes, newest seq) of the ring as it is now."""
    fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    n = size = 0
    last = -1
    try:
        while True:
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                return n, size, last
            except BrokenPipeError:
                continue
            n += 1
            size += len(data)
            last = int(data.split(b",", 2)[1])
    finally:
        os.close(fd)


def fill(count: int) -> None:
    lines = [ln for ln in LINES.read_text().splitlines() if ln and not ln.startswith("#")]
    tag = f"moptd-bench-{uuid.uuid4().hex[:8]}"
    for i in range(count):
        # a PCI domain per 256 lines, 8 in turn: two GPUs each (9b:00 and 05:00), as on a big host
        line = lines[i % len(lines)].replace("PCI:0000:", f"PCI:{0xFE00 + i // 256 % 8:04x}:")
        fd = os.open(KMSG, os.O_WRONLY)  # one open per write: the kernel rate-limits per file
        try:
            os.write(fd, f"<3>{line} {tag}-{i}\n".encode())
        finally:
            os.close(fd)


async def poll(done: Callable[[], bool], step: float = 0.002) -> None:
    """Until done() (the loop runs the collector and the rules in between)."""
    while not done():  # noqa: ASYNC110 - what it waits for sets no event
        await asyncio.sleep(step)


async def one_run() -> dict[str, float]:
    records, size, newest = ring()
    with tempfile.TemporaryDirectory(prefix="moptd-first-start-") as tmp:
        state = Path(tmp)
        store = SignalStore(max_events=200_000)
        db = FindingsDB(state / FILE_NAME)
        rules = RuleService(store, SystemClock(), [default_rules_dir()])
        diagnosis = Diagnosis(store, rules, db, interval=1.0)
        await diagnosis.start()
        ctx = CollectorContext(
            options={"kmsg_path": str(KMSG)},
            state_dir=state,
            publish=store.add_events,
            positions=db,
        )
        collector = KernelLogCollector(ctx)
        # each rule evaluation's start and end (the loop runs it when events wake it)
        ticks: list[tuple[float, float]] = []
        step = diagnosis._step

        def timed_step(now: float | None) -> Any:
            began = time.perf_counter()
            try:
                return step(now)
            finally:
                ticks.append((began, time.perf_counter()))

        diagnosis._step = timed_step  # type: ignore[method-assign]
        read_at: list[float] = []
        on_records = collector._on_records

        def timed_on_records(records: list[KernelRecord]) -> None:
            on_records(records)  # parsed, attributed and published
            if (records[-1].seq or -1) >= newest and not read_at:
                read_at.append(time.perf_counter())

        collector._on_records = timed_on_records  # type: ignore[method-assign]
        t0 = time.perf_counter()
        await collector.start()
        follower = collector.follower
        assert isinstance(follower, KmsgFollower)
        await poll(lambda: bool(read_at))
        t_read = read_at[0]
        # the first evaluation that began after the last record's events were published
        await poll(lambda: any(began >= t_read for began, _ in ticks))
        t_diag = next(end for began, end in ticks if began >= t_read)
        active = len(rules.active())
        await collector.stop()
        await diagnosis.stop()
    return {
        "ring_records": records,
        "ring_bytes": size,
        "records_read": follower.records_read,
        "records_lost": follower.records_lost,
        "read_s": t_read - t0,
        "diagnosed_s": t_diag - t0,
        "active_findings": active,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fill", type=int, default=0, help="real lines to write first")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if not os.access(KMSG, os.R_OK | (os.W_OK if args.fill else 0)):
        sys.exit(f"{KMSG} must be readable (and writable for --fill): run as root")
    if args.fill:
        fill(args.fill)
    runs = [await one_run() for _ in range(args.runs)]
    for r in runs:
        print(json.dumps(r))
    summary = {
        "runs": runs,
        "read_s_median": statistics.median(r["read_s"] for r in runs),
        "diagnosed_s_median": statistics.median(r["diagnosed_s"] for r in runs),
        "diagnosed_s_max": max(r["diagnosed_s"] for r in runs),
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
