"""What the daemon benchmarks share: start a real `moptd run` from a tree, time /metrics
scrapes and read its RSS while it runs, and run several trees ("arms") side by side.

bench/hostile_endpoint.py and bench/rule_cost.py --daemon use it. An arm is a tree and,
optionally, a `sys.setswitchinterval` the daemon is started with (set before moptd is
imported, through a launcher, so any tree runs it the same way): that is how the GIL
hand-off was measured against the same tree without it (BENCHMARKS.md, issue 18).
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from percentile import pct

REPO = Path(__file__).resolve().parent.parent

# `python -c LAUNCHER SECONDS run --config ...`: moptd's __main__ with a switch interval
LAUNCHER = (
    "import runpy, sys; s = float(sys.argv.pop(1)); "
    "s > 0 and sys.setswitchinterval(s); sys.argv[0] = 'moptd'; "
    "runpy.run_module('moptd', run_name='__main__', alter_sys=True)"
)


@dataclass(frozen=True)
class Arm:
    name: str
    tree: Path
    switch_interval: float | None = None  # None: as the tree leaves it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


class Daemon:
    """A `moptd run` from `arm.tree` with `config`, its log in tmp/moptd.log."""

    def __init__(self, arm: Arm, config: dict[str, Any], tmp: Path) -> None:
        self.arm = arm
        self.tmp = tmp
        self.port = free_port()
        config = {
            "state_dir": str(tmp / "state"),
            "exporter": {"listen": f"127.0.0.1:{self.port}"},
            "api": {"socket": str(tmp / "api.sock")},
            **config,
        }
        (tmp / "moptd.yaml").write_text(json.dumps(config))
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self._log = (tmp / "moptd.log").open("wb")
        cmd = [sys.executable, "-m", "moptd"]
        if arm.switch_interval is not None:
            cmd = [sys.executable, "-c", LAUNCHER, str(arm.switch_interval)]
        self.proc = subprocess.Popen(
            [*cmd, "run", "--config", str(tmp / "moptd.yaml")],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=arm.tree,
            # the arm's tree first; what PYTHONPATH held stays after it (a host without
            # moptd's dependencies installed brings them on PYTHONPATH)
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in (str(arm.tree), os.environ.get("PYTHONPATH", "")) if p)},
        )

    def wait_up(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.url, timeout=2).read()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit(
                        f"no daemon: {(self.tmp / 'moptd.log').read_text()[-3000:]}"
                    ) from None
                time.sleep(0.2)

    def scrape_for(
        self, seconds: float, scrapes_per_s: int
    ) -> tuple[list[float], list[tuple[float, float]], str]:
        """/metrics latencies (ms), (elapsed s, RSS MiB) once a second, the last page."""
        lat: list[float] = []
        rss: list[tuple[float, float]] = []
        text = ""
        t0 = time.monotonic()
        while (elapsed := time.monotonic() - t0) < seconds:
            rss.append((round(elapsed, 1), rss_mib(self.proc.pid)))
            for _ in range(scrapes_per_s):
                s0 = time.perf_counter()
                text = urllib.request.urlopen(self.url, timeout=10).read().decode()
                lat.append((time.perf_counter() - s0) * 1000)
                time.sleep(max(0.0, 1.0 / scrapes_per_s - (time.perf_counter() - s0)))
        return lat, rss, text

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        self._log.close()


def latency_figures(ms: Sequence[float], scrapes_per_s: int) -> dict[str, float]:
    return {
        "metrics_scrapes": len(ms),
        "metrics_p50_ms": round(pct(list(ms), 0.5), 2),
        "metrics_p99_ms": round(pct(list(ms), 0.99), 2),
        "metrics_max_ms": round(max(ms), 2),
        "metrics_p99_after_10s_ms": round(pct(list(ms[10 * scrapes_per_s :]), 0.99), 2),
    }


def arms_from(other: Path | None, switch_interval: float | None) -> list[Arm]:
    """This tree, the tree before (--other) and this tree with a switch interval."""
    arms = [Arm("this", REPO)]
    if other is not None:
        arms.append(Arm("other", other))
    if switch_interval is not None:
        arms.append(Arm(f"this_switch_{switch_interval:g}", REPO, switch_interval))
    return arms


def side_by_side(
    arms: Sequence[Arm],
    rounds: int,
    run_once: Callable[[Arm], dict[str, Any]],
    keys: Sequence[str],
) -> dict[str, Any]:
    """Each arm once a round, the order rotated each round so none always runs first on
    a cooler machine; medians per arm and each arm's ratio to the first ("this") and,
    where there is one, to "other"."""
    runs: dict[str, list[dict[str, Any]]] = {a.name: [] for a in arms}
    for i in range(rounds):
        k = i % len(arms)
        for arm in [*arms[k:], *arms[:k]]:
            r = run_once(arm)
            r["load1_at_end"] = os.getloadavg()[0]
            runs[arm.name].append(r)
            print(arm.name, json.dumps({key: r.get(key) for key in (*keys, "load1_at_end")}),
                  flush=True)
    med = {
        name: {key: statistics.median(float(r.get(key) or 0.0) for r in rs) for key in keys}
        for name, rs in runs.items()
    }

    def ratio(over: str) -> dict[str, dict[str, float | None]]:
        return {
            name: {
                key: round(m[key] / med[over][key], 3) if med[over][key] else None
                for key in keys
            }
            for name, m in med.items()
            if name != over
        }

    summary: dict[str, Any] = {
        "arms": {a.name: {"tree": str(a.tree), "switch_interval": a.switch_interval}
                 for a in arms},
        "rounds": rounds,
        "median": med,
        "ratio_to_this": ratio("this"),
        "load1": {name: [r["load1_at_end"] for r in rs] for name, rs in runs.items()},
    }
    if "other" in med:
        summary["ratio_to_other"] = ratio("other")
    print(json.dumps(summary, indent=1), flush=True)
    summary["runs"] = runs
    return summary
