"""Cumulative Prometheus histograms: the difference of two scrapes and its quantiles."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Histogram:
    """Cumulative bucket counts keyed by upper bound (``le``), as Prometheus exposes them."""

    buckets: dict[float, float] = field(default_factory=dict)
    count: float = 0.0
    sum: float = 0.0

    def add_bucket(self, le: float, value: float) -> None:
        # Several engines (data-parallel ranks) expose one series each: add them up.
        self.buckets[le] = self.buckets.get(le, 0.0) + value

    def minus(self, earlier: Histogram) -> Histogram:
        """What was observed between ``earlier`` and this scrape. A count that went down
        means the server restarted, and everything here is new."""
        if self.count < earlier.count or any(
            self.buckets.get(le, 0.0) < v for le, v in earlier.buckets.items()
        ):
            return self
        return Histogram(
            {le: v - earlier.buckets.get(le, 0.0) for le, v in self.buckets.items()},
            self.count - earlier.count,
            self.sum - earlier.sum,
        )

    def quantile(self, q: float) -> float | None:
        return histogram_quantile(q, self.buckets)

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket that holds
    the rank; a rank in the +Inf bucket gives the largest finite bound. None when the
    histogram is empty (no observation, so no quantile)."""
    if not buckets or not 0.0 <= q <= 1.0:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if math.isinf(bounds[-1]) else max(buckets.values())
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank and count > prev_count:
            if math.isinf(le):
                return prev_le
            if le <= 0:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = (le if not math.isinf(le) else prev_le), max(prev_count, count)
    finite = [b for b in bounds if not math.isinf(b)]
    return finite[-1] if finite else None
