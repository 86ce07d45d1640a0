"""Property tests of loadgen.Histogram against two oracles: the pure-Python `hdrh`
package (same HdrHistogram design and V2 encoding) and exact order statistics."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hdrh.histogram import HdrHistogram

from loadgen import Histogram

PERCENTILES = [0.0, 1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 99.0, 99.9, 99.99, 100.0]
MAX_HIGHEST = 10**13

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Every significant_figures a Histogram accepts (a strategy is immutable: a safe default).
ALL_SIGNIFICANT_FIGURES = st.integers(1, 5)


# --------------------------------------------------------------- strategies


@st.composite
def configs(draw, sig=ALL_SIGNIFICANT_FIGURES):
    lowest = draw(st.one_of(st.integers(1, 1000), st.sampled_from([1, 2, 3, 512, 1000])))
    significant_figures = draw(sig)
    lo_exp = math.log10(2 * lowest)
    highest = draw(
        st.one_of(
            st.integers(2 * lowest, MAX_HIGHEST),
            st.floats(lo_exp, 13.0).map(lambda e: min(max(2 * lowest, int(10**e)), MAX_HIGHEST)),
            st.sampled_from([2 * lowest, 2 * lowest + 1, 10**6, MAX_HIGHEST]),
        )
    )
    return lowest, highest, significant_figures


@st.composite
def values_for(draw, highest: int, lowest: int, min_size: int = 0, max_random: int = 2000):
    """A few hand-picked values (shrinkable) plus a numpy-generated bulk from a seeded
    distribution: uniform, log-uniform, or lognormal across the whole range."""
    special = st.sampled_from(
        sorted({0, 1, lowest - 1, lowest, lowest + 1, 2 * lowest, highest // 2, highest - 1, highest})
    )
    explicit = draw(st.lists(st.one_of(st.integers(0, highest), special), max_size=25))
    n = draw(st.integers(0, max_random))
    seed = draw(st.integers(0, 2**32 - 1))
    kind = draw(st.sampled_from(["uniform", "loguniform", "lognormal", "narrow"]))
    rng = np.random.default_rng(seed)
    top = math.log(highest + 1)
    if kind == "uniform":
        bulk = rng.integers(0, highest, size=n, endpoint=True)
    elif kind == "loguniform":
        bulk = np.floor(np.exp(rng.uniform(0.0, top, size=n)))
    elif kind == "lognormal":
        bulk = np.rint(rng.lognormal(mean=rng.uniform(0.0, top), sigma=rng.uniform(0.1, 4.0), size=n))
    else:  # many values in a few adjacent buckets
        centre = math.exp(rng.uniform(0.0, top))
        bulk = np.rint(rng.normal(centre, centre * 1e-3 + 1.0, size=n))
    bulk = np.clip(np.asarray(bulk, dtype=np.float64), 0, highest).astype(np.int64)
    values = np.concatenate([np.array(explicit, dtype=np.int64), bulk])
    assume(values.size >= min_size)
    return values


@st.composite
def histogram_cases(draw, sig=ALL_SIGNIFICANT_FIGURES, min_size: int = 0, max_random: int = 2000):
    lowest, highest, significant_figures = draw(configs(sig))
    values = draw(values_for(highest, lowest, min_size=min_size, max_random=max_random))
    return lowest, highest, significant_figures, values


# ------------------------------------------------------------------ helpers


def both(lowest, highest, sig, values):
    ours = Histogram(lowest_discernible_value=lowest, highest_trackable_value=highest, significant_figures=sig)
    theirs = HdrHistogram(lowest, highest, sig)
    assert ours.record_array(values) == values.size
    for v, c in Counter(values.tolist()).items():
        assert theirs.record_value(v, c)
    return ours, theirs


def hdrh_counts(theirs: HdrHistogram) -> np.ndarray:
    return np.ctypeslib.as_array(theirs.counts)[: theirs.counts_len].astype(np.int64)


def exact_mean_stddev_from_hdrh(theirs: HdrHistogram):
    """Mean and population stddev computed exactly (rationals) over hdrh's buckets, each
    taken at hdrh's median equivalent value."""
    counts = hdrh_counts(theirs)
    idx = np.flatnonzero(counts)
    total = int(counts.sum())
    medians = [theirs._hdr_median_equiv_value(theirs.get_value_from_index(int(i))) for i in idx]
    cs = [int(counts[i]) for i in idx]
    s = sum(c * m for c, m in zip(cs, medians))
    mean = Fraction(s, total)
    var = sum(c * (m - mean) ** 2 for c, m in zip(cs, medians)) / total
    return float(mean), math.sqrt(float(var))


def close(a: float, b: float, scale: float) -> bool:
    # relative 1e-9; an absolute floor relative to the mean's magnitude keeps a stddev
    # of (nearly) 0 comparable when the two sides round the mean differently by an ulp
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9 * max(1.0, abs(scale)))


def sorted_rank_value(sorted_values: np.ndarray, p: float) -> int:
    """The order statistic HdrHistogram reports: rank round-half-up(p/100 * n), >= 1."""
    n = sorted_values.size
    k = max(1, int(p * n / 100 + 0.5))
    return int(sorted_values[k - 1])


# ---------------------------------------------------------------- vs hdrh


@settings(max_examples=100, **SETTINGS)
@given(histogram_cases())
def test_matches_hdrh_counts_layout_and_statistics(case):
    lowest, highest, sig, values = case
    ours, theirs = both(lowest, highest, sig, values)

    assert ours.counts_len == theirs.counts_len
    assert ours.bucket_count == theirs.bucket_count
    assert ours.sub_bucket_count == theirs.sub_bucket_count
    assert ours.unit_magnitude == theirs.unit_magnitude

    assert np.array_equal(ours.counts(), hdrh_counts(theirs))
    assert ours.total_count == theirs.get_total_count() == values.size
    assert ours.min == theirs.get_min_value()
    assert ours.max == theirs.get_max_value()

    expected = theirs.get_percentile_to_value_dict(PERCENTILES) if values.size else {}
    got = ours.percentiles(PERCENTILES)
    for p in PERCENTILES:
        assert got[p] == expected.get(p, 0), p

    if values.size:
        mean, stddev = exact_mean_stddev_from_hdrh(theirs)
    else:
        mean, stddev = 0.0, 0.0
    assert close(ours.mean, mean, mean)
    assert close(ours.stddev, stddev, mean)


@settings(max_examples=60, **SETTINGS)
@given(histogram_cases(sig=st.integers(1, 3), max_random=1000), st.floats(0.0, 100.0))
def test_value_at_percentile_and_mean_stddev_match_hdrh_methods(case, extra_p):
    # sig <= 3 keeps hdrh's pure-Python bucket walks short enough to call them directly
    lowest, highest, sig, values = case
    ours, theirs = both(lowest, highest, sig, values)
    for p in PERCENTILES + [extra_p]:
        expected = theirs.get_value_at_percentile(p) if values.size else 0
        assert ours.value_at_percentile(p) == expected, p
    mean = theirs.get_mean_value()
    assert close(ours.mean, mean, mean)
    assert close(ours.stddev, theirs.get_stddev(), mean)


@settings(max_examples=100, **SETTINGS)
@given(configs(), st.data())
def test_accepts_and_rejects_exactly_the_values_hdrh_does(config, data):
    lowest, highest, sig = config
    ours = Histogram(lowest_discernible_value=lowest, highest_trackable_value=highest, significant_figures=sig)
    theirs = HdrHistogram(lowest, highest, sig)
    limit = ours.sub_bucket_count << (ours.unit_magnitude + ours.bucket_count - 1)
    candidates = [-1, 0, highest, highest + 1, limit - 1, limit, limit + 1, 2 * limit]
    candidates += data.draw(st.lists(st.integers(0, 4 * limit), max_size=20))
    rejected = 0
    for v in candidates:
        expected = theirs.record_value(v)
        rejected += not expected
        assert ours.record(v) is expected, v
    assert ours.rejected_count == rejected
    assert np.array_equal(ours.counts(), hdrh_counts(theirs))
    assert ours.max == theirs.get_max_value()


@settings(max_examples=100, **SETTINGS)
@given(configs(), st.data())
def test_equivalent_value_helpers_match_hdrh(config, data):
    lowest, highest, sig = config
    ours = Histogram(lowest_discernible_value=lowest, highest_trackable_value=highest, significant_figures=sig)
    theirs = HdrHistogram(lowest, highest, sig)
    values = data.draw(st.lists(st.integers(0, highest), min_size=1, max_size=30))
    for v in values:
        assert ours.lowest_equivalent_value(v) == theirs.get_lowest_equivalent_value(v)
        assert ours.highest_equivalent_value(v) == theirs.get_highest_equivalent_value(v)
        assert ours.median_equivalent_value(v) == theirs._hdr_median_equiv_value(v)
        assert ours.equivalent_value_range(v) == theirs._hdr_size_of_equiv_value_range(v)


# --------------------------------------------------------------- encodings


@settings(max_examples=100, **SETTINGS)
@given(histogram_cases())
def test_encodings_interoperate_with_hdrh_both_ways(case):
    lowest, highest, sig, values = case
    ours, theirs = both(lowest, highest, sig, values)

    our_text = ours.encode()
    their_bytes = theirs.encode()
    # same V2 layout, same zlib default level: identical text
    assert our_text == their_bytes.decode("ascii")

    # ours -> hdrh
    decoded = HdrHistogram.decode(our_text)
    assert (decoded.lowest_trackable_value, decoded.highest_trackable_value, decoded.significant_figures) == (
        lowest,
        highest,
        sig,
    )
    assert np.array_equal(hdrh_counts(decoded), ours.counts())
    assert decoded.get_total_count() == ours.total_count
    assert decoded.get_min_value() == ours.min
    if values.size and values.max() > 0:
        assert decoded.get_max_value() == ours.max
    if values.size:
        dec_p = decoded.get_percentile_to_value_dict(PERCENTILES)
        got = ours.percentiles(PERCENTILES)
        assert all(got[p] == dec_p[p] for p in PERCENTILES)

    # hdrh -> ours (bytes of base64 and str)
    back = Histogram.decode(their_bytes)
    assert back == ours
    assert Histogram.decode(their_bytes.decode("ascii")) == ours
    assert back.min == ours.min
    if values.size and values.max() > 0:
        assert back.max == ours.max
    assert back.percentiles(PERCENTILES) == ours.percentiles(PERCENTILES)
    assert back.mean == ours.mean

    # our own round trips
    assert Histogram.decode(our_text) == ours
    assert Histogram.decode_compressed(ours.encode_compressed(9)) == ours
    assert Histogram.decode_uncompressed(ours.encode_uncompressed()) == ours


# --------------------------------------------------- exact order statistics


@settings(max_examples=150, **SETTINGS)
@given(histogram_cases(min_size=1), st.lists(st.floats(0.0, 100.0), max_size=5))
def test_percentiles_are_the_exact_order_statistic_to_bucket_precision(case, extra):
    lowest, highest, sig, values = case
    h = Histogram(lowest_discernible_value=lowest, highest_trackable_value=highest, significant_figures=sig)
    h.record_array(values)
    s = np.sort(values)
    n = s.size
    unit = 2**h.unit_magnitude
    for p in PERCENTILES + extra:
        reported = h.value_at_percentile(p)
        if p == 0:
            assert reported == h.lowest_equivalent_value(int(s[0]))
            continue
        v = sorted_rank_value(s, p)
        # strongest statement: the top of the bucket of the round-half-up nearest-rank value
        assert reported == h.highest_equivalent_value(v)
        assert h.lowest_equivalent_value(v) <= v <= reported
        # so the error is below one bucket: 2**unit_magnitude absolute in the first
        # bucket, else relative 10**-significant_figures
        assert reported - v <= max(unit - 1, v * 10.0**-sig)
        if v >= unit * h.sub_bucket_count // 2:
            assert (reported - v) / v < 2 * 10.0**-sig

        # against numpy's inverted CDF (rank ceil(p/100 * n)): HdrHistogram rounds the
        # rank half up instead, so it may be one order statistic lower, never higher
        v_np = int(np.percentile(values, p, method="inverted_cdf"))
        assert reported <= h.highest_equivalent_value(v_np)
        x = p * n / 100
        frac = x - math.floor(x)
        if min(frac, abs(frac - 0.5), 1 - frac) < 1e-9:
            continue  # float rounding may pick either rank at these ties
        k_ceil = max(1, math.ceil(x))
        if frac > 0.5 or k_ceil == 1:  # both pick the same rank
            assert h.lowest_equivalent_value(v_np) <= reported <= h.highest_equivalent_value(v_np)
            assert reported == h.highest_equivalent_value(v_np)
        else:  # HdrHistogram's rank is one lower than the inverted CDF's
            assert int(s[k_ceil - 1]) == v_np
            assert reported == h.highest_equivalent_value(int(s[k_ceil - 2]))


def test_percentile_rank_rounding_differs_from_inverted_cdf():
    # n=2, p=60: rank 1.2 -> HdrHistogram rounds to 1, the inverted CDF takes ceil = 2
    h = Histogram(highest_trackable_value=10**6)
    values = np.array([1, 1000])
    h.record_array(values)
    assert h.value_at_percentile(60) == 1
    assert int(np.percentile(values, 60, method="inverted_cdf")) == 1000
    # at rank 1.5 and above they agree
    assert h.value_at_percentile(75) == h.highest_equivalent_value(1000)
    assert int(np.percentile(values, 75, method="inverted_cdf")) == 1000
