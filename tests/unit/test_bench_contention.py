"""bench/bench_contention.py's pure parts without Triton or perf_analyzer: the lateness of
sends against a constant-rate grid, the reading of a hand-written perf_analyzer profile
export (its 2.60 layout), what is kept of a loadgen document, and the table's medians and
loadgen / perf_analyzer ratios."""

from __future__ import annotations

import json

import pytest

from tests.bench_modules import load_bench

MS = 1_000_000


@pytest.fixture(scope="module")
def bc():
    return load_bench("bench_contention")


def test_nearest_rank_percentile(bc):
    values = list(range(1, 101))
    assert bc.percentile(values, 0.5) == 50 and bc.percentile(values, 0.99) == 99
    assert bc.percentile(values, 1.0) == 100 and bc.percentile([7], 0.99) == 7
    assert bc.percentile([], 0.5) is None


def test_sends_on_the_grid_are_on_time_whatever_the_start(bc):
    start = 1_796_399_492_855_016_849  # perf_analyzer's clock: ns since the epoch
    g = bc.grid_lateness([start + i * 500_000 for i in range(1000)], 2000)
    assert (g["n"], g["p50_ns"], g["p99_ns"], g["max_ns"]) == (1000, 0, 0, 0)
    assert g["sent_qps"] == pytest.approx(2000)


def test_lateness_is_measured_from_the_earliest_send_that_was_on_time(bc):
    # 100 slots 1 ms apart from t=0. Slot 0 is sent 2 ms late, slot 50 5 ms late and slot
    # 99 10 ms late; the others are on time, so t0 = 0. The sends, sorted, are matched to
    # the slots in order: the send at 2 ms takes slot 0's place (then 1 ms late, as slot 1's
    # send is), the one at 55 ms slot 54's (1 ms late, as are slots 51-53's), and the last
    # keeps its 10 ms. A lower bound: 5 ms of true lateness reads as 1 ms.
    ts = [i * MS for i in range(100)]
    ts[0] += 2 * MS
    ts[50] += 5 * MS
    ts[99] += 10 * MS
    g = bc.grid_lateness(ts, 1000)
    assert g["max_ns"] == 10 * MS and g["p50_ns"] == 0
    assert g["p99_ns"] == 1 * MS  # 7 sends 1 ms late, one 10 ms: the 99th of 100 is 1 ms
    assert g["sent_qps"] == pytest.approx(99 / 0.108)  # 1 ms to 109 ms


def test_a_late_start_is_not_seen_so_the_figure_is_a_lower_bound(bc):
    # Every send 3 ms late against the true schedule: no send is on time, yet t0 is
    # taken where the earliest send is, and nothing looks late.
    true_t0 = 10 * MS
    g = bc.grid_lateness([true_t0 + 3 * MS + i * MS for i in range(50)], 1000)
    assert g["max_ns"] == 0


def test_a_tool_that_sends_slower_than_asked_falls_ever_later(bc):
    g = bc.grid_lateness([i * 2 * MS for i in range(101)], 1000)  # 500/s asked 1000/s
    assert g["max_ns"] == 100 * MS and g["sent_qps"] == pytest.approx(500)
    empty = bc.grid_lateness([], 1000)
    assert empty["n"] == 0 and empty["p99_ns"] is None and empty["sent_qps"] is None
    assert bc.grid_lateness([5], 1000)["sent_qps"] is None


def _request(ts: int) -> dict:
    return {"timestamp": ts, "request_inputs": {"INPUT0": [1.0] * 16},
            "response_timestamps": [ts + 250_000], "response_outputs": [{"OUTPUT0": [2.0] * 16}]}


EXPORT = {
    "experiments": [{
        "experiment": {"mode": "request_rate", "value": 1000.0},
        # Windows from 1.0 ms to 6.0 ms: the send at 0.5 ms and the one at 7 ms are outside.
        "requests": [_request(t) for t in (500_000, 1_000_000, 2_000_000, 4_000_000,
                                           3_000_000, 5_200_000, 7_000_000)],
        "window_boundaries": [1_000_000, 3_500_000, 6_000_000],
    }],
    "version": "0.0.0", "service_kind": "triton", "endpoint": "",
}


def test_export_sends_are_those_inside_the_measurement_windows(bc):
    assert bc.export_send_times(EXPORT) == [1_000_000, 2_000_000, 4_000_000, 3_000_000, 5_200_000]
    whole = {"experiments": [{**EXPORT["experiments"][0], "window_boundaries": []}]}
    assert len(bc.export_send_times(whole)) == 7
    with pytest.raises(ValueError):
        bc.export_send_times({"experiments": []})


def test_perf_analyzer_lateness_from_an_export_file(bc, tmp_path):
    path = tmp_path / "export.json"
    path.write_text(json.dumps(EXPORT))
    r = bc.perf_analyzer_lateness(str(path), 1000)
    # Sends at 1, 2, 3, 4 and 5.2 ms against slots 1 ms apart from 1 ms: only the last is late.
    assert r["sends"] == 5 and r["late_p50_ns"] == 0
    assert r["late_p99_ns"] == r["late_max_ns"] == pytest.approx(200_000)
    assert r["achieved_qps"] == pytest.approx(4 / 4.2e-3)


def _doc(valid=True, issue_p99=40_000, issued=20_000, extra=None):
    d = {"valid": valid, "invalid_reasons": [] if valid else ["generator overload: ..."],
         "duration_s": 10.0, "issue_duration_s": 9.9995,
         "counts": {"issued": issued, "completed": issued, "failed": 0, "timed_out": 0},
         "latency_ns": {"p50": 300_000, "p99": 900_000},
         "issue_delay_ns": {"p50": 5_000, "p99": issue_p99, "max": 2 * MS},
         "throughput": {"target_qps": 2000.0, "scheduled_qps": 2000.1}}
    return {**d, **(extra or {})}


def test_what_is_kept_of_a_loadgen_document(bc):
    r = bc.loadgen_fields(_doc())
    assert (r["late_p50_ns"], r["late_p99_ns"], r["late_max_ns"]) == (5_000, 40_000, 2 * MS)
    assert r["sends"] == 20_000 and r["achieved_qps"] == pytest.approx(20_000 / 9.9995)
    assert r["valid"] is True and r["ok"] == 20_000 and r["duration_s"] == 10.0
    assert r["diagnosis_cause"] is None and r["warnings"] == []
    late = bc.loadgen_fields(_doc(valid=False, extra={"diagnosis": {"cause": "client CPU starved"},
                                                      "warnings": ["steal time 30%"]}))
    assert late["invalid_reasons"] and late["diagnosis_cause"] == "client CPU starved"
    assert late["warnings"] == ["steal time 30%"]


def _run(tool, rnd, p99, state="busy", valid=True, proto="http", rate=2000.0, **extra):
    return {"tool": tool, "proto": proto, "rate": rate, "state": state, "round": rnd, "ok": 1000,
            "late_p50_ns": p99 / 10, "late_p99_ns": p99, "late_max_ns": p99 * 3,
            "achieved_qps": rate, "cpu_s": 1.0, "others_cores": 0.1, "competing_cores": 1.5,
            **({"valid": valid} if tool == "loadgen" else {}), **extra}


def test_rows_take_medians_over_rounds_and_the_ratio_of_the_medians(bc):
    runs = [_run("loadgen", 1, 3 * MS), _run("perf_analyzer", 1, 1 * MS),
            _run("loadgen", 2, 5 * MS, valid=False), _run("perf_analyzer", 2, 0.5 * MS),
            _run("loadgen", 3, 11 * MS, valid=False), _run("perf_analyzer", 3, 2 * MS),
            _run("loadgen", 1, 60_000, state="idle"), _run("perf_analyzer", 1, 120_000, state="idle"),
            {**_run("perf_analyzer", 2, 0, state="idle"), "ok": None}]  # a failed run: left out
    rows = bc.cell_rows(runs)
    assert [(r["state"]) for r in rows] == ["busy", "idle"]
    busy, idle = rows
    assert busy["ratio_p99"] == pytest.approx(5.0)  # median 5 ms over median 1 ms
    assert busy["round_ratios"] == pytest.approx([3.0, 10.0, 5.5])
    assert (busy["loadgen_valid"], busy["loadgen_runs"]) == (1, 3)
    assert idle["ratio_p99"] == pytest.approx(0.5) and idle["perf_analyzer_late_p99_ns"] == [120_000]
    lines = bc.table(rows)
    assert lines[0].startswith("| protocol | rate | state |") and len(lines) == 4
    assert ("| http | 2000/s | busy | 5.00 ms [3.00 ms-11.00 ms] (n=3) | 1.00 ms [500.00 us-2.00 ms] (n=3) "
            "| **5.00x** | 3.00x-10.00x |") in lines[2]
    assert "| 1 of 3 |" in lines[2] and "| 1.50, 1.50 |" in lines[2]
    assert "| **0.50x** | 0.50x |" in lines[3]


def test_loadgen_alone_has_no_ratio(bc):
    rows = bc.cell_rows([_run("loadgen", 1, 3 * MS)])
    assert rows[0]["ratio_p99"] is None and rows[0]["round_ratios"] == []
    assert "| **-** | - |" in bc.table(rows)[2]


def test_competing_work_of_each_state(bc):
    assert bc.competing_argvs("idle", 2, 60) == []
    busy = bc.competing_argvs("busy", 2, 60)
    assert len(busy) == 2 and busy[0][:2] == ["timeout", "60"] and busy[0][-2:] == ["-c", "while True: pass"]
    assert bc.competing_argvs("stress", 4, 90) == [["timeout", "90", "stress-ng", "--cpu", "4", "--quiet"]]
