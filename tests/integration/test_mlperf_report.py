"""loadgen.mlperf's evaluation and log writers against MLPerf LoadGen's rules and its real log files.

The tests that start processes; the in-process ones are in tests/unit/test_mlperf_report.py."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest

from loadgen.mlperf.accuracy_log import AccuracyLog
from loadgen.mlperf.detail_log import (
    DetailLog,
    current_date_time_iso8601,
    log_paths,
    write_detail_results,
)
from loadgen.mlperf.effective import effective_settings
from loadgen.mlperf.evaluate import evaluate
from loadgen.mlperf.figures import RunFigures
from loadgen.mlperf.settings import TestMode, TestScenario, TestSettings
from loadgen.mlperf.summary import write_summary, write_summary_trailer
from loadgen.stats.histogram import Histogram
from tests.unit.test_mlperf_report import EXACT_MAX, figures, hist

_LG_SCRIPT = textwrap.dedent(
    """
    import array, os, sys, time
    import mlperf_loadgen as lg

    root = sys.argv[1]
    keep = []

    def complete(qs, tokens):
        if tokens:
            first = []
            for q in qs:
                b = array.array("B", bytes([q.index % 256])); keep.append(b)
                first.append(lg.QuerySampleResponse(q.id, *b.buffer_info()))
            lg.FirstTokenComplete(first)
        out = []
        for q in qs:
            b = array.array("B", bytes([q.index % 256, 0xAB])); keep.append(b)
            address, size = b.buffer_info()
            if tokens:
                out.append(lg.QuerySampleResponse(q.id, address, size, 4))
            else:
                out.append(lg.QuerySampleResponse(q.id, address, size))
        lg.QuerySamplesComplete(out)

    def run(name, scenario, mode="PerformanceOnly", tokens=False, prefix=None):
        outdir = os.path.join(root, name)
        os.makedirs(outdir)
        sut = lg.ConstructSUT(lambda qs: complete(qs, tokens), lambda: None)
        qsl = lg.ConstructQSL(64, 16, lambda s: None, lambda s: None)
        ts = lg.TestSettings()
        ts.scenario = getattr(lg.TestScenario, scenario)
        ts.mode = getattr(lg.TestMode, mode)
        ts.min_duration_ms = 150
        ts.min_query_count = 100
        ts.server_target_qps = 2000
        ts.offline_expected_qps = 1000
        ts.single_stream_expected_latency_ns = 100000
        ts.multi_stream_expected_latency_ns = 100000
        if tokens:
            ts.use_token_latencies = True
            ts.ttft_latency = 50000000
            ts.tpot_latency = 50000000
            ts.server_target_qps = 1000
        ls = lg.LogSettings()
        ls.log_output.outdir = outdir
        ls.enable_trace = False
        if prefix:
            ls.log_output.prefix = prefix
            ls.log_output.suffix = "_suf"
            ls.log_output.prefix_with_datetime = True
        lg.StartTestWithLogSettings(sut, qsl, ts, ls)
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)

    for scenario in ("SingleStream", "MultiStream", "Server", "Offline"):
        run(scenario, scenario)
    run("ServerTokens", "Server", tokens=True)
    run("OfflineAccuracy", "Offline", mode="AccuracyOnly")
    run("Paths", "Offline", prefix="pre_")
    """
)


_CASES = {
    "SingleStream": {"scenario": TestScenario.SingleStream},
    "MultiStream": {"scenario": TestScenario.MultiStream},
    "Server": {"scenario": TestScenario.Server},
    "Offline": {"scenario": TestScenario.Offline},
    "ServerTokens": {"scenario": TestScenario.Server, "tokens": True},
}


@pytest.fixture(scope="module")
def lg_runs(tmp_path_factory):
    pytest.importorskip("mlperf_loadgen")
    root = tmp_path_factory.mktemp("lg")
    proc = subprocess.run([sys.executable, "-c", _LG_SCRIPT, str(root)], check=False, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root


def _our_test_settings(scenario: TestScenario, tokens: bool = False) -> TestSettings:
    ts = TestSettings()
    ts.scenario = scenario
    ts.mode = TestMode.PerformanceOnly
    ts.min_duration_ms = 150
    ts.min_query_count = 100
    ts.server_target_qps = 2000.0
    ts.offline_expected_qps = 1000.0
    ts.single_stream_expected_latency_ns = 100000
    ts.multi_stream_expected_latency_ns = 100000
    if tokens:
        ts.use_token_latencies = True
        ts.ttft_latency = 50000000
        ts.tpot_latency = 50000000
        ts.server_target_qps = 1000.0
    return ts


_LINE = re.compile(r'^:::MLLOG \{"key": "(.*?)", "value": (.*), "time_ms": ')


def _read_detail(path):
    records, raw_values = [], {}
    with open(path) as f:
        for line in f:
            assert line.startswith(":::MLLOG ")
            records.append(json.loads(line[len(":::MLLOG "):]))
            m = _LINE.match(line)
            raw_values.setdefault(m.group(1), m.group(2))
    return records, raw_values


def _crafted_figures(eff, values) -> RunFigures:
    """Figures that make evaluate() take the branches the real run took."""
    scenario = int(eff.scenario)
    queries = values["result_query_count"]
    per_query = values["generated_samples_per_query"] if scenario == 3 else int(eff.samples_per_query)
    n = queries * per_query
    min_s = eff.min_duration_ns / 1e9
    duration = min_s * (2 if values["result_min_duration_met"] else 0.5)
    rng = np.random.default_rng(5)
    samples = rng.integers(100, EXACT_MAX, size=n).tolist()
    over = values.get("result_overlatency_query_count", 0)
    samples[:over] = [eff.target_latency_ns * 2] * over
    kw = {}
    if scenario == 1:
        kw["queries"] = rng.integers(100, EXACT_MAX, size=queries)
    if eff.use_token_latencies:
        kw["first_token_latency"] = hist(rng.integers(100, EXACT_MAX, size=n))
        kw["time_per_output_token"] = hist(rng.integers(100, EXACT_MAX, size=n))
        kw["tokens_per_sample_sum"] = 4 * n
    fig = figures(samples, queries_issued=queries, duration_s=duration, **kw)
    fig.max_latency_s = duration
    fig.issue_delay = hist(rng.integers(10, 500, size=queries))
    return fig


def _shape(text: str):
    number = r"-?(?:\d+(?:\.\d+)?(?:e[+-]\d+)?|inf|nan)"
    return [re.sub(number, "N", line) for line in text.split("\n")]


def _lg_counts(summary: str):
    warnings = re.search(r"\n(No|\d+) warnings? encountered", summary).group(1)
    errors = re.search(r"\n(No|\d+) (?:errors|ERRORS?) encountered", summary).group(1)
    return tuple(0 if x == "No" else int(x) for x in (warnings, errors))


@pytest.mark.integration
@pytest.mark.parametrize("case", sorted(_CASES))
def test_summary_and_detail_match_mlperf(lg_runs, case):
    spec = _CASES[case]
    folder = lg_runs / case
    records, raw = _read_detail(folder / "mlperf_log_detail.txt")
    values = {}
    for r in records:
        values.setdefault(r["key"], r["value"])
    eff = effective_settings(_our_test_settings(spec["scenario"], spec.get("tokens", False)), 16, 64)
    fig = _crafted_figures(eff, values)
    ev = evaluate(eff, fig)
    assert ev.valid == (values["result_validity"] == "VALID")
    assert ev.min_queries_met == values["result_min_queries_met"]
    assert ev.early_stopping_met == values["early_stopping_met"]

    # The summary: MLPerf's lines, in its order and shapes, then our issue delay block.
    lg_summary = (folder / "mlperf_log_summary.txt").read_text()
    ours = io.StringIO()
    write_summary(ours, eff, fig, ev, "PySUT")
    body = ours.getvalue()
    extra_at = body.index("\n\n" + "=" * 48 + "\nIssue delay")
    trailer = io.StringIO()
    write_summary_trailer(trailer, *_lg_counts(lg_summary))
    assert _shape(body[:extra_at + 1] + trailer.getvalue()) == _shape(lg_summary)
    assert "Mean issue delay (ns)" in body[extra_at:]

    # Early stopping counts depend only on the query count (and overlatency count).
    lg_es = values.get("early_stopping_result", values.get("early_stopping_tpot_result"))
    our_es = ev.early_stopping_text if not eff.use_token_latencies else ev.early_stopping_tpot_text
    keep = [s for s in lg_es.split("  ") if "estimate" not in s]
    assert keep == [s for s in our_es.replace("\n", " ").split("  ") if "estimate" not in s]

    # The detail log: every line is JSON with MLPerf's fields in MLPerf's order.
    buf = io.StringIO()
    detail = DetailLog(buf)
    detail.log_version_info()
    detail.log_test_start(test_date_time=current_date_time_iso8601(), sut_name="PySUT",
                          get_sut_name_duration_ns=100, qsl_name="PyQSL", qsl_total_count=64,
                          qsl_performance_count=16)
    detail.log_settings(eff)
    detail.log("generic_message", "Starting performance mode")
    detail.log_loaded_qsl_set(list(range(16)))
    detail.log_generated_queries(values["generated_query_count"], values["generated_samples_per_query"],
                                 values["generated_query_duration"])
    detail.log_power(time.time_ns(), 150_000_000)
    write_detail_results(detail, eff, fig, ev)
    path = lg_runs / f"ours_{case}.txt"
    path.write_text(buf.getvalue())
    our_records, our_raw = _read_detail(path)
    for mine, theirs in zip(our_records, records):
        assert list(mine) == list(theirs)
        assert list(mine["metadata"]) == list(theirs["metadata"])
    our_keys = [r["key"] for r in our_records]
    lg_keys = [r["key"] for r in records]
    assert our_keys[-1] == "num_errors"

    # Our result lines follow MLPerf's, key for key, with our loadgen_* additions.
    def result_part(keys):
        start = keys.index("result_validity")
        return [k for k in keys[start:keys.index("num_errors", start) + 1] if not k.startswith("loadgen_")]

    assert result_part(our_keys) == result_part(lg_keys)
    assert "loadgen_sample_latency_hdr" in our_keys and "loadgen_issue_delay_p50_ns" in our_keys
    decoded = Histogram.decode(our_raw["loadgen_sample_latency_hdr"].strip('"'))
    assert decoded.total_count == fig.sample_latency.total_count

    # The settings lines: the same keys, and the same value text, as MLPerf's.
    settings_keys = [k for k in lg_keys if k.startswith(("requested_", "effective_"))]
    assert settings_keys == [k for k in our_keys if k.startswith(("requested_", "effective_"))]
    for key in settings_keys:
        assert our_raw[key] == raw[key], key

    # What the submission checker reads is there.
    needed = {
        "loadgen_version", "loadgen_git_commit_date", "loadgen_git_status_message", "loadgen_file_sha1",
        "test_datetime", "sut_name", "qsl_name", "qsl_reported_total_count",
        "qsl_reported_performance_count", "effective_scenario", "effective_test_mode",
        "effective_min_duration_ms", "effective_min_query_count", "effective_target_qps",
        "effective_samples_per_query", "effective_sample_concatenate_permutation",
        "generated_query_count", "generated_samples_per_query", "generated_query_duration",
        "loaded_qsl_set", "power_begin", "power_end", "result_validity", "result_min_duration_met",
        "result_min_queries_met", "early_stopping_met", "result_query_count", "num_errors",
        ev.result_key,
    }
    assert needed <= set(our_keys), needed - set(our_keys)
    assert our_records[our_keys.index(ev.result_key)]["value"] == pytest.approx(ev.result_value, rel=1e-5)
    assert re.fullmatch(r"\d\d-\d\d-\d{4} \d\d:\d\d:\d\d\.\d{3}", our_records[our_keys.index("power_begin")]["value"])
    assert raw["test_datetime"][1:-1] != "" and re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", json.loads(raw["test_datetime"]))


@pytest.mark.integration
def test_accuracy_log_matches_mlperf(lg_runs):
    theirs = (lg_runs / "OfflineAccuracy" / "mlperf_log_accuracy.json").read_text()
    entries = json.loads(theirs)
    assert entries
    buf = io.StringIO()
    acc = AccuracyLog(buf)
    for e in entries:
        acc.add(e["seq_id"], e["qsl_idx"], bytes.fromhex(e["data"]))
    acc.close()
    assert buf.getvalue() == theirs
    # A performance run logs no response: the same empty list as MLPerf's.
    empty = io.StringIO()
    AccuracyLog(empty).close()
    assert empty.getvalue() == (lg_runs / "Server" / "mlperf_log_accuracy.json").read_text()
    # An accuracy-only run's summary is just the trailer.
    summary = (lg_runs / "OfflineAccuracy" / "mlperf_log_summary.txt").read_text()
    trailer = io.StringIO()
    write_summary_trailer(trailer, *_lg_counts(summary))
    assert trailer.getvalue() == summary


@pytest.mark.integration
def test_log_paths_match_mlperf(lg_runs):
    folder = lg_runs / "Paths"
    names = sorted(os.listdir(folder))
    stamp = names[0][len("pre_"):len("pre_") + len("2024-01-01T00:00:00Z")]
    out = types.SimpleNamespace(outdir=str(folder), prefix="pre_", suffix="_suf", prefix_with_datetime=True)
    assert sorted(os.path.basename(p) for p in log_paths(out, stamp).values()) == names
    _, raw = _read_detail(log_paths(out, stamp)["detail"])
    assert json.loads(raw["test_datetime"]) == stamp
