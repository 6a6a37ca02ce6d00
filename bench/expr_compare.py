"""Compare the condition-language choices on one typical condition: compile and evaluate time.

  ours: the restricted Python subset (moptd.diagnose.expr), AST-whitelisted, compiled to closures
  cel:  common-expression-language (pip install common-expression-language), with the window
        function registered as a Python callback, as the engine would have to

Both read the same store; the condition is the gen-under-load PCIe branch. Prints µs per
compile and per evaluation. The numbers are recorded in docs/rules.md.

    python bench/expr_compare.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from moptd.catalog import CATALOG
from moptd.clock import VirtualClock
from moptd.diagnose.expr import Compiler, Env
from moptd.observations import Batch
from moptd.store import SignalStore

OURS = "gpu.pcie_link_gen < gpu.pcie_link_gen_max and min(gpu.util, 1m) >= 0.5"
CEL = "last('gpu.pcie_link_gen') < last('gpu.pcie_link_gen_max') && wmin('gpu.util', 60.0) >= 0.5"


def store() -> SignalStore:
    s = SignalStore(clock=VirtualClock(0))
    for t in range(120):
        b = Batch()
        b.add("gpu.util", "gpu:0", 0.9 + (t % 7) / 100)
        b.add("gpu.pcie_link_gen", "gpu:0", 3)
        b.add("gpu.pcie_link_gen_max", "gpu:0", 5)
        s.ingest("x", b, t=float(t))
    return s


def timeit(fn: Callable[[], object], n: int) -> float:
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


def main() -> None:
    s = store()
    comp = Compiler(CATALOG, scope="gpu")
    ex = comp.compile(OURS)

    def ours() -> object:
        return ex(Env(s, "gpu:0", 119.0))

    compile_us = timeit(lambda: Compiler(CATALOG, scope="gpu").compile(OURS), 500)
    print(f"ours: compile {compile_us:.1f} µs, evaluate {timeit(ours, 5000):.1f} µs -> {ours()}")
    try:
        import cel  # type: ignore[import-not-found]
    except ImportError:
        print("cel: not installed (pip install common-expression-language)")
        return

    def last(name: str) -> float:
        series = s.series(name, "gpu:0")
        v = series.last() if series else None
        return float("nan") if v is None else v

    def wmin(name: str, window: float) -> float:
        series = s.series(name, "gpu:0")
        v = series.min(119.0, window) if series else None
        return float("nan") if v is None else v

    ctx = cel.Context()
    ctx.add_function("last", last)
    ctx.add_function("wmin", wmin)
    prog = cel.compile(CEL)

    def run_cel() -> object:
        return prog.execute(ctx)

    print(
        f"cel:  compile {timeit(lambda: cel.compile(CEL), 500):.1f} µs,"
        f" evaluate {timeit(run_cel, 5000):.1f} µs -> {run_cel()}"
    )


if __name__ == "__main__":
    main()
