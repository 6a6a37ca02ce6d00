"""Time one rule-engine tick: the full default rule set over 8 GPUs and one serving endpoint.

Fills a signal store with an hour (the longest window a shipped rule reads) of 1-second
samples for every gpu.* signal of 8 GPUs (changing values, so window functions walk real
points), the host signals, every serving.* signal of one endpoint and a few kernel events.
Every counter rises, so the error rules match on every GPU: a worst case, since a match
also computes its evidence and renders its summary. Then it times RuleService.tick() (evaluation and
lifecycle) at 1-second steps. Target: at most 2 ms per tick.

    python bench/rules_tick.py [--ticks 300]
    python bench/rules_tick.py --flood 10000 [--plain-count]   # after a kernel-log flood
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

from moptd.catalog import CATALOG
from moptd.clock import VirtualClock
from moptd.diagnose import expr
from moptd.diagnose.loader import default_rules_dir
from moptd.diagnose.service import RuleService
from moptd.observations import Batch, Event, labels_of
from moptd.store import SignalStore

GPUS = 8
LABELS = {
    "reason": ["gpu_idle", "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown"],
    "counter": ["replay", "recovery", "crc_flit", "crc_data"],
    "cause": ["single_bit", "double_bit"],
    "tier": ["fast", "slow", "static"],
    "path": ["/", "/models", "/tmp"],
    "module": ["nvidia", "nvidia_uvm"],
    "node": ["nvidiactl", "nvidia0", "nvidia-uvm"],
    "engine": ["docker"],
    "file": ["/etc/cdi/nvidia.yaml"],
}


def value(kind: str, help_text: str, t: float, i: int) -> float:
    """Fast-tier gauges move every second; slow-tier values every 10 s; static ones never
    (what the NVML collector's tiers produce)."""
    if "static tier" in help_text:
        return float(i + 1)
    step = 10 if "slow tier" in help_text else 1
    tt = t - t % step
    if kind == "counter":
        return float(int(tt) * (i + 1))
    return 0.5 + 0.4 * math.sin(tt / 30 + i) + random.random() * 0.01


def batch_at(t: float, gpus: int = GPUS, endpoints: int = 1) -> Batch:
    """Every catalog signal's samples at time t (bench/scaling.py varies the counts)."""
    b = Batch()
    subjects = {
        "gpu": [f"gpu:{i}" for i in range(gpus)],
        "node": ["node"],
        "serving": (
            ["serving:main"] if endpoints == 1 else [f"serving:ep{i}" for i in range(endpoints)]
        ),
        "collector": ["collector:nvml"],
    }
    for spec in CATALOG.values():
        if spec.kind in ("event", "info") or spec.subject == "process":
            continue
        for i, subject in enumerate(subjects.get(spec.subject, [])):
            label_sets = [()]
            if spec.labels:
                name = spec.labels[0]
                label_sets = [labels_of({name: v}) for v in LABELS.get(name, ["x"])]
            for lbl in label_sets:
                b.add(spec.name, subject, value(spec.kind, spec.help, t, i), lbl)
    for i in range(gpus):
        b.describe(f"gpu:{i}", pci_bus_id=f"0000:{0x19 + i:02x}:00.0")
    return b


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument(
        "--history", type=int, default=3600, help="seconds of history (longest rule window)"
    )
    ap.add_argument("--rules", action="append", default=[], help="rule paths (default: shipped)")
    ap.add_argument(
        "--flood", type=int, default=0, help="Xid events in the last 10 minutes (a flooded log)"
    )
    ap.add_argument(
        "--plain-count", action="store_true", help="walk the event log for count() (old way)"
    )
    args = ap.parse_args()
    random.seed(1)
    clock = VirtualClock(1_000_000.0)
    store = SignalStore(clock=clock)
    svc = RuleService(store, clock, args.rules or [default_rules_dir()])
    assert not svc.errors, svc.errors
    t = clock.now()
    for _ in range(args.history):
        store.ingest("bench", batch_at(t), t)
        t += 1
        clock.set(t)
    store.add_events([Event("kernel.xid", "gpu:3", t - 100, {"code": 13, "caused_by": None})])
    if args.flood:
        expr.INCREMENTAL_COUNT = not args.plain_count
        store.add_events(
            Event("kernel.xid", f"gpu:{i % GPUS}", t - 600 + 600 * i / args.flood,
                  {"code": 13, "caused_by": None})
            for i in range(args.flood)
        )
    times = []
    for _ in range(args.ticks):
        store.ingest("bench", batch_at(t), t)
        t0 = time.process_time()  # CPU time: steadier than wall time on a shared host
        svc.tick(t)
        times.append((time.process_time() - t0) * 1000)
        t += 1
        clock.set(t)
    times.sort()
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    rules = len(svc.ruleset.rules)
    evaluations = len(svc.last_results)
    print(
        f"{rules} rules, {evaluations} (rule, subject) evaluations per tick, "
        f"{store.stats()['series']} series"
    )
    print(
        f"tick: median {statistics.median(times):.3f} ms, p99 {p99:.3f} ms, "
        f"max {times[-1]:.3f} ms over {len(times)} ticks (target <= 2 ms)"
    )


if __name__ == "__main__":
    main()
