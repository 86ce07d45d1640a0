"""The verdict names the side that limited a run, with its numbers
(loadgen/scenarios/diagnosis.py): a generator that could not issue on time (invalid only
where it falsified the load), a client out of connections, a saturated server, or none.
Real runs produce each cause; the classification itself is checked on hand-built figures."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from loadgen.engine import EngineSettings, RunResult
from loadgen.options import RunOptions
from loadgen.results import build_document, render_summary
from loadgen.results.html_sections import run_sections
from loadgen.results.merge import merge_results
from loadgen.scenarios import get_scenario
from loadgen.scenarios.diagnosis import OVERLOAD_PREFIX, add_diagnosis, diagnose, judge_lateness
from loadgen.stats.histogram import Histogram
from tests.servers.scripted_proc import start_scripted
from tests.helpers import run_cli, run_json, write

MS = 1_000_000

# The Python SUTs: one that blocks the issuing thread (20 ms on every third query, a
# third more than the schedule's 15 ms for three queries), one whose answers take 200 ms
# and that holds the event loop 3 ms on every tenth query (the next arrivals go out late).
BLOCKING = """
import itertools, time
_n = itertools.count()
def f(sample_index):
    if next(_n) % 3 == 0:
        time.sleep(0.02)
"""
SLOW_ASYNC = """
import asyncio, itertools, time
_n = itertools.count()
async def f(sample_index):
    if next(_n) % 10 == 0:
        time.sleep(0.003)
    await asyncio.sleep(0.2)
"""


def _names(doc):
    return [w["name"] for w in doc["warnings"]]


# ------------------------------------------------------------------ real runs

def test_a_sut_call_that_blocks_the_issuing_thread_is_a_late_generator_and_invalid(tmp_path):
    sut = write(tmp_path / "blocking.py", BLOCKING)
    _, doc = run_json("--scenario", "constant", "--target-qps", "200", "--duration-s", "1", "--interval-s", "0.25",
                      "--sut", f"python:{sut}:f", "--inline-dispatch", expect=1, timeout=60)
    d, ev = doc["diagnosis"], doc["diagnosis"]["evidence"]
    assert d["cause"] == "generator" and d["invalid"] is True
    overload = [r for r in doc["invalid_reasons"] if r.startswith(OVERLOAD_PREFIX)]
    assert overload and "fell short of the schedule" in overload[0]
    # The SUT's own time is small; the lateness is the generator's, and it cut the load.
    assert doc["service_time_ns"]["p50"] < 5 * MS
    assert ev["issue_delay_p99_ns"] > 50 * MS and ev["offered_fraction"] < 0.95
    assert ev["lateness_share"] > 0.5
    assert "generator_late" in _names(doc)
    assert f"diagnosis    {d['summary']}" in render_summary(doc)
    assert "offered" in d["summary"] and "p99 issue delay" in d["summary"]


def test_lateness_small_against_a_long_latency_is_valid_with_a_generator_late_warning(tmp_path):
    sut = write(tmp_path / "slow_async.py", SLOW_ASYNC)
    proc = run_cli("run", "--scenario", "constant", "--target-qps", "500", "--duration-s", "1", "--interval-s",
                   "0.25", "--sut", f"python:{sut}:f", "--output", tmp_path / "out", timeout=60)
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    assert proc.returncode == 0, (doc["invalid_reasons"], proc.stderr[-2000:])
    ev = doc["diagnosis"]["evidence"]
    # Late past --max-issue-delay-ms (1 ms), but a small part of a 200 ms latency, and
    # every scheduled query went out within the run: the latencies stand.
    assert ev["issue_delay_p99_ns"] > 1 * MS
    assert ev["lateness_share"] < 0.1 and ev["offered_fraction"] >= 0.95
    assert doc["valid"] and not any(OVERLOAD_PREFIX in r for r in doc["invalid_reasons"])
    assert doc["diagnosis"] == {**doc["diagnosis"], "cause": "generator", "invalid": False}
    late = next(w for w in doc["warnings"] if w["name"] == "generator_late")
    assert "p99 issue delay" in late["message"] and "of the p99 latency" in late["message"]
    # The text summary says it, with its numbers.
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "diagnosis    generator: late but the load held: p99 issue delay" in summary


def test_queries_waiting_for_one_of_two_connections_are_the_clients_limit(tmp_path):
    # 2 connections, 20 ms an answer: 100 answers/s at most, for 200 arrivals/s; the
    # server answers each at once, so the client's two connections are the limit.
    with start_scripted(tmp_path, "--delay-ms", "20") as srv:
        _, doc = run_json("--sut", f"{srv.url}/v2/models/m/infer", "--http-engine", "native", "--scenario",
                          "constant", "--target-qps", "200", "--duration-s", "0.5", "--connections", "2",
                          "--interval-s", "0.25", timeout=90)
    d, ev = doc["diagnosis"], doc["diagnosis"]["evidence"]
    assert d["cause"] == "client" and d["invalid"] is False
    assert ev["queued_in_client"] == doc["network"]["native"]["queued_in_client"] >= 40
    assert ev["slots"] == 2 and ev["slot_hold_ratio"] < 3
    assert "client_saturated" in _names(doc)
    assert "waited in the client for one of 2 connections" in d["summary"]


def test_a_server_past_its_capacity_is_named_and_the_generator_is_not_blamed():
    # One worker of 5 ms a query: 200 queries/s, offered 300/s for 1.5 s.
    _, doc = run_json("--scenario", "constant", "--target-qps", "300", "--duration-s", "1.5", "--interval-s", "0.25",
                      "--sut", "demo:workers=1,max_batch=1,service_us=5000,sigma=0", timeout=60)
    d, ev = doc["diagnosis"], doc["diagnosis"]["evidence"]
    assert d["cause"] == "server" and d["invalid"] is False
    assert not any("generator" in r for r in doc["invalid_reasons"])
    assert ev["outstanding_end"] >= 2 * ev["outstanding_start"] and ev["outstanding_growth"] >= 50
    assert ev["latency_p99_end_ns"] >= 2 * ev["latency_p99_start_ns"]
    assert ev["offered_fraction"] >= 0.95
    assert "server_saturated" in _names(doc)
    assert "generator" not in d["summary"].split(":")[0]


# ------------------------------------------------- the rule on hand-built figures

def _result(issue_delays_ns, latencies_ns, *, mode="constant", timeseries=(), counts=None):
    """A finished run of these figures, as the engine would hand it over."""
    def hist(values):
        h = Histogram()
        for v in values:
            h.record(int(v))
        return h
    n = len(latencies_ns)
    c = {"issued": n, "completed": n, "failed": 0, "timed_out": 0, "cancelled": 0, "outstanding": 0,
         "unknown_completions": 0, "cap_waits": 0, "tokens": 0, **(counts or {})}
    return RunResult(counts=c, latency=hist(latencies_ns), service_time=hist(latencies_ns),
                     issue_delay=hist(issue_delays_ns), ttft=Histogram(), tpot=Histogram(),
                     timeseries=list(timeseries), errors={}, error_messages=[], duration_s=10.1, issue_duration_s=10.0,
                     interrupted=False, settings=EngineSettings(mode=mode, target_qps=100.0))


def _document(result, **options):
    scenario = get_scenario("constant")
    o = scenario.effective(RunOptions(scenario="constant", sut="null", target_qps=100.0, **options))
    return build_document(scenario, o, result, interrupted=False, given={}, started_wall=time.time())


def test_a_p99_issue_delay_of_1_5_ms_against_a_100_ms_latency_is_now_valid_with_a_warning():
    # 1000 queries, 100 ms each; 3% left 1.5 ms late: p99 issue delay 1.5 ms, above the
    # default --max-issue-delay-ms of 1, which alone used to make the run INVALID.
    result = _result([10_000] * 970 + [1_500_000] * 30, [100 * MS] * 1000)
    assert result.issue_delay.value_at_percentile(99) > 1 * MS
    doc = _document(result)
    assert doc["valid"], doc["invalid_reasons"]
    assert doc["diagnosis"]["cause"] == "generator" and doc["diagnosis"]["invalid"] is False
    assert _names(doc) == ["generator_late"]
    assert "1.5" in doc["warnings"][0]["message"] and "100.0" in doc["warnings"][0]["message"]
    # The same figures with a stricter share of latency: invalid, as generator overload.
    strict = _document(result, max_lateness_share=0.01)
    assert not strict["valid"] and strict["invalid_reasons"][0].startswith(OVERLOAD_PREFIX)
    assert "--max-lateness-share" in strict["invalid_reasons"][0]
    assert strict["diagnosis"]["invalid"] is True
    # And with a looser --max-issue-delay-ms it is not even late.
    relaxed = _document(result, max_issue_delay_ms=2.0)
    assert relaxed["diagnosis"]["cause"] == "none" and relaxed["warnings"] == []


def test_judge_lateness_invalid_only_when_short_of_the_schedule_or_material():
    kw = dict(latency_p99_ns=100 * MS, issue_duration_s=10.0, open_loop=True, max_issue_delay_ms=1.0,
              max_lateness_share=0.1)
    on_time = judge_lateness(issue_delay_p99_ns=500_000, points=[], **kw)
    assert not on_time.late and not on_time.invalid
    late = judge_lateness(issue_delay_p99_ns=5 * MS, points=[{"issued": 10, "issue_delay_p50_ns": 2 * MS}], **kw)
    assert late.late and not late.invalid and late.offered_fraction == pytest.approx(1 - 0.002 / 10)
    # The last queries left 1 s late in a 10 s issue window: 90% of the schedule offered.
    short = judge_lateness(issue_delay_p99_ns=5 * MS, points=[{"issued": 10, "issue_delay_p50_ns": 1000 * MS},
                                                               {"issued": 0, "issue_delay_p50_ns": 0}], **kw)
    assert short.short and short.invalid and short.offered_fraction == pytest.approx(0.9)
    material = judge_lateness(issue_delay_p99_ns=20 * MS, points=[], **kw)
    assert material.material and material.lateness_share == pytest.approx(0.2)
    # A closed loop has no schedule to fall short of: only the share of latency counts.
    closed = judge_lateness(issue_delay_p99_ns=5 * MS, points=[], **{**kw, "open_loop": False})
    assert closed.offered_fraction is None and not closed.invalid
    # No latency at all: a late generator is all of it.
    assert judge_lateness(issue_delay_p99_ns=5 * MS, points=[], **{**kw, "latency_p99_ns": 0}).material


def _doc(**parts):
    """A minimal document for diagnose(): an on-time open loop unless parts say otherwise."""
    doc = {"scenario": "constant", "valid": True, "invalid_reasons": [], "duration_s": 10.0, "issue_duration_s": 10.0,
           "settings": {"effective": {"max_issue_delay_ms": 1.0}, "engine": {"mode": "constant"}},
           "counts": {"issued": 1000, "completed": 1000, "cancelled": 0, "cap_waits": 0},
           "issue_delay_ns": {"p99": 100_000}, "latency_ns": {"p99": 10 * MS, "min": 5 * MS}, "timeseries": []}
    doc.update(parts)
    return doc


def _points(outstanding, p99_ms):
    return [{"t_s": i, "length_s": 1.0, "issued": 100, "outstanding": o, "p99_ns": p * MS, "issue_delay_p50_ns": 0}
            for i, (o, p) in enumerate(zip(outstanding, p99_ms))]


def test_diagnose_names_one_cause_from_the_figures():
    assert diagnose(_doc())[0]["cause"] == "none"
    # The in-flight cap: the client's.
    capped = diagnose(_doc(counts={"issued": 1000, "completed": 1000, "cancelled": 0, "cap_waits": 200}))
    assert capped[0]["cause"] == "client" and "--max-in-flight" in capped[0]["summary"]
    # Outstanding and latency growing while issuing is on time: the server's.
    growing = diagnose(_doc(timeseries=_points([10, 40, 90, 150], [20, 60, 150, 300])))
    assert growing[0]["cause"] == "server" and growing[0]["evidence"]["outstanding_growth"] == 140
    assert [w["name"] for w in growing[1]] == ["server_saturated"]
    steady = diagnose(_doc(timeseries=_points([10, 12, 9, 11], [20, 22, 19, 21])))
    assert steady[0]["cause"] == "none"
    # Queries waiting for 64 connections that each held a query 64 x the fastest latency:
    # the server slowed down under the load, not the client.
    net = {"connections": 64, "native": {"queued_in_client": 300}}
    slow = diagnose(_doc(network=net, duration_s=64.0))  # 64 x 64 s / 1000 = 4.1 s a query, 5 ms the fastest
    assert slow[0]["cause"] == "server" and slow[0]["evidence"]["slot_hold_ratio"] > 3
    fast = diagnose(_doc(network=net, duration_s=0.08))  # 64 x 0.08 s / 1000 = 5.1 ms a query
    assert fast[0]["cause"] == "client" and fast[0]["evidence"]["slot_hold_ratio"] < 3
    # A busy client I/O thread.
    host = {"intervals": [{"t_s": 0, "length_s": 1.0, "busiest_thread": {"io": 0.97}, "machine_steal": 0.0}]}
    assert diagnose(_doc(host=host))[0]["cause"] == "client"


def test_a_generator_invalid_by_its_rules_says_why_from_the_host_figures():
    host = {"run_queue_wait_ms": {"issue": 2500.0, "main": 1.0},
            "intervals": [{"t_s": 0, "length_s": 1.0, "busiest_thread": {"issue": 0.4}, "machine_steal": 0.12,
                           "machine_busy": 1.0}]}
    doc = _doc(host=host, issue_delay_ns={"p99": 40 * MS}, invalid_reasons=[f"{OVERLOAD_PREFIX} ..."], valid=False)
    d, warnings = diagnose(doc)
    assert d["cause"] == "generator" and d["invalid"] is True
    assert d["evidence"]["steal_fraction"] == 0.12 and d["evidence"]["run_queue_wait_ms"]["issue"] == 2500.0
    assert "steal time was 12%" in d["summary"] and "waited 2,500 ms on a run queue" in d["summary"]
    assert [w["name"] for w in warnings] == ["generator_late"]
    # The event loop's saturation rule is the generator's too.
    saturated = diagnose(_doc(invalid_reasons=["worker 1: generator saturated: the event loop ..."]))[0]
    assert saturated["cause"] == "generator" and saturated["invalid"] is True


def test_offline_issue_delay_is_its_backlog_not_lateness():
    doc = _doc(scenario="offline", settings={"effective": {}, "engine": {"mode": "offline"}},
               issue_delay_ns={"p99": 900 * MS}, latency_ns={"p99": 950 * MS})
    d, warnings = diagnose(doc)
    assert d["cause"] == "none" and warnings == []


def test_add_diagnosis_keeps_other_warnings_and_replaces_its_own():
    doc = _doc(warnings=[{"name": "other", "message": "kept"}, {"name": "generator_late", "message": "stale"}])
    add_diagnosis(doc)
    assert doc["warnings"] == [{"name": "other", "message": "kept"}]


def test_a_document_from_before_diagnoses_still_renders(tmp_path):
    doc = _document(_result([10_000] * 100, [2 * MS] * 100))
    assert doc["diagnosis"]["cause"] == "none" and doc["warnings"] == []
    assert "diagnosis    none: nothing limited the run" in render_summary(doc)
    old = {k: v for k, v in doc.items() if k not in ("diagnosis", "warnings")}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(old))
    proc = run_cli("report", path, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "diagnosis" not in proc.stdout and "VALID" in proc.stdout
    run_sections([("old", old)])  # the HTML report's sections too


def test_a_merged_result_is_diagnosed_from_the_merged_figures(tmp_path: Path):
    workers = []
    for index in range(2):
        _, doc = run_json("--scenario", "constant", "--target-qps", "300", "--duration-s", "1.5", "--interval-s",
                          "0.25", "--sut", "demo:workers=1,max_batch=1,service_us=10000,sigma=0", "--workers", "2",
                          "--worker-index", str(index), timeout=60)
        workers.append((f"w{index}.json", doc))
    merged = merge_results(workers)
    assert merged["diagnosis"]["cause"] == "server"
    assert all(w["diagnosis"] for w in merged["merge"]["workers"])
