"""The percentile the benchmarks quote: the value at rank int(q * n) of the sorted samples
(with a few dozen samples, p99 is the maximum, which is what BENCHMARKS.md says)."""

from __future__ import annotations

from collections.abc import Sequence


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
