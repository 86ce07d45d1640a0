"""``loadgen merge`` (``loadgen.results.merge``): the workers' results of a scaled-out run
as one result.

The tests that start processes; the in-process ones are in tests/unit/test_merge.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import List

import pytest

from loadgen.results import load_result, write_outputs
from tests.helpers import run_cli
from tests.unit import test_merge as unit
from tests.unit.test_merge import make_sweep

sweep_docs, three = unit.sweep_docs, unit.three  # the unit tests' fixtures


def test_a_point_one_sweep_lacks_is_invalid_naming_the_worker(sweep_docs, tmp_path):
    a = make_sweep(tmp_path / "a", {"000-qps-400": sweep_docs[(0, 400.0)], "001-qps-800": sweep_docs[(0, 800.0)]})
    b = make_sweep(tmp_path / "b", {"000-qps-400": sweep_docs[(1, 400.0)]})
    proc = run_cli("merge", a, b, "--output", tmp_path / "out")
    assert proc.returncode == 1, proc.stderr
    assert "== 000-qps-400\nVALID" in proc.stdout and "== 001-qps-800\nINVALID" in proc.stdout
    assert "worker 1 of 2 is missing" in proc.stdout
    assert load_result(tmp_path / "out" / "points" / "000-qps-400" / "result.json")["valid"]
    assert not load_result(tmp_path / "out" / "points" / "001-qps-800" / "result.json")["valid"]


def write_workers(root: Path, docs) -> List[Path]:
    paths = []
    for i, doc in enumerate(docs):
        write_outputs(doc, str(root / f"w{i}"))
        paths.append(root / f"w{i}")
    return paths


@pytest.mark.integration
def test_cli_merge_exit_codes_outputs_and_json(tmp_path):
    # A bound each worker meets on a busy host too: the exit codes are the point here.
    three = [unit.worker_doc(i, latency_bound_ms=1000.0) for i in range(3)]
    w = write_workers(tmp_path / "in", three)
    proc = run_cli("merge", *w, "--output", tmp_path / "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("VALID  poisson on demo")
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"result.json", "summary.txt", "latency.hlog",
                                                                "results.csv", "report.html"}
    proc = run_cli("merge", tmp_path / "in" / "w0", tmp_path / "in" / "w2", "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["invalid_reasons"][0].startswith("worker 1 of 3 is missing")
    proc = run_cli("merge", tmp_path / "in")  # a folder holding the workers' folders
    assert proc.returncode == 0, proc.stdout


@pytest.mark.integration
def test_cli_merge_bad_input_is_exit_2_naming_the_file(three, tmp_path):
    w = write_workers(tmp_path, three[:1])
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    proc = run_cli("merge", w[0], junk)
    assert proc.returncode == 2 and str(junk) in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("merge", tmp_path / "nowhere.json")
    assert proc.returncode == 2 and "nowhere.json" in proc.stderr
    sweep = tmp_path / "s"
    (sweep / "points").mkdir(parents=True)
    proc = run_cli("merge", sweep, w[0])
    assert proc.returncode == 2 and "give sweep folders or results, not both" in proc.stderr
    proc = run_cli("merge", w[0], "--outptu", "x")
    assert proc.returncode == 2 and "did you mean --output" in proc.stderr


WORKERS = 3


TOTAL_QPS = 120.0


RUN_S = 2.0


@pytest.fixture(scope="module")
def network():
    from tests.servers.netns import worker_network

    with worker_network(WORKERS) as net:
        if net.fallback_reason:
            warnings.warn(f"workers run in the root namespace against 127.0.0.1: {net.fallback_reason}",
                          stacklevel=2)
        yield net


@pytest.fixture(scope="module")
def server(network, tmp_path_factory):
    from tests.servers.mlserver import INSTALL_HINT, find_mlserver, start_mlserver
    from tests.servers.procs import require_servers

    if find_mlserver() is None:
        if require_servers():
            pytest.fail(f"MLServer is not installed: {INSTALL_HINT}")
        pytest.skip(f"MLServer is not installed: {INSTALL_HINT}")
    s = start_mlserver(str(tmp_path_factory.mktemp("mlserver")), host=network.server_host)
    try:
        yield s
    finally:
        s.stop()


def worker_command(net, server, index: int, out: Path, start_at: float, duration_s: float) -> List[str]:
    return [*net.prefixes[index], sys.executable, "-m", "loadgen", "run", "--scenario", "poisson",
            "--sut", f"{server.http_url}/v2/models/add_one/infer", "--target-qps", str(TOTAL_QPS),
            "--duration-s", str(duration_s), "--interval-s", "0.5", "--max-issue-delay-ms", "100",
            "--grace-s", "5", "--start-at", f"{start_at:.3f}", "--output", str(out), "--quiet"]


def start_workers(net, server, root: Path, duration_s: float, lead_s: float = 4.0):
    """The workers as an Indexed Job starts them: the same command, LOADGEN_WORKERS and
    JOB_COMPLETION_INDEX in the environment, a common --start-at a few seconds ahead."""
    start_at = time.time() + lead_s
    procs = []
    for i in range(WORKERS):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOADGEN_")}
        env.update(LOADGEN_WORKERS=str(WORKERS), JOB_COMPLETION_INDEX=str(i), POD_NAME=f"bench-{i}")
        procs.append(subprocess.Popen(worker_command(net, server, i, root / f"w{i}", start_at, duration_s),
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return start_at, procs


def finish(procs, timeout_s: float = 60):
    """Each worker's (exit code, stderr); any still running at the deadline is killed."""
    out = []
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        out.append((p.returncode, err))
    return out


def kill_all(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate()


@pytest.mark.integration
def test_three_pods_against_mlserver_merge_to_the_servers_count(network, server, tmp_path):
    """Three workers (Indexed Job environment, common --start-at), each in its own network
    namespace with its own address, 40 queries/s each for 2 s against MLServer over REST.

    The merged completed count equals MLServer's own count of successful inferences (its
    Prometheus counter, read before and after). The merged percentiles are compared with
    one process at the same total rate: the same server, the same arrivals (Poisson at
    120/s either way), so the same latencies but for noise. On this two-core machine
    four Python processes (the server and three clients) share the cores, so a request's
    millisecond or two varies from run to run by up to 1.8x (seen: merged 1.03 ms, one
    process 1.60 and 1.78 ms); hence the generous bound, p50 within a factor of 2, and one
    retry of the single process. The bound still catches a merge that is off by a unit or
    adds values up (the histogram itself is exact to 0.1%, and the merged p50 lies exactly
    between the pods' own, which is asserted first).
    """
    before = server.inference_count("add_one", protocol="rest")
    start_at, procs = start_workers(network, server, tmp_path / "pods", RUN_S)
    try:
        for i, p in enumerate(procs):  # each worker process is in its own namespace
            if network.namespaces[i]:
                # `ip netns exec` enters the namespace, then execs the worker: ask until it has.
                deadline = time.monotonic() + 5
                while True:
                    where = subprocess.run(["ip", "netns", "identify", str(p.pid)], capture_output=True,
                                           text=True, timeout=10).stdout.split()
                    if where or time.monotonic() > deadline or p.poll() is not None:
                        break
                    time.sleep(0.02)
                assert where == [network.namespaces[i]], (i, where)
        results = finish(procs)
    finally:
        kill_all(procs)
    assert all(rc == 0 for rc, _ in results), results
    merged_proc = run_cli("merge", tmp_path / "pods", "--output", tmp_path / "merged")
    assert merged_proc.returncode == 0, merged_proc.stdout + merged_proc.stderr
    merged = load_result(tmp_path / "merged" / "result.json")
    from tests.servers.procs import wait_for_count

    served = wait_for_count(lambda: server.inference_count("add_one", protocol="rest") - before,
                            merged["counts"]["completed"])
    assert merged["counts"]["failed"] == 0 and merged["counts"]["completed"] == served
    assert merged["settings"]["effective"]["target_qps"] == TOTAL_QPS
    workers = merged["merge"]["workers"]
    assert [w["pod"] for w in workers] == ["bench-0", "bench-1", "bench-2"]
    assert merged["merge"]["start_spread_s"] < 1.0
    pod_p50 = []
    for i in range(WORKERS):
        doc = load_result(tmp_path / "pods" / f"w{i}" / "result.json")
        assert doc["settings"]["effective"]["target_qps"] == TOTAL_QPS / WORKERS
        assert doc["worker"]["start_at"] == pytest.approx(start_at, abs=1e-3)
        assert doc["network"]["target"].startswith(server.http_url)
        pod_p50.append(doc["latency_ns"]["p50"])
    # Exact: the median of the merged histogram lies between the pods' medians (half of
    # every pod is at or below the largest of them, and below the smallest is less than
    # half of every pod).
    assert min(pod_p50) <= merged["latency_ns"]["p50"] <= max(pod_p50), (pod_p50, merged["latency_ns"])

    single = [*network.prefixes[0], sys.executable, "-m", "loadgen", "run", "--json", "--scenario", "poisson",
              "--sut", f"{server.http_url}/v2/models/add_one/infer", "--target-qps", str(TOTAL_QPS),
              "--duration-s", str(RUN_S), "--max-issue-delay-ms", "100", "--grace-s", "5"]
    # Not exact: a run of one process at the same total rate. A request's millisecond or
    # so on two shared cores varies by up to 1.8x from run to run, so one run is retried
    # before the merged p50 is judged against it, within a factor of 2.
    alone_p50 = []

    def near(p50: float) -> bool:
        return 0.5 <= merged["latency_ns"]["p50"] / p50 <= 2.0

    for _ in range(2):
        one = subprocess.run(single, capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if not k.startswith("LOADGEN_")})
        assert one.returncode == 0, one.stderr
        alone_p50.append(json.loads(one.stdout)["latency_ns"]["p50"])
        if near(alone_p50[-1]):
            break
    assert near(alone_p50[-1]), (merged["latency_ns"], alone_p50)


@pytest.mark.integration
def test_a_pod_killed_mid_run_makes_the_merge_invalid(network, server, tmp_path):
    start_at, procs = start_workers(network, server, tmp_path / "pods", 3.0)
    try:
        time.sleep(max(0.0, start_at + 1.0 - time.time()))
        procs[1].send_signal(signal.SIGKILL)  # by its own PID: `ip netns exec` execs the worker
        results = finish(procs)
    finally:
        kill_all(procs)
    assert results[1][0] == -signal.SIGKILL
    assert results[0][0] == 0 and results[2][0] == 0, results
    assert not (tmp_path / "pods" / "w1" / "result.json").exists()
    proc = run_cli("merge", tmp_path / "pods")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "INVALID" in proc.stdout and "worker 1 of 3 is missing" in proc.stdout
