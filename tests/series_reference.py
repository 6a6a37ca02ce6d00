"""The first, plainly written Series readers (tuples and Python loops), kept as the oracle
that tests/test_store.py checks the array-slicing readers in moptd/store/series.py against."""

from __future__ import annotations

import bisect
import math
from array import array


class ReferenceSeries:
    __slots__ = ("_start", "_t", "_v", "last_seen", "max_points")

    def __init__(self, max_points: int = 4096) -> None:
        self._t = array("d")
        self._v = array("d")
        self._start = 0  # index of the oldest live point; compacted lazily
        self.last_seen = -math.inf
        self.max_points = max_points

    # --- writing ---

    def append(self, t: float, v: float) -> None:
        n = len(self._t)
        if n > self._start:
            if t < self._t[-1]:
                return  # out of order: the store is append-only
            if v == self._v[-1] or (math.isnan(v) and math.isnan(self._v[-1])):
                self.last_seen = max(self.last_seen, t)
                return
        self._t.append(t)
        self._v.append(v)
        self.last_seen = t
        if n + 1 - self._start > self.max_points:
            self._start += 1
            self._compact()

    def evict_before(self, t: float) -> None:
        """Forget points older than t, but keep the one in effect at t (it still holds)."""
        i = self._start
        end = len(self._t)
        while i + 1 < end and self._t[i + 1] <= t:
            i += 1
        if i != self._start:
            self._start = i
            self._compact()

    def _compact(self) -> None:
        if self._start > 64 and self._start * 2 > len(self._t):
            del self._t[: self._start]
            del self._v[: self._start]
            self._start = 0

    # --- reading ---

    def __len__(self) -> int:
        return len(self._t) - self._start

    def points(self) -> list[tuple[float, float]]:
        return list(zip(self._t[self._start :], self._v[self._start :], strict=True))

    def last(self) -> float | None:
        return self._v[-1] if len(self._t) > self._start else None

    def first_time(self) -> float | None:
        return self._t[self._start] if len(self._t) > self._start else None

    def _window(self, now: float, window: float) -> list[tuple[float, float]] | None:
        """Points that matter for [now - window, now]: the one in effect at the window's
        start (clipped to it) and those inside. None when nothing was seen in the window."""
        if len(self._t) == self._start:
            return None
        start = now - window
        if self.last_seen < start:
            return None
        # a point exactly at the window's start counts as the value carried in
        lo = bisect.bisect_right(self._t, start, self._start)
        hi = bisect.bisect_right(self._t, now, lo)
        out = list(zip(self._t[lo:hi], self._v[lo:hi], strict=True))
        if lo > self._start:
            out.insert(0, (start, self._v[lo - 1]))
        return out or None

    def _segments(self, now: float, window: float) -> list[tuple[float, float]] | None:
        """(value, duration) pieces of the step function inside the window, up to the
        time the series was last seen."""
        pts = self._window(now, window)
        if pts is None:
            return None
        end = min(now, self.last_seen)
        segs = []
        for i, (t, v) in enumerate(pts):
            t_next = pts[i + 1][0] if i + 1 < len(pts) else end
            segs.append((v, max(0.0, t_next - t)))
        return segs

    def avg(self, now: float, window: float) -> float | None:
        segs = self._segments(now, window)
        if segs is None:
            return None
        total = sum(d for _, d in segs)
        if total == 0:
            return sum(v for v, _ in segs) / len(segs)
        return sum(v * d for v, d in segs) / total

    def min(self, now: float, window: float) -> float | None:
        pts = self._window(now, window)
        return None if pts is None else min(v for _, v in pts)

    def max(self, now: float, window: float) -> float | None:
        pts = self._window(now, window)
        return None if pts is None else max(v for _, v in pts)

    def increase(self, now: float, window: float) -> float | None:
        """Counter increase over the window; a drop is a reset, counted from zero."""
        pts = self._window(now, window)
        if pts is None:
            return None
        total = 0.0
        prev = pts[0][1]
        for _, v in pts[1:]:
            total += v - prev if v >= prev else v
            prev = v
        return total

    def rate(self, now: float, window: float) -> float | None:
        """Per-second increase over the part of the window the series covers."""
        inc = self.increase(now, window)
        if inc is None:
            return None
        first = self.first_time()
        covered_from = max(now - window, first if first is not None else now)
        span = min(now, self.last_seen) - covered_from
        if span <= 0:
            return None  # a single observation says nothing about a rate
        return inc / span

    def slope(self, now: float, window: float) -> float | None:
        """Least-squares slope (units per second) over the points in the window, with the
        last value repeated at the time it was last seen."""
        pts = self._window(now, window)
        if pts is None:
            return None
        if self.last_seen > pts[-1][0]:
            pts = [*pts, (min(now, self.last_seen), pts[-1][1])]
        n = len(pts)
        if n < 2:
            return None
        # one pass over times shifted to the first point (keeps the sums well conditioned)
        t0 = pts[0][0]
        st = sv = stt = stv = 0.0
        for t, v in pts:
            x = t - t0
            st += x
            sv += v
            stt += x * x
            stv += x * v
        var = stt - st * st / n
        if var <= 0:
            return None
        return (stv - st * sv / n) / var

    def quantile(self, q: float, now: float, window: float) -> float | None:
        """Time-weighted quantile (0 <= q <= 1) of the value over the window."""
        segs = self._segments(now, window)
        if segs is None:
            return None
        segs.sort()
        total = sum(d for _, d in segs)
        if total == 0:
            vals = [v for v, _ in segs]
            return vals[min(len(vals) - 1, int(q * len(vals)))]
        acc = 0.0
        for v, d in segs:
            acc += d
            if acc >= q * total:
                return v
        return segs[-1][0]

    def changes(self, now: float, window: float) -> int | None:
        pts = self._window(now, window)
        return None if pts is None else len(pts) - 1
