"""Aggregates over a window that only moves forward, kept up to date point by point.

A rule reads ``slope(gpu.memory_used, 1h)`` every second. Recomputing it walks 3,600 points
a GPU a tick; moving the window costs the one or two points that entered or left it. Both
structures below work on absolute point indices (a series' local index plus the points it
has compacted away), which never change once a point is written: series are append-only.

A query whose window moved backwards (explain at a past time, a test) is not served here;
the series then computes it plainly and leaves these structures alone.
"""

from __future__ import annotations

from array import array
from collections import deque

# Float sums that are added to and subtracted from drift; rebuilding from the points now
# and then keeps the error at the level of one plain pass.
REBUILD_AFTER = 4096


class SlidingAggregate:
    """An aggregate over the points [lo, hi) (absolute indices) of one series."""

    __slots__ = ("hi", "lo")

    def __init__(self) -> None:
        self.lo = self.hi = 0

    def can_advance(self, lo: int, hi: int, window: float, t_lo: float) -> bool:
        """Whether moving to [lo, hi) is cheaper than a rebuild (the window only moved on)."""
        return lo >= self.lo and hi >= self.hi

    def advance(self, ts: array[float], vs: array[float], lo: int, hi: int, base: int) -> None:
        raise NotImplementedError


class SlidingSums(SlidingAggregate):
    """n, Σx, Σy, Σx², Σxy over points [lo, hi), with x = t - t_ref and y = v - v_ref
    (shifted to keep the sums well conditioned): what a least-squares slope needs."""

    __slots__ = ("n", "sx", "sxx", "sxy", "sy", "t_ref", "updates", "v_ref")

    def __init__(self, ts: array[float], vs: array[float], lo: int, hi: int, base: int) -> None:
        """Build over local indices [lo, hi) of a series whose absolute index is local + base."""
        self.t_ref = ts[lo]
        self.v_ref = vs[lo]
        self.lo = self.hi = lo + base
        self.n = 0
        self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.updates = 0
        self.advance(ts, vs, lo + base, hi + base, base)
        self.updates = 0

    def can_advance(self, lo: int, hi: int, window: float, t_lo: float) -> bool:
        return (
            super().can_advance(lo, hi, window, t_lo)
            and self.updates < REBUILD_AFTER
            and t_lo - self.t_ref <= 2 * window  # x stays small next to the window
        )

    def advance(self, ts: array[float], vs: array[float], lo: int, hi: int, base: int) -> None:
        """Move to absolute [lo, hi): add the points that entered, drop those that left."""
        for i in range(self.hi, hi):
            self._add(ts[i - base], vs[i - base], 1.0)
        self.hi = hi
        for i in range(self.lo, min(lo, self.hi)):
            self._add(ts[i - base], vs[i - base], -1.0)
        self.lo = lo
        self.updates += 1

    def _add(self, t: float, v: float, sign: float) -> None:
        x = t - self.t_ref
        y = v - self.v_ref
        self.n += int(sign)
        self.sx += sign * x
        self.sy += sign * y
        self.sxx += sign * x * x
        self.sxy += sign * x * y


class SlidingExtreme(SlidingAggregate):
    """The minimum (or maximum) over points [lo, hi): a deque of indices whose values only
    rise (or fall) from front to back, so the front is the answer."""

    __slots__ = ("idx", "is_min")

    def __init__(self, vs: array[float], lo: int, hi: int, base: int, is_min: bool) -> None:
        self.is_min = is_min
        self.idx: deque[int] = deque()
        self.lo = self.hi = lo + base
        self.advance(vs, vs, lo + base, hi + base, base)

    def advance(self, ts: array[float], vs: array[float], lo: int, hi: int, base: int) -> None:
        idx = self.idx
        for i in range(self.hi, hi):
            v = vs[i - base]
            if self.is_min:
                while idx and vs[idx[-1] - base] >= v:
                    idx.pop()
            else:
                while idx and vs[idx[-1] - base] <= v:
                    idx.pop()
            idx.append(i)
        self.hi = hi
        while idx and idx[0] < lo:
            idx.popleft()
        self.lo = lo

    def value(self, vs: array[float], base: int) -> float | None:
        return vs[self.idx[0] - base] if self.idx else None
