#!/usr/bin/env python3
"""Soak: `moptd run` for a long time under load, watching its footprint for growth.

The daemon runs with every interval at 1 s: 8 GPUs through the recorded NVML backend (the
real H200 recording), the host and self collectors, the rules, one serving endpoint (a
local HTTP server serving a real vLLM /metrics capture) and, as root, the real /dev/kmsg,
into which the soak writes an Xid record every --incident-every seconds (codes and GPUs
in rotation, so findings fire, resolve and fire again). A client scrapes /metrics every
second and reads /v1/findings over the API socket every 5 s.

Every --sample-every seconds it records the daemon's RSS, open files and threads from
/proc, its asyncio task count from /metrics, and its CPU time. After --warmup it reports
the growth of each, and the CPU share per tenth of the run (flat means no creeping cost).

    python bench/soak.py --seconds 3600 --warmup 600 --out bench/results/soak.json
    python bench/soak.py --seconds 100 --warmup 40 --retention 30s   # the CI version

The store keeps --retention of history (5 minutes by default, not the daemon's hour) so
that it is full before the warm-up ends: its designed growth up to that bound is not a
leak, and bench/store_memory.py measures it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# bench/ itself too: tests/test_soak.py loads this file by path, where bench/ is not on
# sys.path unless another test put it there first
sys.path.insert(0, str(REPO / "bench"))
from benchenv import add_ports_arg, bench_pcis, metrics_endpoint, use_ports  # noqa: E402

from moptd.cli.client import DaemonUnreachable  # noqa: E402
from moptd.collectors.daemon_self import read_self  # noqa: E402
from tests.api_helpers import get as api_get  # noqa: E402
from tests.daemon_proc import DaemonProcess  # noqa: E402

RECORDING = REPO / "tests/fixtures/h200/nvml_recording_h200.jsonl"
VLLM_PAGE = REPO / "tests/fixtures/vllm-cpu/vllm_cpu_metrics_load.txt"
KMSG = Path("/dev/kmsg")
# (Xid, what it is): an application fault, a page fault, a double-bit ECC error
INCIDENTS = [(13, "Graphics Engine Exception"), (31, "MMU Fault"), (48, "DBE (Double Bit Error)")]
# three addresses of the reserved range (bench/benchenv.py) from a random start, so runs
# sharing a kernel log do not see each other
_PCIS = bench_pcis()
PCI = [next(_PCIS) for _ in range(3)]


def proc_figures(pid: int) -> dict[str, float]:
    """RSS, threads, open files and CPU seconds, read the way the daemon reads its own."""
    got = {s.signal: float(s.value) for s in read_self(Path(f"/proc/{pid}")).samples}  # type: ignore[arg-type]
    return {
        "rss": got["daemon.resident_memory"],
        "threads": got["daemon.threads"],
        "fds": got["daemon.open_fds"],
        "cpu": got["daemon.cpu_seconds"],
    }


def metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def soak(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    can_write_kmsg = os.access(KMSG, os.W_OK)
    with metrics_endpoint(VLLM_PAGE.read_bytes()) as url:
        extra: dict[str, Any] = {
            "collectors": {
                "nvml": {"interval": "1s", "backend": "recorded", "recording": str(RECORDING),
                         "replicate": args.gpus},
                "host": {"interval": "1s"},
                "self": {"interval": "1s"},
                "serving": {"interval": "1s",
                            "endpoints": [{"name": "main", "url": url, "probes": ["health"]}]},
                "kernel": {"enabled": can_write_kmsg},
            },
            "rules": {"interval": "1s"},
            # The store fills up to its retention by design (bench/store_memory.py measures
            # that bound); a retention shorter than the warm-up leaves only leaks to see.
            "store": {"retention": args.retention},
        }
        d = DaemonProcess(tmp, extra)
        d.start()
        try:
            d.wait_metrics(timeout=30)
            assert d.proc is not None
            return _drive(args, d, d.proc.pid, can_write_kmsg)
        finally:
            d.stop()


def _drive(args: argparse.Namespace, d: DaemonProcess, pid: int, kmsg: bool) -> dict[str, Any]:
    t0 = time.monotonic()
    incidents = itertools.cycle(itertools.product(INCIDENTS, PCI))
    samples: list[dict[str, float]] = []
    scrape_ms: list[float] = []
    errors: list[str] = []
    codes_seen: set[str] = set()
    next_sample = next_incident = next_api = t0
    tag = os.urandom(3).hex()
    while (now := time.monotonic()) - t0 < args.seconds:
        s0 = time.perf_counter()
        try:
            text = urllib.request.urlopen(d.url + "/metrics", timeout=10).read().decode()
            scrape_ms.append((time.perf_counter() - s0) * 1000)
        except OSError as exc:
            errors.append(f"{now - t0:.0f}s scrape: {exc}")
            text = ""
        if now >= next_api:
            try:
                status, body = api_get(d.socket, "/v1/findings")
                if status != 200:
                    errors.append(f"{now - t0:.0f}s api: HTTP {status}")
                else:
                    for f in [*body["active"], *body["history"]]:
                        codes_seen.add(f["code"])
            except (OSError, ValueError, DaemonUnreachable) as exc:
                errors.append(f"{now - t0:.0f}s api: {exc}")
            next_api += 5
        if kmsg and now >= next_incident:
            (xid, what), pci = next(incidents)
            with KMSG.open("w") as f:
                f.write(f"NVRM: Xid (PCI:{pci}): {xid}, pid=0, {what}. soak-{tag}\n")
            next_incident += args.incident_every
        if now >= next_sample:
            fig = proc_figures(pid)
            fig["t"] = now - t0
            fig["tasks"] = metric(text, "moptd_daemon_tasks") or float("nan")
            samples.append(fig)
            next_sample += args.sample_every
            if not args.quiet:
                print(f"{fig['t']:7.0f}s rss {fig['rss'] / 2**20:6.1f} MB  fds {fig['fds']:.0f}"
                      f"  threads {fig['threads']:.0f}  tasks {fig['tasks']:.0f}"
                      f"  cpu {fig['cpu']:.1f} s", flush=True)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
    return {**summarise(args, samples, scrape_ms, errors, kmsg), "codes_seen": sorted(codes_seen)}


def summarise(args: argparse.Namespace, samples: list[dict[str, float]], scrape_ms: list[float],
              errors: list[str], kmsg: bool) -> dict[str, Any]:
    warm = [s for s in samples if s["t"] >= args.warmup]
    if len(warm) < 2:
        raise SystemExit("soak: too short for its warm-up; raise --seconds")
    first, last = warm[0], warm[-1]
    # CPU share per tenth of the post-warm-up run: flat means no cost that creeps up
    tenth = max(1, len(warm) // 10)
    shares = []
    for i in range(0, len(warm) - tenth, tenth):
        a, b = warm[i], warm[i + tenth]
        shares.append(100 * (b["cpu"] - a["cpu"]) / (b["t"] - a["t"]))
    growth = {
        k: {"after_warmup": first[k], "end": last[k], "max": max(s[k] for s in warm),
            "growth": last[k] - first[k]}
        for k in ("rss", "fds", "threads", "tasks")
    }
    scrape_ms.sort()
    return {
        "seconds": args.seconds,
        "warmup": args.warmup,
        "gpus": args.gpus,
        "retention": args.retention,
        "kmsg_incidents": kmsg,
        "rss_growth_mb": round((last["rss"] - first["rss"]) / 2**20, 2),
        "rss_max_growth_mb": round((max(s["rss"] for s in warm) - first["rss"]) / 2**20, 2),
        "growth": growth,
        "cpu_percent_by_tenth": [round(x, 2) for x in shares],
        "cpu_percent": round(100 * (last["cpu"] - first["cpu"]) / (last["t"] - first["t"]), 2),
        "scrapes": len(scrape_ms),
        "scrape_ms_p50": round(statistics.median(scrape_ms), 2) if scrape_ms else None,
        "scrape_ms_p99": round(scrape_ms[int(0.99 * (len(scrape_ms) - 1))], 2)
        if scrape_ms else None,
        "errors": errors,
        "samples": samples,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--warmup", type=float, default=300)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--retention", default="5m", help="store.retention (shorter than --warmup)")
    ap.add_argument("--sample-every", type=float, default=10)
    ap.add_argument("--incident-every", type=float, default=30)
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--quiet", action="store_true")
    add_ports_arg(ap)
    args = ap.parse_args()
    use_ports(args.ports)
    with tempfile.TemporaryDirectory() as tmp:
        result = soak(args, Path(tmp))
    brief = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(brief, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
