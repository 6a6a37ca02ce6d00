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

Run it with the tree under test first on PYTHONPATH (the daemon is `python -m moptd`); it
sets no key an older tree lacks, so the tree before the cap runs it the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from percentile import pct

REPO = Path(__file__).resolve().parent.parent
PAGE = (REPO / "tests/fixtures/vllm-cpu/vllm_cpu_metrics_idle.txt").read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) / 1024 if m else float("nan")


def metric(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + "{" if want else name + " ") and want in line:
            return float(line.rsplit(" ", 1)[1])
    return None


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
    ap.add_argument("--rounds", type=int, default=1, help="runs of each tree (with --other)")
    args = ap.parse_args()
    if args.other is None:
        result = run_once(REPO, args)
        print(json.dumps(result, indent=1))
        if args.out:
            args.out.write_text(json.dumps(result, indent=1) + "\n")
        return 0
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "other": []}
    for i in range(args.rounds):
        # alternate the order each round, so neither tree always runs on a warmer machine
        order = [("this", REPO), ("other", args.other)]
        for side, tree in order if i % 2 == 0 else order[::-1]:
            r = run_once(tree, args)
            runs[side].append(r)
            print(side, json.dumps({k: r.get(k) for k in KEYS}), flush=True)
    med = {side: {k: statistics.median(float(r[k] or 0.0) for r in rs) for k in KEYS}
           for side, rs in runs.items()}
    ratio = {k: round(med["this"][k] / med["other"][k], 3) if med["other"][k] else None
             for k in KEYS}
    summary = {"median_this": med["this"], "median_other": med["other"],
               "ratio_this_over_other": ratio, "other": str(args.other), "runs": runs}
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


def run_once(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    engine = Engine(args.rotating)
    tmp = Path(tempfile.mkdtemp(prefix="moptd-hostile-"))
    port = free_port()
    config: dict[str, Any] = {
        "state_dir": str(tmp / "state"),
        "exporter": {"listen": f"127.0.0.1:{port}"},
        "api": {"socket": str(tmp / "api.sock")},
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
    (tmp / "moptd.yaml").write_text(json.dumps(config))
    log = (tmp / "moptd.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moptd", "run", "--config", str(tmp / "moptd.yaml")],
        stdout=log, stderr=subprocess.STDOUT, cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"no daemon: {(tmp / 'moptd.log').read_text()}") from None
                time.sleep(0.2)
        latencies: list[float] = []
        rss: list[tuple[float, float]] = []
        t0 = time.monotonic()
        text = ""
        while (elapsed := time.monotonic() - t0) < args.seconds:
            rss.append((round(elapsed, 1), rss_mib(proc.pid)))
            for _ in range(args.scrapes_per_s):
                s0 = time.perf_counter()
                text = urllib.request.urlopen(url, timeout=10).read().decode()
                latencies.append(time.perf_counter() - s0)
                time.sleep(max(0.0, 1.0 / args.scrapes_per_s - (time.perf_counter() - s0)))
        series_in_metrics = sum(1 for ln in text.splitlines() if ln and ln[0] != "#")
        ms = [x * 1000 for x in latencies]
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
            "metrics_scrapes": len(ms),
            "metrics_p50_ms": round(pct(ms, 0.5), 2),
            "metrics_p99_ms": round(pct(ms, 0.99), 2),
            "metrics_max_ms": round(max(ms), 2),
            "metrics_p99_after_10s_ms": round(pct(ms[10 * args.scrapes_per_s :], 0.99), 2),
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
        proc.terminate()
        proc.wait(20)
        log.close()
    result["tree"] = str(tree)
    return result




if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
