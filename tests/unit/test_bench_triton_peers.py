"""bench/triton_peers.py without perf_analyzer: its command lines, the reading of its report
(texts as perf_analyzer 2.60 prints them against Triton's add_one) and the triton case's
rows and loadgen / perf_analyzer ratios from hand-made run records."""

from __future__ import annotations

import os

import pytest

from tests.bench_modules import load_bench


CLOSED = """\
*** Measurement Settings ***
  Batch size: 1
  Service Kind: TRITON
  Using "time_windows" mode for stabilization
  Stabilizing using average latency and throughput
  Measurement window: 1000 msec
  Using synchronous calls for inference

Request concurrency: 8
  Client:
    Request count: 16145
    Throughput: 4382.88 infer/sec
    Avg latency: 1815 usec (standard deviation 1658 usec)
    p50 latency: 1435 usec
    p90 latency: 2894 usec
    p95 latency: 4212 usec
    p99 latency: 8706 usec
    Avg gRPC time: 1804 usec ((un)marshal request/response 4 usec + response wait 1800 usec)
  Server:
    Inference count: 16148
    Execution count: 16148
    Successful request count: 16148
    Avg request latency: 773 usec (overhead 2 usec + queue 595 usec + compute input 10 usec + compute infer 92 usec + compute output 74 usec)

Inferences/Second vs. Client Average Batch Latency
Concurrency: 8, throughput: 4382.88 infer/sec, latency 1815 usec
"""

OPEN_LATE = """\
*** Measurement Settings ***
  Batch size: 1
  Service Kind: TRITON
  Using "time_windows" mode for stabilization
  Stabilizing using average throughput
  Measurement window: 1000 msec
  Using poisson distribution on request generation
  Using asynchronous calls for inference

Request Rate: 3410 inference requests per second
  Client:
    Request count: 12607
    Avg send request rate: 3850.31 infer/sec
    [WARNING] Perf Analyzer was not able to keep up with the desired request rate. 28.53% of the requests were delayed.
    Throughput: 3325.24 infer/sec
    Avg latency: 388460 usec (standard deviation 2783 usec)
    p50 latency: 1990 usec
    p90 latency: 3939 usec
    p95 latency: 5668 usec
    p99 latency: 785000 usec
  Server:
    Inference count: 13269
    Successful request count: 13269

Inferences/Second vs. Client Average Batch Latency
Request Rate: 3410.00, throughput: 3325.24 infer/sec, latency 388460 usec
"""


@pytest.fixture(scope="module")
def peers():
    return load_bench("triton_peers")


def test_closed_loop_report(peers):
    r = peers.parse_perf_analyzer(CLOSED)
    assert r["ok"] == 16145 and r["errors"] == 0
    assert r["duration_s"] == pytest.approx(16145 / 4382.88)
    assert (r["p50_ns"], r["p99_ns"]) == (1_435_000, 8_706_000)
    assert "target_qps" not in r and "delayed_share" not in r


def test_open_loop_report_keeps_the_rate_sent_and_the_delay_warning(peers):
    late = peers.parse_perf_analyzer(OPEN_LATE)
    assert (late["target_qps"], late["sent_qps"]) == (3410.0, 3850.31)
    assert late["delayed_share"] == pytest.approx(0.2853)
    assert late["p99_ns"] == 785_000_000
    on_time = peers.parse_perf_analyzer(OPEN_LATE.replace(
        "    [WARNING] Perf Analyzer was not able to keep up with the desired request rate. "
        "28.53% of the requests were delayed.\n", ""))
    assert on_time["delayed_share"] == 0.0
    assert peers.open_loop_kept_up({"tool": "perf_analyzer", "mode": "open", **on_time}) is True
    assert peers.open_loop_kept_up({"tool": "perf_analyzer", "mode": "open", **late}) is False
    assert peers.open_loop_kept_up({"tool": "loadgen", "mode": "open", "valid": False}) is False
    assert peers.open_loop_kept_up({"tool": "loadgen", "mode": "open", "valid": True, "queued_in_client": 0}) is True
    # Valid, but requests waited in the client for a connection: not sent on schedule.
    assert peers.open_loop_kept_up({"tool": "loadgen", "mode": "open", "valid": True, "queued_in_client": 3}) is False
    assert peers.open_loop_kept_up({"tool": "loadgen", "valid": True}) is None  # closed loop


def test_a_failed_run_is_not_read_as_figures(peers):
    with pytest.raises(ValueError):
        peers.parse_perf_analyzer("error: failed to get model metadata: connection refused\n")


def test_command_lines(peers, tmp_path):
    closed = peers.perf_analyzer_argv("pa", "http", "127.0.0.1:8000", 3, concurrency=8)
    assert closed[:7] == ["pa", "-m", "add_one", "-i", "http", "-u", "127.0.0.1:8000"]
    assert closed[closed.index("--measurement-interval") + 1] == "1000"  # three 1 s windows
    assert closed[-2:] == ["--concurrency-range", "8"] and "--input-tensor-format" in closed
    rate = peers.perf_analyzer_argv("pa", "grpc", "127.0.0.1:8001", 6, rate=3410)
    assert rate[-5:] == ["--request-rate-range", "3410", "--request-distribution", "poisson",
                         "--async"]
    assert "--input-tensor-format" not in rate
    with pytest.raises(ValueError):
        peers.perf_analyzer_argv("pa", "grpc", "x", 3)
    exe = tmp_path / "perf_analyzer"
    exe.write_text("#!/bin/sh\n")
    assert peers.find_perf_analyzer(str(exe)) is None  # not executable
    os.chmod(exe, 0o755)
    assert peers.find_perf_analyzer(str(exe)) == str(exe)


def run(tool, load, cpu_s, served, qps, **extra):
    return {"tool": tool, "proto": "grpc", "load": load, "ok": served, "cpu_s": cpu_s,
            "qps": qps, "p50_ns": 1e6, "p99_ns": 2e6, "cpu_ms_per_1k": 1e6 * cpu_s / served,
            "server_counts": {"inferences": served}, "server_cpu_share": 0.9,
            "others_cores": 0.0, **extra}


def test_rows_compare_loadgen_with_perf_analyzer_of_the_same_run(peers):
    runs = [run("loadgen", "c8", 1.5, 10_000, 3000.0, window_cpu_ms_per_1k=40.0),
            run("perf_analyzer", "c8", 1.02, 10_000, 3300.0,  # perf_analyzer sent 10k, counted fewer
                window_cpu_ms_per_1k=100.0),
            run("loadgen", "poisson 3410/s, spin 0 us", 1.0, 10_000, 3400.0, mode="open",
                valid=True, scheduled_qps=3410.0, issue_delay_p99_ns=40_000),
            run("perf_analyzer", "poisson 3410/s", 0.52, 5_000, 1600.0, mode="open",
                delayed_share=0.99, sent_qps=1618.0)]
    loads = {"grpc": ["c8", "poisson 3410/s, spin 0 us", "poisson 3410/s"]}
    fixed = {("loadgen", "grpc"): 0.5, ("perf_analyzer", "grpc"): 0.02}
    rows = peers.triton_rows(runs, fixed, loads, measured=True)
    by = {(r["tool"], r["load"]): r for r in rows}
    c8 = by[("loadgen", "c8")]
    assert c8["steady_cpu_ms_per_1k"] == pytest.approx(100.0)  # (1.5 - 0.5) s / 10k
    assert c8["perf_analyzer_ms_per_1k"] == pytest.approx(100.0)  # (1.02 - 0.02) s / 10k
    assert c8["over_perf_analyzer"] == pytest.approx(1.0)
    assert c8["over_perf_analyzer_with_startup"] == pytest.approx(150 / 102)
    assert c8["over_perf_analyzer_qps"] == pytest.approx(3000 / 3300)
    op = by[("loadgen", "poisson 3410/s, spin 0 us")]
    assert op["over_perf_analyzer"] == pytest.approx(50 / 100)  # 0.5 s / 10k vs 0.5 s / 5k
    assert op["kept_up"] == [True] and by[("perf_analyzer", "poisson 3410/s")]["kept_up"] == [False]
    table = "\n".join(peers.triton_table(rows, measured=True))
    assert c8["over_perf_analyzer_in_run"] == pytest.approx(0.4) and "over_wrk" not in c8
    assert "| 40.0 ms | - | 0.40x | 1.00x | 1.47x | 0.91x | - |" in table
    assert "| 1.6k, 0/1 (99% late) |" in table
    assert "| 3.4k, 1/1 (issue delay p99 40.00 us) |" in table


def test_http_rows_compare_loadgen_with_wrk_in_the_run_and_net_of_start_up(peers):
    runs = [{**run("loadgen", "c32", 1.2, 20_000, 5000.0, window_cpu_ms_per_1k=24.0), "proto": "http"},
            {**run("wrk", "c32", 0.55, 22_000, 5500.0, window_cpu_ms_per_1k=25.0), "proto": "http"}]
    rows = peers.triton_rows(runs, {("loadgen", "http"): 0.6}, {"http": ["c32"]}, measured=True)
    lg = next(r for r in rows if r["tool"] == "loadgen")
    assert lg["steady_cpu_ms_per_1k"] == pytest.approx(30.0)  # (1.2 - 0.6) s / 20k
    assert lg["over_wrk"] == pytest.approx(30.0 / 25.0)  # wrk: 0.55 s / 22k, start-up kept
    assert lg["over_wrk_in_run"] == pytest.approx(24.0 / 25.0)
    table = "\n".join(peers.triton_table(rows, measured=True))
    assert "| 0.96x, 1.20x |" in table


def test_without_perf_analyzer_the_reference_figure_is_labelled(peers):
    rows = peers.triton_rows([run("loadgen", "c8", 1.6, 10_000, 3000.0)],
                             {("loadgen", "grpc"): 0.5}, {"grpc": ["c8"]}, measured=False)
    assert rows[0]["over_perf_analyzer"] == pytest.approx(110.0 / peers.PERF_ANALYZER_MS_PER_1K)
    table = "\n".join(peers.triton_table(rows, measured=False))
    assert "reference, not measured here" in table and "| 110.0 ms | 1.00x |" in table
