"""Where the NVML collector's fast tick goes, against the floor of any threaded read.

Run on the GPU host (read-only NVML calls):

    python bench/nvml_overhead.py                              # every row, this tree
    python bench/nvml_overhead.py --other OTHER_TREE --runs 2  # this tree against another

Side by side on the 20 ms tick grid of bench/nvml_ticks.py, CPU µs per tick (1 GPU) or per
GPU, medians of 7 rounds of 50 ticks, each row twice (machines are noisy):

- the collector's fast tier as the daemon runs it;
- the bare fast-tier reads on the event loop's thread (issue 23's floor);
- a hand-off of an empty call to a worker thread (moptd.worker.Worker.post);
- the bare fast-tier reads handed to a worker thread: the floor of any design that keeps
  NVML off the event loop, as the house style and a hung GPU require (issue 32's floor);
- the collector with its batch building (_report) taken out, and with the NVML reads
  taken out (what is left is the collector's own bookkeeping and hand-off).

With --other, each run is a fresh child process per tree (`--tree`, which imports that
tree's moptd), the trees alternating and swapping which goes first; each child measures
the collector, the bare reads on a worker thread and on the loop's thread, twice, in one
process, so every ratio is to the floor measured beside it. Prints each run, then the
medians of each tree's runs and the ratio collector / bare reads on a worker thread.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The tree measured goes first on the path, before anything imports moptd (nvml_ticks does).
TREE = Path(sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv else HERE.parent)
sys.path[:0] = [str(HERE), str(TREE.resolve())]

from nvml_ticks import spaced_cost, tick_cost  # noqa: E402 - after the path is set

ROUNDS, TICKS, SPACING = 7, 50, 0.02


def median_us(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e6, 1)


nvml: Any = None  # moptd.collectors.nvml of the tree measured (--tree)

COLLECTOR = "collector, fast tier (per tick / GPUs)"
ON_LOOP = "bare fast reads on the loop's thread (per GPU)"
ON_WORKER = "bare fast reads on a worker thread (per GPU)"


def collector(**patch: Callable[..., Any]) -> float:
    saved = {k: getattr(nvml.NvmlCollector, k) for k in patch}
    for k, v in patch.items():
        setattr(nvml.NvmlCollector, k, v)
    try:
        return median_us(
            tick_cost(
                nvml.NvmlCollector, fast_only=True, spacing=SPACING, ticks=TICKS, rounds=ROUNDS
            )
        )
    finally:
        for k, v in saved.items():
            setattr(nvml.NvmlCollector, k, v)


def spaced(fn: Callable[[], object], per: int) -> float:
    return median_us(
        [c / per for c in spaced_cost(fn, spacing=SPACING, ticks=TICKS, rounds=ROUNDS)]
    )


def measure(rows: str) -> dict[str, list[float]]:
    from moptd.gpu.backend import NvmlBackend
    from moptd.worker import Worker

    backend = NvmlBackend()
    backend.init()
    n = backend.device_count()
    worker = Worker("moptd-bench")

    def fast() -> None:
        for i in range(n):
            backend.read_fast(i)

    def noop() -> None:
        pass

    plan: list[tuple[str, Callable[[], float]]] = [
        (COLLECTOR, lambda: collector() / n),
        (ON_WORKER, lambda: spaced(lambda: worker.post(fast), n)),
        (ON_LOOP, lambda: spaced(fast, n)),
    ]
    if rows == "all":
        plan[2:2] = [
            (
                "hand-off of an empty call to a worker thread (per tick)",
                lambda: spaced(lambda: worker.post(noop), 1),
            )
        ]
        plan += [
            (
                "collector without _report (per tick / GPUs)",
                lambda: collector(_report=lambda self, *a: None) / n,
            ),
            (
                "collector without the NVML reads (per tick / GPUs)",
                lambda: collector(_read_gpu=lambda self, b, i, t: nvml._Pass()) / n,
            ),
        ]
    out: dict[str, list[float]] = {}
    for _ in range(2):
        for name, fn in plan:
            value = fn()
            out.setdefault(name, []).append(value)
            print(f"{name:60} {value:8.1f}", flush=True)
    backend.shutdown()
    floor = statistics.median(out[ON_LOOP])
    print(f"\n{n} GPU(s); CPU µs, medians; ratio to the bare reads on the loop's thread")
    for name, vs in out.items():
        m = statistics.median(vs)
        print(f"{name:60} {m:8.1f} {m / floor:6.2f}x")
    return out


def child(tree: Path) -> dict[str, list[float]]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    got = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--tree", str(tree), "--rows", "ab"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, list[float]] = json.loads(got.stdout.strip().splitlines()[-1])
    return result


def against(other: Path, runs: int, out: Path | None) -> int:
    this = HERE.parent
    trees = {"this": this, "other": other.resolve()}
    got: dict[str, list[dict[str, list[float]]]] = {"this": [], "other": []}
    for r in range(runs):
        order = ("other", "this") if r % 2 == 0 else ("this", "other")
        for name in order:
            res = child(trees[name])
            got[name].append(res)
            col = statistics.median(res[COLLECTOR])
            wk = statistics.median(res[ON_WORKER])
            lp = statistics.median(res[ON_LOOP])
            print(
                f"run {r + 1} {name:5}  collector {col:7.1f}  bare on a worker thread {wk:7.1f}"
                f"  bare on the loop {lp:7.1f}  collector/worker {col / wk:5.2f}x",
                flush=True,
            )
    summary: dict[str, dict[str, float]] = {}
    print("\nCPU µs per GPU per fast tick; medians of every run's values")
    for name in ("other", "this"):
        med = {
            k: statistics.median([v for res in got[name] for v in res[k]])
            for k in (COLLECTOR, ON_WORKER, ON_LOOP)
        }
        med["collector / bare on a worker thread"] = med[COLLECTOR] / med[ON_WORKER]
        med["collector / bare on the loop"] = med[COLLECTOR] / med[ON_LOOP]
        summary[name] = med
        print(
            f"{name:5}  collector {med[COLLECTOR]:7.1f}  on a worker thread {med[ON_WORKER]:7.1f}"
            f"  on the loop {med[ON_LOOP]:7.1f}  ratio to the worker floor"
            f" {med['collector / bare on a worker thread']:5.2f}x"
        )
    print(f"collector this / other: {summary['this'][COLLECTOR] / summary['other'][COLLECTOR]:.2f}")
    if out is not None:
        out.write_text(
            json.dumps(
                {"trees": {k: str(v) for k, v in trees.items()}, "runs": got, "summary": summary},
                indent=1,
            )
        )
    return 0


def main() -> int:
    global nvml
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=HERE.parent, help="the tree whose moptd runs")
    ap.add_argument("--rows", choices=("all", "ab"), default="all")
    ap.add_argument("--other", type=Path, help="measure this tree against another, alternating")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", type=Path, help="--other: every run's figures as JSON")
    args = ap.parse_args()
    if args.other is not None:
        return against(args.other, args.runs, args.out)
    nvml = importlib.import_module("moptd.collectors.nvml")
    print(f"tree {Path(nvml.__file__).parent.parent.parent}", file=sys.stderr)
    print(json.dumps(measure(args.rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
