#!/usr/bin/env python3
"""The daemon's steady work per tick, phase by phase, this tree against another.

    python bench/daemon_phases.py --other /tmp/base-REV --rounds 3 [--ticks 1100]

One tick as the daemon makes it with 8 recorded GPUs (tests/fixtures/h200, every NVML tier
at its default cadence) and the host collector: the two collectors' passes (`collect`),
their batches into the store (`ingest`), the rule tick (`rules`: evaluation and lifecycle)
and the findings batch into the store (`findings`). Single-threaded and on a virtual clock
that moves 1 s a tick, so none of the daemon's threads, scrapes or sleeps are in it: the
figures are the Python work a tick costs, not the daemon's CPU (bench/daemon_steady.py).
Each round runs one fresh child process per tree, alternating which goes first; CPU ms per
tick (process time), the mean over the ticks after the first 100, then each tree's median
of rounds and the ratio this / other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORDING = HERE.parent / "tests/fixtures/h200/nvml_recording_h200.jsonl"
PHASES = ("collect", "ingest", "rules", "findings")

CHILD = """
import asyncio, json, statistics, sys, time
sys.path[:0] = [sys.argv[1]]
from moptd.clock import VirtualClock
from moptd.collector import CollectorContext
from moptd.collectors import host, nvml
from moptd.diagnose.rulefiles import default_rules_dir
from moptd.diagnose.service import RuleService
from moptd.store import SignalStore

recording, ticks = sys.argv[2], int(sys.argv[3])
clock = VirtualClock(time.time())
store = SignalStore(clock=clock)
nv = nvml.NvmlCollector(CollectorContext(clock=clock, options={
    "backend": "recorded", "recording": recording, "replicate": 8, "xid_events": False,
    "gpu_deadline": 1e9}))
hc = host.HostCollector(CollectorContext(options={}, clock=clock))
rules = RuleService(store, clock, [default_rules_dir()])
cpu = time.process_time


async def main():
    await nv.start()
    await hc.start()
    spent = {name: [] for name in ("collect", "ingest", "rules", "findings")}
    for tick in range(ticks):
        clock.advance(1.0)
        await asyncio.sleep(0.002)  # the reader thread ends the read the last tick started
        t0 = cpu()
        gpus = await nv.collect()
        node = await hc.collect()
        t1 = cpu()
        now = clock.now()
        store.ingest("nvml", gpus, now)
        store.ingest("host", node, now)
        t2 = cpu()
        rules.tick(now)
        t3 = cpu()
        store.ingest("rules", rules.findings_batch(), now)
        t4 = cpu()
        if tick >= 100:
            for name, d in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                spent[name].append(d * 1e3)
    await nv.stop()
    await hc.stop()
    out = {name: statistics.fmean(v) for name, v in spent.items()}
    out["series"] = store.stats()["series"]
    out["results"] = len(rules.last_results)
    print(json.dumps(out))


asyncio.run(main())
"""


def run(tree: Path, ticks: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), str(RECORDING), str(ticks)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", type=Path, required=True, help="the tree to compare with")
    ap.add_argument("--this", type=Path, default=HERE.parent, help="default: this tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=1100)
    ap.add_argument("--out", type=Path, help="write every round and the medians as JSON")
    args = ap.parse_args()
    trees = {"this": args.this.resolve(), "other": args.other.resolve()}
    rounds: dict[str, list[dict[str, float]]] = {"this": [], "other": []}
    for r in range(args.rounds):
        order = ("this", "other") if r % 2 == 0 else ("other", "this")
        for name in order:
            res = run(trees[name], args.ticks)
            res["all"] = sum(res[p] for p in PHASES)
            rounds[name].append(res)
            shown = "  ".join(f"{p} {res[p]:.3f}" for p in PHASES)
            print(f"round {r + 1} {name:5}: {shown}  all {res['all']:.3f} ms", flush=True)
    medians = {
        name: {p: statistics.median(x[p] for x in runs) for p in (*PHASES, "all")}
        for name, runs in rounds.items()
    }
    print(f"medians of {args.rounds} rounds, CPU ms per tick (this = {trees['this']}):")
    for p in (*PHASES, "all"):
        this, other = medians["this"][p], medians["other"][p]
        print(f"  {p:8} this {this:.3f}  other {other:.3f}  ratio {this / other:.3f}")
    if args.out:
        trees_shown = {k: str(v) for k, v in trees.items()}
        record = {"trees": trees_shown, "rounds": rounds, "medians": medians}
        args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
