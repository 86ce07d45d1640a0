"""The verdict names the side that limited a run, with its numbers
(loadgen/scenarios/diagnosis.py): a generator that could not issue on time (invalid only
where it falsified the load), a client out of connections, a saturated server, or none.
Real runs produce each cause; the classification itself is checked on hand-built figures.

The tests that start processes or servers are in tests/integration/test_verdict.py."""

from __future__ import annotations

import time

import pytest

from loadgen.engine import EngineSettings, RunResult
from loadgen.options import RunOptions
from loadgen.results import build_document
from loadgen.scenarios import get_scenario
from loadgen.scenarios.diagnosis import OVERLOAD_PREFIX, add_diagnosis, diagnose, judge_lateness
from loadgen.stats.histogram import Histogram

MS = 1_000_000


def _names(doc):
    return [w["name"] for w in doc["warnings"]]


# ------------------------------------------------------------------ real runs


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


