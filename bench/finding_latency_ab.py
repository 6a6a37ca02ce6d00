#!/usr/bin/env python3
"""Kernel record -> finding in the API and /metrics, two trees side by side in one run (as
root: it writes the real kernel log).

Starts a real `moptd run` from this tree and, with --other, one from another checkout, at
the same time (each its own interpreter path, PYTHONPATH and working directory, so each
imports its own moptd). Each round writes one Xid 79 ("GPU has fallen off the bus") to
/dev/kmsg for a PCI address no real GPU has, a new one each round; both daemons read the
same record. Four threads (API and /metrics of each daemon) poll every --poll seconds until
GPU_LOST for that address shows; the latency runs from just before write(2). Rounds are
spread at random over the rule tick. Daemons are restarted every --per-daemon rounds, so
the number of open findings (each round adds one, kept 30 min) stays small.

    sudo python bench/finding_latency_ab.py --other /tmp/before --rounds 200 --out ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchenv import add_ports_arg, use_ports, write_xid79
from percentile import pct

from moptd.cli.client import DaemonUnreachable
from tests.api_helpers import get as api_get
from tests.daemon_proc import free_port

THIS = Path(__file__).resolve().parent.parent


class Daemon:
    """`moptd run` of one tree, on its own ports and state directory."""

    def __init__(self, tree: Path, tmp: Path, rules_interval: str | None) -> None:
        self.tree = tree
        self.port = free_port()
        self.socket = tmp / "api.sock"
        config: dict[str, Any] = {
            "state_dir": str(tmp / "state"),
            "exporter": {"listen": f"127.0.0.1:{self.port}"},
            "api": {"socket": str(self.socket)},
        }
        if rules_interval:
            config["rules"] = {"interval": rules_interval}
        self.config = tmp / "moptd.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = (tmp / "moptd.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moptd", "run", "--config", str(self.config)],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the kernel collector has run (it follows /dev/kmsg from then on)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"moptd of {self.tree} exited with {self.proc.returncode}")
            try:
                code, body = api_get(self.socket, "/v1/health")
                if code == 200 and body["collectors"]["kernel"]["runs"] > 0:
                    return
            except (OSError, KeyError, DaemonUnreachable):
                pass
            time.sleep(0.1)
        raise SystemExit(f"moptd of {self.tree} not ready within {timeout} s")

    def in_api(self, subject: str) -> bool:
        code, body = api_get(self.socket, "/v1/findings?code=GPU_LOST")
        return code == 200 and any(f["subject"] == subject for f in body["active"])

    def in_metrics(self, subject: str) -> bool:
        url = f"http://127.0.0.1:{self.port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        return any(
            line.startswith("moptd_finding_active{")
            and f'subject="{subject}"' in line
            and 'code="GPU_LOST"' in line
            for line in text.splitlines()
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def one_round(daemons: dict[str, Daemon], poll: float, timeout: float) -> dict[str, float]:
    """Seconds from the write to the finding, per "<tree>/<api|metrics>" (inf: not seen)."""
    out: dict[str, float] = {}
    subject_box: list[str] = []
    start = threading.Event()
    t0_box: list[float] = []

    def watch(key: str, shown: Any) -> None:
        start.wait()
        subject, t0 = subject_box[0], t0_box[0]
        while time.perf_counter() - t0 < timeout:
            if shown(subject):
                out[key] = time.perf_counter() - t0
                return
            time.sleep(poll)
        out[key] = float("inf")

    threads = []
    for name, d in daemons.items():
        for surface, shown in (("api", d.in_api), ("metrics", d.in_metrics)):
            th = threading.Thread(target=watch, args=(f"{name}/{surface}", shown))
            th.start()
            threads.append(th)
    t0 = time.perf_counter()
    _, pci = write_xid79()
    subject_box.append(f"gpu:{pci}")
    t0_box.append(t0)
    start.set()
    for th in threads:
        th.join()
    return out


def summary(values: list[float]) -> dict[str, Any]:
    seen = [v for v in values if v != float("inf")]
    return {
        "rounds": len(values),
        "missed": len(values) - len(seen),
        "p50_ms": round(1000 * statistics.median(seen), 1) if seen else None,
        "p99_ms": round(1000 * pct(seen, 0.99), 1) if seen else None,
        "max_ms": round(1000 * max(seen), 1) if seen else None,
        "over_100ms": sum(1 for v in values if v > 0.1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--other", type=Path, help="a checkout of the other commit")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--per-daemon", type=int, default=50, help="rounds before a restart")
    ap.add_argument("--rules-interval", help="rules.interval for both (default: 1s)")
    ap.add_argument("--poll", type=float, default=0.01, help="seconds between polls")
    ap.add_argument("--timeout", type=float, default=10.0, help="per round, seconds")
    ap.add_argument("--out", type=Path)
    add_ports_arg(ap)
    args = ap.parse_args()
    use_ports(args.ports)
    if not os.access("/dev/kmsg", os.W_OK):
        raise SystemExit("needs a writable /dev/kmsg (root)")
    trees = {"this": THIS}
    if args.other is not None:
        trees["other"] = args.other.resolve()
    samples: dict[str, list[float]] = {}
    done = 0
    while done < args.rounds:
        with tempfile.TemporaryDirectory() as tmp:
            daemons = {}
            try:
                for name, tree in trees.items():
                    (Path(tmp) / name).mkdir()
                    daemons[name] = Daemon(tree, Path(tmp) / name, args.rules_interval)
                for d in daemons.values():
                    d.wait_ready()
                time.sleep(2.0)  # first collection passes and rule ticks done
                for _ in range(min(args.per_daemon, args.rounds - done)):
                    for key, value in one_round(daemons, args.poll, args.timeout).items():
                        samples.setdefault(key, []).append(value)
                    done += 1
                    time.sleep(random.uniform(0.0, 1.0))  # land anywhere in the tick
            finally:
                for d in daemons.values():
                    d.stop()
        print(f"{done} rounds", file=sys.stderr)
    result: dict[str, Any] = {
        "trees": {k: str(v) for k, v in trees.items()},
        "rules_interval": args.rules_interval or "1s (default)",
        "poll_s": args.poll,
        "target_p99_ms": 100.0,
        "latency": {key: summary(values) for key, values in sorted(samples.items())},
        "load_average_after": os.getloadavg(),
        # per round, in the order written: which rounds were slow on both trees at once
        "rounds_ms": {
            key: [round(1000 * v, 1) for v in values] for key, values in sorted(samples.items())
        },
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds_ms"}, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
