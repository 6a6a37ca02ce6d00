#!/usr/bin/env python3
"""A real `moptd run` scraping a hostile serving endpoint (issue 18, item 4): bounded RSS and
/metrics latency while the endpoint's label values rotate.

The endpoint is an aiohttp server on loopback serving the captured vLLM CPU page
(tests/fixtures/vllm-cpu/vllm_cpu_metrics_idle.txt) followed by ``--rotating`` lines of
``vllm:request_success_total`` whose ``finished_reason`` values no earlier page had: the
shape of the adversarial run in issue 18 (55 -> 1,176 MiB in 150 s, 50,000 series in
moptd's /metrics). The daemon scrapes it every ``--interval``; this script reads the
daemon's VmRSS once a second and times ``--scrapes-per-s`` /metrics scrapes a second.

    python bench/hostile_endpoint.py --seconds 150 --out result.json
    python bench/hostile_endpoint.py --seconds 45 --other /tmp/base --rounds 3 \
        --switch-interval 0.001 --out ab.json   # side by side (bench/daemon_bench.py)

Run it with the tree under test first on PYTHONPATH (the daemon is `python -m moptd`); it
sets no key an older tree lacks, so the tree before the cap runs it the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchenv import add_ports_arg, use_ports
from daemon_bench import (
    REPO,
    Arm,
    Daemon,
    arms_from,
    free_port,
    latency_figures,
    metric,
    side_by_side,
)

PAGE = (REPO / "tests/fixtures/vllm-cpu/vllm_cpu_metrics_idle.txt").read_text()


class Engine:
    def __init__(self, rotating: int) -> None:
        self.rotating = rotating
        self.scrapes = 0
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", lambda r: self._ok())
        runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        ready.set()
        self.loop.run_forever()

    async def _ok(self) -> web.Response:
        return web.Response(text="")

    async def _metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        n = self.scrapes
        extra = "".join(
            f'vllm:request_success_total{{engine="0",finished_reason="r{n}-{i}",'
            f'model_name="tinyllama"}} 1.0\n'
            for i in range(self.rotating)
        )
        return web.Response(text=PAGE + extra, content_type="text/plain")


KEYS = ("rss_mib_at_10s", "rss_mib_last", "metrics_p50_ms", "metrics_p99_ms",
        "metrics_p99_after_10s_ms", "metrics_max_ms", "daemon_cpu_seconds",
        "daemon_gc_seconds", "series_dropped_total")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--rotating", type=int, default=1000, help="new label values per page")
    ap.add_argument("--interval", default="500ms", help="the serving collector's interval")
    ap.add_argument("--scrapes-per-s", type=int, default=5)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--other", type=Path,
                    help="another tree (a git archive) run alternately with this one")
    ap.add_argument("--switch-interval", type=float,
                    help="also run this tree with sys.setswitchinterval(S) set at start")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each arm (side by side)")
    add_ports_arg(ap)
    args = ap.parse_args()
    use_ports(args.ports)
    arms = arms_from(args.other, args.switch_interval)
    if len(arms) == 1:
        result = run_once(arms[0], args)
        print(json.dumps(result, indent=1))
        if args.out:
            args.out.write_text(json.dumps(result, indent=1) + "\n")
        return 0
    summary = side_by_side(arms, args.rounds, lambda arm: run_once(arm, args), KEYS)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


def run_once(arm: Arm, args: argparse.Namespace) -> dict[str, Any]:
    engine = Engine(args.rotating)
    tmp = Path(tempfile.mkdtemp(prefix="moptd-hostile-"))
    config: dict[str, Any] = {
        "collectors": {
            "serving": {
                "interval": args.interval,
                "endpoints": [
                    {"name": "hostile", "url": f"http://127.0.0.1:{engine.port}",
                     "engine": "vllm", "probes": ["health"]}
                ],
            }
        },
    }
    d = Daemon(arm, config, tmp)
    try:
        d.wait_up()
        ms, rss, text = d.scrape_for(args.seconds, args.scrapes_per_s)
        series_in_metrics = sum(1 for ln in text.splitlines() if ln and ln[0] != "#")
        mibs = [m for _, m in rss]
        result = {
            "seconds": args.seconds,
            "rotating_per_page": args.rotating,
            "pages_served": engine.scrapes,
            "label_values_offered": engine.scrapes * args.rotating,
            "rss_mib_first": round(mibs[0], 1),
            "rss_mib_at_10s": round(mibs[min(10, len(mibs) - 1)], 1),
            "rss_mib_last": round(mibs[-1], 1),
            "rss_mib_max": round(max(mibs), 1),
            **latency_figures(ms, args.scrapes_per_s),
            "series_in_metrics": series_in_metrics,
            "series_dropped_total": metric(
                text, "moptd_store_series_dropped_total", collector="serving"
            ),
            "serving_up": metric(text, "moptd_serving_up", serving="hostile"),
            "daemon_cpu_seconds": metric(text, "moptd_daemon_cpu_seconds_total"),
            "daemon_gc_seconds": metric(text, "moptd_daemon_gc_seconds_total"),
            "load1_at_end": os.getloadavg()[0],
            "rss_mib_every_10s": [m for t, m in rss[::10]],
        }
    finally:
        d.stop()
    result["tree"] = str(arm.tree)
    result["switch_interval"] = arm.switch_interval
    return result


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
