#!/usr/bin/env python3
"""How long `moptd explain` and `moptd status` take, two trees side by side in one run.

Each command runs as an operator runs it (a fresh `python -m moptd` process, output to a
pipe) from each tree in turn, round after round, so both trees see the same machine load;
the figure is the median wall time of the rounds, with the modules the process had
imported when it ended (sys.modules, counted once per command). The commands:

- `explain` and `status` with the daemon up (a `moptd run` of this tree on a temporary
  socket and state directory; both trees ask the same daemon);
- `explain --offline` and `status --offline` (no daemon asked: one collection pass here);
- `explain --bundle PASTE`: a one-line kernel-log paste (tests/fixtures/kernel-drill).

    git worktree add /tmp/before REV     # the tree before
    python bench/cli_latency.py --other /tmp/before --rounds 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

THIS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(THIS / "tests"))

from daemon_proc import DaemonProcess  # noqa: E402

PASTE = "tests/fixtures/kernel-drill/xid63.log"


def commands(config: Path) -> dict[str, list[str]]:
    cfg = ["--config", str(config)]
    return {
        "explain (daemon up)": ["explain", *cfg],
        "status (daemon up)": ["status", *cfg],
        "explain --offline": ["explain", "--offline", *cfg],
        "status --offline": ["status", "--offline", *cfg],
        "explain --bundle PASTE": ["explain", "--bundle", PASTE],
    }


# `python -m moptd ARGS` that writes the number of modules in sys.modules at exit
COUNT_MODULES = (
    "import atexit, runpy, sys; out = sys.argv.pop(1); "
    "atexit.register(lambda: open(out, 'w').write(str(len(sys.modules)))); "
    "runpy.run_module('moptd', run_name='__main__', alter_sys=True)"
)


def run(tree: Path, args: list[str], count: Path | None = None) -> tuple[float, int, int]:
    """(seconds, exit status, modules imported) of one `python -m moptd ARGS` in `tree`;
    the modules are counted (by a wrapper, so not timed) where `count` names a file."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "100"}
    head = ["-c", COUNT_MODULES, str(count)] if count else ["-m", "moptd"]
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, *head, *args], cwd=tree, env=env, capture_output=True, timeout=60
    )
    seconds = time.perf_counter() - t0
    modules = int(count.read_text()) if count else 0
    return seconds, out.returncode, modules


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", type=Path, required=True, help="the other tree (before)")
    ap.add_argument("--rounds", type=int, default=15)
    opts = ap.parse_args()
    trees = {"before": opts.other.resolve(), "after": THIS}
    with tempfile.TemporaryDirectory(prefix="moptd-cli-bench-") as tmp:
        daemon = DaemonProcess(Path(tmp)).start()
        try:
            daemon.wait_metrics(timeout=30)
            deadline = time.monotonic() + 30
            while not daemon.socket.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            cmds = commands(daemon.config_path)
            times: dict[tuple[str, str], list[float]] = {}
            modules: dict[tuple[str, str], int] = {}
            for name, args in cmds.items():
                for label, tree in trees.items():
                    _, rc, n = run(tree, args, Path(tmp) / "n")  # also warms .pyc files
                    modules[name, label] = n
                    if rc not in (0, 1, 2):
                        print(f"{label} {name}: exit {rc}", file=sys.stderr)
            for _ in range(opts.rounds):
                for name, args in cmds.items():
                    for label, tree in trees.items():
                        seconds, _, _ = run(tree, args)
                        times.setdefault((name, label), []).append(seconds)
        finally:
            daemon.stop()
    print(
        f"median of {opts.rounds} rounds, seconds (modules imported); "
        f"before = {trees['before']}, after = {trees['after']}"
    )
    print(f"{'command':26} {'before':>16} {'after':>16} {'ratio':>6}")
    for name in cmds:
        b = statistics.median(times[name, "before"])
        a = statistics.median(times[name, "after"])
        print(
            f"{name:26} {b:8.3f} ({modules[name, 'before']:4d}) "
            f"{a:8.3f} ({modules[name, 'after']:4d}) {b / a:6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
