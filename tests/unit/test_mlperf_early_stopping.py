"""One early-stopping verdict for ``loadgen run --scenario server`` and ``loadgen.mlperf``.

The same latencies go through both paths: a SUT that answers every EVERY-th query (in
issue order) SLOW_MS late and the others at once, around a bound far from both, for the
same number of queries. Both must count the same queries over the bound and reach the
same early-stopping verdict (loadgen.stats.early_stopping is the one implementation).
"""

from __future__ import annotations

import itertools
import json
import threading

import pytest

import loadgen.mlperf as lg
from loadgen.options import RunOptions
from loadgen.runner import run_benchmark

QUERIES = 300
TARGET_QPS = 600.0
BOUND_MS = 60.0
SLOW_MS = 150.0

CASES = [
    # (every, percentile): (every 60th, p90) passes; (every 5th, p99) does not.
    pytest.param(60, 90.0, id="passes"),
    pytest.param(5, 99.0, id="fails"),
]

_SUT_SOURCE = """
import asyncio
import itertools

_order = itertools.count()


async def f(sample_index):
    if next(_order) % {every} == 0:
        await asyncio.sleep({slow_s})
"""


def _cli_server(tmp_path, every: int, percentile: float) -> tuple[int, int, bool]:
    path = tmp_path / "straddle_sut.py"
    path.write_text(_SUT_SOURCE.format(every=every, slow_s=SLOW_MS / 1000))
    options = RunOptions(
        scenario="server", sut=f"python:{path}:f", target_qps=TARGET_QPS,
        latency_bound_ms=BOUND_MS, latency_percentile=percentile,
        min_duration_s=0.0, min_query_count=QUERIES, query_count=QUERIES,
        max_issue_delay_ms=1000.0,
    )
    doc = run_benchmark(options)
    es = doc["early_stopping"]
    return doc["counts"]["issued"], es["overlatency_queries"], es["passed"]


def _mlperf_server(tmp_path, every: int, percentile: float) -> tuple[int, int, bool]:
    order = itertools.count()
    timers: list[threading.Timer] = []

    def complete(sample) -> None:
        lg.QuerySamplesComplete([lg.QuerySampleResponse(sample.id, 0, 0)])

    def issue(samples) -> None:
        for sample in samples:
            if next(order) % every == 0:
                timer = threading.Timer(SLOW_MS / 1000, complete, [sample])
                timers.append(timer)
                timer.start()
            else:
                complete(sample)

    ts = lg.TestSettings()
    ts.scenario = lg.TestScenario.Server
    ts.mode = lg.TestMode.PerformanceOnly
    ts.server_target_qps = TARGET_QPS
    ts.server_target_latency_ns = int(BOUND_MS * 1e6)
    ts.server_target_latency_percentile = percentile / 100
    ts.min_duration_ms = 0
    ts.min_query_count = QUERIES
    ts.max_query_count = QUERIES
    log = lg.LogSettings()
    log.log_output.outdir = str(tmp_path)
    log.enable_trace = False
    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(64, 64, lambda indices: None, lambda indices: None)
    try:
        lg.StartTestWithLogSettings(sut, qsl, ts, log)
    finally:
        for timer in timers:
            timer.join()
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    lines = (tmp_path / "mlperf_log_detail.txt").read_text().splitlines()
    detail = {}
    for line in lines:
        entry = json.loads(line.split(":::MLLOG ", 1)[1])
        detail[entry["key"]] = entry["value"]
    return (
        detail["result_query_count"],
        detail["result_overlatency_query_count"],
        detail["early_stopping_met"],
    )


@pytest.mark.parametrize("every, percentile", CASES)
def test_cli_server_and_mlperf_server_agree_on_early_stopping(tmp_path, every, percentile):
    cli_dir, mlperf_dir = tmp_path / "cli", tmp_path / "mlperf"
    cli_dir.mkdir()
    mlperf_dir.mkdir()
    cli = _cli_server(cli_dir, every, percentile)
    ours = _mlperf_server(mlperf_dir, every, percentile)
    slow = len(range(0, QUERIES, every))
    assert cli == ours == (QUERIES, slow, every == 60), (cli, ours)
