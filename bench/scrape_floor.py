#!/usr/bin/env python3
"""What a /metrics scrape costs this host before moptd does anything: the daemon and a
static page of the same bytes, scraped by one real Prometheus in the same run.

    python bench/scrape_floor.py --seconds 300 --scrape-every 15 \\
        --recording tests/fixtures/h200/nvml_recording_h200.jsonl --gpus 8

The daemon runs as in bench/daemon_steady.py (8 recorded GPUs, NVML and host collectors at
1 s). Beside it, a child process serves one page the daemon rendered at the start, held in
memory and gzip-compressed once, from aiohttp (the daemon's HTTP server) with the same
headers: a scrape of it is Prometheus's request, loopback and aiohttp's handling, without
moptd's render, its store or its other threads. Both are jobs of one Prometheus (2.42 from
Debian here), which spreads their scrapes over the interval; the figures are its own
scrape_duration_seconds for each job. The static page's p99 is the floor the scrape goal
stands on, on this host, at this interval.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchenv import add_ports_arg, use_ports
from daemon_steady import Prometheus
from percentile import pct

from tests.daemon_proc import DaemonProcess, free_port

# The static page's server: the body from a file, gzip-compressed once (level 6, as the
# daemon does), served to whoever asks with the daemon's headers.
STATIC = """
import gzip, sys
from aiohttp import web
body = open(sys.argv[1], "rb").read()
zipped = gzip.compress(body, compresslevel=6, mtime=0)
CT = "text/plain; version=0.0.4; charset=utf-8"

async def metrics(request):
    headers = {"Content-Type": CT, "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        headers["Content-Encoding"] = "gzip"
        return web.Response(body=zipped, headers=headers)
    return web.Response(body=body, headers=headers)

app = web.Application()
app.router.add_get("/metrics", metrics)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=None, access_log=None)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--scrape-every", type=float, default=15.0)
    ap.add_argument("--recording", help="NVML recording for the recorded backend")
    ap.add_argument("--gpus", type=int, default=1, help="replicate the recording to N GPUs")
    ap.add_argument("--out", help="write the figures as JSON here")
    add_ports_arg(ap)
    args = ap.parse_args()
    use_ports(args.ports)

    collectors: dict[str, dict[str, object]] = {"nvml": {"interval": "1s"},
                                                 "host": {"interval": "1s"}}
    if args.recording:
        collectors["nvml"].update(
            {"backend": "recorded", "recording": str(Path(args.recording).resolve()),
             "replicate": args.gpus})
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        d = DaemonProcess(tmp, {"collectors": collectors})
        d.start()
        static: subprocess.Popen[bytes] | None = None
        prom: Prometheus | None = None
        try:
            d.wait_metrics(timeout=30)
            time.sleep(3)  # every collector has reported: the page at its full size
            page = tmp / "page.txt"
            with urllib.request.urlopen(d.url + "/metrics", timeout=5) as resp:
                page.write_bytes(resp.read())
            page_bytes = page.stat().st_size
            static_port = free_port()
            static = subprocess.Popen([sys.executable, "-c", STATIC, str(page), str(static_port)])
            wait_http(f"http://127.0.0.1:{static_port}/metrics")
            prom = Prometheus(tmp, {"moptd": f"127.0.0.1:{d.port}",
                                    "static": f"127.0.0.1:{static_port}"}, args.scrape_every)
            prom.wait_first_scrape()
            time.sleep(args.warmup)
            t0 = time.monotonic()
            time.sleep(args.seconds)
            elapsed = time.monotonic() - t0
            ms = {job: prom.scrape_ms(elapsed, job) for job in prom.jobs}
        finally:
            if prom is not None:
                prom.stop()
            if static is not None:
                static.terminate()
                static.wait(10)
            d.stop()
    result: dict[str, Any] = {
        "gpus": args.gpus if args.recording else "live",
        "scrape_every_s": args.scrape_every,
        "seconds": round(elapsed, 1),
        "page_bytes": page_bytes,
    }
    for job, values in ms.items():
        result[job] = {
            "scrapes": len(values),
            "p50_ms": round(statistics.median(values), 2) if values else None,
            "p99_ms": round(pct(values, 0.99), 2) if values else None,
            "max_ms": round(max(values), 2) if values else None,
            "scrape_ms": [round(v, 2) for v in values],
        }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} did not answer within {timeout:g} s") from None
            time.sleep(0.2)


if __name__ == "__main__":
    raise SystemExit(main())
