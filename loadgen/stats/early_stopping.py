"""MLPerf's early stopping: the one implementation behind ``loadgen run`` and ``loadgen.mlperf``.

MLPerf Inference treats each query as a Bernoulli trial: "over the latency" or not. With
``t`` overlatency queries, the run supports the claim "the true quantile q is met" at
confidence c when at least ``h(t)`` queries were under it, where ``h(t)`` is the least h
for which P[Binomial(h + t, 1 - q) <= t] < 1 - c (MLPerf uses c = 0.99 and no tolerance).

- Server (:func:`server_early_stopping`): t is the number of queries above the latency
  bound, passed in; the run passes early stopping when ``queries >= h(t) + t``.
- SingleStream/MultiStream (:func:`estimate_early_stopping`): the estimate is the latency
  such that the claim holds: with t the largest count for which ``queries >= h(t) + t``,
  it is the (queries - t + 1)-th smallest latency (MLPerf: ``sorted[queries - t]``).

Latencies come from an HDR histogram, read through :class:`OrderStatistics`: the value
reported for a rank is the highest value of the bucket holding it, capped at the exact
largest latency (so the top rank is exact) and floored at the exact smallest. Quantiles
are fractions (0.99) in the core functions, as MLPerf's settings give them; the
``percentile`` arguments of :func:`min_passing_queries` and :func:`percentile_estimate`
are percents (99.0), as ``loadgen run`` takes them.

The Server overlatency count should be exact, counted at record time. Until the engine
counts it, :func:`count_over` derives it from the histogram with the same rule as the
reported values (a latency is over when its reported value is), and every caller passes
its count to :func:`server_early_stopping` as ``overlatency_count``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Dict, Optional, Union

from loadgen.stats.histogram import Histogram
from loadgen.units import ns_to_ms

__all__ = [
    "CONFIDENCE",
    "EarlyStoppingResult",
    "OrderStatistics",
    "binomial_cdf_upper_q",
    "count_over",
    "rank_over_bound",
    "estimate_early_stopping",
    "largest_passing_overlatency",
    "min_passing_queries",
    "min_passing_queries_fraction",
    "percentile_estimate",
    "server_early_stopping",
]

CONFIDENCE = 0.99


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _beta_continued_fraction(x: float, a: float, b: float) -> float:
    # Lentz's method for the continued fraction of the incomplete beta function.
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(a * math.log(x) + b * math.log1p(-x) - _log_beta(a, b))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(x, a, b) / a
    return 1.0 - front * _beta_continued_fraction(1.0 - x, b, a) / b


def binomial_cdf_upper_q(h: int, t: int, p: float) -> float:
    """P[at most t of h + t queries are over the latency], each over with probability 1 - p.

    Equals I_p(h, t + 1).
    """
    return regularized_beta(p, h, t + 1)


def min_passing_queries(t: int, percentile: float, confidence: float = CONFIDENCE) -> int:
    """h(t) for a percentile given in percent (90.0); see :func:`min_passing_queries_fraction`."""
    return min_passing_queries_fraction(t, percentile / 100.0, confidence)


@lru_cache(maxsize=65536)
def min_passing_queries_fraction(t: int, p: float, confidence: float = CONFIDENCE) -> int:
    """MLPerf's h(t): the fewest under-latency queries that let ``t`` overlatency ones pass.

    Args:
        t: queries over the latency (>= 0).
        p: the quantile, a fraction strictly between 0 and 1 (0.9 for the 90th percentile).
        confidence: the confidence of the claim (MLPerf: 0.99).

    Returns:
        The least h >= 1 with P[Binomial(h + t, 1 - p) <= t] < 1 - confidence.

    Raises:
        ValueError: ``t`` is negative or ``p`` is not strictly between 0 and 1.
    """
    t = int(t)
    if t < 0:
        raise ValueError(f"overlatency count must be >= 0, got {t}")
    if not 0.0 < p < 1.0:
        raise ValueError(f"percentile must be in (0, 100), got {p * 100}")
    limit = 1.0 - confidence
    lo, hi = 1, max(2, int(math.ceil(math.log(limit) / math.log(p))) + 1)
    while binomial_cdf_upper_q(hi, t, p) >= limit:  # grow until it passes
        lo, hi = hi, hi * 2
    while lo < hi:  # least passing h in [lo, hi]
        mid = (lo + hi) // 2
        if binomial_cdf_upper_q(mid, t, p) < limit:
            hi = mid
        else:
            lo = mid + 1
    return lo


def largest_passing_overlatency(queries: int, p: float, confidence: float = CONFIDENCE) -> int:
    """The largest t with ``queries >= h(t) + t``, given that t = 1 qualifies."""
    lo, hi = 1, max(1, queries - 1)
    while lo < hi:  # h(t) + t grows with t, so bisect
        mid = (lo + hi + 1) // 2
        if queries >= min_passing_queries_fraction(mid, p, confidence) + mid:
            lo = mid
        else:
            hi = mid - 1
    return lo


# ------------------------------------------------------------------ order statistics


class OrderStatistics:
    """Order statistics of a histogram's values, to the precision of its buckets.

    The value at a rank is the highest value of the bucket holding it, capped at the
    exact largest value and floored at the exact smallest.

    Attributes:
        count: values recorded.
        min / max: the exact smallest and largest values (0 when empty).
    """

    __slots__ = ("_cumulative", "_highest", "count", "max", "min")

    def __init__(self, histogram: Optional[Histogram]) -> None:
        import numpy as np

        self.count = 0 if histogram is None else int(histogram.total_count)
        self.min = self.max = 0
        if histogram is not None and self.count:
            self.min = histogram.exact_min
            self.max = histogram.exact_max
            _, highest, counts = histogram.recorded_buckets()
            self._highest = np.minimum(np.asarray(highest, dtype=np.int64), self.max)
            self._cumulative = np.cumsum(np.asarray(counts, dtype=np.int64))

    def at(self, index: int) -> int:
        """The value at 0-based ``index`` of the sorted values (clamped into range)."""
        import numpy as np

        if not self.count:
            return 0
        rank = min(max(int(index), 0), self.count - 1) + 1
        i = int(np.searchsorted(self._cumulative, rank, side="left"))
        return max(int(self._highest[i]), self.min)

    def count_at_or_under(self, bound_ns: int) -> int:
        """How many values are at or under ``bound_ns``, to bucket precision."""
        import numpy as np

        first_over = int(np.searchsorted(self._highest, int(bound_ns), side="right"))
        return int(self._cumulative[first_over - 1]) if first_over > 0 else 0


def rank_over_bound(count: int, over: int, rank: int) -> bool:
    """Whether the ``rank``-th smallest (1-based, clamped into 1..count) of ``count``
    values is over a bound that ``over`` of them exceed: exactly when at least
    ``count - rank + 1`` values are over it. The one rule by which a percentile is judged
    against a bound from an exact over-bound count; callers differ only in which rank
    their percentile means."""
    if count <= 0:
        return False
    return over >= count - min(max(rank, 1), count) + 1


def count_over(latency: Union[Histogram, OrderStatistics, None], bound_ns: int) -> int:
    """How many latencies are over ``bound_ns``, to bucket precision (the fallback).

    A latency counts as over when its reported value (:class:`OrderStatistics`) is: the
    top of its bucket, capped at the exact maximum, is above the bound. A bucket that
    straddles the bound therefore counts as over (at 3 significant figures it spans at
    most 0.1% of the bound), so the count agrees with the reported percentiles. Where the
    engine counts queries over the bound exactly at record time, pass that count to
    :func:`server_early_stopping` instead.
    """
    view = latency if isinstance(latency, OrderStatistics) else OrderStatistics(latency)
    if not view.count:
        return 0
    return view.count - view.count_at_or_under(bound_ns)


# -------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class EarlyStoppingResult:
    """An early-stopping verdict or estimate.

    Attributes:
        percentile: the percentile the estimate is for (e.g. 90.0).
        queries: queries the estimate is based on.
        min_queries: least number of queries early stopping can work with.
        overlatency: queries allowed/found above the estimate or bound (t).
        more_queries_needed: Server: queries, all under the bound, still needed to pass
            (0 when passed).
        passed: True when there were enough queries (and, for Server, the bound held).
        estimate_ns: the early-stopping latency estimate (None for Server).
        message: a sentence a user understands.
    """

    percentile: float
    queries: int
    min_queries: int
    overlatency: int
    passed: bool
    estimate_ns: Optional[int]
    message: str
    more_queries_needed: int = 0

    def as_dict(self) -> Dict[str, Any]:
        return {
            "percentile": self.percentile,
            "queries": self.queries,
            "min_queries": self.min_queries,
            "overlatency_queries": self.overlatency,
            "passed": self.passed,
            "estimate_ns": self.estimate_ns,
            "message": self.message,
        }


def estimate_early_stopping(
    latency: OrderStatistics, queries: int, p: float, confidence: float = CONFIDENCE
) -> EarlyStoppingResult:
    """SingleStream/MultiStream: the early-stopping estimate of the ``p`` quantile.

    Args:
        latency: the latencies (query latencies for MultiStream).
        queries: queries the estimate is based on (MLPerf: queries issued).
        p: the quantile, a fraction (0.9).
        confidence: the confidence of the claim.

    Returns:
        The estimate (``estimate_ns``; None and ``passed`` False when fewer than
        ``min_queries`` queries ran) and t (``overlatency``).
    """
    percentile = p * 100
    min_queries = min_passing_queries_fraction(1, p, confidence) + 1
    if queries < min_queries:
        return EarlyStoppingResult(
            percentile, queries, min_queries, 0, False, None,
            f"only {queries} queries; early stopping needs at least {min_queries} for the "
            f"p{percentile:g} estimate",
        )
    t = largest_passing_overlatency(queries, p, confidence)
    estimate = latency.at(queries - t)
    return EarlyStoppingResult(
        percentile, queries, min_queries, t, True, estimate,
        f"early-stopping p{percentile:g} estimate {ns_to_ms(estimate):.3f} ms "
        f"(would discard the {t - 1} highest latencies of {queries})",
    )


def percentile_estimate(
    latency: Histogram, percentile: float, confidence: float = CONFIDENCE
) -> EarlyStoppingResult:
    """:func:`estimate_early_stopping` over every recorded latency, percentile in percent."""
    return estimate_early_stopping(
        OrderStatistics(latency), latency.total_count, percentile / 100.0, confidence
    )


def server_early_stopping(
    *, queries: int, overlatency_count: int, p: float, confidence: float = CONFIDENCE
) -> EarlyStoppingResult:
    """Server: whether enough queries ran for the latency bound to hold at quantile ``p``.

    Args:
        queries: queries issued (failed ones included: they were trials too).
        overlatency_count: t, the queries over the latency bound: the engine's exact
            count where it keeps one, else :func:`count_over` (the bucket fallback).
        p: the quantile, a fraction (0.99).
        confidence: the confidence of the claim.

    Returns:
        The verdict; ``more_queries_needed`` says how far a failed run fell short.
    """
    t = int(overlatency_count)
    needed = min_passing_queries_fraction(t, p, confidence) + t
    passed = queries >= needed
    if passed:
        message = f"early stopping met: {t} of {queries} queries over the bound"
    else:
        message = (
            f"early stopping not met: {t} of {queries} queries over the bound; at least "
            f"{needed - queries} more queries, all under the bound, would be needed"
        )
    return EarlyStoppingResult(
        p * 100, queries, min_passing_queries_fraction(0, p, confidence), t, passed, None,
        message, 0 if passed else needed - queries,
    )
