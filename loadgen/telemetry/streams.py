"""Bounded-memory aggregates of sampled telemetry.

A day of sampling at 100 ms is 864,000 readings per metric and device. Nothing here keeps
them all: :class:`StreamStats` keeps exact min, max and mean and an HDR histogram for the
percentiles, :class:`BinnedSeries` keeps a time series of (sum, count, max) points that
halves its resolution when it is full, and :class:`CounterSeries` keeps (time, value)
points of a monotonic counter the same way. Their memory is fixed at construction.
"""

from __future__ import annotations

import bisect
import math
from array import array
from typing import Any, Dict, List, Optional, Tuple

from loadgen.stats.histogram import Histogram

__all__ = ["BinnedSeries", "CounterSeries", "StreamStats", "DEFAULT_MAX_POINTS", "bin_mean"]

#: Points a series keeps before it halves its resolution: 100 ms sampling keeps every
#: reading for 54 minutes, then 200 ms points for the next 54, and so on.
DEFAULT_MAX_POINTS = 1 << 15

_HDR_TOP = 1 << 50  # 1 PiB in bytes: beyond every reading
_HDR_DIGITS = 3


class StreamStats:
    """Streaming statistics of non-negative readings: exact ``min``, ``max`` and ``mean``;
    ``p50`` and ``p99`` from an HDR histogram of ``round(value * scale)`` at 3 significant
    digits (exact for scaled values below 2048, within 0.1% above), clamped to
    [min, max].

    Args:
        scale: multiplier that turns a reading into the integer the histogram records
            (1000 records watts as milliwatts).
        highest: the largest scaled value the histogram tells apart (larger ones are
            recorded as this; min, max and mean stay exact); its memory grows with the
            logarithm of it (about 32 KB at 2^12, 350 KB at 2^50).
    """

    __slots__ = ("scale", "highest", "n", "total", "low", "high", "_hist")

    def __init__(self, scale: float = 1.0, highest: int = _HDR_TOP) -> None:
        self.scale = scale
        self.highest = highest
        self.n = 0
        self.total = 0.0
        self.low = math.inf
        self.high = -math.inf
        self._hist = Histogram(lowest_discernible_value=1, highest_trackable_value=highest,
                               significant_figures=_HDR_DIGITS)

    def add(self, value: float) -> None:
        """Adds one reading (a NaN is ignored)."""
        if value != value:  # NaN
            return
        self.n += 1
        self.total += value
        if value < self.low:
            self.low = value
        if value > self.high:
            self.high = value
        self._hist.record(min(max(int(round(value * self.scale)), 0), self.highest))

    def summary(self) -> Dict[str, float]:
        """``{min, mean, max, p50, p99, n}``; ``{"n": 0}`` when nothing was added."""
        if not self.n:
            return {"n": 0}
        return {
            "min": self.low,
            "mean": self.total / self.n,
            "max": self.high,
            "p50": self._percentile(50.0),
            "p99": self._percentile(99.0),
            "n": self.n,
        }

    def section(self, unsupported: Optional[str]) -> Dict[str, Any]:
        """:meth:`summary` as a result section, or ``{"supported": False, "why": ...}``
        when the metric is not supported (``unsupported`` says why)."""
        if unsupported:
            return {"supported": False, "why": unsupported}
        return dict(self.summary())

    def _percentile(self, p: float) -> float:
        value = self._hist.value_at_percentile(p) / self.scale
        return min(max(value, self.low), self.high)


class BinnedSeries:
    """A time series of readings kept as points of (first time, last time, sum, count,
    max), at most ``max_points`` of them. While there is room every reading is its own
    point; when full, neighbouring points are merged in pairs and each later point takes
    twice as many readings, so memory stays fixed and resolution halves.

    Readings must come in time order (as a sampler produces them).
    """

    __slots__ = ("max_points", "_t0", "_t1", "_sum", "_count", "_max", "_per_point", "_in_last")

    def __init__(self, max_points: int = DEFAULT_MAX_POINTS) -> None:
        if max_points < 2:
            raise ValueError(f"max_points must be >= 2; got {max_points}")
        self.max_points = max_points
        self._t0 = array("q")
        self._t1 = array("q")
        self._sum = array("d")
        self._count = array("q")
        self._max = array("d")
        self._per_point = 1  # readings a new point takes before the next one starts
        self._in_last = 0  # readings in the last point so far

    def __len__(self) -> int:
        return len(self._t0)

    @property
    def readings_per_point(self) -> int:
        """How many readings one point takes now (1 until the series first filled)."""
        return self._per_point

    def add(self, t_ns: int, value: float) -> None:
        """Adds a reading taken at ``t_ns``."""
        if self._t0 and self._in_last < self._per_point:
            i = len(self._t0) - 1
            self._t1[i] = t_ns
            self._sum[i] += value
            self._count[i] += 1
            self._max[i] = max(self._max[i], value)
            self._in_last += 1
            return
        if len(self._t0) >= self.max_points:
            self._halve()
        self._t0.append(t_ns)
        self._t1.append(t_ns)
        self._sum.append(value)
        self._count.append(1)
        self._max.append(value)
        self._in_last = 1

    def _halve(self) -> None:
        n = len(self._t0) // 2 * 2
        t0, t1, s, c, m = array("q"), array("q"), array("d"), array("q"), array("d")
        for i in range(0, n, 2):
            t0.append(self._t0[i])
            t1.append(self._t1[i + 1])
            s.append(self._sum[i] + self._sum[i + 1])
            c.append(self._count[i] + self._count[i + 1])
            m.append(max(self._max[i], self._max[i + 1]))
        if n < len(self._t0):  # an odd point out: kept as it is
            t0.append(self._t0[n])
            t1.append(self._t1[n])
            s.append(self._sum[n])
            c.append(self._count[n])
            m.append(self._max[n])
        self._t0, self._t1, self._sum, self._count, self._max = t0, t1, s, c, m
        self._per_point *= 2
        self._in_last = self._per_point  # the next reading starts a new point

    def bins(self, start_ns: int, interval_ns: int, n: int) -> List[Tuple[int, float, float]]:
        """(count, sum, max) of the readings in each of ``n`` intervals
        [start + i * interval, start + (i + 1) * interval); a point falls where its
        middle time does. An interval with no reading has count 0."""
        out: List[List[float]] = [[0, 0.0, -math.inf] for _ in range(n)]
        for i in range(len(self._t0)):
            mid = (self._t0[i] + self._t1[i]) // 2
            k = (mid - start_ns) // interval_ns
            if 0 <= k < n:
                b = out[k]
                b[0] += self._count[i]
                b[1] += self._sum[i]
                b[2] = max(b[2], self._max[i])
        return [(int(c), s, m) for c, s, m in out]


class CounterSeries:
    """(time, value) points of a non-decreasing counter (an energy counter in mJ), at
    most ``max_points``: when full, every other point is dropped (the first and last
    stay), which keeps linear interpolation between points valid.
    """

    __slots__ = ("max_points", "_t", "_v")

    def __init__(self, max_points: int = DEFAULT_MAX_POINTS) -> None:
        if max_points < 3:
            raise ValueError(f"max_points must be >= 3; got {max_points}")
        self.max_points = max_points
        self._t = array("q")
        self._v = array("d")

    def __len__(self) -> int:
        return len(self._t)

    def add(self, t_ns: int, value: float) -> None:
        """Adds a reading of the counter taken at ``t_ns`` (time order)."""
        if len(self._t) >= self.max_points:
            last_t, last_v = self._t[-1], self._v[-1]
            self._t = self._t[:-1:2]
            self._v = self._v[:-1:2]
            self._t.append(last_t)
            self._v.append(last_v)
        self._t.append(t_ns)
        self._v.append(value)

    def last(self) -> Optional[Tuple[int, float]]:
        """The newest (time, value) reading, or None."""
        return (self._t[-1], self._v[-1]) if self._t else None

    def at(self, t_ns: int) -> Optional[float]:
        """The counter at ``t_ns``, linearly interpolated; None outside the readings."""
        if not self._t or t_ns < self._t[0] or t_ns > self._t[-1]:
            return None
        i = bisect.bisect_left(self._t, t_ns)
        if self._t[i] == t_ns:
            return self._v[i]
        t0, t1, v0, v1 = self._t[i - 1], self._t[i], self._v[i - 1], self._v[i]
        return v0 + (v1 - v0) * (t_ns - t0) / (t1 - t0)

    def delta(self, a_ns: int, b_ns: int) -> Optional[float]:
        """How much the counter grew over [a, b] where readings cover it: the part of
        [a, b] inside the first and last reading; None when they do not overlap (or
        touch at one point only)."""
        if not self._t:
            return None
        lo, hi = max(a_ns, self._t[0]), min(b_ns, self._t[-1])
        if lo >= hi:
            return None
        va, vb = self.at(lo), self.at(hi)
        assert va is not None and vb is not None
        return vb - va


def bin_mean(b: Tuple[int, float, float]) -> Optional[float]:
    """The mean of a :class:`BinnedSeries` bin ``(count, sum, max)``; None when empty."""
    return b[1] / b[0] if b[0] else None
