"""The per-interval time series: the figures the monitor thread cuts at each interval's
end (failures, time-outs, errors by kind, outstanding, issue delay, TTFT, tokens), the
live accessor, the document, the schema, the pandas frame and the merge of workers."""

from __future__ import annotations

import copy
import threading
import time

import pytest

import loadgen
from loadgen import EngineSettings
from loadgen.options import resolve
from loadgen.results import load_result, load_timeseries, write_outputs
from loadgen.results.document import timeseries_point
from loadgen.results.merge import merge_results
from loadgen.results.schema import check_result
from loadgen.runner import run_benchmark

MS = 1_000_000
NEW_KEYS = ("p90_ns", "failed", "timed_out", "errors", "outstanding", "issue_delay_p50_ns",
            "issue_delay_p99_ns", "issue_delay_max_ns", "ttft_p50_ns", "ttft_p99_ns", "tokens")

# The SUT of these runs, by the rank of each query it receives (1-based): every 7th fails
# as "Overload", every 11th raises ValueError, every 13th is never answered (it times
# out), the rest stream a first token and complete with 3 tokens.
SUT_SOURCE = '''
import time

class Mixed:
    def __init__(self):
        self.k = 0
        self.engine = None  # set by tests that call the token API; else complete() only

    def issue(self, batch):
        ids = batch.ids.tolist()
        ranks = range(self.k + 1, self.k + 1 + len(ids))
        self.k += len(ids)
        if any(r % 11 == 0 for r in ranks):
            raise ValueError("bad input")
        for qid, r in zip(ids, ranks):
            if r % 13 == 0:
                continue
            if r % 7 == 0:
                batch.fail([qid], kind="Overload", message="busy")
            elif self.engine is not None:
                self.engine.first_token(qid)
                self.engine.complete(qid, 0, 3)
            else:
                batch.complete_many([qid])
'''


def _expected(n):
    """Outcome counts of the first n ranks under SUT_SOURCE's rules (one query a batch)."""
    value_error = sum(1 for r in range(1, n + 1) if r % 11 == 0)
    timed_out = sum(1 for r in range(1, n + 1) if r % 11 and r % 13 == 0)
    overload = sum(1 for r in range(1, n + 1) if r % 11 and r % 13 and r % 7 == 0)
    return value_error, overload, timed_out


@pytest.fixture
def mixed_sut(tmp_path):
    path = tmp_path / "mixed_sut.py"
    path.write_text(SUT_SOURCE)
    namespace: dict = {}
    exec(compile(SUT_SOURCE, str(path), "exec"), namespace)
    return path, namespace["Mixed"]


def _sum(points, key):
    return sum(p[key] for p in points)


def test_interval_figures_add_up_to_the_run_totals_and_are_readable_live(mixed_sut):
    _, mixed = mixed_sut
    sut = mixed()
    s = EngineSettings(mode="constant", target_qps=1000, query_count=400, batch_max=1, timeout_ms=30,
                       grace_s=0.5, interval_s=0.05)
    seen, stop = [], threading.Event()
    with loadgen.Engine(s, sut) as eng:
        sut.engine = eng._core
        assert eng.last_interval() is None  # nothing before the first interval ends

        def poll():  # a live reader on another thread
            while not stop.is_set() and len(seen) < 1000:
                # Kinds first: a failure is counted in failed before its kind is.
                errors = eng.error_counts()
                seen.append((eng.last_interval(), eng.counts(), errors))
                time.sleep(0.005)

        reader = threading.Thread(target=poll)
        eng.start()
        reader.start()
        try:
            assert eng.wait(20)
        finally:
            stop.set()
            reader.join(5)
        result = eng.result()
        assert eng.last_interval() == result.timeseries[-1]
    c, points = result.counts, result.timeseries
    value_error, overload, timed_out = _expected(400)
    assert c["failed"] == value_error + overload and c["timed_out"] == timed_out
    assert result.errors == {"ValueError": value_error, "Overload": overload}
    assert len(points) >= 6
    for key in ("issued", "completed", "failed", "timed_out", "tokens"):
        assert _sum(points, key) == c[key], key
    assert c["tokens"] == 3 * c["completed"]
    errors: dict = {}
    for p in points:
        for kind, n in p["errors"].items():
            errors[kind] = errors.get(kind, 0) + n
    assert errors == result.errors
    busy = [p for p in points if p["completed"] > 0]
    assert busy
    for p in busy:
        assert 0 < p["latency_p50_ns"] <= p["latency_p90_ns"] <= p["latency_p99_ns"] <= p["latency_max_ns"]
        assert 0 < p["ttft_p50_ns"] <= p["ttft_p99_ns"]
    assert all(p["issue_delay_p50_ns"] <= p["issue_delay_p99_ns"] <= p["issue_delay_max_ns"] for p in points)
    assert any(p["issue_delay_max_ns"] > 0 for p in points)
    # Queries never answered are in flight at some interval's end (each waits 30 ms);
    # at the last, every query has been resolved.
    assert any(p["outstanding"] > 0 for p in points[:-1]) and points[-1]["outstanding"] == 0
    live = [(p, cnt, err) for p, cnt, err in seen if p is not None]
    assert live, "no interval was seen while the run went on"
    assert all(set(p) == set(points[0]) for p, _, _ in live)
    assert all(sum(err.values()) <= cnt["failed"] for _, cnt, err in seen)


def test_a_run_without_tokens_or_failures_has_zeros_and_empty_errors():
    result = loadgen.engine.run(EngineSettings(mode="constant", target_qps=2000, query_count=300, interval_s=0.05),
                                loadgen.FixedDelaySUT(200))
    points = result.timeseries
    assert points and _sum(points, "completed") == 300
    for p in points:
        assert p["failed"] == p["timed_out"] == p["tokens"] == p["ttft_p50_ns"] == p["ttft_p99_ns"] == 0
        assert p["errors"] == {}


def _document(sut_path, **extra):
    flags = {"sut": f"python:{sut_path}:Mixed", "scenario": "constant", "target_qps": "1000",
             "query_count": "300", "timeout_ms": "30", "interval_s": "0.05", "grace_s": "0.5",
             **extra}
    options, given = resolve(flags, environ={})
    return run_benchmark(options, given=given)


def test_document_schema_frame_and_merge_of_two_workers(tmp_path, mixed_sut):
    sut_path, _ = mixed_sut
    doc = _document(sut_path)
    check_result(doc)
    points = doc["timeseries"]
    for key in NEW_KEYS:
        assert all(key in p for p in points), key
    for key in ("failed", "timed_out"):
        assert _sum(points, key) == doc["counts"][key]
    kinds = {k: sum(p["errors"].get(k, 0) for p in points) for k in doc["errors"]["counts"]}
    assert kinds == doc["errors"]["counts"] and set(kinds) == {"ValueError", "Overload"}

    # The pandas frame: a row per interval with the new columns, a column per error kind.
    write_outputs(doc, str(tmp_path / "out"))
    frame = load_timeseries(tmp_path / "out")
    assert len(frame) == len(points)
    assert {"p90_ns", "outstanding", "issue_delay_p99_ns", "tokens", "errors.Overload"} <= set(frame.columns)
    assert int(frame["errors.ValueError"].sum()) == doc["errors"]["counts"]["ValueError"]
    assert "latency_hdr" not in frame.columns

    # Two workers: the same document as worker 0 and 1 of 2 (same start) merge into
    # points with every count doubled and the issue-delay figures unchanged (the max).
    workers = []
    for index in (0, 1):
        w = copy.deepcopy(doc)
        w["worker"] = {"index": index, "count": 2, "started_at_epoch_s": doc["started_at_epoch_s"]}
        workers.append((f"w{index}/result.json", w))
    merged = merge_results(workers)
    check_result(merged)
    assert len(merged["timeseries"]) == len(points)
    for mp, p in zip(merged["timeseries"], points):
        for key in ("issued", "completed", "failed", "timed_out", "outstanding", "tokens"):
            assert mp[key] == 2 * p[key], key
        assert mp["errors"] == {k: 2 * n for k, n in p["errors"].items()}
        for key in ("issue_delay_p50_ns", "issue_delay_p99_ns", "issue_delay_max_ns", "ttft_p99_ns"):
            assert mp[key] == p[key], key
        assert mp["p50_ns"] <= mp["p90_ns"] <= mp["p99_ns"]


def test_documents_from_before_the_new_keys_still_load_and_merge(tmp_path):
    options, given = resolve({"sut": "null", "scenario": "constant", "target_qps": "2000",
                              "duration_s": "0.3", "interval_s": "0.1"}, environ={})
    doc = run_benchmark(options, given=given)
    for p in doc["timeseries"]:
        for key in NEW_KEYS:
            del p[key]
    path = tmp_path / "old"
    write_outputs(doc, str(path))
    old = load_result(path / "result.json")
    merged = merge_results([("old/result.json", old)])
    assert all(p["failed"] == 0 and p["errors"] == {} and "p90_ns" in p for p in merged["timeseries"])


def test_timeseries_point_carries_every_engine_figure():
    p = {"start_offset_ns": 0, "length_ns": 100 * MS, "issued": 5, "completed": 4, "latency_p50_ns": 10,
         "latency_p90_ns": 20, "latency_p99_ns": 30, "latency_max_ns": 40, "latency_hdr": b"",
         "failed": 1, "timed_out": 0, "errors": {"Overload": 1}, "outstanding": 2, "issue_delay_p50_ns": 1,
         "issue_delay_p99_ns": 2, "issue_delay_max_ns": 3, "ttft_p50_ns": 4, "ttft_p99_ns": 5, "tokens": 6}
    point = timeseries_point(p)
    assert point["p90_ns"] == 20 and point["errors"] == {"Overload": 1} and point["outstanding"] == 2
    assert [point[k] for k in ("issue_delay_p50_ns", "issue_delay_p99_ns", "issue_delay_max_ns",
                               "ttft_p50_ns", "ttft_p99_ns", "tokens")] == [1, 2, 3, 4, 5, 6]
    assert point["qps"] == pytest.approx(40.0)
