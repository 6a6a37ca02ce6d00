"""A bounded numeric time series with the window functions rules use.

Points are stored only when the value changes (plus the time it was last seen), so a
constant signal costs one point however long it is kept, and a changing one costs 16
bytes a point in two ``array('d')``. The value is a step function: a point holds until
the next. ``avg`` and ``quantile`` are therefore time-weighted, which is also what a
gauge means between samples.

Every window function returns None when the series has nothing inside the window: the
caller turns that into *unknown*, never into a healthy zero.
"""

from __future__ import annotations

import bisect
import math
import operator
from array import array
from collections.abc import Callable
from itertools import islice, repeat

from moptd.store.sliding import SlidingAggregate, SlidingExtreme, SlidingSums

SLIDING_FROM = 64  # points in a window from which min, max and slope are kept incrementally
# An append after a silence this long counts as new even with the same value: a reader that
# took the series for stale (the rule engine does after 300 s: moptd.diagnose.expr.Stamp)
# must learn that it is back.
REVIVED_AFTER = 60.0


class Series:
    __slots__ = (
        "_base",
        "_sliding",
        "_start",
        "_t",
        "_v",
        "last_seen",
        "max_points",
        "observed_since",
    )

    def __init__(self, max_points: int = 4096) -> None:
        self._t = array("d")
        self._v = array("d")
        self._start = 0  # index of the oldest live point; compacted lazily
        self._base = 0  # points compacted away: local index + _base is a point's for good
        # (function, window) -> aggregate kept up to date as the window moves; only for
        # windows of at least SLIDING_FROM points, which is where walking them costs
        self._sliding: dict[tuple[str, float], SlidingAggregate] | None = None
        self.last_seen = -math.inf
        # Since when the series has been seen without a silence longer than REVIVED_AFTER:
        # points are stored only when the value changes, so a value carried across a gap
        # (moptd not running, a forward clock jump) reads as if it had held all along; this
        # says how long there is evidence that it did (the rules' seen_for()).
        self.observed_since = math.inf
        self.max_points = max_points

    # --- writing ---

    def append(self, t: float, v: float) -> bool:
        """Record a value seen at t; True when it is a new point (the value changed) or
        the series comes back after REVIVED_AFTER seconds unseen."""
        n = len(self._t)
        if n > self._start and t < self._t[-1]:
            return False  # out of order: the store is append-only
        if not t - self.last_seen <= REVIVED_AFTER:  # the first value, or after a silence
            self.observed_since = t
        if n > self._start:
            if v == self._v[-1] or (math.isnan(v) and math.isnan(self._v[-1])):
                # the same value again: most appends of a steady host (no max(): a call)
                last_seen = self.last_seen
                if t > last_seen:
                    self.last_seen = t
                return t - last_seen > REVIVED_AFTER
        self._t.append(t)
        self._v.append(v)
        self.last_seen = t
        if n + 1 - self._start > self.max_points:
            self._start += 1
            self._compact()
        return True

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
            self._base += self._start
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

    def _range(self, now: float, window: float) -> tuple[int, int, bool] | None:
        """Index range [lo, hi) of the points inside (now - window, now], and whether the
        point in effect at the window's start (index lo - 1) is carried in. None when
        nothing was seen in the window.

        The readers below work on array slices with C-level builtins (min, max, sum, map)
        instead of building a list of tuples: a rule tick reads hundreds of windows."""
        if len(self._t) == self._start:
            return None
        start = now - window
        if self.last_seen < start:
            return None
        # a point exactly at the window's start counts as the value carried in
        lo = bisect.bisect_right(self._t, start, self._start)
        hi = bisect.bisect_right(self._t, now, lo)
        carried = lo > self._start
        if hi == lo and not carried:
            return None
        return lo, hi, carried

    def _values(self, now: float, window: float) -> array[float] | None:
        r = self._range(now, window)
        if r is None:
            return None
        lo, hi, carried = r
        return self._v[lo - 1 if carried else lo : hi]

    def _times(self, lo: int, hi: int, carried: bool, start: float) -> array[float]:
        if not carried:
            return self._t[lo:hi]
        ts = self._t[lo - 1 : hi]
        ts[0] = start  # the carried-in value holds from the window's start
        return ts

    def _durations(
        self, now: float, window: float
    ) -> tuple[array[float], array[float], float] | None:
        """Values, how long each held inside the window (up to the time the series was
        last seen), and the sum of those durations."""
        r = self._range(now, window)
        if r is None:
            return None
        lo, hi, carried = r
        vs = self._v[lo - 1 if carried else lo : hi]
        ts = self._times(lo, hi, carried, now - window)
        end = min(now, self.last_seen)
        durs = array("d", map(operator.sub, islice(ts, 1, None), ts))
        durs.append(max(0.0, end - ts[-1]))
        return vs, durs, max(0.0, end - ts[-1]) + (ts[-1] - ts[0])

    def constant_until(self, now: float, window: float) -> float:
        """The latest time until which, with no new point (and no revival: REVIVED_AFTER),
        every window function over (now - window, now] returns what it returns at `now`;
        -inf where points inside the window make it move with the clock."""
        if len(self._t) == self._start:
            return math.inf  # nothing yet: None until a first point
        start = now - window
        if self.last_seen < start:
            # None until seen again, and an append after so long a silence is new
            return math.inf if window >= REVIVED_AFTER else -math.inf
        if self._t[-1] <= start:
            # only the value carried in: the same until the window passes the time it
            # was last seen (at that instant rate and avg see no time in the window)
            return math.nextafter(self.last_seen + window, -math.inf)
        return -math.inf

    def values_until(self, now: float, window: float) -> float:
        """constant_until for the functions of the window's values alone, not of how long
        each held (min, max, increase, changes): with no new point they change only when
        a value leaves the window (the window's start passes the point after the one it
        carries in) or nothing is left in it; -inf while points later than `now` wait."""
        n = len(self._t)
        if n == self._start:
            return math.inf
        start = now - window
        if self.last_seen < start:
            return math.inf if window >= REVIVED_AFTER else -math.inf
        if self._t[-1] > now:
            return -math.inf
        lo = bisect.bisect_right(self._t, start, self._start)
        carried = lo - 1 if lo > self._start else lo  # the oldest value the window holds
        until = math.nextafter(self.last_seen + window, -math.inf)
        if carried + 1 < n:
            # at that instant the next point is the one carried in: `carried` leaves
            until = min(until, math.nextafter(self._t[carried + 1] + window, -math.inf))
        return until

    def avg(self, now: float, window: float) -> float | None:
        got = self._durations(now, window)
        if got is None:
            return None
        vs, durs, total = got
        if total == 0 or len(vs) == 1:  # one value: itself, not v * d / d rounded
            return sum(vs) / len(vs)
        return float(sum(map(operator.mul, vs, durs))) / total

    def min(self, now: float, window: float) -> float | None:
        return self._extreme(now, window, True)

    def max(self, now: float, window: float) -> float | None:
        return self._extreme(now, window, False)

    def _extreme(self, now: float, window: float, is_min: bool) -> float | None:
        r = self._range(now, window)
        if r is None:
            return None
        lo, hi, carried = r
        pick = min if is_min else max
        if hi - lo < SLIDING_FROM:
            return pick(self._v[lo - 1 if carried else lo : hi])
        agg = self._sliding_at(
            ("min" if is_min else "max", window),
            lo,
            hi,
            window,
            lambda: SlidingExtreme(self._v, lo, hi, self._base, is_min),
        )
        if agg is None:
            return pick(self._v[lo - 1 if carried else lo : hi])
        assert isinstance(agg, SlidingExtreme)
        inside = agg.value(self._v, self._base)
        assert inside is not None  # hi - lo >= SLIDING_FROM points are inside
        return pick(inside, self._v[lo - 1]) if carried else inside

    def _sliding_at(
        self,
        key: tuple[str, float],
        lo: int,
        hi: int,
        window: float,
        build: Callable[[], SlidingAggregate],
    ) -> SlidingAggregate | None:
        """The aggregate `key` moved to the local points [lo, hi), built when it does not
        exist yet or a rebuild is due. None for a window in the past: the caller answers it
        plainly and the live aggregate stays as it is."""
        if self._sliding is None:
            self._sliding = {}
        base = self._base
        agg = self._sliding.get(key)
        if agg is not None and agg.can_advance(lo + base, hi + base, window, self._t[lo]):
            agg.advance(self._t, self._v, lo + base, hi + base, base)
            return agg
        if agg is not None and hi + base < agg.hi:
            return None
        agg = self._sliding[key] = build()
        return agg

    def increase(self, now: float, window: float) -> float | None:
        """Counter increase over the window; a drop is a reset, counted from zero."""
        vs = self._values(now, window)
        if vs is None:
            return None
        if all(map(operator.le, vs, islice(vs, 1, None))):
            return vs[-1] - vs[0]  # no reset: the common case, without a Python loop
        total = 0.0
        prev = vs[0]
        for v in islice(vs, 1, None):
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
        r = self._range(now, window)
        if r is None:
            return None
        lo, hi, carried = r
        if hi - lo < SLIDING_FROM:
            return self._plain_slope(now, window, lo, hi, carried)
        agg = self._sliding_at(
            ("slope", window),
            lo,
            hi,
            window,
            lambda: SlidingSums(self._t, self._v, lo, hi, self._base),
        )
        if agg is None:
            return self._plain_slope(now, window, lo, hi, carried)
        assert isinstance(agg, SlidingSums)
        n, sx, sy, sxx, sxy = agg.n, agg.sx, agg.sy, agg.sxx, agg.sxy
        extra = []
        if carried:
            extra.append((now - window, self._v[lo - 1]))
        if self.last_seen > self._t[hi - 1]:
            extra.append((min(now, self.last_seen), self._v[hi - 1]))
        for t, v in extra:
            x, y = t - agg.t_ref, v - agg.v_ref
            n += 1
            sx += x
            sy += y
            sxx += x * x
            sxy += x * y
        var = sxx - sx * sx / n
        if var <= 0:
            return None
        return (sxy - sx * sy / n) / var

    def _plain_slope(
        self, now: float, window: float, lo: int, hi: int, carried: bool
    ) -> float | None:
        vs = self._v[lo - 1 if carried else lo : hi]
        ts = self._times(lo, hi, carried, now - window)
        if self.last_seen > ts[-1]:
            ts.append(min(now, self.last_seen))
            vs.append(vs[-1])
        n = len(ts)
        if n < 2:
            return None
        # times shifted to the first point keep the sums well conditioned
        xs = array("d", map(operator.sub, ts, repeat(ts[0], n)))
        st = sum(xs)
        var = float(sum(map(operator.mul, xs, xs))) - st * st / n
        if var <= 0:
            return None
        return (float(sum(map(operator.mul, xs, vs))) - st * sum(vs) / n) / var

    def quantile(self, q: float, now: float, window: float) -> float | None:
        """Time-weighted quantile (0 <= q <= 1) of the value over the window."""
        got = self._durations(now, window)
        if got is None:
            return None
        vs, durs, total = got
        if total == 0:
            vals = sorted(vs)
            return vals[min(len(vals) - 1, int(q * len(vals)))]
        pairs = sorted(zip(vs, durs, strict=True))
        # The total summed in the order acc is, not the window's end minus its start:
        # otherwise rounding can leave acc a hair short of q * total at q = 1 and give a
        # value that held for a time too short to count (1e-94 s of 2050 s).
        total = 0.0
        for _, d in pairs:
            total += d
        acc = 0.0
        for v, d in pairs:
            acc += d
            if acc >= q * total:
                return v
        return max(vs)

    def changes(self, now: float, window: float) -> int | None:
        r = self._range(now, window)
        if r is None:
            return None
        lo, hi, carried = r
        return hi - lo + carried - 1
