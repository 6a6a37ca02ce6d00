#!/usr/bin/env python3
"""How moptd's per-tick costs grow with GPUs, serving endpoints and rules, in one run.

Four measurements, each on this process's CPU time (time.process_time, which counts
the NVML collector's worker threads too):

- rule tick: RuleService.tick() over a SignalStore on a VirtualClock holding an hour of
  1 s history (bench/rules_tick.py's worst case: every counter rises, so error rules
  match and render evidence), against GPUs (one endpoint), serving endpoints (8 GPUs)
  and rule count (the shipped set, then copies of its rules under new ids);
- /metrics render: TextRenderer over a fresh store snapshot, the work MetricsEndpoint
  does once per snapshot change, against GPUs, with the series count and body size;
- NVML collector: collect() then settle() through the recorded backend replaying the
  real H200 capture replicated to N GPUs (what `moptd run` does per tick);
- store memory: tracemalloc of the store after an hour at 1 s (bench/store_memory.py's
  fill) against GPUs.

    python bench/scaling.py [--ticks 200] [--out bench/results/cpu-scaling-DATE.txt]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import io
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import store_memory  # noqa: E402
from percentile import pct  # noqa: E402
from rules_tick import batch_at  # noqa: E402

from moptd.catalog import CATALOG  # noqa: E402
from moptd.clock import VirtualClock  # noqa: E402
from moptd.collector import CollectorContext  # noqa: E402
from moptd.collectors.nvml import NvmlCollector  # noqa: E402
from moptd.daemon.exporter import TextRenderer  # noqa: E402
from moptd.diagnose.loader import default_rules_dir  # noqa: E402
from moptd.diagnose.service import RuleService  # noqa: E402
from moptd.observations import Batch, Event  # noqa: E402
from moptd.store import SignalStore  # noqa: E402

RECORDING = ROOT / "tests/fixtures/h200/nvml_recording_h200.jsonl"
GPU_COUNTS = (1, 2, 4, 8, 16)
ENDPOINT_COUNTS = (1, 2, 4, 8)
RULE_COPIES = (1, 2, 4)


# --- rule tick ------------------------------------------------------------------------


def synthetic_batch(t: float, gpus: int, endpoints: int) -> Batch:
    return batch_at(t, gpus, endpoints)


def copied_rules(dest: Path, copies: int) -> list[Path]:
    """The shipped rules plus copies-1 more copies of every rule under new ids; lists and
    macros stay defined once, in the shipped files."""
    shipped = default_rules_dir()
    base = dest / "shipped"
    shutil.copytree(shipped, base)
    paths = [base]
    for k in range(1, copies):
        extra = dest / f"copy{k}"
        extra.mkdir()
        for f in sorted(shipped.rglob("*.rules.yaml")):
            doc = yaml.safe_load(f.read_text(encoding="utf-8"))
            rules = doc.get("rules") or []
            if not rules:
                continue
            for r in rules:
                r["id"] = f"{r['id']}-copy{k}"
            out = {"schema": doc["schema"], "rules": rules}
            (extra / f"{f.parent.name}-{f.name}").write_text(yaml.safe_dump(out, sort_keys=False))
        paths.append(extra)
    return paths


def rule_tick(gpus: int, endpoints: int, rule_paths: list[Path], ticks: int) -> dict[str, Any]:
    random.seed(1)
    clock = VirtualClock(1_000_000.0)
    store = SignalStore(clock=clock)
    svc = RuleService(store, clock, rule_paths)
    if svc.errors:
        raise SystemExit(f"rules did not load: {svc.errors[:3]}")
    t = clock.now()
    for _ in range(3600):
        store.ingest("bench", synthetic_batch(t, gpus, endpoints), t)
        t += 1
        clock.set(t)
    store.add_events([Event("kernel.xid", "gpu:0", t - 100, {"code": 13, "caused_by": None})])
    times = []
    for _ in range(ticks):
        store.ingest("bench", synthetic_batch(t, gpus, endpoints), t)
        t0 = time.process_time()
        svc.tick(t)
        times.append((time.process_time() - t0) * 1000)
        t += 1
        clock.set(t)
    return {
        "gpus": gpus,
        "endpoints": endpoints,
        "rules": len(svc.ruleset.rules),
        "evaluations": len(svc.last_results),
        "series": store.stats()["series"],
        "median_ms": statistics.median(times),
        "p99_ms": pct(times, 0.99),
    }


# --- NVML collector and /metrics render -----------------------------------------------


async def nvml_and_render(gpus: int, ticks: int, state_dir: Path) -> dict[str, Any]:
    clock = VirtualClock(1000.0)
    opts = {
        "backend": "recorded",
        "recording": str(RECORDING),
        "replicate": gpus,
        "xid_events": False,
    }
    collector = NvmlCollector(CollectorContext(options=opts, state_dir=state_dir, clock=clock))
    store = SignalStore(clock=clock)
    renderer = TextRenderer()
    await collector.start()
    collect_ms: list[float] = []
    render_ms: list[float] = []
    body = b""
    try:
        for i in range(ticks + 10):
            clock.advance(1.0)
            t0 = time.process_time()
            batch = await collector.collect()
            await collector.settle()
            spent = (time.process_time() - t0) * 1000
            store.ingest("nvml", batch, clock.now())
            t1 = time.process_time()
            body = renderer.render(store.snapshot())
            rendered = (time.process_time() - t1) * 1000
            if i >= 10:  # the first ticks read the static tier and fill the caches
                collect_ms.append(spent)
                render_ms.append(rendered)
    finally:
        await collector.stop()
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {
        "gpus": gpus,
        "collect_median_ms": statistics.median(collect_ms),
        "collect_p99_ms": pct(collect_ms, 0.99),
        "render_median_ms": statistics.median(render_ms),
        "render_p99_ms": pct(render_ms, 0.99),
        "series": series,
        "body_kib": len(body) / 1024,
    }


# --- store memory ---------------------------------------------------------------------


def store_mb(gpus: int) -> dict[str, Any]:
    gpu_signals = [
        s.name
        for s in CATALOG.values()
        if s.subject == "gpu" and s.kind in ("gauge", "counter") and not s.labels
    ]
    node_signals = [
        s.name
        for s in CATALOG.values()
        if s.subject == "node" and s.kind in ("gauge", "counter") and not s.labels
    ]
    args = SimpleNamespace(gpus=gpus, hours=1.0)
    keep: list[SignalStore] = []
    tracemalloc.start()
    store_memory.fill(
        args, gpu_signals, node_signals, set(gpu_signals[::2]), random.Random(0), 3600, keep
    )
    current, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    stats = keep[0].stats()
    return {
        "gpus": gpus,
        "series": stats["series"],
        "points": stats["points"],
        "traced_mb": current / 2**20,
    }


# --- report ---------------------------------------------------------------------------


def growth(xs: Sequence[float], ys: Sequence[float]) -> str:
    """Least-squares slope and intercept: the fixed part and the part per unit."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return f"fit: {my - slope * mx:.3f} + {slope:.3f} per unit"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ticks", type=int, default=200, help="timed ticks per configuration")
    ap.add_argument("--out", type=Path, help="also write the report here")
    args = ap.parse_args()
    out = io.StringIO()

    def say(line: str = "") -> None:
        print(line, flush=True)
        out.write(line + "\n")

    started = time.monotonic()
    say(f"# bench/scaling.py --ticks {args.ticks}")
    say(
        f"# {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    raw: dict[str, list[dict[str, Any]]] = {}

    def section(name: str, rows: list[dict[str, Any]], cols: list[str], key: str) -> None:
        raw[name] = rows
        say(f"\n## {name}")
        say(" | ".join(cols))
        for r in rows:
            say(" | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
        median_col = next(c for c in cols if "median" in c or c == "traced_mb")
        say(growth([float(r[key]) for r in rows], [float(r[median_col]) for r in rows]))

    with tempfile.TemporaryDirectory() as tmp:
        shipped = [default_rules_dir()]
        tick_cols = ["gpus", "endpoints", "rules", "evaluations", "series", "median_ms", "p99_ms"]
        by_gpu = [rule_tick(g, 1, shipped, args.ticks) for g in GPU_COUNTS]
        section("rule tick vs GPUs (1 endpoint, shipped rules)", by_gpu, tick_cols, "gpus")
        eight = next(r for r in by_gpu if r["gpus"] == 8)
        by_ep = [eight] + [rule_tick(8, e, shipped, args.ticks) for e in ENDPOINT_COUNTS[1:]]
        section("rule tick vs serving endpoints (8 GPUs)", by_ep, tick_cols, "endpoints")
        by_rules = [eight]
        for copies in RULE_COPIES[1:]:
            dest = Path(tmp) / f"rules{copies}"
            dest.mkdir()
            by_rules.append(rule_tick(8, 1, copied_rules(dest, copies), args.ticks))
        section("rule tick vs rule count (8 GPUs, 1 endpoint)", by_rules, tick_cols, "rules")

        collect_rows = []
        for g in GPU_COUNTS:
            state = Path(tmp) / f"nvml{g}"
            state.mkdir()
            collect_rows.append(asyncio.run(nvml_and_render(g, args.ticks, state)))
        section(
            "NVML collector CPU per tick (recorded backend, H200 capture)",
            collect_rows,
            ["gpus", "collect_median_ms", "collect_p99_ms"],
            "gpus",
        )
        section(
            "/metrics render per snapshot change (NVML collector output)",
            collect_rows,
            ["gpus", "series", "body_kib", "render_median_ms", "render_p99_ms"],
            "gpus",
        )
    memory = [store_mb(g) for g in GPU_COUNTS]
    mem_cols = ["gpus", "series", "points", "traced_mb"]
    section("store memory after 1 h at 1 s", memory, mem_cols, "gpus")
    say(f"\n# took {time.monotonic() - started:.0f} s")
    say("\n# raw")
    say(json.dumps(raw))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(out.getvalue(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
