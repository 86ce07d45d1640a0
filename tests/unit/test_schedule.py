"""Properties of the native arrival schedules and sample orders (loadgen._core.ArrivalSchedule
and loadgen._core.SampleSelector), drawn directly: no engine threads, no clock."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen import _core

scipy_stats = pytest.importorskip("scipy.stats")

Stage = _core.Stage
Order = _core.SampleOrder
SEC = 1_000_000_000


def stages(spec, poisson=False, seed=0):
    """spec: [(duration_s, start_qps, end_qps)] -> an ArrivalSchedule."""
    return _core.ArrivalSchedule.stages(
        [Stage(int(round(d * SEC)), float(a), float(b)) for d, a, b in spec], poisson, seed
    )


def per_stage_counts(offsets, spec):
    """How many offsets fall in each stage's half-open window [start, end)."""
    edges = np.concatenate([[0], np.cumsum([int(round(d * SEC)) for d, _, _ in spec])])
    idx = np.searchsorted(offsets, edges, side="left")
    return np.diff(idx), edges


# ------------------------------------------------------------------ Poisson


@pytest.mark.parametrize("qps,seed", [(1000.0, 1), (1000.0, 2), (37_500.0, 7), (3.5, 123)])
def test_poisson_gaps_are_exponential_at_the_set_rate(qps, seed):
    offsets = _core.ArrivalSchedule.poisson(qps, seed).take(200_001)
    gaps = np.diff(offsets).astype(np.float64)
    assert offsets[0] == 0
    assert (gaps >= 0).all()
    # Offsets are rounded to whole ns; at these rates the mean gap is >= 26 us, so the
    # rounding moves the empirical CDF by < 1e-4, far below the KS resolution at n=2e5.
    result = scipy_stats.kstest(gaps, "expon", args=(0, 1e9 / qps))
    assert result.pvalue > 0.001, (qps, seed, result)


def test_poisson_gaps_fail_ks_against_a_wrong_rate():
    # The KS check above has teeth: 2% off in rate is detected at n = 2e5.
    gaps = np.diff(_core.ArrivalSchedule.poisson(1000.0, 1).take(200_001)).astype(np.float64)
    assert scipy_stats.kstest(gaps, "expon", args=(0, 1e9 / 1020.0)).pvalue < 0.001


@pytest.mark.parametrize("qps,seed", [(1000.0, 0), (250_000.0, 99)])
def test_poisson_realised_rate_over_a_million_arrivals_is_within_1_percent(qps, seed):
    n = 1_000_001
    offsets = _core.ArrivalSchedule.poisson(qps, seed).take(n)
    assert len(offsets) == n
    # Sum of 1e6 exponential gaps: relative sd 1e-3, so 1% is a 10-sigma bound.
    realised = (n - 1) / (offsets[-1] / 1e9)
    assert realised == pytest.approx(qps, rel=0.01)


def test_poisson_offsets_are_non_decreasing():
    offsets = _core.ArrivalSchedule.poisson(5e6, 3).take(100_000)
    assert (np.diff(offsets) >= 0).all()


# ----------------------------------------------------------------- constant


@pytest.mark.parametrize("qps", [3000, 7, 12345, 1])
def test_constant_gaps_are_floor_or_ceil_of_the_period(qps):
    offsets = _core.ArrivalSchedule.constant(float(qps)).take(200_000)
    gaps = np.diff(offsets)
    lo, hi = math.floor(1e9 / qps), math.ceil(1e9 / qps)
    assert set(np.unique(gaps).tolist()) <= {lo, hi}


@pytest.mark.parametrize("qps", [3000, 7, 12345])
def test_constant_offsets_never_drift(qps):
    # Offset k is round(k * 1e9 / qps), computed exactly in integers. These rates have
    # an odd reduced denominator, so no exact .5 ties (where rounding rules differ).
    n = 1_000_000
    offsets = _core.ArrivalSchedule.constant(float(qps)).take(n)
    k = np.arange(n, dtype=np.int64)
    expected = [(2 * int(i) * SEC + qps) // (2 * qps) for i in (0, 1, n // 3, n - 2, n - 1)]
    assert offsets[[0, 1, n // 3, n - 2, n - 1]].tolist() == expected
    # All of them, in exact integer arithmetic (k * 1e9 fits in int64 for k < 1e6).
    exact = (2 * k * SEC + qps) // (2 * qps)
    np.testing.assert_array_equal(offsets, exact)


def test_constant_schedule_is_unbounded_and_resumes_where_it_stopped():
    s = _core.ArrivalSchedule.constant(1000.0)
    first = s.take(10)
    second = s.take(10)
    np.testing.assert_array_equal(np.concatenate([first, second]), np.arange(20) * 1_000_000)


# ---------------------------------------------------------------- seeds


def test_same_poisson_seed_gives_identical_schedule_and_other_seeds_differ():
    a = _core.ArrivalSchedule.poisson(1000.0, 42).take(10_000)
    b = _core.ArrivalSchedule.poisson(1000.0, 42).take(10_000)
    c = _core.ArrivalSchedule.poisson(1000.0, 43).take(10_000)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # Different seeds are not just shifted copies: the gaps differ almost everywhere.
    assert np.mean(np.diff(a) != np.diff(c)) > 0.99


def test_same_seed_gives_identical_poisson_stages_and_other_seeds_differ():
    spec = [(1.0, 100, 100), (1.0, 100, 2000)]
    a = stages(spec, True, 5).take(100_000)
    b = stages(spec, True, 5).take(100_000)
    c = stages(spec, True, 6).take(100_000)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a[: min(len(a), len(c))], c[: min(len(a), len(c))])


@pytest.mark.parametrize("order", [Order.random, Order.shuffled])
def test_same_sample_seed_gives_identical_order_and_other_seeds_differ(order):
    a = _core.SampleSelector(1000, order, 9).take(5000)
    b = _core.SampleSelector(1000, order, 9).take(5000)
    c = _core.SampleSelector(1000, order, 10).take(5000)
    np.testing.assert_array_equal(a, b)
    assert np.mean(a != c) > 0.9


# ------------------------------------------------------------------ stages


def test_step_stages_have_rate_times_duration_arrivals_each():
    spec = [(1.0, 100, 100), (0.5, 400, 400), (1.0, 50, 50), (0.25, 2000, 2000)]
    offsets = stages(spec).take(100_000)
    counts, _ = per_stage_counts(offsets, spec)
    expected = [100, 200, 50, 500]
    assert len(offsets) < 100_000  # it ended
    for got, want in zip(counts.tolist(), expected):
        assert abs(got - want) <= 1, (counts, expected)
    assert abs(len(offsets) - sum(expected)) <= 1
    # Evenly spaced within a step: gaps are the period (to the ns) away from boundaries.
    first_stage = offsets[offsets < SEC]
    assert set(np.unique(np.diff(first_stage)).tolist()) <= {10_000_000 - 1, 10_000_000, 10_000_001}


@pytest.mark.parametrize("start,end", [(0, 1000), (200, 1800), (1000, 0)])
def test_linear_ramp_count_is_the_integral_of_the_rate(start, end):
    spec = [(1.0, start, end)]
    offsets = stages(spec).take(100_000)
    integral = 0.5 * (start + end) * 1.0
    assert abs(len(offsets) - integral) <= 2
    assert offsets[-1] <= SEC
    # Halves: the integral of a linear rate over [0, D/2] is D/2 * (3*start + end) / 4.
    first_half = np.count_nonzero(offsets < SEC // 2)
    assert abs(first_half - 0.5 * (3 * start + end) / 4) <= 2


def test_rising_ramp_local_rate_increases():
    offsets = stages([(1.0, 0, 1000)]).take(100_000)
    gaps = np.diff(offsets)
    # The gaps shrink as the rate grows; +1 ns for the rounding of each offset.
    assert (np.diff(gaps) <= 1).all()
    assert gaps[:10].min() > 5 * gaps[-10:].max()
    # Counts per tenth of the run grow with the rate (expected 10, 30, 50, ..., 190).
    per_tenth = np.histogram(offsets, bins=np.linspace(0, SEC, 11))[0]
    assert (np.diff(per_tenth) > 0).all()


def test_step_then_ramp_carries_across_stage_boundaries():
    spec = [(0.5, 200, 200), (0.5, 200, 600), (0.2, 0, 0), (0.3, 1000, 1000)]
    offsets = stages(spec).take(100_000)
    counts, edges = per_stage_counts(offsets, spec)
    expected = [100, 200, 0, 300]
    for got, want in zip(counts.tolist(), expected):
        assert abs(got - want) <= 2, (counts, expected)
    # Nothing during the zero-rate stage.
    assert not np.any((offsets > edges[2]) & (offsets < edges[3]))
    assert (np.diff(offsets) >= 0).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_poisson_stages_counts_are_within_a_few_sigma(seed):
    spec = [(1.0, 2000, 2000), (1.0, 0, 4000), (0.5, 500, 500)]
    offsets = stages(spec, poisson=True, seed=seed).take(1_000_000)
    counts, _ = per_stage_counts(offsets, spec)
    for got, want in zip(counts.tolist(), [2000, 2000, 250]):
        # Poisson counts: sd = sqrt(mean); 5 sigma for a fixed-seed deterministic draw.
        assert abs(got - want) <= 5 * math.sqrt(want), (counts, seed)
    assert (np.diff(offsets) >= 0).all()
    assert len(offsets) < 1_000_000


def test_poisson_stages_gaps_in_a_step_are_exponential():
    offsets = stages([(20.0, 5000, 5000)], poisson=True, seed=11).take(1_000_000)
    gaps = np.diff(offsets).astype(np.float64)
    assert scipy_stats.kstest(gaps, "expon", args=(0, 1e9 / 5000)).pvalue > 0.001


@pytest.mark.parametrize("poisson", [False, True])
def test_stages_end_after_the_last_stage(poisson):
    s = stages([(0.1, 1000, 1000)], poisson=poisson, seed=1)
    got = s.take(10_000)
    assert 0 < len(got) < 10_000
    assert got[-1] <= SEC // 10
    assert len(s.take(10)) == 0  # stays exhausted


@pytest.mark.parametrize(
    "spec",
    [
        [],
        [(0, 100, 100)],
        [(1.0, 100, 100), (0, 10, 10)],
        [(-1.0, 100, 100)],
        [(1.0, -5, 100)],
        [(1.0, 100, -1)],
        [(1.0, float("nan"), 100)],
        [(1.0, 100, float("inf"))],
        [(1.0, 0, 0)],
        [(1.0, 0, 0), (2.0, 0, 0)],
    ],
)
def test_bad_stages_raise_value_error_naming_stages(spec):
    with pytest.raises(ValueError, match="stages"):
        _core.ArrivalSchedule.stages(
            [Stage(int(round(d * SEC)), float(a), float(b)) for d, a, b in spec], False, 0
        )


# ------------------------------------------------------------------- trace


def test_trace_yields_exactly_the_offsets_then_stops():
    offsets = np.array([0, 0, 5, 1000, 1000, 2_000_000, 7_000_000_000], dtype=np.int64)
    s = _core.ArrivalSchedule.trace(offsets)
    got = s.take(3)
    np.testing.assert_array_equal(got, offsets[:3])
    rest = s.take(100)
    np.testing.assert_array_equal(rest, offsets[3:])
    assert len(s.take(5)) == 0


@pytest.mark.parametrize(
    "offsets", [[0, 10, 5], [5, 4], [-1, 0, 1], [0, -3], []], ids=["dec", "dec2", "neg", "neg2", "empty"]
)
def test_bad_traces_raise_value_error(offsets):
    with pytest.raises(ValueError, match="trace"):
        _core.ArrivalSchedule.trace(np.array(offsets, dtype=np.int64))


# ----------------------------------------------------------------- offline


def test_offline_gives_zeros_without_end():
    s = _core.ArrivalSchedule.offline()
    got = s.take(100_000)
    assert len(got) == 100_000
    assert not got.any()
    assert not s.take(10).any()


def test_take_zero_and_negative():
    assert len(_core.ArrivalSchedule.constant(10.0).take(0)) == 0
    with pytest.raises(ValueError):
        _core.ArrivalSchedule.constant(10.0).take(-1)


# ----------------------------------------------------------- bad rates


@pytest.mark.parametrize("qps", [0.0, -1.0, -1e9, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("kind", ["constant", "poisson"])
def test_bad_rates_raise_value_error_naming_target_qps(kind, qps):
    with pytest.raises(ValueError, match="target_qps"):
        if kind == "constant":
            _core.ArrivalSchedule.constant(qps)
        else:
            _core.ArrivalSchedule.poisson(qps, 0)


# ----------------------------------------------------------- sample orders


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_sequential_order_cycles_through_all_samples(n):
    got = _core.SampleSelector(n, Order.sequential, 123).take(5 * n + 3)
    np.testing.assert_array_equal(got, np.arange(5 * n + 3) % n)


@pytest.mark.parametrize("n", [1, 5, 1000])
def test_shuffled_order_is_a_permutation_per_pass(n):
    passes = 6
    got = _core.SampleSelector(n, Order.shuffled, 4).take(passes * n)
    rows = got.reshape(passes, n)
    for row in rows:
        np.testing.assert_array_equal(np.sort(row), np.arange(n))
    distinct = len({tuple(r) for r in rows})
    if n == 1000:
        # A fresh permutation each pass: a repeat among 6 passes has probability ~1/1000!.
        assert distinct == passes
        assert not any(np.array_equal(r, np.arange(n)) for r in rows)
    elif n == 5:
        assert distinct > 1  # not the same permutation every pass


def test_shuffled_first_position_is_uniform_over_seeds():
    # Over many seeds, the first element of the first pass is roughly uniform (a biased
    # shuffle, e.g. an off-by-one in Fisher-Yates, shows here).
    n, seeds = 8, 8000
    firsts = np.array([_core.SampleSelector(n, Order.shuffled, s).take(1)[0] for s in range(seeds)])
    counts = np.bincount(firsts, minlength=n)
    assert scipy_stats.chisquare(counts).pvalue > 0.001


@pytest.mark.parametrize("n", [1, 3, 20, 1_000_003])
def test_random_order_is_within_range(n):
    got = _core.SampleSelector(n, Order.random, 77).take(100_000)
    assert got.min() >= 0 and got.max() < n
    if n == 1:
        assert not got.any()


def test_random_order_is_uniform():
    n = 20
    got = _core.SampleSelector(n, Order.random, 2024).take(200_000)
    counts = np.bincount(got, minlength=n)
    assert len(counts) == n
    assert scipy_stats.chisquare(counts).pvalue > 0.001
    # Simple bounds too: each bin within 5% of 10_000 (sd is ~97, so ~5 sigma).
    assert (np.abs(counts - 10_000) < 500).all()


def test_random_order_draws_with_replacement():
    got = _core.SampleSelector(1000, Order.random, 1).take(1000)
    # 1000 draws from 1000: ~632 distinct expected; a permutation would give 1000.
    assert 550 < len(np.unique(got)) < 700


@pytest.mark.parametrize("count", [0, -1])
@pytest.mark.parametrize("order", [Order.sequential, Order.shuffled, Order.random])
def test_sample_count_below_one_raises_value_error(count, order):
    with pytest.raises(ValueError, match="sample_count"):
        _core.SampleSelector(count, order, 0)
