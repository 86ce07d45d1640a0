"""MLPerf early stopping (loadgen.stats.early_stopping) against values computed here,
independently, with scipy and plain loops over sorted raw latencies.

MLPerf's rule: each query is a Bernoulli trial, "over the latency" with probability
1 - p. With t queries over, h(t) is the least h such that
P[Binomial(h + t, 1 - p) <= t] < 1 - confidence (confidence 0.99).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from loadgen.stats.early_stopping import (
    CONFIDENCE,
    OrderStatistics,
    binomial_cdf_upper_q,
    count_over,
    min_passing_queries,
    percentile_estimate,
    server_early_stopping,
)
from loadgen.stats.histogram import Histogram

stats = pytest.importorskip("scipy.stats")
binom = stats.binom

MS = 1_000_000


# ----------------------------------------------------------------- independent oracle


def oracle_cdf(h: int, t: int, p: float) -> float:
    """P[X <= t] with X ~ Binomial(h + t, 1 - p)."""
    return float(binom.cdf(t, h + t, 1.0 - p))


def oracle_h(t: int, percentile: float, confidence: float = CONFIDENCE) -> int:
    """Least h >= 1 with P[Binomial(h + t, 1 - p) <= t] < 1 - confidence, by brute force:
    every h in a growing window is evaluated with scipy and the first passing one kept."""
    p = percentile / 100.0
    limit = 1.0 - confidence
    start, width = 1, 4096
    while True:
        hs = np.arange(start, start + width)
        passing = binom.cdf(t, hs + t, 1.0 - p) < limit
        if passing.any():
            return int(hs[np.argmax(passing)])
        start += width
        width *= 2


def oracle_estimate(raw: np.ndarray, percentile: float, confidence: float = CONFIDENCE):
    """MLPerf's SingleStream/MultiStream estimate on raw latencies: t is the largest i with
    n >= h(i) + i (a plain loop from i = 1), and the estimate is sorted[n - t] (0-based).
    Returns (t, estimate) or (None, None) when n < h(1) + 1."""
    ordered = np.sort(raw)
    n = len(ordered)
    if n < oracle_h(1, percentile, confidence) + 1:
        return None, None
    t = 1
    while n >= oracle_h(t + 1, percentile, confidence) + (t + 1):
        t += 1
    return t, int(ordered[n - t])


def histogram_of(values) -> Histogram:
    h = Histogram()
    h.record_array(np.asarray(values, dtype=np.int64))
    return h


# ------------------------------------------------------------------- binomial CDF


@pytest.mark.parametrize("p", [0.5, 0.9, 0.95, 0.99, 0.999])
@pytest.mark.parametrize("t", [0, 1, 2, 7, 40])
def test_binomial_cdf_matches_scipy(p, t):
    for h in (1, 2, 5, 44, 63, 100, 459, 661, 2_000, 20_000):
        got = binomial_cdf_upper_q(h, t, p)
        want = oracle_cdf(h, t, p)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-300), (h, t, p)


def test_binomial_cdf_is_a_probability_that_falls_as_h_grows():
    values = [binomial_cdf_upper_q(h, 3, 0.9) for h in range(1, 400, 7)]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert all(a > b for a, b in zip(values, values[1:]))


# ------------------------------------------------------------ min passing queries


@pytest.mark.parametrize("percentile", [50.0, 90.0, 95.0, 99.0, 99.9])
def test_min_passing_queries_matches_brute_force(percentile):
    for t in (0, 1, 2, 3, 5, 10, 25):
        assert min_passing_queries(t, percentile) == oracle_h(t, percentile), t


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.999])
def test_min_passing_queries_honours_the_confidence(confidence):
    for t in (0, 1, 4):
        assert min_passing_queries(t, 90.0, confidence) == oracle_h(t, 90.0, confidence)


def test_min_passing_queries_is_the_least_passing_h():
    # The defining property, checked on both sides of the answer.
    for percentile in (90.0, 99.0):
        p = percentile / 100
        for t in (0, 1, 6):
            h = min_passing_queries(t, percentile)
            assert oracle_cdf(h, t, p) < 1 - CONFIDENCE
            assert oracle_cdf(h - 1, t, p) >= 1 - CONFIDENCE


def test_known_mlperf_figures():
    # MLPerf Inference's published numbers: p90 needs 44 queries with none over, and
    # SingleStream's p90 estimate needs 64 queries; p99 needs 459, and 662 for the
    # p99 estimate (h(1) + 1).
    assert min_passing_queries(0, 90.0) == 44
    assert min_passing_queries(1, 90.0) + 1 == 64
    assert min_passing_queries(0, 99.0) == 459
    assert min_passing_queries(1, 99.0) + 1 == 662
    assert percentile_estimate(histogram_of([MS] * 63), 90.0).min_queries == 64
    assert percentile_estimate(histogram_of([MS] * 10), 99.0).min_queries == 662


@pytest.mark.parametrize(
    "t, percentile", [(-1, 90.0), (0, 0.0), (0, 100.0), (0, -5.0), (1, 150.0)]
)
def test_min_passing_queries_rejects_bad_arguments(t, percentile):
    with pytest.raises(ValueError):
        min_passing_queries(t, percentile)


# ------------------------------------------------------ SingleStream / MultiStream


LATENCY_SETS = {
    # name -> (generator of raw latencies in ns)
    "lognormal": lambda rng, n: np.rint(rng.lognormal(np.log(2 * MS), 0.4, n)).astype(np.int64),
    "uniform": lambda rng, n: rng.integers(100_000, 50 * MS, n),
    "bimodal": lambda rng, n: np.where(rng.random(n) < 0.97, rng.integers(MS, 2 * MS, n),
                                       rng.integers(20 * MS, 90 * MS, n)),
    "ties": lambda rng, n: rng.choice(np.array([MS, 3 * MS, 7 * MS]), n),
}


@pytest.mark.parametrize("kind", sorted(LATENCY_SETS))
@pytest.mark.parametrize(
    "percentile, n",
    [(90.0, 64), (90.0, 65), (90.0, 100), (90.0, 1_000), (90.0, 4_321), (99.0, 662), (99.0, 2_500),
     (95.0, 777), (50.0, 40)],
)
def test_percentile_estimate_matches_mlperf_rule_on_raw_latencies(kind, percentile, n):
    rng = np.random.default_rng(zlib.crc32(f"{kind}/{percentile}/{n}".encode()))
    raw = LATENCY_SETS[kind](rng, n)
    h = histogram_of(raw)
    t, value = oracle_estimate(raw, percentile)
    got = percentile_estimate(h, percentile)
    assert got.passed
    assert got.queries == n
    assert got.min_queries == oracle_h(1, percentile) + 1
    assert got.overlatency == t
    # The histogram keeps values to bucket precision: the estimate is the raw value's
    # bucket, so it lies within that bucket's equivalent range.
    assert h.lowest_equivalent_value(value) <= got.estimate_ns <= h.highest_equivalent_value(value)
    assert f"{t - 1} highest latencies of {n}" in got.message


def test_percentile_estimate_at_the_minimum_is_the_maximum_latency():
    # With exactly h(1) + 1 queries t = 1, so the estimate is sorted[n - 1], the largest.
    raw = np.arange(1, 65, dtype=np.int64) * 100_000
    got = percentile_estimate(histogram_of(raw), 90.0)
    assert got.passed and got.overlatency == 1
    h = histogram_of(raw)
    assert h.lowest_equivalent_value(int(raw[-1])) <= got.estimate_ns <= h.highest_equivalent_value(int(raw[-1]))


@pytest.mark.parametrize("percentile, n", [(90.0, 63), (90.0, 1), (99.0, 661), (99.0, 100)])
def test_percentile_estimate_too_few_queries_fails_and_says_how_many(percentile, n):
    got = percentile_estimate(histogram_of(np.full(n, MS)), percentile)
    needed = oracle_h(1, percentile) + 1
    assert not got.passed
    assert got.estimate_ns is None
    assert got.queries == n and got.min_queries == needed
    assert f"only {n} queries" in got.message and str(needed) in got.message


def test_percentile_estimate_of_an_empty_histogram_fails():
    got = percentile_estimate(Histogram(), 90.0)
    assert not got.passed and got.queries == 0 and got.estimate_ns is None


def test_percentile_estimate_is_at_least_the_plain_percentile():
    # The estimate is a confident upper bound: never below the sample percentile.
    rng = np.random.default_rng(5)
    raw = LATENCY_SETS["lognormal"](rng, 3_000)
    h = histogram_of(raw)
    for percentile in (90.0, 99.0):
        assert percentile_estimate(h, percentile).estimate_ns >= h.value_at_percentile(percentile)


def test_percentile_estimate_as_dict_has_the_documented_keys():
    d = percentile_estimate(histogram_of(np.full(100, MS)), 90.0).as_dict()
    assert set(d) == {"percentile", "queries", "min_queries", "overlatency_queries", "passed",
                      "estimate_ns", "message"}
    assert d["percentile"] == 90.0 and d["queries"] == 100 and d["passed"] is True


# ------------------------------------------------------------------------- Server


def server_histogram(under: int, over: int, bound_ns: int) -> Histogram:
    """`under` latencies at or below half the bound and `over` at twice it or more, so
    that bucket precision cannot blur which side of the bound a value is on."""
    rng = np.random.default_rng(under * 7919 + over)
    low = rng.integers(bound_ns // 10, bound_ns // 2, under)
    high = rng.integers(2 * bound_ns, 5 * bound_ns, over)
    return histogram_of(np.concatenate([low, high]))


BOUND = 10 * MS


def server_verdict(h: Histogram, queries: int, percentile: float):
    """The Server verdict with the overlatency count taken from the histogram."""
    return server_early_stopping(
        queries=queries, overlatency_count=count_over(h, BOUND), p=percentile / 100
    )


@pytest.mark.parametrize("percentile", [90.0, 99.0])
@pytest.mark.parametrize("over", [0, 1, 3, 12])
def test_server_verdict_flips_exactly_at_h_of_t_plus_t(percentile, over):
    needed = oracle_h(over, percentile) + over
    for queries, expect in ((needed, True), (needed - 1, False), (needed + 50, True)):
        h = server_histogram(queries - over, over, BOUND)
        got = server_verdict(h, queries, percentile)
        assert got.overlatency == over
        assert got.passed is expect, (queries, needed)
        assert got.queries == queries
        assert got.min_queries == oracle_h(0, percentile)
        assert got.estimate_ns is None
        if expect:
            assert "early stopping met" in got.message and got.more_queries_needed == 0
        else:
            assert "not met" in got.message
            assert f"at least {needed - queries} more queries" in got.message
            assert got.more_queries_needed == needed - queries


def test_server_uses_the_issued_count_not_the_histogram_count():
    # Failed queries have no latency but were issued: the verdict counts them.
    h = server_histogram(400, 0, BOUND)
    assert not server_verdict(h, 400, 99.0).passed
    assert server_verdict(h, 459, 99.0).passed


def test_server_counts_only_latencies_over_the_bound():
    # 1,000 values whose bucket lies wholly at or below the bound vs 5 well over.
    h = histogram_of([BOUND])
    at_bound = h.lowest_equivalent_value(BOUND) - 1
    h = histogram_of(np.concatenate([np.full(1_000, at_bound), np.full(5, 3 * BOUND)]))
    got = server_verdict(h, 1_005, 99.0)
    assert got.overlatency == 5
    assert got.passed is (1_005 >= oracle_h(5, 99.0) + 5)


def test_count_over_counts_a_bucket_straddling_the_bound_as_over():
    # The fallback's one rule: a latency is over when its reported value (the top of its
    # bucket, capped at the exact maximum) is, as the reported percentiles say.
    h = histogram_of(np.concatenate([np.full(10, BOUND), np.full(2, 3 * BOUND)]))
    assert h.highest_equivalent_value(BOUND) > BOUND
    assert count_over(h, BOUND) == 12
    assert OrderStatistics(h).at(0) > BOUND
    # ...unless the exact maximum shows that no value in the bucket is over.
    assert count_over(histogram_of(np.full(10, BOUND)), BOUND) == 0
    assert count_over(histogram_of([BOUND + 1]), BOUND) == 1
    assert count_over(Histogram(), BOUND) == 0


def test_server_verdict_takes_the_exact_count_as_given():
    # The count is passed in, not derived: an exact count the engine kept wins.
    assert server_early_stopping(queries=459, overlatency_count=0, p=0.99).passed
    got = server_early_stopping(queries=459, overlatency_count=1, p=0.99)
    assert not got.passed and got.overlatency == 1
    assert got.more_queries_needed == oracle_h(1, 99.0) + 1 - 459


def test_server_known_figure_p99_all_under_needs_459():
    h = server_histogram(459, 0, BOUND)
    assert server_verdict(h, 459, 99.0).passed
    h = server_histogram(458, 0, BOUND)
    got = server_verdict(h, 458, 99.0)
    assert not got.passed and "at least 1 more" in got.message


def test_rank_over_bound_agrees_with_sorting_the_values():
    from loadgen.stats.early_stopping import rank_over_bound

    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        values = np.sort(rng.integers(0, 20, n))
        bound = int(rng.integers(0, 20))
        over = int(np.sum(values > bound))
        for rank in range(1, n + 1):
            assert rank_over_bound(n, over, rank) == bool(values[rank - 1] > bound), (values, bound, rank)
    assert rank_over_bound(0, 0, 1) is False
