"""MLPerf's early-stopping estimates, computed from a latency histogram.

MLPerf Inference treats each query as a Bernoulli trial: "over the latency" or not. With
``t`` overlatency queries, the run supports the claim "the true percentile p is met" at
confidence c when at least ``h(t)`` queries were under it, where ``h(t)`` is the least h
for which P[Binomial(h + t, 1 - p) <= t] < 1 - c (MLPerf uses c = 0.99 and no tolerance).

- Server: t is the number of queries above the latency bound; the run passes early
  stopping when ``queries >= h(t) + t``.
- SingleStream/MultiStream: the estimate is the latency such that the claim holds: with
  t the largest count for which ``queries >= h(t) + t``, it is the (queries - t + 1)-th
  smallest latency (MLPerf: ``sorted[queries - t]``, 0-based).

Latencies come from an HDR histogram, so ranks resolve to bucket precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from loadgen.stats.histogram import Histogram

__all__ = [
    "EarlyStoppingResult",
    "binomial_cdf_upper_q",
    "min_passing_queries",
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
    """Least h with P[Binomial(h + t, 1 - p) <= t] < 1 - confidence (p = percentile/100)."""
    if t < 0:
        raise ValueError(f"overlatency count must be >= 0, got {t}")
    return min_passing_queries_fraction(t, percentile / 100.0, confidence)


def min_passing_queries_fraction(t: int, p: float, confidence: float = CONFIDENCE) -> int:
    """min_passing_queries with the percentile as a fraction ``p`` in (0, 1)."""
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


@dataclass(frozen=True)
class EarlyStoppingResult:
    """An early-stopping verdict or estimate.

    Attributes:
        percentile: the percentile the estimate is for (e.g. 90.0).
        queries: queries the estimate is based on.
        min_queries: least number of queries early stopping can work with.
        overlatency: queries allowed/found above the estimate or bound (t).
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

    def as_dict(self) -> dict:
        return {
            "percentile": self.percentile,
            "queries": self.queries,
            "min_queries": self.min_queries,
            "overlatency_queries": self.overlatency,
            "passed": self.passed,
            "estimate_ns": self.estimate_ns,
            "message": self.message,
        }


def _value_at_rank(h: Histogram, rank: int) -> int:
    """The rank-th smallest value (1-based), to bucket precision."""
    lowest, highest, counts = h.recorded_buckets()
    cumulative = np.cumsum(counts)
    i = int(np.searchsorted(cumulative, rank, side="left"))
    return int(highest[min(i, len(highest) - 1)])


def percentile_estimate(
    latency: Histogram, percentile: float, confidence: float = CONFIDENCE
) -> EarlyStoppingResult:
    """SingleStream/MultiStream: the early-stopping estimate of a latency percentile."""
    n = latency.total_count
    min_queries = min_passing_queries(1, percentile, confidence) + 1
    if n < min_queries:
        return EarlyStoppingResult(
            percentile, n, min_queries, 0, False, None,
            f"only {n} queries; early stopping needs at least {min_queries} for the "
            f"p{percentile:g} estimate",
        )
    # The largest t with n >= h(t) + t; h(t) + t grows with t, so bisect.
    lo, hi = 1, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if n >= min_passing_queries(mid, percentile, confidence) + mid:
            lo = mid
        else:
            hi = mid - 1
    t = lo
    estimate = _value_at_rank(latency, n - t + 1)
    return EarlyStoppingResult(
        percentile, n, min_queries, t, True, estimate,
        f"early-stopping p{percentile:g} estimate {estimate / 1e6:.3f} ms "
        f"(would discard the {t - 1} highest latencies of {n})",
    )


def server_early_stopping(
    latency: Histogram, queries: int, bound_ns: int, percentile: float,
    confidence: float = CONFIDENCE,
) -> EarlyStoppingResult:
    """Server: whether enough queries ran for the latency bound to hold at ``percentile``.

    Queries above the bound are counted to bucket precision: a bucket counts as over
    when its lowest value exceeds the bound.
    """
    first_over = latency.highest_equivalent_value(bound_ns) + 1
    t = latency.count_between(first_over, latency.max) if latency.max >= first_over else 0
    h = min_passing_queries(t, percentile, confidence)
    passed = queries >= h + t
    if passed:
        message = f"early stopping met: {t} of {queries} queries over the bound"
    else:
        message = (
            f"early stopping not met: {t} of {queries} queries over the bound; at least "
            f"{h + t - queries} more queries, all under the bound, would be needed"
        )
    return EarlyStoppingResult(
        percentile, queries, min_passing_queries(0, percentile, confidence), t, passed, None, message
    )
