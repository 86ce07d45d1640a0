"""The recorder shared by the engine and the MLPerf run: completions whose times cannot be
recorded are counted (never silently lost), and "over the latency bound" is an exact
count kept at record time, checked against numpy on the raw latencies.

Latencies are made exact by completing each query at its scheduled time plus a chosen
latency, so no test here depends on the machine's timing. Chosen latencies start at
BASE_NS: a completion before the query was issued is out of range too, and on a busy
machine a query may be issued milliseconds after its scheduled time.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import loadgen
from loadgen import EngineSettings, _core

MS = 1_000_000
BASE_NS = 1_000_000_000
FAR_FUTURE_NS = 2**62  # far beyond any histogram's range (1 h by default)
BOUNDS_NS = [BASE_NS + 1 * MS, BASE_NS + 5 * MS, BASE_NS + 20 * MS]


def tricky_latencies(bounds, seed=7, n_random=300):
    """Random latencies of BASE_NS up to 30 ms more, plus each bound exactly, one ns either side, and
    values above the bound that share its HDR bucket (which a bucket count gets wrong)."""
    h = _core.HdrHistogram(1, 3_600_000_000_000, 3)
    special = []
    for b in bounds:
        above_same_bucket = h.highest_equivalent_value(b)
        assert above_same_bucket > b and h.lowest_equivalent_value(above_same_bucket) == h.lowest_equivalent_value(b)
        special += [b - 1, b, b, b + 1, above_same_bucket, above_same_bucket - 1]
    rng = np.random.default_rng(seed)
    lat = np.concatenate([BASE_NS + rng.integers(0, 30 * MS, n_random), np.array(special, dtype=np.int64)])
    rng.shuffle(lat)
    return lat.astype(np.int64)


def core_queue_settings(n_queries, bounds=()):
    s = _core.EngineSettings()
    s.load_mode = _core.LoadMode.open_loop
    s.arrival = _core.ArrivalKind.constant
    s.target_qps = 50_000.0
    s.max_query_count = n_queries
    s.sut = _core.NativeSutSettings(kind=_core.SutKind.queue)
    s.latency_bounds_ns = list(bounds)
    s.interval_ns = 0
    s.grace_ns = 5_000_000_000
    return s


def drive_core_engine(engine, latency_of):
    """Completes every query at scheduled + latency_of(k) (k: issue order); returns the
    scheduled times in issue order."""
    scheduled_all = []
    engine.start()
    while True:
        got = engine.take_batch(64, 5.0)
        if got is None:
            break
        ids, _, scheduled = got
        k0 = len(scheduled_all)
        scheduled_all.extend(scheduled.tolist())
        t = scheduled + np.array([latency_of(k0 + i) for i in range(len(ids))], dtype=np.int64)
        engine.complete_many(ids, t)
    assert engine.wait(20.0), "the run did not end"
    return np.array(scheduled_all, dtype=np.int64)


# ------------------------------------------------------------------ the engine


class ReportsStrangeTimes:
    """Batched SUT that completes query k (issue order) far in the future when k % 3 == 0,
    5 us before it was scheduled when k % 3 == 1, and BASE_NS after it was scheduled
    otherwise."""

    def __init__(self):
        self.lock = threading.Lock()
        self.k = 0
        self.far, self.early, self.normal = [], [], []  # scheduled times of each kind

    def issue(self, batch):
        with self.lock:
            times = []
            for scheduled in batch.scheduled_ns.tolist():
                kind = self.k % 3
                self.k += 1
                if kind == 0:
                    self.far.append(scheduled)
                    times.append(FAR_FUTURE_NS)
                elif kind == 1:
                    self.early.append(scheduled)
                    times.append(scheduled - 5_000)
                else:
                    self.normal.append(scheduled)
                    times.append(scheduled + BASE_NS)
        batch.complete_many(batch.ids, np.array(times, dtype=np.int64))


def test_completions_out_of_range_are_counted_not_recorded_and_still_complete():
    sut = ReportsStrangeTimes()
    s = EngineSettings(mode="constant", target_qps=5_000, query_count=60, grace_s=5.0, interval_s=0.0)
    with loadgen.Engine(s, sut) as eng:
        eng.start()
        assert eng.wait(20.0), "the run did not end"
        r = eng.result()
    c = r.counts
    assert c["issued"] == c["completed"] == 60, c
    assert c["outstanding"] == 0 and c["unknown_completions"] == 0, c
    assert c["out_of_range"] == len(sut.far) + len(sut.early) == 40, c
    # Only the in-range completions are in the histograms, none rejected by them.
    assert r.latency.total_count == len(sut.normal) == 20
    assert r.latency.rejected_count == 0
    assert r.service_time.total_count == 20
    assert r.latency.min >= BASE_NS * 0.999 and r.latency.max <= BASE_NS * 1.001
    # The extremes say what the SUT reported: 5 us early, and the farthest future time.
    assert c["out_of_range_min_ns"] == -5_000
    assert c["out_of_range_max_ns"] == FAR_FUTURE_NS - min(sut.far)


def test_counts_have_no_out_of_range_when_every_time_is_recordable():
    s = core_queue_settings(50)
    e = _core.Engine(s)
    drive_core_engine(e, lambda k: BASE_NS + k)
    c = e.counts()
    assert c["completed"] == 50 and c["out_of_range"] == 0, c
    assert (c["out_of_range_min_ns"], c["out_of_range_max_ns"]) == (0, 0)
    assert e.recorder.latency().total_count == 50


def test_engine_over_bound_counts_equal_numpy_on_the_raw_latencies():
    lat = tricky_latencies(BOUNDS_NS)
    e = _core.Engine(core_queue_settings(len(lat), BOUNDS_NS))
    drive_core_engine(e, lambda k: int(lat[k]))
    assert e.counts()["completed"] == len(lat)
    assert e.recorder.latency().total_count == len(lat)
    assert e.recorder.over_bound() == [int(np.sum(lat > b)) for b in BOUNDS_NS]
    # A count from the histogram's buckets differs here: that is why it is kept exactly.
    h = e.recorder.latency()
    bucket_estimate = h.count_between(BOUNDS_NS[0] + 1, h.max)
    assert bucket_estimate != int(np.sum(lat > BOUNDS_NS[0]))


def test_engine_without_bounds_reports_an_empty_over_bound_list():
    e = _core.Engine(core_queue_settings(5))
    drive_core_engine(e, lambda k: BASE_NS)
    assert e.recorder.over_bound() == []


def test_first_token_before_scheduled_is_counted_not_recorded():
    e = _core.Engine(core_queue_settings(4))
    e.start()
    seen = 0
    while True:
        got = e.take_batch(8, 5.0)
        if got is None:
            break
        ids, _, scheduled = got
        for i, t0 in zip(ids.tolist(), scheduled.tolist()):
            # The first two get a first token before they were scheduled.
            assert e.first_token(i, t0 - 1_000 if seen < 2 else t0 + 10_000)
            e.complete(i, t0 + BASE_NS)
            seen += 1
    assert e.wait(20.0)
    c = e.counts()
    assert c["first_token_out_of_range"] == 2 and c["out_of_range"] == 0, c
    assert e.recorder.ttft().total_count == 2


# ------------------------------------------------------------------ the MLPerf run


def offline_run(samples, **kw):
    args = {"scenario": 3, "accuracy": False, "loaded_samples": [0, 1, 2, 3], "sample_distribution_end": 4,
            "samples_per_query": samples, "target_duration_ns": 0, "min_query_count": 1, "max_query_count": 0,
            "max_duration_ns": 0, "max_async_queries": 0, "target_qps": 1.0}
    args.update(kw)
    return _core.MlperfRun(**args)


def test_mlperf_over_bound_and_out_of_range_are_exact_and_weighted_by_samples():
    lat = tricky_latencies(BOUNDS_NS, seed=11, n_random=120)
    n_far, n_early = 5, 3
    run = offline_run(len(lat) + n_far + n_early, latency_bounds_ns=BOUNDS_NS)
    ids = []
    run.issue_all(lambda i, idx: ids.extend(i), fast=True)
    assert len(ids) == len(lat) + n_far + n_early
    start = run.counts()["start_ns"]  # Offline: every sample is scheduled at the start
    # Samples with equal latencies complete in one call: one record of several samples.
    order = np.argsort(lat, kind="stable")
    pos = 0
    while pos < len(order):
        end = pos
        while end < len(order) and lat[order[end]] == lat[order[pos]]:
            end += 1
        group = [ids[int(j)] for j in order[pos:end]]
        assert run.complete_ids(group, start + int(lat[order[pos]])) == 0
        pos = end
    rest = ids[len(lat):]
    assert run.complete_ids(rest[:n_far], FAR_FUTURE_NS) == 0  # several samples at once
    assert run.complete_ids(rest[n_far:], start - 1_000) == 0
    assert run.wait_all(5.0)
    c = run.counts()
    assert c["samples_completed"] == len(ids) and c["queries_completed"] == 1, c
    assert c["out_of_range"] == n_far + n_early, c
    assert c["out_of_range_min_ns"] == -1_000
    assert c["out_of_range_max_ns"] == FAR_FUTURE_NS - start
    assert run.recorder.latency().total_count == len(lat)
    assert run.recorder.over_bound() == [int(np.sum(lat > b)) for b in BOUNDS_NS]
    # The latency sum and maximum leave the unrecordable samples out.
    assert c["latency_sum_ns"] == int(lat.sum())
    assert c["max_latency_ns"] == int(lat.max())


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize("bounds", [[0], [-5], [MS, 0], [MS] * 9])
def test_bad_latency_bounds_are_refused_naming_the_field(bounds):
    s = core_queue_settings(10)
    s.latency_bounds_ns = bounds
    with pytest.raises(ValueError, match="latency_bounds_ns"):
        _core.Engine(s)
    with pytest.raises(ValueError, match="latency_bounds_ns"):
        offline_run(4, latency_bounds_ns=bounds)


def test_eight_bounds_are_accepted_and_each_counted():
    s = core_queue_settings(3)
    s.latency_bounds_ns = [1, 2, 3, 4, 5, 6, 7, 8]
    e = _core.Engine(s)
    drive_core_engine(e, lambda k: BASE_NS)
    assert e.recorder.over_bound() == [3] * 8


def test_ttft_and_tpot_over_bound_counts_are_exact():
    """First tokens at scheduled + a chosen TTFT, completions with a chosen token count:
    the exact TTFT and TPOT over-bound counts equal numpy's on the raw values, including
    values in the same HDR bucket as a bound."""
    n = 120
    ttft = tricky_latencies(BOUNDS_NS[:2], seed=11, n_random=n - 12)[:n]
    tpot_per_token = (tricky_latencies(BOUNDS_NS[:2], seed=12, n_random=n - 12)[:n] // 1000).astype(np.int64)
    tokens = 5
    ttft_bounds = BOUNDS_NS[:2]
    tpot_bounds = [b // 1000 for b in BOUNDS_NS[:2]]
    s = core_queue_settings(n)
    s.ttft_bounds_ns = ttft_bounds
    s.tpot_bounds_ns = tpot_bounds
    e = _core.Engine(s)
    e.start()
    k = 0
    while True:
        got = e.take_batch(64, 5.0)
        if got is None:
            break
        ids, _, scheduled = got
        for qid, sched in zip(ids.tolist(), scheduled.tolist()):
            first = sched + int(ttft[k])
            assert e.first_token(qid, first)
            assert e.complete(qid, first + int(tpot_per_token[k]) * (tokens - 1), tokens)
            k += 1
    assert e.wait(20.0), "the run did not end"
    assert k == n
    assert e.recorder.over_ttft_bound() == [int(np.sum(ttft > b)) for b in ttft_bounds]
    assert e.recorder.over_tpot_bound() == [int(np.sum(tpot_per_token > b)) for b in tpot_bounds]
    assert e.counts()["first_token_out_of_range"] == 0


def test_ttft_and_tpot_bounds_are_validated_by_name():
    for field in ("ttft_bounds_ns", "tpot_bounds_ns"):
        s = core_queue_settings(1)
        setattr(s, field, [0])
        with pytest.raises(ValueError, match=field):
            _core.Engine(s)
