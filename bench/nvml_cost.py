"""CPU cost of one GPU sample: moptd's NVML collector against the usual alternatives.

Run on the GPU host (read-only NVML calls; no GPU setting changes):

    python bench/nvml_cost.py --out nvml_cost.json

In one run, side by side, it measures CPU seconds (user + system, of this process and of
any subprocess) per GPU sample for:

- moptd's collector per tick, fast tier only, and amortised over the default cadence
  (one tick a second; slow and profile every 5 s, costly every 10 s, total energy every
  60 s, static every 300 s), ticks 20 ms apart (bench/nvml_ticks.py);
- a bare loop over the backend's tier reads (the NVML calls without the collector);
- ``nvidia-smi --query-gpu=<the same fields> --format=csv`` (a subprocess per sample);
- ``nvidia-smi -q -x``;
- gpustat's ``GPUStatCollection.new_query()`` and nvitop's ``Device.all()`` plus the same
  fields, when those packages are importable.

It prints a table of medians and ratios to moptd's amortised tick, and a table of each
NVML query's wall time (µs, median and p99) that justifies the tiering. The whole run
stays under 3 minutes.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nvml_ticks import spaced_cost, tick_cost

from moptd.collectors.nvml import NvmlCollector
from moptd.gpu.backend import NvmlBackend

QUERY_FIELDS = [
    "index", "uuid", "pci.bus_id", "name", "serial", "vbios_version", "driver_version",
    "utilization.gpu", "utilization.memory", "memory.total", "memory.used", "memory.free",
    "memory.reserved", "temperature.gpu", "temperature.memory", "power.draw",
    "enforced.power.limit", "power.default_limit", "clocks.sm", "clocks.mem",
    "clocks.max.sm", "clocks.max.mem", "pstate", "clocks_event_reasons.active",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current",
    "pcie.link.width.max", "ecc.mode.current", "ecc.mode.pending",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total", "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.sbe", "retired_pages.dbe", "retired_pages.pending",
    "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
    "remapped_rows.failure", "persistence_mode", "compute_mode", "mig.mode.current",
    "total_energy_consumption",
]  # fmt: skip


SPACING = 0.02  # seconds between ticks, for every row measured "on the tick grid"
AMORTISED = (
    "moptd collector, amortised (1 s tick; slow, profile 5 s, costly 10 s, energy 60 s, "
    "static 300 s)"
)


def cpu_now() -> float:
    """CPU seconds of this process (all threads) plus its waited-for children."""
    own = time.process_time()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own + kids.ru_utime + kids.ru_stime


def rounds(fn: Callable[[], None], n_rounds: int, per_round: int, per: float) -> list[float]:
    """CPU seconds per unit for each round: (cpu of per_round calls) / (per_round * per)."""
    out = []
    for _ in range(n_rounds):
        c0 = cpu_now()
        for _ in range(per_round):
            fn()
        out.append((cpu_now() - c0) / (per_round * per))
    return out


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
    }


# --- moptd ----------------------------------------------------------------------------


def collector_cost(ngpus: int, fast_only: bool, n_rounds: int, ticks: int) -> list[float]:
    """Per GPU, ticks 20 ms apart (nvml_ticks.py)."""
    per_tick = tick_cost(
        NvmlCollector, fast_only=fast_only, spacing=SPACING, ticks=ticks, rounds=n_rounds
    )
    return [c / ngpus for c in per_tick]


def bare_cost(backend: NvmlBackend, n_rounds: int) -> dict[str, list[float]]:
    ngpus = backend.device_count()
    gpus = range(ngpus)

    def fast() -> None:
        for i in gpus:
            backend.read_fast(i)

    def slow() -> None:
        for i in gpus:
            backend.read_slow(i)

    def static() -> None:
        for i in gpus:
            backend.read_static(i)

    def costly() -> None:
        for i in gpus:
            backend.read_costly(i)

    def costly_fields() -> None:  # the costly tier between two energy reads
        for i in gpus:
            backend.read_costly(i, energy=False)

    def profile() -> None:
        for i in gpus:
            backend.read_profile(i)

    f = rounds(fast, n_rounds, 100, ngpus)
    f_grid = spaced(fast, n_rounds, ngpus)
    s = rounds(slow, n_rounds, 20, ngpus)
    st = rounds(static, max(3, n_rounds // 3), 5, ngpus)
    co = rounds(costly, max(3, n_rounds // 3), 10, ngpus)
    cf = rounds(costly_fields, max(3, n_rounds // 3), 10, ngpus)
    profile()  # the first GPM read only takes a sample
    pr = rounds(profile, max(3, n_rounds // 3), 10, ngpus)
    # The collector's default cadence: per 1-s tick, a fast read, 1/5 of a slow and of a
    # profile read, 1/10 of a costly one without energy, 1/60 of the energy call (a costly
    # read with energy less one without) and 1/300 of a static one.
    st_median = statistics.median(st)
    cf_median = statistics.median(cf)
    energy = max(0.0, statistics.median(co) - cf_median)
    pr_median = statistics.median(pr)
    rest = cf_median / 10 + st_median / 300 + pr_median / 5
    floor = [a + b / 5 + rest for a, b in zip(f, s, strict=True)]
    amortised = [x + energy / 60 for x in floor]
    return {
        "fast": f,
        "fast_on_grid": f_grid,
        "slow": s,
        "costly": co,
        "costly_without_energy": cf,
        "profile": pr,
        "static": st,
        "amortised_without_energy": floor,
        "amortised": amortised,
    }


def per_call_table(backend: NvmlBackend) -> list[dict[str, Any]]:
    rows = []
    for tier, name, fn in backend.calls(0):
        dear = tier in ("static", "profile") or "Energy" in name or "ProcessUtil" in name
        reps = 30 if dear else 300
        times: list[float] = []
        error = ""
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - NotSupported still costs a call
                error = type(exc).__name__
            times.append((time.perf_counter_ns() - t0) / 1000.0)
        times.sort()
        rows.append(
            {
                "tier": tier,
                "call": name,
                "median_us": statistics.median(times),
                "p99_us": times[min(len(times) - 1, int(len(times) * 0.99))],
                "n": reps,
                "error": error,
            }
        )
    return rows


# --- the alternatives -------------------------------------------------------------------


def usable_query_fields() -> list[str]:
    def ok(fields: list[str]) -> bool:
        r = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return r.returncode == 0

    if ok(QUERY_FIELDS):
        return list(QUERY_FIELDS)
    return [f for f in QUERY_FIELDS if ok([f])]


def subprocess_cost(argv: list[str], n: int, ngpus: int) -> list[float]:
    def once() -> None:
        subprocess.run(argv, capture_output=True, check=True, timeout=60)

    return rounds(once, n, 1, ngpus)


def spaced(fn: Callable[[], None], n_rounds: int, ngpus: int) -> list[float]:
    """Per GPU, one call per tick on the collector's tick grid (nvml_ticks.py)."""
    per_call = spaced_cost(fn, spacing=SPACING, ticks=50, rounds=n_rounds)
    return [c / ngpus for c in per_call]


def gpustat_cost(n: int, ngpus: int, on_grid: bool) -> list[float] | str:
    try:
        from gpustat import GPUStatCollection
    except ImportError as exc:
        return f"gpustat not importable: {str(exc).strip().splitlines()[-1]}"

    def once() -> None:
        GPUStatCollection.new_query()

    return spaced(once, n, ngpus) if on_grid else rounds(once, n, 1, ngpus)


def nvitop_cost(n: int, ngpus: int, on_grid: bool) -> list[float] | str:
    try:
        from nvitop import Device
    except ImportError as exc:
        return f"nvitop not importable: {str(exc).strip().splitlines()[-1]}"

    from anchor_steady import read_nvitop_fields

    def once() -> None:
        for d in Device.all():
            read_nvitop_fields(d)
            d.pcie_link_generation() if hasattr(d, "pcie_link_generation") else None

    return spaced(once, n, ngpus) if on_grid else rounds(once, n, 1, ngpus)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = ap.parse_args()
    n = 3 if args.quick else 15
    started = time.monotonic()

    backend = NvmlBackend()
    backend.init()
    ngpus = backend.device_count()
    static = backend.read_static(0)
    results: dict[str, Any] = {
        "host": platform.node(),
        "python": platform.python_version(),
        "driver": backend.driver_version(),
        "gpus": ngpus,
        "gpu_name": static.name,
        "unit": "CPU seconds per GPU sample (median over rounds)",
    }
    calls = per_call_table(backend)
    bare = bare_cost(backend, n)
    backend.shutdown()

    rows: dict[str, list[float] | str] = {
        "moptd collector, fast tier only": collector_cost(ngpus, True, n, 50),
        AMORTISED: collector_cost(ngpus, False, max(2, n // 5), 300),
        "bare backend reads, fast tier, on the same tick grid": bare["fast_on_grid"],
        "bare backend reads, fast tier, back to back": bare["fast"],
        "bare backend reads, amortised": bare["amortised"],
        "bare backend reads, amortised, without total energy": bare["amortised_without_energy"],
        "bare backend reads, slow tier": bare["slow"],
        "bare backend reads, costly tier": bare["costly"],
        "bare backend reads, costly tier without energy": bare["costly_without_energy"],
        "bare backend reads, profile tier (GPM)": bare["profile"],
        "bare backend reads, static tier": bare["static"],
    }
    fields = usable_query_fields()
    rows[f"nvidia-smi --query-gpu ({len(fields)} fields) --format=csv"] = subprocess_cost(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv"], n, ngpus
    )
    rows["nvidia-smi -q -x"] = subprocess_cost(["nvidia-smi", "-q", "-x"], max(3, n // 3), ngpus)
    rows["gpustat GPUStatCollection.new_query(), back to back"] = gpustat_cost(n, ngpus, False)
    rows["gpustat GPUStatCollection.new_query(), on the tick grid"] = gpustat_cost(n, ngpus, True)
    rows["nvitop Device.all() + fields, back to back"] = nvitop_cost(n, ngpus, False)
    rows["nvitop Device.all() + fields, on the tick grid"] = nvitop_cost(n, ngpus, True)

    base = statistics.median(rows[AMORTISED])  # type: ignore[arg-type]
    table = {}
    print(f"\n{ngpus} x {static.name}, driver {results['driver']}")
    print(f"{'what':70} {'CPU µs/GPU sample':>18} {'x moptd':>9}")
    for name, v in rows.items():
        if isinstance(v, str):
            table[name] = {"skipped": v}
            print(f"{name:70} {'skipped: ' + v:>28}")
            continue
        s = summary(v)
        s["ratio_to_moptd_amortised"] = s["median"] / base if base else float("nan")
        table[name] = s
        print(f"{name:70} {s['median'] * 1e6:18.1f} {s['ratio_to_moptd_amortised']:9.1f}")
    print(f"\n{'tier':7} {'NVML call':52} {'median µs':>10} {'p99 µs':>10}  note")
    for r in calls:
        print(
            f"{r['tier']:7} {r['call']:52} {r['median_us']:10.1f} {r['p99_us']:10.1f}  {r['error']}"
        )
    results.update(
        per_sample=table,
        per_call=calls,
        query_gpu_fields=fields,
        seconds=time.monotonic() - started,
    )
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out} ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
