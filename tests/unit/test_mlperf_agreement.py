"""Agreement of :mod:`loadgen.mlperf` with the MLPerf LoadGen (``mlperf_loadgen``).

Every test runs one MLPerf-style harness (``tests/mlperf_harnesses.py``) twice with the
same settings and seeds: once against ``mlperf_loadgen`` and once against
``loadgen.mlperf``; the harness code is the same for both. What must agree exactly:

* the sample indices handed to issue_query, call by call (Server with coalescing:
  the concatenated sequence, since how many queries one call carries depends on time);
* the number of flush_queries calls, the QSL load/unload calls with their index lists
  (in order), the ``loaded_qsl_set`` log entries, and the order of load, issue, flush
  and unload calls;
* the ``requested_*`` / ``effective_*`` settings and ``generated_*`` entries of the
  detail log, the query count and the validity decision with its parts;
* the accuracy log, as a set of (seq_id, qsl_idx, data) entries, and how many times
  the response callback ran;
* the summary's lines, numbers masked (ours may add lines of its own).

A setting that ours refuses with NotImplementedError counts as an expected failure,
not a disagreement.

Every case is built so these do not depend on timing: the SUTs sleep a fixed time
per query so a run always outlasts min_duration and ends exactly at min_query_count;
Server issues all generated queries; INVALID cases fail for a reason that does not
depend on speed (max_query_count below min_query_count, a 1 us latency bound,
too few queries for early stopping, an Offline SUT far faster than min_duration).

Latencies are compared only where they are robust: the closed-loop scenarios
(SingleStream inline, MultiStream from a worker), where each query is dominated by a
2 ms sleep. Both libraries then report about 2 ms plus scheduling noise; the 50th and
90th percentiles must agree within the larger of 5 % and 0.5 ms. That covers the
histogram's relative precision (0.1 %) and the different issue paths and thread
wake-ups on a small, noisy machine; a pair of runs that misses it is repeated (at most
LATENCY_ATTEMPTS runs in all), since a burst of load can shift one run's percentiles
while a systematic difference shows in every run. Server and Offline latencies are only
checked against bounds that hold for both (no overlatency query; Offline's largest
latency is at least the sum of the SUT's sleeps).

Without ``mlperf_loadgen`` (PyPI ``mlcommons-loadgen``) installed, these tests skip.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from pathlib import Path

import pytest

ref_lg = pytest.importorskip("mlperf_loadgen")


def _load_harnesses():
    name = "mlperf_harnesses"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "mlperf_harnesses.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


H = _load_harnesses()
MS = H.MS

# The module under test; the reference is mlperf_loadgen.
CANDIDATE = "loadgen.mlperf"

# (qsl_rng_seed, sample_index_rng_seed, schedule_rng_seed): the defaults, small
# values, and the 64-bit seeds of MLPerf's mlperf.conf (all above 2**32).
SEEDS = [
    (0, 0, 0),
    (12345, 678, 91011),
    (2085463073848966840, 2747215439041700203, 16159082839903944936),
]
SEED_IDS = ["default", "small", "official"]

LATENCY_TOLERANCE_REL = 0.05
LATENCY_TOLERANCE_ABS_NS = 0.5 * MS
LATENCY_ATTEMPTS = 3

# Detail-log entries that do not depend on timing in the cases below.
RESULT_KEYS = (
    "result_validity",
    "result_perf_constraints_met",
    "result_min_duration_met",
    "result_min_queries_met",
    "early_stopping_met",
    "result_query_count",
)
GENERATED_KEYS = ("generated_query_count", "generated_samples_per_query", "generated_query_duration")


@pytest.fixture(scope="module")
def ours():
    return importlib.import_module(CANDIDATE)


@pytest.fixture
def both(ours, tmp_path):
    """Run a harness against the reference, then against ours: (ref, got)."""

    def go(harness, **kw):
        ref = harness(ref_lg, tmp_path / "ref", **kw)
        got = harness(ours, tmp_path / "ours", **kw)
        for name, obs in (("mlperf_loadgen", ref), (CANDIDATE, got)):
            assert not obs.errors, f"{name}: SUT errors {obs.errors}"
            # Ids identify a sample until the flush that ends its run (they may be reused
            # by a later loaded set).
            for ids in obs.id_epochs:
                assert len(set(ids)) == len(ids), f"{name}: response ids repeat within one run"
        return ref, got

    return go


# ------------------------------------------------------------------ assertions


def assert_same_settings(ref, got):
    for prefix in ("requested_", "effective_"):
        r, g = ref.keys_with_prefix(prefix), got.keys_with_prefix(prefix)
        missing = sorted(set(r) - set(g))
        assert not missing, f"{prefix}* keys missing from ours: {missing}"
        differ = {k: (r[k], g[k]) for k in r if r[k] != g[k]}
        assert not differ, f"{prefix}* differ (ref, ours): {differ}"


def assert_same_qsl(ref, got):
    assert [(k, len(v)) for k, v in got.qsl_events] == [(k, len(v)) for k, v in ref.qsl_events]
    assert got.qsl_events == ref.qsl_events, "QSL load/unload index lists differ"
    assert got.detail.get("loaded_qsl_set") == ref.detail.get("loaded_qsl_set")
    # The log names what the callback was given.
    loads = [v for k, v in ref.qsl_events if k == "load"]
    assert ref.detail.get("loaded_qsl_set") == loads


def assert_same_results(ref, got, keys=RESULT_KEYS):
    assert got.validity == ref.validity, f"summary: ours {got.validity}, mlperf_loadgen {ref.validity}"
    for key in keys:
        assert got.detail.get(key) == ref.detail.get(key), f"{key}: ours {got.detail.get(key)}, ref {ref.detail.get(key)}"


# The closing warning count: MLPerf's own logger warns about its buffer growth
# ("Logging allocation detected") depending on what ran earlier in the process, which
# says nothing about the test; the count line is left out of the comparison.
_WARNING_COUNT = re.compile(r"^(No warnings encountered|N warnings? encountered)")


def _masked_lines(text: str) -> list:
    lines = [re.sub(r"[-+]?\d[\d.e+-]*", "N", line).rstrip() for line in text.splitlines()]
    return [line for line in lines if not _WARNING_COUNT.match(line)]


def assert_same_summary_shape(ref, got):
    """Every line of MLPerf's summary is in ours, in order, numbers aside (ours may
    add lines of its own)."""
    want = _masked_lines(ref.summary)
    have = iter(_masked_lines(got.summary))
    missing = [line for line in want if not any(line == h for h in have)]
    assert not missing, f"summary lines missing or out of order in ours: {missing[:5]}"


def assert_agree(ref, got, *, per_call: bool = True, results=RESULT_KEYS):
    """The timing-free part of two runs agrees."""
    assert_same_settings(ref, got)
    assert_same_qsl(ref, got)
    for key in GENERATED_KEYS:
        assert got.detail.get(key) == ref.detail.get(key), f"{key}: ours {got.detail.get(key)}, ref {ref.detail.get(key)}"
    assert len(got.flat) == len(ref.flat), "number of issued samples differs"
    if per_call:
        assert len(got.issued) == len(ref.issued), "number of issue_query calls differs"
        first = next((i for i, (a, b) in enumerate(zip(ref.issued, got.issued)) if a != b), None)
        assert first is None, f"issue_query call {first}: ours {got.issued[first]}, ref {ref.issued[first]}"
    else:
        assert got.flat == ref.flat, "issued sample sequence differs"
    assert got.flush_calls == ref.flush_calls
    assert got.timeline == ref.timeline, "order of load / issue / flush / unload calls differs"
    assert_same_results(ref, got, results)
    assert_same_summary_shape(ref, got)


def latency_mismatches(ref, got, keys) -> list:
    out = []
    for key in keys:
        r, g = ref.one(key), got.one(key)
        tol = max(LATENCY_TOLERANCE_REL * max(r, g), LATENCY_TOLERANCE_ABS_NS)
        if abs(r - g) > tol:
            out.append(f"{key}: ours {g} ns, mlperf_loadgen {r} ns (tolerance {tol:.0f} ns)")
    return out


def assert_latency_close(both, harness, kw, ref, got, keys):
    """Percentiles agree within the tolerance. A mismatch may be a burst of load on a
    busy machine, so the pair of runs is repeated, after a pause, up to
    LATENCY_ATTEMPTS times in all; a systematic difference fails every time."""
    attempts = [latency_mismatches(ref, got, keys)]
    while attempts[-1] and len(attempts) < LATENCY_ATTEMPTS:
        time.sleep(1.0)
        ref, got = both(harness, **kw)
        attempts.append(latency_mismatches(ref, got, keys))
    assert not attempts[-1], attempts


# ------------------------------------------------------------------ SingleStream


@pytest.mark.parametrize("seeds", SEEDS, ids=SEED_IDS)
def test_single_stream_inline(both, seeds):
    ref, got = both(H.single_stream_inline, seeds=seeds)
    assert_agree(ref, got)
    assert len(ref.issued) == 64 and all(len(c) == 1 for c in ref.issued)
    assert ref.flush_calls == 1
    assert ref.validity == "VALID"
    for obs in (ref, got):
        assert obs.one("result_min_latency_ns") >= 2 * MS  # the SUT sleeps 2 ms
    keys = ["result_50.00_percentile_latency_ns", "result_90.00_percentile_latency_ns"]
    assert_latency_close(both, H.single_stream_inline, {"seeds": seeds}, ref, got, keys)


def test_single_stream_sample_count_override(both):
    """performance_sample_count_override shrinks the loaded set below the QSL's."""
    ref, got = both(H.single_stream_inline, seeds=SEEDS[1], performance_sample_count_override=40)
    assert_agree(ref, got)
    assert len(ref.qsl_events[0][1]) == 40
    assert set(got.flat) <= set(got.qsl_events[0][1])


def test_single_stream_max_query_count_invalid(both):
    """max_query_count below min_query_count: the run stops at 64 queries, INVALID."""
    ref, got = both(H.single_stream_inline, seeds=SEEDS[1], min_query_count=1000, max_query_count=64)
    assert_agree(ref, got)
    assert len(ref.issued) == 64
    assert ref.validity == "INVALID"
    assert ref.one("result_min_queries_met") is False


def test_single_stream_concatenate_permutation(both):
    """sample_concatenate_permutation: min_query_count becomes a multiple of the QSL's
    performance count (128) and each block of 128 queries is a permutation of the set."""
    ref, got = both(
        H.single_stream_inline,
        seeds=SEEDS[2],
        min_duration_ms=50,
        delay_s=0.001,
        expected_latency_ns=1 * MS,
        sample_concatenate_permutation=True,
    )
    assert_agree(ref, got)
    assert len(ref.issued) == 128
    assert sorted(ref.flat) == sorted(ref.qsl_events[0][1])


# ------------------------------------------------------------------ MultiStream


@pytest.mark.parametrize("seeds", SEEDS[:2], ids=SEED_IDS[:2])
def test_multi_stream_worker(both, seeds):
    """48 queries of 8 contiguous samples: too few for early stopping, so INVALID."""
    ref, got = both(H.multi_stream_worker, seeds=seeds)
    assert_agree(ref, got)
    assert len(ref.issued) == 48 and all(len(c) == 8 for c in ref.issued)
    assert ref.validity == "INVALID" and ref.one("early_stopping_met") is False
    for obs in (ref, got):
        assert obs.one("result_min_query_latency_ns") >= 2 * MS
    keys = ["result_50.00_percentile_per_query_latency_ns", "result_90.00_percentile_per_query_latency_ns"]
    assert_latency_close(both, H.multi_stream_worker, {"seeds": seeds}, ref, got, keys)


def test_multi_stream_three_samples_per_query(both):
    """samples_per_query 3: the loaded set is padded by 2, queries are contiguous."""
    ref, got = both(H.multi_stream_worker, seeds=SEEDS[2], samples_per_query=3)
    assert_agree(ref, got)
    assert len(ref.qsl_events[0][1]) == 130
    assert all(len(c) == 3 for c in ref.issued)


def test_multi_stream_valid(both):
    """662 queries (the early-stopping minimum for the 99th percentile): VALID."""
    ref, got = both(
        H.multi_stream_worker, seeds=SEEDS[2], min_query_count=662, min_duration_ms=100, delay_s=0.0005
    )
    assert_agree(ref, got)
    assert len(ref.issued) == 662
    assert ref.validity == "VALID"


# ------------------------------------------------------------------ Server


@pytest.mark.parametrize("seeds", SEEDS, ids=SEED_IDS)
def test_server_worker(both, seeds):
    """Poisson arrivals at 3000 QPS for 200 ms, each query completed 1 ms after issue."""
    ref, got = both(H.server_worker, seeds=seeds)
    # All generated queries are issued, one per call, in generated order.
    assert_agree(ref, got)
    assert len(ref.issued) == ref.one("generated_query_count")
    assert ref.validity == "VALID"
    for obs in (ref, got):
        assert obs.one("result_overlatency_query_count") == 0


def test_server_coalesce(both):
    """server_coalesce_queries with an issue_query that takes 1 ms: queries past due are
    issued together. The sequence is the same; how it is split depends on time."""
    ref, got = both(H.server_worker, seeds=SEEDS[1], coalesce=True, issue_delay_s=0.001)
    assert_agree(ref, got, per_call=False)
    for obs in (ref, got):
        assert len(obs.flat) == obs.one("generated_query_count") == obs.one("result_query_count")
        assert len(obs.issued) < len(obs.flat), "no query was coalesced"


@pytest.mark.parametrize(
    "extra",
    [
        {"performance_issue_unique": True},
        {"performance_issue_same": True, "performance_issue_same_index": 3},
        {"sample_concatenate_permutation": True},
    ],
    ids=["unique", "same", "concatenate"],
)
def test_server_issue_modes(both, extra):
    """Server with performance_issue_unique (every loaded sample once), _same, and
    sample_concatenate_permutation (whole permutations of the loaded set)."""
    ref, got = both(H.server_worker, seeds=SEEDS[1], min_duration_ms=50, **extra)
    assert_agree(ref, got)
    loaded = ref.qsl_events[0][1]
    if "performance_issue_unique" in extra:
        assert sorted(ref.flat) == sorted(loaded)
    elif "performance_issue_same" in extra:
        assert set(ref.flat) == {loaded[3]}
    else:
        assert len(ref.flat) % 128 == 0
        assert all(sorted(ref.flat[k : k + 128]) == sorted(loaded) for k in range(0, len(ref.flat), 128))


def test_server_latency_bound_invalid(both):
    """A 1 us latency bound that a 1 ms SUT cannot meet: INVALID on performance."""
    ref, got = both(H.server_worker, seeds=SEEDS[0], latency_ns=1000, target_qps=2000.0, min_duration_ms=100)
    assert_agree(ref, got)
    assert ref.validity == "INVALID"
    assert ref.one("result_perf_constraints_met") is False
    for obs in (ref, got):
        assert obs.one("result_overlatency_query_count") == len(obs.flat)


def test_server_min_query_count(both):
    """min_query_count above what min_duration generates: Server generates (and
    issues) exactly min_query_count queries."""
    ref, got = both(H.server_worker, seeds=SEEDS[2], target_qps=2000.0, min_duration_ms=50, min_query_count=300)
    assert_agree(ref, got)
    assert len(ref.issued) == ref.one("generated_query_count") == 300


# ------------------------------------------------------------------ Offline


@pytest.mark.parametrize("seeds", SEEDS[1:], ids=SEED_IDS[1:])
def test_offline_batches(both, seeds):
    """One query of 550 samples, completed from a worker in 9 chunks of 64 (15 ms each)."""
    ref, got = both(H.offline_batches, seeds=seeds)
    assert_agree(ref, got)
    assert len(ref.issued) == 1 and len(ref.issued[0]) == 550
    assert ref.validity == "VALID"
    for obs in (ref, got):
        assert obs.one("result_max_latency_ns") >= 9 * 15 * MS


def test_offline_concatenate_permutation(both):
    """sample_concatenate_permutation pads Offline's query to whole shuffled copies of
    the loaded set (550 samples -> 640 = 5 x 128)."""
    ref, got = both(H.offline_batches, seeds=SEEDS[1], sample_concatenate_permutation=True)
    assert_agree(ref, got)
    assert len(ref.flat) == 640
    assert ref.validity == "VALID"
    loaded = sorted(ref.qsl_events[0][1])
    assert all(sorted(ref.flat[k : k + 128]) == loaded for k in range(0, 640, 128))


def test_offline_too_fast_invalid(both):
    """A SUT that finishes 550 samples at once cannot fill a 500 ms min duration."""
    ref, got = both(H.offline_batches, seeds=SEEDS[0], expected_qps=1000.0, min_duration_ms=500, chunk_delay_s=0.0)
    assert_agree(ref, got)
    assert ref.validity == "INVALID"
    assert ref.one("result_min_duration_met") is False


# ------------------------------------------------------------------ accuracy


ACCURACY_CASES = [
    ("SingleStream", False, SEEDS[0]),
    ("SingleStream", True, SEEDS[2]),
    ("Offline", False, SEEDS[1]),
    ("Offline", True, SEEDS[2]),
    ("MultiStream", False, SEEDS[1]),
    ("Server", True, SEEDS[1]),
]


@pytest.mark.parametrize(
    "scenario, use_cb, seeds",
    ACCURACY_CASES,
    ids=[f"{s}-{'cb' if cb else 'data'}" for s, cb, _ in ACCURACY_CASES],
)
def test_accuracy(both, scenario, use_cb, seeds):
    """AccuracyOnly over a 300-sample QSL loaded 128 at a time: every sample once, the
    response bytes in the accuracy log, a flush after each loaded set."""
    kw = {"scenario": scenario, "seeds": seeds, "use_response_cb": use_cb}
    if scenario == "Server":
        kw["server_target_qps"] = 5000.0
    ref, got = both(H.accuracy_arrays, **kw)
    assert_agree(ref, got, per_call=scenario != "Server", results=())
    assert ref.validity is None  # accuracy runs have no performance summary
    loads = [v for k, v in ref.qsl_events if k == "load"]
    assert [len(v) for v in loads] == ([135, 135, 51] if scenario == "MultiStream" else [128, 128, 44])
    assert ref.flush_calls == 3
    if scenario != "MultiStream":
        assert sorted(ref.flat) == list(range(300))
    assert got.accuracy_triples() == ref.accuracy_triples()
    expected = {(i, H.payload(i).tobytes().hex().upper()) for i in ref.flat}
    assert {(q, d) for _, q, d in got.accuracy_triples()} == expected
    for obs in (ref, got):
        assert len(obs.accuracy) == len(obs.flat)
        assert len(obs.callback_ids) == (len(obs.flat) if use_cb else 0)
        assert set(obs.callback_ids) <= set(obs.response_ids)


def test_accuracy_waits_for_logging(both):
    """Offline AccuracyOnly completed from a worker whose response_cb takes 20 ms per
    response: the run (and StartTest) ends only after every response was called back
    and logged, so nothing is lost or written to a closed log."""
    ref, got = both(
        H.accuracy_arrays,
        scenario="Offline",
        seeds=SEEDS[0],
        use_response_cb=True,
        total_count=8,
        perf_count=8,
        cb_delay_s=0.02,
    )
    assert_agree(ref, got, results=())
    for obs in (ref, got):
        assert len(obs.accuracy) == len(obs.callback_ids) == 8
        assert obs.wall_s >= 8 * 0.02
    assert got.accuracy_triples() == ref.accuracy_triples()


def test_accuracy_sample_count_override(both):
    """accuracy_sample_count_override: only the first N of the shuffled QSL are used."""
    ref, got = both(H.accuracy_arrays, scenario="SingleStream", seeds=SEEDS[1], accuracy_sample_count_override=200)
    assert_agree(ref, got, results=())
    assert len(ref.flat) == 200
    assert got.accuracy_triples() == ref.accuracy_triples()


def test_performance_log_sampling(both):
    """PerformanceOnly with accuracy_log_probability: the same responses are logged
    (and passed to the response callback) by both."""
    try:
        ref, got = both(H.performance_log_sampling, seeds=SEEDS[1])
    except NotImplementedError as e:  # refused by name, not answered differently
        pytest.xfail(str(e))
    assert_agree(ref, got)
    assert 0 < len(ref.accuracy) < 64
    assert got.accuracy_triples() == ref.accuracy_triples()
    for obs in (ref, got):
        assert len(obs.callback_ids) == len(obs.accuracy)
        assert sorted(obs.callback_sizes) == sorted(len(e["data"]) // 2 for e in obs.accuracy)


# ------------------------------------------------------------------ performance_issue_*


ISSUE_CASES = [
    ("SingleStream", "unique"),
    ("SingleStream", "same"),
    ("MultiStream", "unique"),
    ("MultiStream", "same"),
    ("Offline", "unique"),
    ("Offline", "same"),
]


@pytest.mark.parametrize("scenario, how", ISSUE_CASES, ids=[f"{s}-{h}" for s, h in ISSUE_CASES])
def test_performance_issue(both, scenario, how):
    kw: dict = {"scenario": scenario, "seeds": SEEDS[1]}
    if how == "unique":
        kw["unique"] = True
        if scenario == "SingleStream":
            kw["min_query_count"] = 128  # every loaded sample once
        elif scenario == "MultiStream":
            kw["min_query_count"] = 16  # 128 samples in 16 contiguous queries of 8
    else:
        kw.update(same=True, same_index=5)
    ref, got = both(H.performance_issue, **kw)
    assert_agree(ref, got)
    loaded = ref.qsl_events[0][1]
    if how == "unique":
        assert sorted(ref.flat) == sorted(loaded[:128])
    elif scenario == "MultiStream":
        assert all(call == loaded[5:13] for call in ref.issued)
    else:
        assert set(ref.flat) == {loaded[5]}


# ------------------------------------------------------------------ SubmissionRun


def test_submission_run(both):
    """SubmissionRun: the accuracy pass (sets of 100 and 50, each flushed), then the
    performance run on a freshly loaded set; sequence ids run on across both."""
    ref, got = both(H.submission_run, seeds=SEEDS[1])
    assert_agree(ref, got)
    assert [k for k, _ in ref.qsl_events] == ["load", "unload"] * 3
    assert ref.flush_calls == 3
    assert len(ref.issued) == 150 + 64
    assert sorted(ref.flat[:150]) == list(range(150))
    assert ref.validity == "VALID"
    assert got.accuracy_triples() == ref.accuracy_triples()
    assert [e[0] for e in ref.accuracy_triples()] == list(range(150))
