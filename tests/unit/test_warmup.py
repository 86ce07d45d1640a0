"""Warm-up (--warmup-s, EngineSettings.warmup_s): queries scheduled in the first warmup_s
are issued at the schedule but not recorded; they are counted apart, and every bound,
duration, histogram and the time series start at the end of the warm-up.

The tests that start processes or servers are in tests/integration/test_warmup.py."""

from __future__ import annotations

import time

import pytest

import loadgen
from loadgen import EngineSettings
from loadgen.engine import Engine


def _run(settings: EngineSettings, sut):
    return Engine(settings, sut).run()


@pytest.mark.parametrize("sut_name", ["demo", "function", "async"])
def test_warmup_queries_are_issued_at_the_rate_and_counted_apart(sut_name):
    def f(sample):
        return None

    async def af(sample):
        return None

    sut = {"demo": loadgen.DemoSUT(), "function": f, "async": af}[sut_name]
    rate, warmup, duration = 2000.0, 0.4, 0.6
    r = _run(EngineSettings(mode="constant", target_qps=rate, duration_s=duration, warmup_s=warmup), sut)
    c = r.counts
    # Constant arrivals: the warm-up holds rate x warmup queries, the measured part rate x duration.
    assert c["warmup_issued"] == pytest.approx(rate * warmup, abs=2)
    assert c["issued"] == pytest.approx(rate * duration, abs=2)
    assert c["warmup_completed"] + c["warmup_failed"] == c["warmup_issued"]
    assert c["issued"] == c["completed"] + c["failed"] + c["timed_out"] + c["cancelled"] + c["outstanding"]
    # Only measured queries are in the histograms.
    assert r.latency.total_count == c["completed"]
    assert r.issue_delay.total_count == c["issued"]
    # Durations start at the end of the warm-up.
    assert r.issue_duration_s == pytest.approx(duration, abs=0.05)


def test_a_slow_start_is_kept_out_of_the_latencies_by_the_warmup():
    """A SUT that is slow for its first 0.3 s (a server compiling): without a warm-up
    its slow answers are in the tail; with a 0.5 s warm-up they are not."""

    def make_sut():
        start = []

        def sut(sample):
            if not start:
                start.append(time.monotonic())
            if time.monotonic() - start[0] < 0.3:
                time.sleep(0.02)
        return sut

    settings = dict(mode="poisson", target_qps=200.0, duration_s=0.8, schedule_seed=3)
    cold = _run(EngineSettings(**settings), make_sut())
    warm = _run(EngineSettings(**settings, warmup_s=0.5), make_sut())
    assert cold.latency.max > 50_000_000  # the slow start queued up: tens of ms
    # Kept out: the warm run has a fraction of the cold one's slow answers. Counted, not
    # the largest one: a busy shared machine adds hiccups of its own, of 100 ms and more,
    # that a single maximum cannot tell from the slow start.
    slow = 20_000_000
    cold_slow = cold.latency.count_between(slow, cold.latency.highest_trackable_value)
    warm_slow = warm.latency.count_between(slow, warm.latency.highest_trackable_value)
    assert cold_slow >= 40 and warm_slow < cold_slow / 2, (cold_slow, warm_slow)
    assert warm.counts["warmup_completed"] > 50


def test_query_counts_count_measured_queries_only_in_closed_loop():
    r = _run(EngineSettings(mode="closed", concurrency=2, query_count=500, warmup_s=0.2), loadgen.DemoSUT())
    c = r.counts
    assert c["issued"] == 500
    assert c["warmup_issued"] > 0
    assert r.latency.total_count == c["completed"] == 500


def test_failures_in_the_warmup_are_counted_apart_and_not_as_errors():
    calls = []

    def sut(sample):
        calls.append(time.monotonic())
        if time.monotonic() - calls[0] < 0.25:
            raise RuntimeError("still loading")

    r = _run(EngineSettings(mode="constant", target_qps=400.0, duration_s=0.5, warmup_s=0.4), sut)
    c = r.counts
    assert c["warmup_failed"] > 50
    assert c["failed"] == 0 and not r.errors and not r.error_messages
    assert c["completed"] == c["issued"] > 150


def test_timeouts_in_the_warmup_are_warmup_failures():
    class Never:
        def issue(self, batch):  # keeps every query: they time out
            pass

    r = _run(EngineSettings(mode="constant", target_qps=200.0, duration_s=0.3, warmup_s=0.2,
                            timeout_ms=50.0, grace_s=0.2), Never())
    c = r.counts
    assert c["warmup_failed"] == c["warmup_issued"] > 30
    assert c["timed_out"] + c["cancelled"] == c["issued"] > 50


def test_the_time_series_starts_after_the_warmup():
    r = _run(EngineSettings(mode="constant", target_qps=1000.0, duration_s=0.6, warmup_s=0.5, interval_s=0.2),
             loadgen.DemoSUT())
    first = r.timeseries[0]
    assert first["start_offset_ns"] == 0
    assert first["issued"] == pytest.approx(200, abs=3)  # the first interval holds no warm-up query
    assert sum(p["completed"] for p in r.timeseries) <= r.counts["completed"]


@pytest.mark.parametrize("mode, extra", [
    ("offline", dict(query_count=10)),
    ("trace", dict(trace_offsets_ns=[0, 1000])),
    ("stages", dict(stages=[(0.1, 10.0, 10.0)])),
])
def test_warmup_is_refused_where_it_has_no_meaning(mode, extra):
    with pytest.raises(ValueError, match="warmup_s"):
        EngineSettings(mode=mode, warmup_s=0.5, **extra).validate()


