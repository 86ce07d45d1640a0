"""loadgen embedded in a program: ``loadgen.run`` returns a :class:`loadgen.result.Result`
with the command's verdict and summary, from any thread, without changing the process;
and a real inference server (examples/embedded_server) that benchmarks its own model
behind an endpoint.

The tests that start processes; the in-process ones are in tests/unit/test_embedding.py."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import loadgen
from loadgen.engine import RunResult
from loadgen.result import Result
from tests.helpers import assert_counts_add_up, run_json
from tests.servers.procs import REPO, ServerProcess, free_port, get_json, post_json
from tests.unit.test_embedding import POISSON, _process_state, _run_in_thread, model

SERVER = Path(REPO) / "examples" / "embedded_server" / "server.py"


def assert_verdict_consistent(result: Result) -> None:
    """valid, reasons, the summary and the document say the same thing."""
    doc = result.to_dict()
    assert result.valid is doc["valid"] is (not result.reasons)
    assert result.reasons == doc["invalid_reasons"]
    summary = result.summary()
    assert summary.split()[0] == ("VALID" if result.valid else "INVALID")
    for reason in result.reasons:
        assert f"  - {reason}" in summary
    assert doc["counts"]["issued"] == result.counts["issued"]
    assert_counts_add_up(result.counts)


def issued_by_schedule(**options) -> int:
    """How many queries these options' (seeded) schedule issues: a run of the native
    null SUT, in this process."""
    return loadgen.run(sut="null", **options).counts["issued"]


def test_engine_run_returns_a_result_with_its_verdict():
    result = loadgen.run(loadgen.EngineSettings(mode="poisson", target_qps=200, duration_s=1), model)
    assert isinstance(result, Result) and isinstance(result, RunResult)  # what callers had, and more
    assert result.counts["completed"] > 0 and result.latency.total_count == result.counts["completed"]
    assert_verdict_consistent(result)
    assert result.summary().startswith(("VALID  poisson on model:", "INVALID  poisson on model:"))
    assert result.metric["name"] == "completed_qps"
    doc = result.to_dict()
    assert doc["schema"] == "loadgen.result/1" and doc["scenario"] == "poisson"
    doc["valid"] = "changed"
    assert result.document["valid"] in (True, False)  # to_dict() is a copy


def test_an_invalid_engine_run_says_why():
    # Every query times out after 1 us: over the error rate allowed (none), whatever the load on the host.
    result = loadgen.run(loadgen.EngineSettings(mode="constant", target_qps=200, duration_s=0.5, timeout_ms=0.001),
                         model)
    assert not result.valid and not result.passed
    assert any("timed out" in r and "--max-error-rate" in r for r in result.reasons), result.reasons
    assert_verdict_consistent(result)


def test_a_run_with_the_command_options_is_the_commands_run():
    result = loadgen.run(sut="demo", **POISSON)
    _, doc = run_json("--sut", "demo", "--scenario", "poisson", "--target-qps", "200", "--duration-s", "1")
    assert_verdict_consistent(result)
    mine = result.to_dict()
    assert mine["counts"]["issued"] == doc["counts"]["issued"]  # the same seeded schedule
    assert mine["scenario"] == doc["scenario"] and mine["sut"] == doc["sut"] == "demo"
    assert set(mine) == set(doc)  # the same document, section by section
    assert {**mine["settings"]["effective"], "json": True} == doc["settings"]["effective"]  # --json aside
    figures = result.summary().split("\n\n", 1)[1]  # after the verdict, its reasons and the diagnosis
    labels = [line.split()[0] for line in figures.splitlines()]
    assert labels[:5] == ["duration", "queries", "throughput", "latency", "service"]


def test_stop_requested_ends_a_run_early_and_invalid():
    deadline = time.monotonic() + 0.5
    started = time.monotonic()
    result = loadgen.run(sut=model, scenario="constant", target_qps=100, duration_s=30,
                         stop_requested=lambda: time.monotonic() > deadline)
    assert time.monotonic() - started < 20  # not the 30 s asked for
    assert result.interrupted and not result.valid
    assert any("interrupted" in r for r in result.reasons), result.reasons
    assert 0 < result.counts["issued"] < 3000
    assert_verdict_consistent(result)


def test_a_run_from_another_thread_changes_nothing_in_the_process():
    before = _process_state()
    out = _run_in_thread(pin_cpus=[sorted(os.sched_getaffinity(0))[-1]], **POISSON)
    assert out["during"] == before  # no signal handler, no switch interval, no frozen collector
    assert _process_state() == before
    assert out["affinity_after"] == out["affinity_before"]  # only the run's own thread was pinned
    assert out["result"].counts["completed"] > 0
    assert_verdict_consistent(out["result"])


def test_two_runs_at_once_both_measure_their_whole_schedule():
    results = []
    threads = [threading.Thread(target=lambda: results.append(loadgen.run(sut=model, **POISSON))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 2
    expected = issued_by_schedule(**POISSON)
    for result in results:
        assert result.counts["issued"] == expected
        assert_verdict_consistent(result)


def _post(url, body):
    """(status, JSON answer) of a POST, errors included."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def embedded_server(tmp_path):
    port = free_port()
    proc = ServerProcess([sys.executable, str(SERVER), "--port", str(port)], str(tmp_path / "server.log"))
    try:
        proc.wait_http_ok(f"http://127.0.0.1:{port}/health", 60)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.stop()


def test_the_example_server_runs_loadgen_behind_an_endpoint(embedded_server):
    url, proc = embedded_server
    assert get_json(url + "/health")["loadgen"] == loadgen.__version__
    [probs] = post_json(url + "/v1/models/tiny:predict", {"instances": [[0.5] * 16]})["predictions"]
    assert len(probs) == 4 and abs(sum(probs) - 1) < 1e-5

    run = {"scenario": "poisson", "target_qps": 200, "duration_s": 2}
    verdict = post_json(url + "/loadgen/run", run, timeout_s=120)
    assert verdict["valid"] is (not verdict["reasons"])
    assert verdict["summary"].split()[0] == ("VALID" if verdict["valid"] else "INVALID")
    assert verdict["summary"].splitlines()[0].split()[1:4] == ["poisson", "on", "model"]
    counts = verdict["counts"]
    assert counts["issued"] == issued_by_schedule(**run)  # the whole seeded schedule went to the model
    assert counts["issued"] == counts["completed"] + counts["failed"] + counts["timed_out"] + counts["cancelled"]
    assert verdict["metric"]["name"] == "completed_qps" and verdict["metric"]["value"] > 0
    assert verdict["latency_ns"]["p50"] > 0

    # An invalid run, whatever the load on this host: every query times out.
    verdict = post_json(url + "/loadgen/run", {**run, "duration_s": 0.5, "timeout_ms": 0.001}, timeout_s=120)
    assert not verdict["valid"] and any("--max-error-rate" in r for r in verdict["reasons"])
    assert verdict["counts"]["timed_out"] > 0

    # Bad requests get a clear error, and the server keeps serving.
    status, answer = _post(url + "/loadgen/run", {**run, "target_qps": -5})
    assert status == 400 and "--target-qps" in answer["error"]
    status, answer = _post(url + "/loadgen/run", {**run, "sut": "http://example.com"})
    assert status == 400 and "sut" in answer["error"]
    status, answer = _post(url + "/loadgen/run", {**run, "duration_s": 3600})
    assert status == 400 and "duration_s" in answer["error"]

    # One benchmark at a time: a second, while the first runs, gets 409. The probe's rate is
    # bad, so that when it does get the server (before the first started) it ends at once.
    first = {}

    def first_run():
        for _ in range(100):  # a probe that held the server for its moment: try again
            first["status"], first["answer"] = _post(url + "/loadgen/run", {**run, "duration_s": 4})
            if first["status"] != 409:
                return

    thread = threading.Thread(target=first_run)
    thread.start()
    try:
        status, answer = 0, {}
        for _ in range(200):  # until the first has started (a busy host may take a while)
            status, answer = _post(url + "/loadgen/run", {**run, "target_qps": -5})
            if status == 409:
                break
            time.sleep(0.02)
        assert status == 409 and "running" in answer["error"]
    finally:
        thread.join(120)
    assert first["status"] == 200 and first["answer"]["counts"]["issued"] > 0
    assert proc.alive()  # the runs were on handler threads; the server's main thread is untouched


def test_a_sut_keyboard_interrupt_stops_a_run_from_another_thread_and_not_the_main_thread():
    from tests.unit.test_hardening_sut import _interrupting_function

    out = {}

    def body():
        try:
            out["result"] = loadgen.run(sut=_interrupting_function(10), scenario="constant",
                                        target_qps=500, duration_s=30)
        except BaseException as e:  # handed to the test
            out["error"] = e

    thread = threading.Thread(target=body)
    main_interrupted = False
    started = time.monotonic()
    thread.start()
    try:  # the main thread sleeps on: an interrupt meant for it would end this loop
        while thread.is_alive() and time.monotonic() - started < 60:
            time.sleep(0.01)
        time.sleep(0.5)
    except KeyboardInterrupt:
        main_interrupted = True
    thread.join(120)
    assert not main_interrupted
    assert "error" not in out, out.get("error")
    result = out["result"]
    assert result.interrupted is True and result.valid is False
    assert result.to_dict()["interrupted"] is True
    assert result.errors == {"KeyboardInterrupt": 1}
    assert 9 <= result.counts["completed"] and result.counts["issued"] < 5000  # stopped, not 30 s of it
