"""The NVML collector's tick, this tree against another, side by side in one run.

On the GPU host (read-only NVML calls):

    python bench/nvml_tick_ab.py --other build/base-REV --rounds 6

Off it, a smoke run over a recording (8 GPUs):

    python bench/nvml_tick_ab.py --other build/base-REV --rounds 2 \\
        --recording tests/fixtures/h200/nvml_recording_h200.jsonl --replicate 8

Each round runs, in a fresh child process per tree and alternating which goes first, the
collector's fast tier on bench/nvml_ticks.py's 20 ms tick grid (CPU µs per GPU per tick,
median of 5 × 50 ticks) and the amortised cost over the daemon's cadences (60 ticks with the
virtual clock moving 1 s a tick: slow, costly and profile come due; static is read once
before, as in the daemon). Prints every round, then the medians and ratios (this / other).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

CHILD = """
import json, statistics, sys
tree = sys.argv[1]
sys.path[:0] = [tree + "/bench", tree]
from nvml_ticks import tick_cost
from moptd.collectors import nvml
opts = json.loads(sys.argv[2])
n = int(sys.argv[3])
fast = tick_cost(nvml.NvmlCollector, fast_only=True, spacing=0.02, ticks=50, rounds=5,
                 options=opts)
amortised = tick_cost(nvml.NvmlCollector, fast_only=False, spacing=0.02, ticks=60, rounds=3,
                      options=opts)
print(json.dumps({"fast": statistics.median(fast) * 1e6 / n,
                  "amortised": statistics.median(amortised) * 1e6 / n}))
"""


def gpu_count(opts: dict[str, object]) -> int:
    if opts.get("backend") == "recorded":
        return int(str(opts.get("replicate", 1)))
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def run(tree: Path, opts: dict[str, object], n: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), json.dumps(opts), str(n)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", type=Path, required=True, help="the other tree (a git archive)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--recording", help="an NVML recording (a smoke run off the GPU host)")
    ap.add_argument("--replicate", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    opts: dict[str, object] = {}
    if args.recording:
        opts = {
            "backend": "recorded",
            "recording": str(Path(args.recording).resolve()),
            "replicate": args.replicate,
        }
    n = gpu_count(opts)
    trees = {"this": HERE, "other": args.other.resolve()}
    rows: dict[str, dict[str, list[float]]] = {k: {"fast": [], "amortised": []} for k in trees}
    for i in range(args.rounds):
        order = ["this", "other"] if i % 2 == 0 else ["other", "this"]
        for name in order:
            r = run(trees[name], opts, n)
            for k, v in r.items():
                rows[name][k].append(v)
            print(
                f"round {i + 1} {name:5} fast {r['fast']:8.1f}  amortised {r['amortised']:8.1f}"
                " µs per GPU",
                flush=True,
            )
    print(f"\n{n} GPU(s), CPU µs per GPU, medians of {args.rounds} rounds")
    summary: dict[str, object] = {"gpus": n, "rounds": rows}
    for k in ("fast", "amortised"):
        this, other = (statistics.median(rows[t][k]) for t in ("this", "other"))
        print(f"{k:10} this {this:8.1f}  other {other:8.1f}  this/other {this / other:5.2f}")
        summary[k] = {"this": this, "other": other, "ratio": this / other}
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
