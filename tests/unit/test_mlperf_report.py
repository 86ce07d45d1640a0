"""loadgen.mlperf's evaluation and log writers against MLPerf LoadGen's rules and its real log files.

Decisions are checked against a plain reimplementation of MLPerf's rules on the raw
latencies (sorted vectors, scipy's incomplete beta); the files against what the real
``mlperf_loadgen`` module writes for the same settings, run briefly in a subprocess with
an SUT that completes every sample at once.

The tests that start processes or servers are in tests/integration/test_mlperf_report.py.
"""

from __future__ import annotations

import io
import json
import os
import re
import types

import numpy as np
import pytest

from loadgen.mlperf.accuracy_log import AccuracyLog
from loadgen.mlperf.detail_log import (
    DetailLog,
    current_date_time_iso8601,
    log_paths,
    power_date_time,
)
from loadgen.mlperf.effective import effective_settings
from loadgen.mlperf.evaluate import LATENCY_PERCENTILES, evaluate
from loadgen.mlperf.figures import RunFigures
from loadgen.mlperf.number_text import cpp_divide, cpp_fixed, cpp_stream_double
from loadgen.mlperf.settings import TestMode, TestScenario, TestSettings
from loadgen.mlperf.summary import write_summary
from loadgen.stats.early_stopping import min_passing_queries_fraction as min_passing_queries
from loadgen.stats.histogram import Histogram

scipy_special = pytest.importorskip("scipy.special")

# Below 2048 a 3-significant-figure histogram has buckets one unit wide: values there
# come back exactly, so the results must equal MLPerf's on the raw values.
EXACT_MAX = 2047


# ----------------------------------------------------------------- test helpers


def hist(values) -> Histogram:
    h = Histogram()
    h.record_array(np.asarray(values, dtype=np.int64))
    return h


def figures(samples, *, queries=None, queries_issued=None, duration_s=1.0, **kw) -> RunFigures:
    samples = [int(v) for v in samples]
    fig = RunFigures(
        sample_latency=hist(samples),
        sample_latency_sum_ns=sum(samples),
        sample_count=len(samples),
        queries_issued=len(samples) if queries_issued is None else queries_issued,
        samples_issued=len(samples),
        max_latency_s=max(samples) / 1e9 if samples else 0.0,
        final_query_scheduled_s=duration_s,
        final_query_issued_s=duration_s,
        final_query_all_samples_done_s=duration_s * 1.01,
    )
    if queries is not None:
        queries = [int(v) for v in queries]
        fig.query_latency = hist(queries)
        fig.query_latency_sum_ns = sum(queries)
    for key, value in kw.items():
        setattr(fig, key, value)
    return fig


def settings(scenario: TestScenario, **kw):
    ts = TestSettings()
    ts.scenario = scenario
    ts.mode = TestMode.PerformanceOnly
    ts.min_duration_ms = 500
    ts.min_query_count = 100
    for key, value in kw.items():
        setattr(ts, key, value)
    return effective_settings(ts, 1024, 1024)


# ------------------------------------------- MLPerf's rules on the raw values


def _oracle_min_passing(t: int, p: float) -> int:
    def passes(h):
        return scipy_special.betainc(h, t + 1, p) < 1 - 0.99

    lo, hi = 1, 2
    while not passes(hi):
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _oracle_estimate(sorted_latencies, queries: int, p: float):
    """MLPerf's SingleStream/MultiStream estimate: a literal walk over t = 2, 3, ..."""
    h_min = _oracle_min_passing(1, p)
    if queries < h_min + 1:
        return None, h_min + 1, None
    t = 1
    for i in range(2, queries + 1):
        if queries < _oracle_min_passing(i, p) + i:
            t = i - 1
            break
    return sorted_latencies[queries - t], h_min + 1, t


def oracle(eff, raw_samples, raw_queries=None, queries_issued=None):
    s = sorted(raw_samples)
    n = len(s)
    q = n if queries_issued is None else queries_issued
    p = eff.target_latency_percentile
    out = {
        "mean": sum(s) // n,
        "min": s[0],
        "max": s[-1],
        "target": s[int(n * p)],
        "percentiles": {lp: s[int(n * lp)] for lp in LATENCY_PERCENTILES},
    }
    scenario = int(eff.scenario)
    if scenario == 0:
        out["es"] = _oracle_estimate(s, q, p)
        out["es99"] = _oracle_estimate(s, q, 0.99)
    elif scenario == 1:
        sq = sorted(raw_queries)
        out["es"] = _oracle_estimate(sq, q, p)
        out["query_target"] = sq[int(q * p)]
        out["query_percentiles"] = {lp: sq[int(q * lp)] for lp in LATENCY_PERCENTILES}
    elif scenario == 2:
        t = sum(1 for v in s if v > eff.target_latency_ns)
        h = _oracle_min_passing(t, p)
        out["overlatency"] = t
        out["es_met"] = q >= h + t
        out["es_more"] = h + t - q
    return out


# ---------------------------------------------------------------- evaluate()


def test_min_passing_queries_matches_scipy():
    for p in (0.9, 0.99, 0.999):
        for t in (0, 1, 2, 7, 50, 300):
            assert min_passing_queries(t, p) == _oracle_min_passing(t, p), (t, p)
    # The counts MLPerf prints for its default percentiles.
    assert min_passing_queries(1, 0.9) + 1 == 64
    assert min_passing_queries(1, 0.99) + 1 == 662
    assert min_passing_queries(0, 0.99) == 459


def test_single_stream_valid_matches_mlperf_rules():
    rng = np.random.default_rng(1)
    raw = rng.integers(100, EXACT_MAX, size=3000)
    eff = settings(TestScenario.SingleStream)
    ev = evaluate(eff, figures(raw, duration_s=0.75))
    ref = oracle(eff, raw)
    assert ev.valid and ev.result_validity == "VALID"
    assert (ev.min_duration_met, ev.min_queries_met, ev.perf_constraints_met, ev.early_stopping_met) == (
        True, True, True, True)
    assert ev.sample_latency_mean_ns == ref["mean"]
    assert (ev.sample_latency_min_ns, ev.sample_latency_max_ns) == (ref["min"], ref["max"])
    assert ev.sample_latency_target_ns == ref["target"]
    assert ev.sample_latency_percentiles_ns == ref["percentiles"]
    estimate, needed, t = ref["es"]
    assert ev.early_stopping_latency_ss_ns == estimate
    assert ev.early_stopping_latency_ms_ns == ref["es99"][0]
    assert ev.early_stopping_text.split("\n") == [
        f" * Processed at least {needed} queries (3000).",
        f" * Would discard {t - 1} highest latency queries.",
        f" * Early stopping 90.0th percentile estimate: {estimate}",
        f" * Early stopping 99.0th percentile estimate: {ref['es99'][0]}",
    ]
    assert ev.result_key == "early_stopping_latency_ss" and ev.result_value == estimate
    assert ev.metric_name == "90.0th percentile latency (ns)"
    assert ev.qps_with_loadgen_overhead == pytest.approx(2999 / 0.75)
    assert ev.qps_without_loadgen_overhead == pytest.approx(1e9 / ref["mean"])
    assert ev.recommendations == []


def test_single_stream_min_duration_and_too_few_queries():
    eff = settings(TestScenario.SingleStream)
    ev = evaluate(eff, figures([500] * 50, duration_s=0.2))
    assert not ev.valid
    assert not ev.min_duration_met and not ev.min_queries_met and not ev.early_stopping_met
    assert ev.recommendations == [
        "Decrease the expected latency so the loadgen pre-generates more queries.",
        "The test exited early, before enough queries were issued.",
    ]
    assert ev.early_stopping_text == (
        " * Only processed 50 queries.\n * Need to process at least 64 queries for early stopping."
    )
    # Enough queries for the 90th percentile, not for the 99th.
    ev = evaluate(eff, figures(list(range(100, 300)), duration_s=1.0))
    assert ev.early_stopping_met and ev.valid
    assert ev.early_stopping_text.endswith(
        "\n * Not enough queries processed for 99.0th percentile\n early stopping estimate "
        "(would need to process at\n least 662 total queries)."
    )
    assert ev.early_stopping_latency_ms_ns == 0


def test_multi_stream_uses_query_latencies():
    rng = np.random.default_rng(2)
    queries = 800
    raw_queries = rng.integers(900, EXACT_MAX, size=queries)
    raw_samples = np.concatenate([rng.integers(100, v + 1, size=7).tolist() + [v] for v in raw_queries])
    eff = settings(TestScenario.MultiStream)
    ev = evaluate(eff, figures(raw_samples, queries=raw_queries, queries_issued=queries))
    ref = oracle(eff, raw_samples, raw_queries, queries)
    estimate, needed, t = ref["es"]
    assert ev.valid
    assert ev.sample_count == queries * 8 and ev.query_count == queries
    assert ev.query_latency_target_ns == ref["query_target"]
    assert ev.query_latency_percentiles_ns == ref["query_percentiles"]
    assert ev.query_latency_mean_ns == int(raw_queries.sum()) // queries
    assert ev.early_stopping_latency_ms_ns == estimate
    assert ev.early_stopping_text == (
        f" * Processed at least {needed} queries ({queries}).\n"
        f" * Would discard {t - 1} highest latency queries.\n"
        f" * Early stopping 99.0th percentile estimate: {estimate}"
    )
    assert ev.metric_value == ref["query_target"] and ev.result_value == estimate
    # Fewer queries than the 99th percentile's early stopping needs.
    short = evaluate(eff, figures(raw_samples[:8 * 600], queries=raw_queries[:600], queries_issued=600))
    assert not short.early_stopping_met and not short.valid
    assert "Need to process at least 662 queries" in short.early_stopping_text


def test_server_latency_bound_and_early_stopping():
    rng = np.random.default_rng(3)
    under = rng.integers(200, 1400, size=5000).tolist()
    eff = settings(TestScenario.Server, server_target_latency_ns=1500, server_target_qps=5000.0)
    # 3% over the bound: the 99th percentile is over it, and early stopping fails.
    raw = under[:4850] + [1800] * 150
    ev = evaluate(eff, figures(raw, duration_s=1.0))
    ref = oracle(eff, raw)
    assert ev.has_perf_constraints and not ev.perf_constraints_met and not ev.valid
    assert ev.sample_latency_target_ns == ref["target"] == 1800
    assert ev.overlatency_query_count == ref["overlatency"] == 150
    assert ev.early_stopping_met == ref["es_met"] is False
    assert f"at least {ref['es_more']} more queries" in ev.early_stopping_text
    assert ev.recommendations == ["Reduce target QPS to improve latency."]
    # 0.5% over: the bound holds, and so does early stopping.
    raw = under[:4975] + [1501] * 25
    ev = evaluate(eff, figures(raw, duration_s=1.0))
    ref = oracle(eff, raw)
    assert ev.perf_constraints_met and ev.early_stopping_met == ref["es_met"] is True and ev.valid
    assert ev.early_stopping_text == " * Run successful."
    assert ev.overlatency_query_count == 25
    assert ev.scheduled_samples_per_s == pytest.approx(4999 / 1.0)
    assert ev.completed_samples_per_s == pytest.approx(4999 / 1.01)
    assert ev.result_key == "result_completed_samples_per_sec"
    # Too few queries: 392 queries, none over, need h(0) = 459.
    ev = evaluate(eff, figures(under[:392], duration_s=1.0))
    assert not ev.early_stopping_met and ev.perf_constraints_met
    assert " * Would need to run at least 67 more queries," in ev.early_stopping_text


def test_server_duration_is_the_final_scheduled_time():
    eff = settings(TestScenario.Server, server_target_latency_ns=1500)
    fig = figures([1000] * 600, duration_s=0.4, final_query_issued_s=0.9)
    ev = evaluate(eff, fig)
    assert not ev.min_duration_met
    assert ev.min_duration_recommendation == (
        "Increase the target QPS so the loadgen pre-generates more queries.")


def test_offline_throughput_and_duration():
    eff = settings(TestScenario.Offline, offline_expected_qps=1000.0)
    raw = list(range(1000, 1000 + 600))
    ev = evaluate(eff, figures(raw, queries_issued=1, max_latency_s=0.6))
    assert ev.min_duration_met and ev.early_stopping_met and ev.valid
    assert ev.samples_per_s == pytest.approx(600 / 0.6)
    assert ev.result_key == "result_samples_per_second" and ev.result_value == ev.samples_per_s
    ev = evaluate(eff, figures(raw, queries_issued=1, max_latency_s=0.3))
    assert not ev.min_duration_met and not ev.valid
    assert ev.recommendations == [
        "Increase expected QPS so the loadgen pre-generates a larger (coalesced) query."]
    assert ev.early_stopping_text == ""


def test_min_sample_count_counts_too():
    eff = settings(TestScenario.Offline, offline_expected_qps=1000.0)
    assert eff.min_sample_count > 50
    ev = evaluate(eff, figures([1000] * 50, queries_issued=1, max_latency_s=1.0))
    assert not ev.min_queries_met and not ev.valid


def test_token_server_constraints_and_chained_early_stopping():
    eff = settings(TestScenario.Server, use_token_latencies=True, ttft_latency=1000, tpot_latency=500,
                   server_target_latency_ns=10**9)
    n = 1000
    rng = np.random.default_rng(4)
    ttft = rng.integers(100, 900, size=n)
    tpot = np.concatenate([rng.integers(100, 400, size=n - 30), [600] * 30])
    fig = figures(rng.integers(1000, 2000, size=n), first_token_latency=hist(ttft),
                  time_per_output_token=hist(tpot), tokens_per_sample_sum=4 * n,
                  extra={"first_token_latency_sum_ns": int(ttft.sum()),
                         "time_per_output_token_sum_ns": int(tpot.sum())})
    ev = evaluate(eff, fig)
    assert not ev.perf_constraints_met
    assert ev.perf_constraints_recommendation == "TPOT constrain not met: Reduce target QPS to improve latency."
    # TPOT early stopping fails (30 over its bound), so TTFT's is never run.
    assert not ev.early_stopping_met and ev.early_stopping_ttft_text == ""
    assert ev.early_stopping_tpot_text.startswith(" * Run unsuccessful.")
    assert ev.first_token_mean_ns == int(ttft.sum()) // n
    assert ev.tpot_target_ns == sorted(tpot)[int(n * 0.99)]
    assert ev.token_count == 4 * n
    assert ev.completed_tokens_per_s == pytest.approx(4 * n / 1.01)


def test_no_completed_sample():
    eff = settings(TestScenario.Server)
    ev = evaluate(eff, figures([], queries_issued=0, duration_s=0.0))
    assert not ev.valid and ev.sample_count == 0 and ev.query_count == 0
    text = io.StringIO()
    write_summary(text, eff, figures([], queries_issued=0, duration_s=0.0), ev, "SUT")
    assert "Completed samples per second    : inf" in text.getvalue()


# ------------------------------------------------------------- number formats


def test_number_formats_match_cpp():
    assert cpp_fixed(1945.8234) == "1945.82"
    assert cpp_fixed(0.9 * 100, 1) == "90.0"
    assert cpp_fixed(0.999 * 100) == "99.90"
    assert cpp_fixed(float("inf")) == "inf"
    assert cpp_fixed(cpp_divide(0.0, 0.0)) == "-nan"
    assert cpp_stream_double(1154990.4) == "1.15499e+06"
    assert cpp_stream_double(624062.3) == "624062"
    assert cpp_stream_double(2000.0) == "2000"
    assert cpp_stream_double(0.9) == "0.9"
    assert cpp_stream_double(1.52099e-05) == "1.52099e-05"


def test_dates_and_paths():
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", current_date_time_iso8601())
    assert power_date_time(1_700_000_000_123_456_789) == "11-14-2023 22:13:20.123"
    out = types.SimpleNamespace(outdir="/x", prefix="p_", suffix="_s", prefix_with_datetime=True)
    assert log_paths(out, "2024-01-02T03:04:05Z") == {
        "summary": "/x/p_2024-01-02T03:04:05Z_summary_s.txt",
        "detail": "/x/p_2024-01-02T03:04:05Z_detail_s.txt",
        "accuracy": "/x/p_2024-01-02T03:04:05Z_accuracy_s.json",
        "trace": "/x/p_2024-01-02T03:04:05Z_trace_s.json",
    }
    out.prefix_with_datetime = False
    assert log_paths(out, "ignored")["detail"] == "/x/p_detail_s.txt"


def test_detail_line_format():
    buf = io.StringIO()
    clock = iter([1_000, 1_000 + 1_234_567_891, 2_000_000_000, 2_000_000_001, 2_000_000_002,
                  2_000_000_003, 2_000_000_004]).__next__
    sink = DetailLog(buf, clock=clock)
    sink.log("a", 1.5)
    sink.error("error_runtime", 'bad "thing"\n')
    sink.warning("warning_generic_message", "hm")
    sink.log("loaded_qsl_set", [3, 1, 2])
    sink.log("empty", [])
    sink.log("map", {"b": "2", "a": "1"})
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith(':::MLLOG {"key": "a", "value": 1.5, "time_ms": 1234.567891, '
                               '"namespace": "mlperf::logging", "event_type": "POINT_IN_TIME", '
                               '"metadata": {"is_error": false, "is_warning": false, '
                               '"file": "test_mlperf_report.py", "line_no": ')
    records = [json.loads(line[len(":::MLLOG "):]) for line in lines]
    assert records[1]["metadata"]["is_error"] and records[1]["value"] == 'bad "thing"\n'
    assert records[2]["metadata"]["is_warning"] and not records[2]["metadata"]["is_error"]
    assert '"value": [3,1,2],' in lines[3] and records[4]["value"] == []
    assert '"value": {"a":"1","b":"2"},' in lines[5]
    assert (sink.error_count, sink.warning_count) == (1, 1)
    assert records[0]["metadata"]["pid"] == os.getpid()


def test_accuracy_log_format():
    buf = io.StringIO()
    acc = AccuracyLog(buf)
    acc.close()
    assert buf.getvalue() == "[\n]\n"
    buf = io.StringIO()
    acc = AccuracyLog(buf, use_tokens=True, needs_first_token=True)
    acc.add(0, 5, b"\x05\xab", token_count=3, token_data=b"\x01")
    acc.add(1, 7, b"", token_count=1)
    acc.close()
    assert buf.getvalue() == (
        '[\n{ "seq_id" : 0, "qsl_idx" : 5, "data" : "05AB", "token_data" : "01", "token_count" : 3 },\n'
        '{ "seq_id" : 1, "qsl_idx" : 7, "data" : "", "token_data" : "", "token_count" : 1 }\n]\n'
    )
    assert [e["qsl_idx"] for e in json.loads(buf.getvalue())] == [5, 7]


# ------------------------------------------------- against the real MLPerf LoadGen


