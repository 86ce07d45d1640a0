"""loadgen.units: the one table of time units, conversions to ns, durations like '10ms'."""

import pytest

from loadgen.units import (
    NS_PER,
    SECONDS_PER,
    TIME_UNITS,
    format_ns,
    ms_to_ns,
    ns_to_s,
    parse_duration_s,
    s_to_ns,
    to_ns,
    us_to_ns,
)


def test_factors_agree_between_the_ns_and_the_seconds_tables():
    assert TIME_UNITS == ("ns", "us", "ms", "s")
    for unit in TIME_UNITS:
        assert SECONDS_PER[unit] * 1e9 == pytest.approx(NS_PER[unit])
    assert SECONDS_PER["m"] == 60.0 and SECONDS_PER["h"] == 3600.0


@pytest.mark.parametrize("value, unit, ns", [(3, "ns", 3), (2.5, "us", 2500), (5, "ms", 5_000_000),
                                             (0.25, "s", 250_000_000)])
def test_to_ns_scales_by_the_unit(value, unit, ns):
    assert to_ns(value, unit) == ns


def test_to_ns_names_the_known_units_for_an_unknown_one():
    with pytest.raises(ValueError, match="unknown unit 'min'.*ns, us, ms, s"):
        to_ns(1, "min")


def test_conversions_round_to_whole_ns_and_treat_none_and_zero_as_none():
    assert s_to_ns(1.5) == 1_500_000_000 and isinstance(s_to_ns(1.5), int)
    assert ms_to_ns(0.0000015) == 2  # 1.5 ns rounds to even
    assert us_to_ns(100) == 100_000
    for f in (s_to_ns, ms_to_ns, us_to_ns):
        assert f(None) == 0 and f(0) == 0
    assert ns_to_s(2_500_000_000) == 2.5


@pytest.mark.parametrize("text, seconds", [("10s", 10.0), ("500ms", 0.5), ("2m", 120.0), ("1.5", 1.5),
                                           ("1h", 3600.0), (" 250 us ", 0.00025), ("1e3ns", 1e-6)])
def test_parse_duration_s_reads_a_number_with_an_optional_unit(text, seconds):
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten", "10 days", "-1s", "s"])
def test_parse_duration_s_rejects_what_is_not_a_duration(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration_s(text)


@pytest.mark.parametrize("ns, text", [(0, "0 ns"), (999, "999 ns"), (1000, "1.0 us"), (1_250_000, "1.250 ms"),
                                      (2_000_000_000, "2.000 s")])
def test_format_ns_picks_the_largest_unit_that_keeps_the_value_at_least_1(ns, text):
    assert format_ns(ns) == text
