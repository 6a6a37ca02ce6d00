#!/usr/bin/env python3
"""Steady-state cost of `moptd run`: CPU share, RSS and /metrics scrape latency.

Starts a real daemon (1 s collection interval), waits for warm-up, then for --seconds
samples its CPU time and RSS and scrapes /metrics every --scrape-every seconds. With
--recording the NVML collector replays a real NVML recording, replicated to --gpus GPUs,
so an 8-GPU host can be measured on a CPU machine.

--scraper picks who scrapes:
  python      urllib from this process, a new connection per scrape (the default). Its
              latency includes the Python client's own work, about 0.8 ms of it.
  prometheus  a real Prometheus (Debian package `prometheus`) scraping every
              --scrape-every seconds; the latencies are its own scrape_duration_seconds
              for the run, which is what an operator sees on the target page.

    python bench/daemon_steady.py --seconds 60 --out .out/steady.json
    python bench/daemon_steady.py --recording tests/fixtures/h200/nvml_recording_h200.jsonl --gpus 8
    python bench/daemon_steady.py --scraper prometheus --scrape-every 15 --seconds 300 \\
        --recording tests/fixtures/h200/nvml_recording_h200.jsonl --gpus 8
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchenv import add_ports_arg, use_ports
from percentile import pct

from tests.daemon_proc import DaemonProcess
from tests.prometheus_proc import PrometheusProcess


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--scrape-every", type=float, default=1.0)
    ap.add_argument("--scraper", choices=("python", "prometheus"), default="python")
    ap.add_argument("--recording", help="NVML recording for the recorded backend")
    ap.add_argument("--gpus", type=int, default=1, help="replicate the recording to N GPUs")
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--option", action="append", default=[], metavar="COLLECTOR.KEY=SECONDS",
                    help="a collector's option, e.g. nvml.profile_interval=30 or host.interval=5 "
                         "(repeatable; the bench itself sets nvml.interval and host.interval to "
                         "1): to price a cadence against another on the same host")
    add_ports_arg(ap)
    args = ap.parse_args()
    use_ports(args.ports)

    collectors: dict[str, dict[str, object]] = {"nvml": {"interval": "1s"},
                                                 "host": {"interval": "1s"}}
    for option in args.option:
        name, _, value = option.partition("=")
        collector, _, key = name.partition(".")
        collectors.setdefault(collector, {})[key] = float(value)
    if args.recording:
        collectors["nvml"].update(
            {"backend": "recorded", "recording": str(Path(args.recording).resolve()),
             "replicate": args.gpus})
    extra: dict[str, object] = {"collectors": collectors}
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp), extra)
        d.start()
        prom: Prometheus | None = None
        try:
            d.wait_metrics(timeout=30)
            proc = psutil.Process(d.proc.pid)  # type: ignore[union-attr]
            if args.scraper == "prometheus":
                prom = Prometheus(Path(tmp), {"moptd": f"127.0.0.1:{d.port}"}, args.scrape_every)
                prom.wait_first_scrape()
            time.sleep(args.warmup)
            cpu0 = proc.cpu_times()
            rss_start = proc.memory_info().rss
            t0 = time.monotonic()
            scrape_ms: list[float] = []
            rss: list[int] = []
            while time.monotonic() - t0 < args.seconds:
                if prom is None:
                    s0 = time.perf_counter()
                    with urllib.request.urlopen(d.url + "/metrics", timeout=5) as resp:
                        resp.read()
                    scrape_ms.append((time.perf_counter() - s0) * 1000)
                rss.append(proc.memory_info().rss)
                time.sleep(args.scrape_every if prom is None else 1.0)
            elapsed = time.monotonic() - t0
            cpu1 = proc.cpu_times()
            if prom is not None:
                scrape_ms = prom.scrape_ms(elapsed)
            with urllib.request.urlopen(d.url + "/metrics", timeout=5) as resp:
                body = resp.read()
            series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        finally:
            if prom is not None:
                prom.stop()
            d.stop()
    cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    result: dict[str, object] = {
        "gpus": args.gpus if args.recording else "live",
        "scraper": args.scraper,
        "scrape_every_s": args.scrape_every,
        "seconds": round(elapsed, 1),
        "cpu_percent_of_one_core": round(100 * cpu_s / elapsed, 3),
        "rss_mb_start": round(rss_start / 2**20, 1),
        "rss_mb_max": round(max(rss) / 2**20, 1),
        "rss_mb_end": round(rss[-1] / 2**20, 1),
        "scrapes": len(scrape_ms),
        "scrape_ms_p50": round(statistics.median(scrape_ms), 2) if scrape_ms else None,
        "scrape_ms_p99": round(pct(scrape_ms, 0.99), 2) if scrape_ms else None,
        "series": series,
        "scrape_ms": [round(v, 2) for v in scrape_ms],
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


class Prometheus(PrometheusProcess):
    """A real Prometheus scraping each target (job name -> host:port) every `every`
    seconds, its data in `tmp`."""

    def __init__(self, tmp: Path, targets: dict[str, str], every: float) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise SystemExit("this bench needs `prometheus` (apt install prometheus)")
        super().__init__(binary, tmp, {
            "global": {"scrape_interval": f"{every:g}s", "scrape_timeout": f"{min(every, 10):g}s"},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                               for job, target in targets.items()],
        })
        self.jobs = tuple(targets)

    def results(self, expr: str) -> list[dict[str, Any]]:
        return list(self.query(expr)["data"]["result"])

    def wait_first_scrape(self, timeout: float = 60) -> None:
        """Until every job has been scraped once."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if set(self.jobs) <= {r["metric"]["job"] for r in self.results("up == 1")}:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"Prometheus did not scrape {', '.join(self.jobs)} within {timeout:g} s")

    def scrape_ms(self, seconds: float, job: str = "moptd") -> list[float]:
        """Prometheus's own scrape durations of one job over the last `seconds`, in ms."""
        got = self.results(f'scrape_duration_seconds{{job="{job}"}}[{int(seconds)}s]')
        values = got[0]["values"] if got else []
        return [1000 * float(v) for _, v in values]


if __name__ == "__main__":
    raise SystemExit(main())
