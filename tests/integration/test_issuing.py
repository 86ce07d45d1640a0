"""How queries are issued: a closed loop's streams start spread over --ramp-up-s (its
queries counted apart like a warm-up), an open loop on a native client is sent by the issue
thread, the issue thread asks the kernel for a short scheduler slice, and a closed loop on
a native client never makes a query wait in the client for a place that has just ended.

Every check here is on scheduled times the engine computes or on counts, never on how
soon a thread woke: they hold on a busy machine."""

from __future__ import annotations

import json
import os
import platform

import pytest

from loadgen.engine import EngineSettings, run
from loadgen.sut import FixedDelaySUT
from tests.servers.scripted_proc import start_scripted
from tests.helpers import run_cli


def _records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = platform.release().split(".")
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)
    except (ValueError, IndexError):
        return False


def _first_per_stream(records, streams):
    """The scheduled offsets (ns from the first) of the first `streams` queries issued."""
    first = sorted(records, key=lambda r: r["query"])[:streams]
    t0 = min(r["scheduled_ns"] for r in first)
    return [r["scheduled_ns"] - t0 for r in first]


@pytest.mark.parametrize("sut_kind", ["native", "python"])
def test_a_ramp_starts_each_stream_at_its_own_time_and_counts_it_apart(tmp_path, sut_kind):
    # 10 streams over 100 ms: stream k starts at k * 10 ms exactly (scheduled times are
    # the engine's own arithmetic), every answer takes 150 ms (so every stream has started
    # before the first answers), and what is scheduled in the ramp is counted apart.
    path = tmp_path / "records.jsonl"
    settings = EngineSettings(mode="closed", concurrency=10, ramp_up_s=0.1, duration_s=0.3,
                              record_requests=str(path), interval_s=0)
    settings.duration_s = 0.5
    if sut_kind == "native":
        sut = FixedDelaySUT(150_000)
    else:
        import time

        def sut(sample_index):
            time.sleep(0.15)
    res = run(settings, sut)
    recs = _records(path)
    starts = _first_per_stream(recs, 10)
    assert starts == [k * 10_000_000 for k in range(10)]
    t0 = min(r["scheduled_ns"] for r in recs)
    in_ramp = [r for r in recs if r["scheduled_ns"] - t0 < 100_000_000]
    assert all(r["warmup"] for r in in_ramp) and not any(r["warmup"] for r in recs if r not in in_ramp)
    assert res.counts["warmup_issued"] == len(in_ramp) >= 10
    assert res.counts["issued"] == len(recs) - len(in_ramp)


def test_without_a_ramp_every_stream_starts_at_once(tmp_path):
    path = tmp_path / "records.jsonl"
    run(EngineSettings(mode="closed", concurrency=8, query_count=40, record_requests=str(path), interval_s=0),
        FixedDelaySUT(10_000))
    assert _first_per_stream(_records(path), 8) == [0] * 8


def test_the_ramp_is_refused_for_an_open_loop():
    with pytest.raises(ValueError, match="ramp_up_s"):
        run(EngineSettings(mode="poisson", target_qps=100, ramp_up_s=1.0, duration_s=0.1), FixedDelaySUT(1000))


def test_ramp_up_auto_spreads_many_streams_and_leaves_few_at_once(tmp_path):
    proc = run_cli("run", "--sut", "sleep:5000", "--scenario", "concurrency", "--concurrency", "200",
                   "--duration-s", "0.5", "--json", "--quiet", "--interval-s", "0", timeout=60)
    doc = json.loads(proc.stdout)
    assert doc["settings"]["effective"]["ramp_up_s"] == pytest.approx(0.2)
    assert doc["warmup"]["ramp_up_s"] == pytest.approx(0.2) and doc["warmup"]["issued"] >= 200
    proc = run_cli("run", "--sut", "sleep:5000", "--scenario", "concurrency", "--concurrency", "8",
                   "--duration-s", "0.2", "--json", "--quiet", "--interval-s", "0", timeout=60)
    doc = json.loads(proc.stdout)
    assert doc["settings"]["effective"]["ramp_up_s"] == 0 and "warmup" not in doc


def test_the_native_client_ramps_its_streams(tmp_path):
    # The I/O threads send a closed loop's queries; the ramp's later streams are started
    # by the issue thread when their time comes.
    path = tmp_path / "records.jsonl"
    with start_scripted(tmp_path, "--delay-ms", "200") as srv:
        proc = run_cli("run", "--sut", f"{srv.url}/v2/models/m/infer", "--http-engine", "native",
                       "--scenario", "concurrency", "--concurrency", "16", "--ramp-up-s", "0.16",
                       "--duration-s", "0.4", "--record-requests", str(path), "--json", "--quiet",
                       "--interval-s", "0", "--max-issue-delay-ms", "1000", timeout=60)
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert _first_per_stream(_records(path), 16) == [k * 10_000_000 for k in range(16)]
    doc = json.loads(proc.stdout)
    assert doc["network"]["native"]["queued_in_client"] == 0


@pytest.mark.parametrize("io_threads", ["1", "2"])
def test_a_closed_loop_on_the_native_http_client_never_queues(tmp_path, io_threads):
    with start_scripted(tmp_path) as srv:
        proc = run_cli("run", "--sut", f"{srv.url}/v2/models/m/infer", "--http-engine", "native",
                       "--io-threads", io_threads, "--scenario", "concurrency", "--concurrency", "32",
                       "--query-count", "4000", "--json", "--quiet", "--interval-s", "0",
                       "--max-issue-delay-ms", "1000", timeout=90)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["counts"]["completed"] == doc["counts"]["issued"] == 4000
    assert doc["network"]["native"]["queued_in_client"] == 0


@pytest.mark.skipif(not _kernel_at_least(6, 12), reason="custom scheduler slices need Linux 6.12 or later")
def test_the_issue_thread_asks_for_a_short_slice_and_says_whether_it_got_it(tmp_path):
    proc = run_cli("run", "--sut", "null", "--scenario", "constant", "--target-qps", "1000", "--duration-s", "0.2",
                   "--json", "--quiet", "--interval-s", "0", timeout=60)
    doc = json.loads(proc.stdout)
    assert doc["issuing"] == {"sched_slice_us": 100.0, "sched_slice_applied": True}
    proc = run_cli("run", "--sut", "null", "--scenario", "constant", "--target-qps", "1000", "--duration-s", "0.2",
                   "--sched-slice-us", "0", "--json", "--quiet", "--interval-s", "0", timeout=60)
    assert json.loads(proc.stdout)["issuing"]["sched_slice_applied"] is False


@pytest.mark.parametrize("server_args,client_args", [((), ()), (("--delay-ms", "20"), ("--connections", "2"))],
                         ids=["room", "queries-wait"])
def test_an_open_loop_on_the_native_client_is_sent_by_the_issue_thread(tmp_path, server_args, client_args):
    # The issue thread (lg-issue) sends each request that finds a free connection; an I/O
    # thread (lg-http) sends only a query that waited in the client for one (counted in
    # network.native.queued_in_client), when a response frees its connection. On a busy
    # host under strace the server can fall behind so that some queries wait: those, and
    # only those, may leave from an I/O thread. The second case makes them wait on purpose.
    # strace counts each thread's sendto calls; skipped where strace is not installed.
    import shutil
    import subprocess
    import sys

    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    out = tmp_path / "strace"
    with start_scripted(tmp_path, *server_args) as srv:
        argv = [sys.executable, "-m", "loadgen", "run", "--sut", f"{srv.url}/v2/models/m/infer", *client_args,
                "--http-engine", "native", "--scenario", "constant", "--target-qps", "500",
                "--duration-s", "0.4", "--quiet", "--interval-s", "0", "--max-issue-delay-ms", "1000",
                "--json"]
        proc = subprocess.run(["strace", "-f", "-qq", "-e", "trace=sendto,prctl", "-o", str(out), *argv],
                              check=False, timeout=90, capture_output=True, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    names, sends = {}, {}
    for line in out.read_text(errors="replace").splitlines():
        tid, _, rest = line.strip().partition(" ")  # strace pads a short thread id with spaces
        rest = rest.lstrip()
        if rest.startswith("prctl(PR_SET_NAME"):
            names[tid] = rest.split('"')[1]
        elif rest.startswith("sendto(") and "POST " in rest:
            sends[tid] = sends.get(tid, 0) + 1
    by_name = {}
    for tid, n in sends.items():
        by_name[names.get(tid, "?")] = by_name.get(names.get(tid, "?"), 0) + n
    waited, issued = doc["network"]["native"]["queued_in_client"], doc["counts"]["issued"]
    from_issue, from_io = by_name.get("lg-issue", 0), by_name.get("lg-http", 0)
    detail = (by_name, waited, issued)
    assert issued == 200 and set(by_name) <= {"lg-issue", "lg-http"}, detail
    assert from_io <= waited and issued - waited <= from_issue and from_issue + from_io <= issued, detail
    if waited == 0:  # the usual case on a host with room: every request from the issue thread
        assert from_issue == issued, detail
    if client_args:  # 2 connections at 20 ms serve 100/s of the 500/s: most queries wait
        assert waited >= 100 and from_io >= 50, detail


@pytest.mark.parametrize("io_threads", ["1", "2"])
def test_a_closed_loop_on_the_native_grpc_client_never_queues(io_threads):
    # A call's place is free before its query resolves, so the query that the resolution
    # makes room for (issued at once, on whichever thread) never waits in the client.
    from tests.servers.grpc_scripted import ScriptedGrpc
    from tests.servers.procs import native_grpc_or_skip

    native_grpc_or_skip()
    with ScriptedGrpc(threads=64) as srv:
        proc = run_cli("run", "--sut", srv.url(), "--grpc-engine", "native", "--io-threads", io_threads,
                       "--scenario", "concurrency", "--concurrency", "32", "--query-count", "3000", "--json",
                       "--quiet", "--interval-s", "0", "--max-issue-delay-ms", "1000", timeout=120)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["network"]["grpc_engine"] == "native"
    assert doc["counts"]["completed"] == doc["counts"]["issued"] == 3000
    assert doc["network"]["native"]["queued_in_client"] == 0


def test_the_native_client_records_how_long_responses_waited_in_the_socket(tmp_path):
    # The kernel stamps what it receives (SO_TIMESTAMPNS); each read's wait from that
    # stamp is recorded beside the latencies, which end at the read itself.
    with start_scripted(tmp_path, "--delay-ms", "2") as srv:
        proc = run_cli("run", "--sut", f"{srv.url}/v2/models/m/infer", "--http-engine", "native",
                       "--scenario", "constant", "--target-qps", "300", "--duration-s", "0.5", "--json",
                       "--quiet", "--interval-s", "0", "--max-issue-delay-ms", "1000", timeout=60)
    doc = json.loads(proc.stdout)
    wait = doc["receive_wait_ns"]
    assert wait["count"] >= doc["counts"]["completed"] == 150
    assert 0 <= wait["p50"] <= doc["latency_ns"]["p50"] and wait["max"] < 1e9
    assert doc["network"]["native"]["receive_wait_ns"]["p99"] == wait["p99"]
    assert doc["histograms"]["receive_wait_ns"] == {"unit": "ns", "source": "sut"}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placement needs two usable CPUs")
def test_pin_auto_keeps_the_native_clients_io_threads_off_the_issue_threads_core(tmp_path):
    from loadgen.engine import io_thread_cpus

    assert io_thread_cpus([3], [2], [0, 1]) == [0, 1, 2] and io_thread_cpus([1], [1], []) == []
    with start_scripted(tmp_path) as srv:
        proc = run_cli("run", "--sut", f"{srv.url}/v2/models/m/infer", "--http-engine", "native", "--pin", "auto",
                       "--scenario", "constant", "--target-qps", "200", "--duration-s", "0.3", "--json", "--quiet",
                       "--interval-s", "0", "--max-issue-delay-ms", "1000", timeout=60)
    applied = json.loads(proc.stdout)["placement"]["applied"]
    assert applied["issue_thread"] and applied["io_threads"]
    assert not set(applied["io_threads"]) & set(applied["issue_thread"])
