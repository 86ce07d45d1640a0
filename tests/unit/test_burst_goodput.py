"""Bursty arrivals (--burstiness: gamma-distributed gaps drawn by the native schedule) and
goodput against --slo (judged per query by the engine), the latter recounted from the
per-request records (--record-requests), which are the truth it must equal exactly.

The tests that start processes or servers are in tests/integration/test_burst_goodput.py."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen import _core
from loadgen.results.goodput import goodput_section, parse_slo, parse_slos

scipy_stats = pytest.importorskip("scipy.stats")

SEC = 1_000_000_000


def _gaps(qps, seed, burstiness, n=200_001):
    return np.diff(_core.ArrivalSchedule.poisson(qps, seed, burstiness).take(n)).astype(np.float64)


# ------------------------------------------------------------------ the native schedule


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_set_mean_and_cv(burstiness):
    qps = 1000.0
    gaps = _gaps(qps, 3, burstiness)
    # 2e5 gaps: the mean's relative sd is cv / 447 (0.45% at cv 2), so 2% is > 4 sigma.
    assert abs(gaps.mean() / (1e9 / qps) - 1) < 0.02, gaps.mean()
    cv = gaps.std() / gaps.mean()
    assert abs(cv * np.sqrt(burstiness) - 1) < 0.03, (burstiness, cv)


def _ks_pvalue(gaps, shape, scale, floor_ns=1000.0):
    """KS p-value of the gaps over ``floor_ns`` against Gamma(shape, scale) conditioned on
    exceeding it. Offsets are whole ns, so each gap is off by up to 1 ns; at B = 0.25
    about 2% of the gaps are under 1 ns, where that rounding is the whole value, and a
    test of the unconditioned CDF would only see the rounding. Over 1 us it moves the
    CDF by < 1e-4, far below the KS resolution at n = 2e5."""
    dist = scipy_stats.gamma(shape, 0, scale)
    tail = dist.sf(floor_ns)
    kept = gaps[gaps > floor_ns]
    return scipy_stats.kstest(kept, lambda x: (dist.cdf(x) - dist.cdf(floor_ns)) / tail).pvalue


@pytest.mark.parametrize("burstiness,seed", [(0.25, 1), (4.0, 2), (0.6, 5), (30.0, 9)])
def test_gamma_gaps_pass_ks_against_scipy_gamma(burstiness, seed):
    qps = 500.0
    gaps = _gaps(qps, seed, burstiness)
    scale = 1e9 / (qps * burstiness)
    assert _ks_pvalue(gaps, burstiness, scale) > 0.001
    # ...and the test has teeth: 3% off in shape (same mean) is detected.
    assert _ks_pvalue(gaps, burstiness * 1.03, scale / 1.03) < 0.001


def test_burstiness_1_is_exactly_todays_poisson_stream():
    for seed in (0, 7, 2**64 - 1):
        a = _core.ArrivalSchedule.poisson(1234.5, seed).take(50_000)
        b = _core.ArrivalSchedule.poisson(1234.5, seed, 1.0).take(50_000)
        assert np.array_equal(a, b)
    stages = [_core.Stage(SEC, 100.0, 1000.0)]
    assert np.array_equal(_core.ArrivalSchedule.stages(stages, True, 4).take(10_000),
                          _core.ArrivalSchedule.stages(stages, True, 4, 1.0).take(10_000))


def test_poisson_stages_take_the_burstiness_too():
    spec = [_core.Stage(200 * SEC, 1000.0, 1000.0)]
    for b in (0.25, 4.0):
        gaps = np.diff(_core.ArrivalSchedule.stages(spec, True, 11, b).take(150_000)).astype(np.float64)
        assert abs(gaps.mean() / 1e6 - 1) < 0.02
        assert abs(gaps.std() / gaps.mean() * np.sqrt(b) - 1) < 0.03


@pytest.mark.parametrize("bad", [0.0, 0.001, 1001.0, float("nan"), float("inf")])
def test_burstiness_out_of_range_is_refused_natively(bad):
    with pytest.raises(ValueError, match="burstiness"):
        _core.ArrivalSchedule.poisson(100.0, 0, bad)


# ------------------------------------------------------------------ SLO texts


def test_slo_texts_parse_to_ns_and_bad_ones_name_the_problem():
    assert parse_slo("ttft<=200ms") == ("ttft", 200_000_000)
    assert parse_slo(" latency <= 5s ") == ("latency", 5 * SEC)
    assert parse_slo("tpot<=40.5us") == ("tpot", 40_500)
    for text, words in (("ttft<200ms", "NAME<=VALUE"), ("foo<=1ms", "unknown SLO"), ("ttft<=200", "time unit"),
                        ("itl<=50ms", "not supported"), ("ttft<=0ms", "out of range .allowed: 1 ns to 1e8 s")):
        with pytest.raises(ValueError, match=words):
            parse_slo(text)
    with pytest.raises(ValueError, match="given twice"):
        parse_slos(["ttft<=1ms", "ttft<=2ms"])


def test_goodput_section_counts_failures_as_not_met():
    counts = {"slo_judged": 8, "slo_met": 5, "slo_met_ttft": 6, "slo_met_latency": 7, "failed": 1,
              "timed_out": 1, "cancelled": 0, "completed": 8}
    g = goodput_section(counts, ["latency<=1s", "ttft<=1ms"], 2.0)
    assert g["of"] == 10 and g["met"] == 5 and g["fraction"] == 0.5 and g["requests_per_s"] == 2.5
    assert g["per_slo"] == {"ttft": {"bound_ns": 1_000_000, "met": 6, "fraction": 0.6},
                            "latency": {"bound_ns": SEC, "met": 7, "fraction": 0.7}}
    assert goodput_section(counts, [], 2.0) is None


# ------------------------------------------------------------------ the CLI


