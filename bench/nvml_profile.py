"""Where the NVML collector's fast tick spends its CPU, under cProfile on both threads.

Run on the GPU host (read-only NVML calls), after bench/nvml_overhead.py's figures:

    python bench/nvml_profile.py [--ticks 1500] [--tree OTHER_TREE]

Ticks on bench/nvml_ticks.py's 20 ms grid (cold caches, as in the daemon), the collector's
fast tier only, with one cProfile on the event loop's thread and one on the shared reader
thread; prints each thread's top functions by own time. cProfile inflates small calls, so
the shares matter, not the absolute µs.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# --tree TREE profiles another tree's collector with this script (it goes first on the path)
TREE = Path(sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv else HERE.parent)
sys.path[:0] = [str(HERE), str(TREE.resolve())]

from moptd.clock import VirtualClock, next_on_grid  # noqa: E402 - after the path is set
from moptd.collector import CollectorContext  # noqa: E402
from moptd.collectors import nvml  # noqa: E402


def top(pr: cProfile.Profile, label: str, n: int) -> str:
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(n)
    return f"== {label}\n" + s.getvalue()


async def run(ticks: int, n: int, options: dict[str, object]) -> None:
    opts: dict[str, object] = {"backend": "live", "xid_events": False, "gpu_deadline": 1e9}
    for tier in ("slow", "costly", "energy", "profile", "static"):
        opts[f"{tier}_interval"] = 1e12
    opts.update(options)
    clock = VirtualClock(time.time())
    c = nvml.NvmlCollector(CollectorContext(options=opts, clock=clock))
    await c.start()
    await c.collect()
    await c.settle()
    clock.advance(1.0)
    await c.collect()  # the shared reader thread exists from here on
    await c.settle()
    worker = c._shared
    assert worker is not None
    loop_prof, thread_prof = cProfile.Profile(), cProfile.Profile()
    started = threading.Event()

    one: list[str] = []

    def enable() -> None:
        try:
            thread_prof.enable()
        except ValueError:  # Python 3.12+: one profiler at a time, and it sees every thread
            one.append("every thread")
        started.set()

    worker.post(enable)
    started.wait(5)
    loop_prof.enable()
    c0 = time.process_time()
    for _ in range(ticks):
        await asyncio.sleep(next_on_grid(time.monotonic(), 0.02) - time.monotonic())
        clock.advance(1.0)
        await c.collect()
    cpu = time.process_time() - c0
    loop_prof.disable()
    stopped = threading.Event()

    def disable() -> None:
        if not one:
            thread_prof.disable()
        stopped.set()

    worker.post(disable)
    stopped.wait(5)
    await c.stop()
    print(f"tree {Path(nvml.__file__).parent.parent.parent}")
    print(f"{ticks} ticks, {n} GPU(s): {cpu / ticks * 1e6:.1f} CPU µs a tick under the profiler")
    if one:
        print(top(loop_prof, "every thread (one profiler sees them all)", 40))
    else:
        print(top(loop_prof, "event loop's thread", 30))
        print(top(thread_prof, "shared reader thread", 20))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=1500)
    ap.add_argument("--tree", type=Path, default=TREE, help="the tree whose collector runs")
    ap.add_argument("--recording", help="an NVML recording (a smoke run off the GPU host)")
    args = ap.parse_args()
    options: dict[str, object] = {}
    n = 1
    if args.recording:
        options = {"backend": "recorded", "recording": args.recording}
    else:
        import pynvml

        pynvml.nvmlInit()
        n = int(pynvml.nvmlDeviceGetCount())
        pynvml.nvmlShutdown()
    asyncio.run(run(args.ticks, n, options))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
