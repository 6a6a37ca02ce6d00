#!/usr/bin/env python3
"""Where a running daemon's CPU goes: its rule ticks, its collector runs, and the rest.

Runs `moptd run` in this process with two wrappers that add up the main thread's CPU time
(time.thread_time) spent in RuleService.tick and in CollectorRuntime.run_collector (which
includes other tasks run while a collector awaits its thread), and prints, for each window,
the process's CPU and those two parts, in % of one core. Used side by side: start it once
per tree (PYTHONPATH) at the same time, with the same config, and compare window by window.

    python bench/daemon_split.py --window 30 -- --config moptd.yaml
    PYTHONPATH=/tmp/old python bench/daemon_split.py --window 30 -- --config old.yaml

Stop it with Ctrl-C (SIGINT); the first window includes start-up.
"""

from __future__ import annotations

import argparse
import functools
import resource
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import moptd.daemon.runtime as runtime
import moptd.diagnose.service as service

spent: dict[str, float] = {"rules": 0.0, "collectors": 0.0}


def _sync(fn: Callable[..., Any], part: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[part] += time.thread_time() - t0

    return wrapper


def _async(fn: Callable[..., Any], part: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return await fn(*args, **kwargs)
        finally:
            spent[part] += time.thread_time() - t0

    return wrapper


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _report(window: float) -> None:
    before = dict(spent)
    t0, c0 = time.monotonic(), _cpu()
    while True:
        time.sleep(window)
        t1, c1 = time.monotonic(), _cpu()
        now = dict(spent)
        el = t1 - t0
        parts = " ".join(f"{k} {100 * (now[k] - before[k]) / el:.3f}" for k in now)
        print(
            f"window {el:.0f} s: process {100 * (c1 - c0) / el:.3f} {parts} (% of a core)",
            file=sys.stderr,
            flush=True,
        )
        before, t0, c0 = now, t1, c1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then moptd run's arguments")
    args = ap.parse_args()
    service.RuleService.tick = _sync(service.RuleService.tick, "rules")  # type: ignore[method-assign]
    runtime.CollectorRuntime.run_collector = _async(  # type: ignore[method-assign]
        runtime.CollectorRuntime.run_collector, "collectors"
    )
    threading.Thread(target=_report, args=(args.window,), daemon=True).start()
    from moptd.cli import main as moptd_main

    run_args = [a for a in args.run_args if a != "--"]
    sys.argv = ["moptd", "run", *run_args]
    moptd_main()


if __name__ == "__main__":
    main()
