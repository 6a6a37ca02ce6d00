#!/usr/bin/env python3
"""What a /metrics scrape costs inside moptd: the page's render and its gzip, for 8 recorded
GPUs, the host collector and the rules, as the daemon's MetricsEndpoint makes them.

    python bench/metrics_render.py [--rounds 16] [--idle 15]

After 120 ticks on a virtual clock, each round times a render and its gzip twice: hot, right
after the previous version's render, and cold, after --idle ticks made one real second
apart with no render between (a Prometheus scraping every 15 s finds the page so). Wall
time (perf_counter) in ms, median and max over the rounds; then the page's size and what
gzip level 1 would make of it. bench/scrape_floor.py has the whole scrape beside a static
page.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moptd.clock import VirtualClock  # noqa: E402
from moptd.collector import CollectorContext  # noqa: E402
from moptd.collectors import host, nvml  # noqa: E402
from moptd.daemon.exporter import MetricsEndpoint  # noqa: E402
from moptd.diagnose.rulefiles import default_rules_dir  # noqa: E402
from moptd.diagnose.service import RuleService  # noqa: E402
from moptd.store import SignalStore  # noqa: E402

RECORDING = ROOT / "tests/fixtures/h200/nvml_recording_h200.jsonl"


async def measure(rounds: int, idle: int) -> dict[str, list[float]]:
    clock = VirtualClock(time.time())
    store = SignalStore(clock=clock)
    gpus = nvml.NvmlCollector(CollectorContext(clock=clock, options={
        "backend": "recorded", "recording": str(RECORDING), "replicate": 8,
        "xid_events": False, "gpu_deadline": 1e9}))
    node = host.HostCollector(CollectorContext(options={}, clock=clock))
    rules = RuleService(store, clock, [default_rules_dir()])
    endpoint = MetricsEndpoint(store)

    async def tick() -> None:
        clock.advance(1.0)
        await asyncio.sleep(0.002)  # the reader thread ends the read the last tick started
        now = clock.now()
        store.ingest("nvml", await gpus.collect(), now)
        store.ingest("host", await node.collect(), now)
        rules.tick(now)
        store.ingest("rules", rules.findings_batch(), now)

    def timed() -> tuple[float, float]:
        t0 = time.perf_counter()
        endpoint.render()
        t1 = time.perf_counter()
        endpoint.render_gzip()
        return (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3

    await gpus.start()
    await node.start()
    try:
        for _ in range(120):
            await tick()
        out: dict[str, list[float]] = {k: [] for k in ("render_hot", "gzip_hot",
                                                       "render_cold", "gzip_cold")}
        for _ in range(rounds):
            await tick()
            endpoint.render()
            await tick()
            render, zipped = timed()
            out["render_hot"].append(render)
            out["gzip_hot"].append(zipped)
            for _ in range(idle):
                await tick()
                await asyncio.sleep(1.0)
            render, zipped = timed()
            out["render_cold"].append(render)
            out["gzip_cold"].append(zipped)
        body = endpoint.render()
        t0 = time.perf_counter()
        level1 = gzip.compress(body, compresslevel=1, mtime=0)
        out["gzip_level1"] = [(time.perf_counter() - t0) * 1e3]
        print(f"page {len(body)} bytes, gzip level 6 {len(endpoint.render_gzip())}, "
              f"level 1 {len(level1)}")
        return out
    finally:
        await gpus.stop()
        await node.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--idle", type=int, default=15, help="ticks, 1 s apart, before a cold render")
    args = ap.parse_args()
    for name, values in asyncio.run(measure(args.rounds, args.idle)).items():
        print(f"{name:12s} median {statistics.median(values):.2f} ms, max {max(values):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
