#!/usr/bin/env python3
"""How long `moptd explain` and `moptd status` take, two trees side by side in one run.

Each command runs as an operator runs it (a fresh `python -m moptd` process, output to a
pipe) from each tree in turn, round after round, so both trees see the same machine load;
the figure is the median wall time of the rounds, with the modules the process had
imported when it ended (sys.modules, counted once per command). The commands:

- `explain` and `status` with the daemon up (a `moptd run` of this tree on a temporary
  socket and state directory; both trees ask the same daemon);
- `explain --offline` and `status --offline` (no daemon asked: one collection pass here);
- `explain --bundle PASTE`: a one-line kernel-log paste (tests/fixtures/kernel-drill);
- the floor: `python -c pass` (the interpreter's own start, with site) and `python -S -c
  pass` (without site), in the same rounds, once per round.

Both trees are byte-compiled first (`compileall`) and the children may write .pyc files: an
installed moptd has them, and with PYTHONDONTWRITEBYTECODE set in the environment every
call would otherwise compile its modules from source (about 0.14 s a call). Each figure is
the median of the rounds with the spread (lowest-highest) beside it; the ratio is
before/after of the medians. A second table gives each call's CPU seconds (user and
system, its children's included) from the same rounds: on a shared machine they move far
less with the load than the wall time.

    git worktree add /tmp/before REV     # the tree before (or: git archive REV | tar -x)
    python bench/cli_latency.py --other /tmp/before --rounds 15 --ports 29400-29499

The daemon's exporter listens only on a port of ``--ports`` (bench/benchenv.py; the API is
a Unix socket in a temporary directory); the load average is printed at the start and the
end, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

THIS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(THIS))

from benchenv import add_ports_arg, use_ports  # noqa: E402

from tests.daemon_proc import DaemonProcess  # noqa: E402

PASTE = "tests/fixtures/kernel-drill/xid63.log"


def commands(config: Path) -> dict[str, list[str]]:
    cfg = ["--config", str(config)]
    return {
        "explain (daemon up)": ["explain", *cfg],
        "explain (daemon up), cold": ["explain", *cfg],
        "status (daemon up)": ["status", *cfg],
        "explain --offline": ["explain", "--offline", *cfg],
        "status --offline": ["status", "--offline", *cfg],
        "explain --bundle PASTE": ["explain", "--bundle", PASTE],
    }


# commands whose every call starts with an empty cache directory (the first call after an
# install, an upgrade or a rule change); the others share one per tree, as an operator's calls do
COLD = {"explain (daemon up), cold"}

# `python -m moptd ARGS` that writes the number of modules in sys.modules at exit
COUNT_MODULES = (
    "import atexit, runpy, sys; out = sys.argv.pop(1); "
    "atexit.register(lambda: open(out, 'w').write(str(len(sys.modules)))); "
    "runpy.run_module('moptd', run_name='__main__', alter_sys=True)"
)


FLOOR = {"python -c pass": ["-c", "pass"], "python -S -c pass": ["-S", "-c", "pass"]}


def run(
    tree: Path,
    args: list[str],
    count: Path | None = None,
    head: list[str] | None = None,
    cache: Path | None = None,
) -> tuple[float, int, int, float]:
    """(seconds, exit status, modules imported, CPU seconds) of one `python -m moptd ARGS`
    in `tree`; the modules are counted (by a wrapper, so not timed) where `count` names a
    file. `cache`: the call's XDG_CACHE_HOME (never the user's own). The CPU seconds are
    the call's user and system time with its own children's (journalctl and the like):
    on a shared machine they move far less with the load than the wall time does."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "100"}
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed moptd has its .pyc files
    if head is None:
        head = ["-c", COUNT_MODULES, str(count)] if count else ["-m", "moptd"]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, *head, *args], cwd=tree, env=env, capture_output=True, timeout=60
    )
    seconds = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the daemon is reaped only at the end
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    modules = int(count.read_text()) if count else 0
    return seconds, out.returncode, modules, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", type=Path, required=True, help="the other tree (before)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TEXT",
        help="only the commands whose name contains TEXT (repeatable)",
    )
    add_ports_arg(ap)
    opts = ap.parse_args()
    use_ports(opts.ports)  # the daemon's exporter: a port of the range, not any free one
    load_at_start = os.getloadavg()[0]
    trees = {"before": opts.other.resolve(), "after": THIS}
    for tree in trees.values():
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(tree / "moptd")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    with tempfile.TemporaryDirectory(prefix="moptd-cli-bench-") as tmp:
        # the XDG_CACHE_HOME of the calls that share one: one per tree, as each installed
        # moptd has its user's own. One for both made the trees evict each other's
        # validated-rules.json (its key names the loader's files, which differ by tree), so
        # every offline call of both ran the JSON Schema check where both trees keep it
        shared = {label: Path(tmp) / f"cache-{label}" for label in trees}
        daemon = DaemonProcess(Path(tmp)).start()
        try:
            daemon.wait_metrics(timeout=30)
            deadline = time.monotonic() + 30
            while not daemon.socket.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            cmds = {
                k: v
                for k, v in commands(daemon.config_path).items()
                if not opts.only or any(t in k for t in opts.only)
            }
            times: dict[tuple[str, str], list[float]] = {}
            cpus: dict[tuple[str, str], list[float]] = {}
            modules: dict[tuple[str, str], int] = {}
            for name, args in cmds.items():
                for label, tree in trees.items():
                    run(tree, args, cache=shared[label])  # a first call: .pyc files, the cache
                    cache = Path(tempfile.mkdtemp(dir=tmp)) if name in COLD else shared[label]
                    _, rc, n, _ = run(tree, args, Path(tmp) / "n", cache=cache)
                    modules[name, label] = n
                    if rc not in (0, 1, 2):
                        print(f"{label} {name}: exit {rc}", file=sys.stderr)
            for i in range(opts.rounds):
                for name, args in cmds.items():
                    # alternate which tree goes first, so neither always follows the other
                    for label, tree in sorted(trees.items(), reverse=bool(i % 2)):
                        cache = Path(tempfile.mkdtemp(dir=tmp)) if name in COLD else shared[label]
                        seconds, _, _, cpu = run(tree, args, cache=cache)
                        times.setdefault((name, label), []).append(seconds)
                        cpus.setdefault((name, label), []).append(cpu)
                for name, head in FLOOR.items():
                    seconds, _, _, _ = run(THIS, [], head=head, cache=shared["after"])
                    times.setdefault((name, "floor"), []).append(seconds)
        finally:
            daemon.stop()
    print(
        f"median of {opts.rounds} rounds, seconds (modules imported); "
        f"before = {trees['before']}, after = {trees['after']}"
    )
    print(
        f"load average (1 min) at the start: {load_at_start:.2f}, "
        f"at the end: {os.getloadavg()[0]:.2f}; exporter port {daemon.port}"
    )
    print(
        f"{'command':26} {'before':>30} {'after':>30} {'ratio':>6}  "
        "(the ratio of medians; then the median and range of the rounds' own ratios)"
    )
    for name in cmds:
        before, after = times[name, "before"], times[name, "after"]
        b = statistics.median(before)
        a = statistics.median(after)
        paired = [x / y for x, y in zip(before, after, strict=True)]
        print(
            f"{name:26} {b:6.3f} {spread(before)} ({modules[name, 'before']:4d}) "
            f"{a:6.3f} {spread(after)} ({modules[name, 'after']:4d}) {b / a:6.2f}  "
            f"{statistics.median(paired):.2f} {spread(paired)}"
        )
    for name in FLOOR:
        f = times[name, "floor"]
        print(f"{name:26} {statistics.median(f):6.3f} {spread(f)}")
    print("\nCPU seconds of a call (user + system, with its children), the same rounds")
    for name in cmds:
        before, after = cpus[name, "before"], cpus[name, "after"]
        b, a = statistics.median(before), statistics.median(after)
        paired = [x / y for x, y in zip(before, after, strict=True)]
        print(
            f"{name:26} {b:6.3f} {spread(before)}        {a:6.3f} {spread(after)}        "
            f"{b / a:6.2f}  {statistics.median(paired):.2f} {spread(paired)}"
        )
    return 0


def spread(values: list[float]) -> str:
    return f"[{min(values):.3f}-{max(values):.3f}]"


if __name__ == "__main__":
    sys.exit(main())
