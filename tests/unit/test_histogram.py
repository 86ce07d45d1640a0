"""Behaviour and edge cases of loadgen.Histogram (the native HDR histogram)."""

from __future__ import annotations

import copy
import math
import pickle
import threading

import numpy as np
import pytest

import loadgen
from loadgen import Histogram, _core

# ---------------------------------------------------------------- helpers


def make(lowest=1, highest=3_600_000_000_000, sig=3) -> Histogram:
    return Histogram(
        lowest_discernible_value=lowest, highest_trackable_value=highest, significant_figures=sig
    )


def ref_counts_index(h: Histogram, value: int) -> int:
    """HdrHistogram's value -> counts-array index mapping, written independently from
    the layout properties (unit_magnitude, sub_bucket_count)."""
    unit = h.unit_magnitude
    sbc = h.sub_bucket_count
    half = sbc // 2
    half_mag = half.bit_length() - 1
    mask = (sbc - 1) << unit
    pow2ceiling = (value | mask).bit_length()
    bucket = pow2ceiling - unit - (half_mag + 1)
    sub_bucket = value >> (bucket + unit)
    return ((bucket + 1) << half_mag) + sub_bucket - half


def first_untrackable_value(h: Histogram) -> int:
    """One past the highest equivalent value of the last bucket of the counts array."""
    return h.sub_bucket_count << (h.unit_magnitude + h.bucket_count - 1)


def reference_corrected_values(value: int, expected_interval: int) -> list[int]:
    """HdrHistogram_c's hdr_record_corrected_values: the values it records."""
    out = [value]
    if expected_interval <= 0 or value <= expected_interval:
        return out
    missing = value - expected_interval
    while missing >= expected_interval:
        out.append(missing)
        missing -= expected_interval
    return out


def all_stats(h: Histogram) -> dict:
    return {
        "total_count": h.total_count,
        "rejected_count": h.rejected_count,
        "min": h.min,
        "max": h.max,
        "mean": h.mean,
        "stddev": h.stddev,
        "percentiles": h.percentiles([0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 100.0]),
        "counts": h.counts().tolist(),
    }


def lognormal_values(seed: int, n: int, highest: int = 3_600_000_000_000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = np.rint(rng.lognormal(mean=13.0, sigma=3.0, size=n)).astype(np.int64)
    return np.clip(v, 0, highest)


# ------------------------------------------------------------ construction


@pytest.mark.parametrize(
    "kwargs, exc, field",
    [
        (dict(lowest_discernible_value=0), ValueError, "lowest_discernible_value"),
        (dict(lowest_discernible_value=-5), ValueError, "lowest_discernible_value"),
        (dict(significant_figures=0), ValueError, "significant_figures"),
        (dict(significant_figures=6), ValueError, "significant_figures"),
        (
            dict(lowest_discernible_value=10, highest_trackable_value=19),
            ValueError,
            "highest_trackable_value",
        ),
        (dict(lowest_discernible_value=1.5), TypeError, "lowest_discernible_value"),
        (dict(highest_trackable_value=1e6), TypeError, "highest_trackable_value"),
        (dict(significant_figures="3"), TypeError, "significant_figures"),
        (dict(significant_figures=True), TypeError, "significant_figures"),
        (
            dict(
                lowest_discernible_value=2**60,
                highest_trackable_value=2**62,
                significant_figures=5,
            ),
            ValueError,
            "lowest_discernible_value",
        ),
        (dict(highest_trackable_value=2**63), ValueError, "highest_trackable_value"),
    ],
)
def test_constructor_rejects_bad_settings_naming_the_field(kwargs, exc, field):
    with pytest.raises(exc) as info:
        Histogram(**kwargs)
    assert field in str(info.value)


def test_constructor_accepts_boundary_settings_and_reports_them():
    h = make(lowest=7, highest=14, sig=5)
    assert (h.lowest_discernible_value, h.highest_trackable_value, h.significant_figures) == (
        7,
        14,
        5,
    )
    h1 = make(sig=1)
    assert h1.significant_figures == 1
    big = make(highest=2**63 - 1)
    assert big.record(2**63 - 1)
    assert big.max == 2**63 - 1


def test_numpy_integer_settings_are_accepted():
    h = Histogram(
        lowest_discernible_value=np.int64(2),
        highest_trackable_value=np.int32(10_000),
        significant_figures=np.int8(2),
    )
    assert (h.lowest_discernible_value, h.highest_trackable_value, h.significant_figures) == (
        2,
        10_000,
        2,
    )


def test_layout_matches_hdrhistogram_formulas():
    h = make(lowest=1000, highest=10**13, sig=3)
    assert h.unit_magnitude == 9  # floor(log2(1000))
    assert h.sub_bucket_count == 2048  # 2**ceil(log2(2 * 10**3))
    assert h.counts_len == (h.bucket_count + 1) * h.sub_bucket_count // 2
    assert first_untrackable_value(h) > h.highest_trackable_value
    # bucket_count is the smallest that covers the highest trackable value
    assert (h.sub_bucket_count << (h.unit_magnitude + h.bucket_count - 2)) <= h.highest_trackable_value


# ------------------------------------------------------------------- empty


def test_empty_histogram_statistics_are_zero():
    h = make()
    assert h.total_count == 0
    assert h.rejected_count == 0
    assert h.min == 0
    assert h.max == 0
    assert h.mean == 0.0
    assert h.stddev == 0.0
    assert h.value_at_percentile(99) == 0
    assert h.value_at_percentile(0) == 0
    assert h.value_at_percentile(100) == 0
    pct = h.percentiles()
    assert set(pct) == set(loadgen.stats.histogram.DEFAULT_PERCENTILES)
    assert all(v == 0 for v in pct.values())
    assert not h.counts().any()
    assert len(h.counts()) == h.counts_len


def test_empty_histogram_has_no_recorded_buckets_or_iteration():
    h = make()
    b = h.recorded_buckets()
    assert b.lowest_values.size == 0 and b.highest_values.size == 0 and b.counts.size == 0
    assert list(h) == []


def test_empty_histogram_encode_decode_round_trip():
    h = make(lowest=3, highest=10**9, sig=2)
    text = h.encode()
    assert text.startswith("HISTF")
    back = Histogram.decode(text)
    assert back == h
    assert back.total_count == 0 and back.max == 0 and back.min == 0
    assert (back.lowest_discernible_value, back.highest_trackable_value, back.significant_figures) == (
        3,
        10**9,
        2,
    )
    assert Histogram.decode_compressed(h.encode_compressed()) == h
    assert Histogram.decode_uncompressed(h.encode_uncompressed()) == h


# ------------------------------------------------------------ single value


@pytest.mark.parametrize("value", [0, 1, 2047, 2048, 123_456, 10**9 + 7, 3_600_000_000_000])
def test_single_value_statistics_are_its_equivalent_values(value):
    h = make()
    assert h.record(value)
    lo = h.lowest_equivalent_value(value)
    hi = h.highest_equivalent_value(value)
    assert h.total_count == 1
    assert h.min == lo
    assert h.max == (0 if value == 0 else hi)
    assert h.value_at_percentile(0) == lo
    for p in (0.0001, 1, 50, 99, 99.999, 100):
        assert h.value_at_percentile(p) == hi
    assert h.mean == float(h.median_equivalent_value(value))
    assert h.stddev == 0.0
    assert h.count_at_value(value) == 1
    assert h.count_at_value(lo) == 1 and h.count_at_value(hi) == 1
    assert h.count_at_value(hi + 1) == 0
    if lo > 0:
        assert h.count_at_value(lo - 1) == 0


def test_single_value_above_precision_range_is_bucketed():
    h = make(sig=2)
    assert h.record(1_000_003)
    assert h.min < 1_000_003 < h.max
    assert h.max - h.min + 1 == h.equivalent_value_range(1_000_003)
    assert h.count_at_value(h.min) == 1


def test_record_n_counts_at_value():
    h = make()
    assert h.record_n(5000, 7)
    assert h.count_at_value(5000) == 7
    assert h.total_count == 7
    assert h.record_n(5000, 0)
    assert h.total_count == 7


def test_record_n_with_negative_count_records_and_rejects_nothing():
    h = make()
    h.record(10)
    assert h.record_n(5000, -3) is False
    assert h.total_count == 1
    assert h.rejected_count == 0
    assert h.count_at_value(5000) == 0
    assert h.max == 10


def test_zero_counts_do_not_move_min_or_max():
    """Recording a value 0 times records nothing, so min and max must not move (HdrHistogram_c
    and hdrh do move them; loadgen documents min/max as the smallest/largest recorded value)."""
    h = make()
    values = np.arange(1, 1001)
    counts = np.r_[np.zeros(100, int), np.ones(800, int), np.zeros(100, int)]
    h.record_array(values, counts=counts)
    assert h.total_count == 800
    assert h.value_at_percentile(100) == 900
    assert (h.min, h.max) == (101, 900)
    assert all_stats(pickle.loads(pickle.dumps(h))) == all_stats(h)
    empty = make()
    empty.record_n(5000, 0)
    assert empty.total_count == 0
    assert empty.max == 0 and empty.min == 0


# --------------------------------------------------------- range limits


def test_zero_is_recorded():
    h = make(lowest=1000, highest=10**6, sig=2)
    assert h.record(0)
    assert h.total_count == 1
    assert h.rejected_count == 0
    assert h.count_at_value(0) == 1
    assert h.min == 0


@pytest.mark.parametrize("lowest, highest, sig", [(1, 1000, 2), (1, 3_600_000_000_000, 3), (1000, 10**13, 5), (7, 14, 1)])
def test_highest_trackable_value_is_recorded(lowest, highest, sig):
    h = make(lowest, highest, sig)
    assert h.record(highest)
    assert h.total_count == 1
    assert h.rejected_count == 0
    assert h.max == h.highest_equivalent_value(highest)


@pytest.mark.parametrize("lowest, highest, sig", [(1, 1000, 2), (1, 3_600_000_000_000, 3), (1000, 10**13, 5), (7, 14, 1)])
def test_value_beyond_range_is_rejected_and_counted(lowest, highest, sig):
    h = make(lowest, highest, sig)
    limit = first_untrackable_value(h)
    assert h.highest_equivalent_value(limit - 1) == limit - 1
    assert h.record(limit - 1)  # last value of the last bucket is still trackable
    assert h.total_count == 1
    assert h.record(limit) is False
    assert h.record(limit + 12345) is False
    assert h.record_n(2**62, 5) is False
    assert h.total_count == 1
    assert h.rejected_count == 7
    assert h.max == limit - 1
    assert h.counts().sum() == 1


def test_negative_value_is_rejected_and_counted():
    h = make()
    assert h.record(-1) is False
    assert h.record_n(-100, 3) is False
    assert h.total_count == 0
    assert h.rejected_count == 4
    assert h.min == 0 and h.max == 0
    assert h.count_at_value(-1) == 0
    assert h.count_at_value(2**62) == 0


def test_record_array_counts_rejections_exactly():
    h = make(lowest=1, highest=10**6, sig=2)
    limit = first_untrackable_value(h)
    values = np.array([0, -1, 5, limit, 10**6, -(2**62), limit - 1, 2**62, 77, 77], dtype=np.int64)
    recorded = h.record_array(values)
    assert recorded == 6
    assert h.total_count == 6
    assert h.rejected_count == 4
    assert h.count_at_value(77) == 2
    assert h.count_at_value(0) == 1


def test_record_array_with_counts_counts_rejections_by_multiplicity():
    h = make(lowest=1, highest=10**6, sig=2)
    recorded = h.record_array([10, -3, 10**9, 20], counts=[4, 5, 6, 0])
    assert recorded == 2  # 10 and 20 (count 0 is still a successful record)
    assert h.total_count == 4
    assert h.rejected_count == 11
    assert h.count_at_value(10) == 4
    assert h.count_at_value(20) == 0


# ------------------------------------------------------------ huge counts


def test_huge_counts_are_exact():
    h = make()
    big = 2**40
    for _ in range(5):
        assert h.record_n(1000, big)
    assert h.record_n(10**9, big)
    assert h.total_count == 6 * big
    assert h.count_at_value(1000) == 5 * big
    assert h.count_at_value(10**9) == big
    assert h.value_at_percentile(50) == 1000
    assert h.value_at_percentile(83.3) == 1000
    assert h.value_at_percentile(83.4) == h.highest_equivalent_value(10**9)
    assert h.value_at_percentile(100) == h.highest_equivalent_value(10**9)
    expected_mean = (5 * 1000 + h.median_equivalent_value(10**9)) / 6
    assert h.mean == pytest.approx(expected_mean, rel=1e-12)
    back = Histogram.decode(h.encode())
    assert back == h
    assert back.total_count == 6 * big


def test_huge_counts_in_record_array():
    h = make()
    counts = np.full(4, 2**41, dtype=np.int64)
    assert h.record_array(np.array([1, 2, 3, 4]), counts=counts) == 4
    assert h.total_count == 4 * 2**41
    assert h.value_at_percentile(25) == 1
    assert h.value_at_percentile(50) == 2
    assert h.value_at_percentile(75) == 3
    assert h.value_at_percentile(75.0001) == 4


# --------------------------------------------------- record_corrected


@pytest.mark.parametrize(
    "value, interval, count",
    [
        (250, 100, 1),
        (300, 100, 1),
        (100, 100, 1),
        (99, 100, 1),
        (1000, 0, 1),
        (1000, -10, 1),
        (10_000, 7, 1),
        (123_456_789, 1_000_000, 3),
        (5, 1, 2),
        (2, 1, 1),
        (0, 10, 1),
    ],
)
def test_record_corrected_matches_hdr_histogram_c_reference(value, interval, count):
    h = make()
    assert h.record_corrected(value, interval, count)
    expected_values = reference_corrected_values(value, interval)
    ref = make()
    for v in expected_values:
        ref.record_n(v, count)
    assert h.total_count == len(expected_values) * count
    assert np.array_equal(h.counts(), ref.counts())
    assert h.min == ref.min and h.max == ref.max
    assert h == ref


def test_record_corrected_random_against_reference():
    rng = np.random.default_rng(7)
    h = make()
    ref = make()
    for _ in range(300):
        interval = int(rng.integers(-5, 5000))
        value = int(rng.integers(0, 200_000))
        assert h.record_corrected(value, interval)
        for v in reference_corrected_values(value, interval):
            ref.record(v)
    assert h == ref


def test_record_corrected_out_of_range_returns_false():
    h = make(lowest=1, highest=1000, sig=2)
    limit = first_untrackable_value(h)
    assert h.record_corrected(limit + 10, 100, 2) is False
    assert h.rejected_count == 2
    assert h.record_corrected(-5, 1) is False


def test_record_corrected_differs_from_hdrh_by_one_trailing_value():
    """hdrh.record_corrected_value keeps going down to the first value <= interval
    (250, 150, 50); HdrHistogram_c (and we) stop at the last value >= interval."""
    from hdrh.histogram import HdrHistogram

    ours = make()
    ours.record_corrected(250, 100)
    theirs = HdrHistogram(1, 3_600_000_000_000, 3)
    theirs.record_corrected_value(250, 100)
    assert ours.total_count == 2
    assert theirs.get_total_count() == 3
    assert [v for v, _ in ours] == [150, 250]
    assert ours.count_at_value(50) == 0
    assert theirs.get_count_at_value(50) == 1


# ------------------------------------------------------------ record_array


def test_record_array_float_raises_type_error_mentioning_cast():
    h = make()
    with pytest.raises(TypeError, match="cast"):
        h.record_array(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="cast"):
        h.record_array([1.5, 2])
    with pytest.raises(TypeError, match="cast"):
        h.record_array([1, 2], counts=np.array([1.0, 1.0]))
    assert h.total_count == 0


def test_record_array_of_empty_float_array_is_a_no_op():
    h = make()
    assert h.record_array(np.array([], dtype=np.float64)) == 0
    assert h.total_count == 0


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64])
def test_record_array_accepts_integer_dtypes(dtype):
    h = make()
    values = np.array([1, 2, 3, 100, 100], dtype=dtype)
    assert h.record_array(values) == 5
    assert h.total_count == 5
    assert h.count_at_value(100) == 2


def test_record_array_rejects_uint64_above_int64():
    h = make()
    with pytest.raises(ValueError):
        h.record_array(np.array([1, 2**63], dtype=np.uint64))
    assert h.total_count == 0


def test_record_array_counts_argument_multiplies():
    h = make()
    assert h.record_array(np.array([10, 20, 30]), counts=np.array([1, 2, 3])) == 3
    assert h.total_count == 6
    assert [h.count_at_value(v) for v in (10, 20, 30)] == [1, 2, 3]


def test_record_array_counts_length_mismatch_raises_value_error():
    h = make()
    with pytest.raises(ValueError, match="same length"):
        h.record_array(np.array([10, 20, 30]), counts=np.array([1, 2]))
    assert h.total_count == 0


def test_record_array_flattens_multidimensional_arrays():
    h = make()
    values = np.arange(1, 25, dtype=np.int64).reshape(2, 3, 4)
    assert h.record_array(values) == 24
    flat = make()
    flat.record_array(values.ravel())
    assert h == flat
    # non-contiguous views too
    h2 = make()
    view = np.arange(100, dtype=np.int64).reshape(10, 10)[::2, 1::3]
    assert h2.record_array(view) == view.size
    ref = make()
    for v in view.ravel().tolist():
        ref.record(v)
    assert h2 == ref


def test_record_array_accepts_python_list():
    h = make()
    assert h.record_array([5, 5, 6, 10**6]) == 4
    ref = make()
    for v in (5, 5, 6, 10**6):
        ref.record(v)
    assert h == ref


def test_record_array_matches_per_value_record():
    values = lognormal_values(1, 20_000)
    a = make()
    b = make()
    assert a.record_array(values) == values.size
    for v in values.tolist():
        b.record(v)
    assert a == b
    assert a.mean == b.mean and a.stddev == b.stddev


# ---------------------------------------------------------------- add / merge


def test_add_same_layout_sums_counts_exactly():
    a = make()
    b = make()
    a.record_array(lognormal_values(2, 5000))
    b.record_array(lognormal_values(3, 7000))
    expected_counts = a.counts() + b.counts()
    expected_min = min(a.min, b.min)
    expected_max = max(a.max, b.max)
    assert a.same_layout(b)
    result = a.add(b)
    assert result is a
    assert np.array_equal(a.counts(), expected_counts)
    assert a.total_count == 12_000
    assert a.min == expected_min and a.max == expected_max


def test_add_different_layout_uses_lowest_equivalent_values():
    src = make(1, 10**6, 2)
    src.record_array(np.array([0, 1, 255, 256, 257, 999, 1000, 12_345, 99_999, 10**6]))
    src.record_n(500_000, 9)
    dst = make(1, 10**12, 3)
    dst.record(42)
    assert not dst.same_layout(src)
    expected = dst.copy()
    for lo, c in zip(src.recorded_buckets().lowest_values.tolist(), src.recorded_buckets().counts.tolist()):
        expected.record_n(lo, c)
    dst.add(src)
    assert np.array_equal(dst.counts(), expected.counts())
    assert dst.total_count == 1 + src.total_count
    # a bucket of src that is wider than dst's lands on src's lowest equivalent value
    assert dst.count_at_value(src.lowest_equivalent_value(500_000)) == 9
    assert src.lowest_equivalent_value(500_000) != 500_000


def test_add_different_significant_figures_same_range():
    src = make(1, 10**9, 5)
    dst = make(1, 10**9, 1)
    values = lognormal_values(4, 3000, 10**9)
    src.record_array(values)
    dst.add(src)
    ref = make(1, 10**9, 1)
    ref.record_array(src.recorded_buckets().lowest_values, counts=src.recorded_buckets().counts)
    assert np.array_equal(dst.counts(), ref.counts())
    assert dst.total_count == 3000


def test_add_beyond_range_raises_and_leaves_target_unchanged():
    small = make(1, 10**6, 2)
    small.record_array([1, 2, 3, 5000])
    small.record(-1)
    before = small.copy()
    big = make(1, 10**12, 3)
    big.record_array([7, 10**10])
    with pytest.raises(ValueError):
        small.add(big)
    with pytest.raises(ValueError):
        small += big
    assert small == before
    assert small.rejected_count == 1
    assert np.array_equal(small.counts(), before.counts())


def test_add_of_a_wider_histogram_whose_values_fit_succeeds():
    small = make(1, 10**6, 2)
    big = make(1, 10**12, 3)
    big.record_array([7, 999_000])
    small.add(big)
    assert small.total_count == 2


def test_add_rejects_non_histogram():
    h = make()
    with pytest.raises(TypeError):
        h.add([1, 2, 3])


def test_iadd_self_doubles():
    h = make()
    h.record_array(lognormal_values(5, 3000))
    h.record(-1)
    counts = h.counts()
    h += h
    assert np.array_equal(h.counts(), 2 * counts)
    assert h.total_count == 6000
    assert h.rejected_count == 2


def test_binary_add_leaves_operands_unchanged():
    a = make()
    b = make()
    a.record_array([1, 2, 3])
    b.record_array([10, 20])
    a_before, b_before = a.copy(), b.copy()
    c = a + b
    assert a == a_before and b == b_before
    assert c.total_count == 5
    assert c is not a and c is not b
    assert np.array_equal(c.counts(), a.counts() + b.counts())


@pytest.mark.parametrize("other_layout", [(1, 3_600_000_000_000, 3), (1, 10**6, 2)])
def test_add_sums_rejected_counts(other_layout):
    a = make()
    b = make(*other_layout)
    a.record(-1)
    a.record(-2)
    b.record_array([-1, -2, -3, 5])
    a.add(b)
    assert a.rejected_count == 5
    assert a.total_count == 1


# ------------------------------------------------------------------ reset


def test_reset_clears_everything():
    h = make()
    h.record_array(lognormal_values(6, 1000))
    h.record(-1)
    h.record(2**62)
    assert h.rejected_count == 2
    h.reset()
    assert h.total_count == 0
    assert h.rejected_count == 0
    assert h.min == 0 and h.max == 0
    assert h.mean == 0.0 and h.stddev == 0.0
    assert not h.counts().any()
    assert h == make()
    assert h.record(10)
    assert h.min == 10 and h.max == 10


# ------------------------------------------------ queries vs counts array


@pytest.fixture(scope="module")
def populated():
    h = make(1, 10**12, 3)
    h.record_array(lognormal_values(8, 30_000, 10**12))
    h.record_n(0, 3)
    return h


def test_reference_index_mapping_agrees_with_count_at_value(populated):
    counts = populated.counts()
    buckets = populated.recorded_buckets()
    for lo, hi, c in zip(buckets.lowest_values.tolist(), buckets.highest_values.tolist(), buckets.counts.tolist()):
        assert counts[ref_counts_index(populated, lo)] == c
        assert ref_counts_index(populated, hi) == ref_counts_index(populated, lo)
        assert populated.count_at_value(hi) == c
    nonzero = np.flatnonzero(counts)
    assert len(nonzero) == len(buckets.counts)


@pytest.mark.parametrize(
    "low, high",
    [(0, 0), (0, 10**12), (100, 5000), (5000, 100), (1, 1), (123_456, 9_876_543), (10**11, 10**15), (-5, 50), (10**15, 10**16), (-10, -1)],
)
def test_count_between_equals_direct_sum_of_counts(populated, low, high):
    counts = populated.counts()
    last = len(counts) - 1
    if high < low or high < 0:
        expected = 0
    else:
        first = 0 if low <= 0 else ref_counts_index(populated, low)
        end = min(ref_counts_index(populated, high), last)
        expected = int(counts[first : end + 1].sum()) if first <= last else 0
    assert populated.count_between(low, high) == expected


def test_count_between_whole_range_is_total(populated):
    assert populated.count_between(0, 2**62) == populated.total_count


@pytest.mark.parametrize("value", [0, 1, 999, 2048, 40_000, 442_413, 10**8, 10**12, 10**14])
def test_percentile_of_value_equals_cumulative_fraction(populated, value):
    counts = populated.counts()
    idx = min(ref_counts_index(populated, value), len(counts) - 1)
    expected = 100.0 * counts[: idx + 1].sum() / populated.total_count
    assert populated.percentile_of_value(value) == pytest.approx(expected, rel=1e-12)


def test_percentile_of_value_edge_cases():
    h = make()
    assert h.percentile_of_value(5) == 100.0  # empty
    h.record_array([10, 20, 30, 40])
    assert h.percentile_of_value(-1) == 0.0
    assert h.percentile_of_value(9) == 0.0
    assert h.percentile_of_value(10) == 25.0
    assert h.percentile_of_value(35) == 75.0
    assert h.percentile_of_value(10**15) == 100.0


def test_value_at_percentile_walks_cumulative_counts(populated):
    counts = populated.counts()
    cum = np.cumsum(counts)
    total = populated.total_count
    for p in (0.0, 0.5, 1, 25, 50, 75, 90, 99, 99.9, 99.99, 100):
        target = max(1, int(p * total / 100 + 0.5))
        idx = int(np.searchsorted(cum, target))  # first index with cum >= target
        lowest = populated.recorded_buckets().lowest_values
        # value of index idx: find via the bucket whose reference index is idx
        lo = next(v for v in lowest.tolist() if ref_counts_index(populated, v) == idx)
        expected = populated.lowest_equivalent_value(lo) if p == 0 else populated.highest_equivalent_value(lo)
        assert populated.value_at_percentile(p) == expected


def test_values_at_percentiles_in_any_order_match_single_queries(populated):
    ps = [99.9, 0, 50, 100, 1, 50, 90, 12.5]
    out = populated.values_at_percentiles(ps)
    assert out.dtype == np.int64
    assert out.tolist() == [populated.value_at_percentile(p) for p in ps]
    assert populated.values_at_percentiles(np.array(ps)).tolist() == out.tolist()
    assert populated.values_at_percentiles([]).size == 0
    d = populated.percentiles([50, 99])
    assert d == {50.0: populated.value_at_percentile(50), 99.0: populated.value_at_percentile(99)}


@pytest.mark.parametrize("bad", [-0.1, -1, 100.0001, 101, float("nan"), float("inf"), float("-inf")])
def test_percentile_out_of_range_raises_value_error(populated, bad):
    with pytest.raises(ValueError):
        populated.values_at_percentiles([50, bad])
    with pytest.raises(ValueError):
        populated.value_at_percentile(bad)
    with pytest.raises(ValueError):
        populated.percentiles([bad])


@pytest.mark.parametrize("sig", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("lowest", [1, 3, 1000])
def test_equivalent_value_helpers_are_consistent(sig, lowest):
    h = make(lowest, 10**13, sig)
    rng = np.random.default_rng(sig * 1000 + lowest)
    values = [0, 1, lowest, lowest - 1, 2047, 2048, 10**13, first_untrackable_value(h) - 1]
    values += np.rint(np.exp(rng.uniform(0, math.log(10**13), 300))).astype(np.int64).tolist()
    for v in values:
        lo = h.lowest_equivalent_value(v)
        hi = h.highest_equivalent_value(v)
        mid = h.median_equivalent_value(v)
        width = h.equivalent_value_range(v)
        assert lo <= v <= hi
        assert hi - lo + 1 == width
        assert lo <= mid <= hi
        assert mid == lo + width // 2
        assert width & (width - 1) == 0  # a power of two
        assert h.lowest_equivalent_value(hi) == lo
        assert h.highest_equivalent_value(lo) == hi
        assert h.lowest_equivalent_value(hi + 1) == hi + 1  # next bucket starts right after
        if v >= h.sub_bucket_count // 2 << h.unit_magnitude:
            assert width <= v / 10**sig  # the promised relative precision
        else:
            assert width == 2**h.unit_magnitude


# --------------------------------------------------------------- iteration


def test_iteration_yields_highest_equivalent_values_and_counts(populated):
    pairs = list(populated)
    assert sum(c for _, c in pairs) == populated.total_count
    values = [v for v, _ in pairs]
    assert values == sorted(values) and len(set(values)) == len(values)
    for v, c in pairs:
        assert c > 0
        assert populated.highest_equivalent_value(v) == v
        assert populated.count_at_value(v) == c
    b = populated.recorded_buckets()
    assert np.array_equal(b.highest_values, [populated.highest_equivalent_value(v) for v in b.lowest_values.tolist()])
    assert pairs[0][1] == 3 and pairs[0][0] == 0


# ------------------------------------------------------------ pickle, copy


@pytest.mark.parametrize("protocol", [0, 2, 4, pickle.HIGHEST_PROTOCOL])
def test_pickle_round_trip_keeps_every_statistic(protocol):
    h = make(5, 10**11, 4)
    h.record_array(lognormal_values(9, 10_000, 10**11))
    h.record_n(12_345, 2**35)
    h.record(-3)
    h.record(2**62)
    back = pickle.loads(pickle.dumps(h, protocol=protocol))
    assert isinstance(back, Histogram)
    assert back == h
    assert all_stats(back) == all_stats(h)
    assert back.rejected_count == 2
    assert (back.lowest_discernible_value, back.highest_trackable_value, back.significant_figures) == (5, 10**11, 4)


def test_pickle_round_trip_of_empty_histogram():
    h = make(2, 100, 1)
    back = pickle.loads(pickle.dumps(h))
    assert back == h
    assert all_stats(back) == all_stats(h)


def test_pickle_round_trip_keeps_max_of_zero_only_histogram():
    """max() is 0 when the raw max is 0, while a decoded histogram's max is the top of
    bucket 0 (511 here); pickle must carry the raw min/max so max stays 0."""
    h = make(1000, 10**6, 2)
    h.record(0)
    assert h.max == 0
    back = pickle.loads(pickle.dumps(h))
    assert back == h
    assert back.max == h.max


def test_copy_and_deepcopy_are_independent():
    h = make()
    h.record_array([1, 2, 3])
    h.record(-1)
    for dup in (copy.copy(h), copy.deepcopy(h), h.copy(), copy.deepcopy([h])[0]):
        assert dup == h and dup is not h
        assert all_stats(dup) == all_stats(h)
        dup.record(10**9)
        dup.record(-5)
        assert h.total_count == 3 and h.rejected_count == 1
        assert h.count_at_value(10**9) == 0
        assert dup != h
    h.reset()
    assert h.total_count == 0


def test_histograms_are_unhashable_and_compare_by_content():
    a = make()
    b = make()
    assert a == b
    a.record(1)
    assert a != b
    b.record(1)
    assert a == b
    assert a != make(2, 3_600_000_000_000, 3)
    assert (a == 5) is False
    with pytest.raises(TypeError):
        hash(a)


# -------------------------------------------------------------------- repr


def test_repr_contains_total_count():
    h = make()
    assert "total_count=0" in repr(h)
    h.record_array([1, 2, 3, 4, 5, 1000])
    r = repr(h)
    assert "total_count=6" in r
    assert f"max={h.max}" in r


# --------------------------------------------------------------- threads


N_THREADS = 8
PER_THREAD = 200_000


def _run_threads(targets):
    barrier = threading.Barrier(len(targets))
    errors = []

    def wrap(fn):
        def run():
            try:
                barrier.wait()
                fn()
            except BaseException as e:  # pragma: no cover - surfaced below
                errors.append(e)

        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_threaded_record_array_loses_nothing():
    shared = make()
    arrays = [lognormal_values(100 + t, PER_THREAD) for t in range(N_THREADS)]

    def worker(arr):
        def fn():
            for chunk in np.array_split(arr, 40):
                shared.record_array(chunk)

        return fn

    _run_threads([worker(a) for a in arrays])
    ref = make()
    for a in arrays:
        ref.record_array(a)
    assert shared.total_count == N_THREADS * PER_THREAD
    assert shared.rejected_count == 0
    assert np.array_equal(shared.counts(), ref.counts())
    assert shared.min == ref.min and shared.max == ref.max


def test_threaded_mixed_record_array_and_record_loses_nothing():
    shared = make()
    per_value_n = 20_000
    arrays = [
        lognormal_values(200 + t, PER_THREAD if t % 2 == 0 else per_value_n) for t in range(N_THREADS)
    ]

    def bulk(arr):
        def fn():
            for chunk in np.array_split(arr, 40):
                shared.record_array(chunk)

        return fn

    def single(arr):
        def fn():
            rec = shared.record
            for v in arr.tolist():
                rec(v)

        return fn

    _run_threads([bulk(a) if t % 2 == 0 else single(a) for t, a in enumerate(arrays)])
    ref = make()
    for a in arrays:
        ref.record_array(a)
    expected_total = sum(a.size for a in arrays)
    assert shared.total_count == expected_total
    assert np.array_equal(shared.counts(), ref.counts())
    assert shared.min == ref.min and shared.max == ref.max


# ------------------------------------------------------------ microbench


@pytest.mark.parametrize("mode", list(_core.RecordMode.__members__.values()))
@pytest.mark.parametrize("threads", [1, 2])
def test_time_record_ns_returns_positive_time(mode, threads):
    values = lognormal_values(300, 50_000)
    values = np.clip(values, 1, 3_600_000_000_000)
    ns = _core.time_record_ns(values, threads, mode)
    assert isinstance(ns, float)
    assert ns > 0 and math.isfinite(ns)


def test_record_modes_are_the_three_schemes():
    assert set(_core.RecordMode.__members__) == {"single_writer", "atomic_shared", "sharded"}


@pytest.mark.parametrize("threads", [0, -1, 65])
def test_time_record_ns_rejects_bad_thread_counts(threads):
    with pytest.raises(ValueError, match="threads"):
        _core.time_record_ns(np.arange(1, 100, dtype=np.int64), threads, _core.RecordMode.single_writer)


def test_time_record_ns_rejects_empty_values():
    with pytest.raises(ValueError):
        _core.time_record_ns(np.array([], dtype=np.int64), 1, _core.RecordMode.single_writer)


def test_exact_min_and_max_are_the_recorded_values_not_bucket_bounds():
    h = Histogram()
    assert (h.exact_min, h.exact_max) == (0, 0)
    h.record(12_345)
    h.record(987_654_321)
    assert (h.exact_min, h.exact_max) == (12_345, 987_654_321)
    assert h.min != 12_345 or h.max != 987_654_321  # the bucket-precision view differs
