"""``loadgen merge`` (``loadgen.results.merge``): the workers' results of a scaled-out run
as one result.

Unit tests merge the documents of real runs made in this process (the native demo SUT,
0.2-0.3 s each): histograms added exactly, counts and over-bound counts summed, time
series aligned, validity recomputed on the whole, and every way a set of results can be
wrong (a worker missing, twice, interrupted, late, with other settings). Sweep folders
are hand-made from such results, in the layout ``loadgen sweep`` writes.

The integration test runs three workers as CLI processes, as an Indexed Job would, each
in a network namespace of its own, against a real MLServer over REST; see its docstring.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

from loadgen.options import RunOptions
from loadgen.results import load_result, render_summary, write_outputs
from loadgen.results.merge import merge_results, merge_sweeps, sweep_key
from loadgen.results.schema import result_schema
from loadgen.runner import run_benchmark
from loadgen.stats.histogram import Histogram

ENGINE_KEYS = ("latency_ns", "service_time_ns", "issue_delay_ns")
RELAXED = {"max_issue_delay_ms": 100.0}  # a CPU hiccup on the shared test machine is not the point here


def worker_doc(index: int, count: int = 3, **kw) -> Dict:
    """One worker's result, run here: Poisson on the demo SUT, a latency bound counted."""
    settings = dict(scenario="poisson", sut="demo", target_qps=1500.0, duration_s=0.25, interval_s=0.1,
                    latency_bound_ms=2.5, latency_percentile=50.0, workers=count, worker_index=index, **RELAXED)
    settings.update(kw)
    return run_benchmark(RunOptions(**settings))


@pytest.fixture(scope="module")
def three() -> List[Dict]:
    return [worker_doc(i) for i in range(3)]


def named(docs):
    return [(f"w{i}/result.json", d) for i, d in enumerate(docs)]


def decoded(doc, key):
    return Histogram.decode(doc[key]["hdr"])


def reasons_of(doc):
    return "\n".join(doc["invalid_reasons"])


# ------------------------------------------------------------------------ exactness

def test_the_merge_adds_every_histogram_and_count_exactly(three):
    merged = merge_results(named(three))
    assert merged["valid"], merged["invalid_reasons"]
    for key in ENGINE_KEYS:
        expected = decoded(three[0], key)
        for d in three[1:]:
            expected.add(decoded(d, key))
        got = decoded(merged, key)
        assert got == expected  # every bucket's count, the layout, the total
        assert np.array_equal(got.counts(), expected.counts())
        assert merged[key]["count"] == sum(d[key]["count"] for d in three)
        assert merged[key]["p99"] == expected.value_at_percentile(99)
    for name in ("issued", "completed", "failed", "timed_out", "cancelled", "samples_completed"):
        assert merged["counts"][name] == sum(d["counts"][name] for d in three), name
    [bound] = merged["latency_bounds"]
    assert bound["bound_ns"] == 2_500_000 and bound["over"] > 0
    assert bound["over"] == sum(d["latency_bounds"][0]["over"] for d in three)
    assert sum(p["completed"] for p in merged["timeseries"]) == merged["counts"]["completed"]
    assert sum(p["issued"] for p in merged["timeseries"]) == merged["counts"]["issued"]


def test_the_merge_judges_the_total_load(three):
    merged = merge_results(named(three))
    assert merged["settings"]["effective"]["target_qps"] == 1500.0
    assert merged["settings"]["engine"]["target_qps"] == 1500.0
    assert merged["throughput"]["target_qps"] == 1500.0
    assert [w["index"] for w in merged["merge"]["workers"]] == [0, 1, 2]
    assert merged["merge"]["expected_workers"] == 3
    starts = [d["worker"]["started_at_epoch_s"] for d in three]
    assert merged["merge"]["start_spread_s"] == pytest.approx(max(starts) - min(starts))
    assert merged["started_at_epoch_s"] == min(starts)
    ends = [d["worker"]["started_at_epoch_s"] + d["duration_s"] for d in three]
    assert merged["duration_s"] == pytest.approx(max(ends) - min(starts))
    assert merged["metric"]["value"] == pytest.approx(merged["counts"]["completed"] / merged["duration_s"])
    for w, d in zip(merged["merge"]["workers"], three):
        assert w["completed"] == d["counts"]["completed"] and w["p99_ns"] == d["latency_ns"]["p99"]
    assert "worker" not in merged


def test_mlperf_rules_are_judged_on_the_whole():
    # 300 queries at least, shared: 100 per worker. Two of three workers are too few.
    docs = [worker_doc(i, scenario="server", target_qps=1200.0, min_duration_s=0.2, min_query_count=300,
                       latency_bound_ms=50.0, duration_s=None) for i in range(3)]
    assert all(d["settings"]["effective"]["min_query_count"] == 100 for d in docs)
    merged = merge_results(named(docs))
    assert merged["valid"], merged["invalid_reasons"]
    assert merged["settings"]["effective"]["min_query_count"] == 300
    assert merged["early_stopping"]["passed"]
    two = merge_results(named(docs[:2]))
    assert not two["valid"]
    assert "worker 2 of 3 is missing" in reasons_of(two)
    if two["counts"]["issued"] < 300:
        assert "fewer than the minimum 300 (--min-query-count)" in reasons_of(two)


def test_time_series_are_aligned_on_the_wall_clock(three):
    doc = three[0]
    n = len(doc["timeseries"])
    shifted = copy.deepcopy(doc)
    shifted["worker"]["index"] = 1
    shifted["worker"]["count"] = doc["worker"]["count"] = 2
    shifted["worker"]["started_at_epoch_s"] += 0.03  # well within half an interval
    merged = merge_results([("a", doc), ("b", shifted)])
    assert [p["completed"] for p in merged["timeseries"]] == [2 * p["completed"] for p in doc["timeseries"]]
    assert [p["t_s"] for p in merged["timeseries"]] == pytest.approx([0.1 * k for k in range(n)])
    for mine, both in zip(doc["timeseries"], merged["timeseries"]):
        twice = Histogram.decode(mine["latency_hdr"])
        twice.add(Histogram.decode(mine["latency_hdr"]))
        assert Histogram.decode(both["latency_hdr"]) == twice
    shifted["worker"]["started_at_epoch_s"] += 0.1 - 0.03  # one interval later
    later = merge_results([("a", doc), ("b", shifted)])
    assert len(later["timeseries"]) == n + 1
    assert later["timeseries"][0]["completed"] == doc["timeseries"][0]["completed"]
    assert later["timeseries"][1]["completed"] == doc["timeseries"][1]["completed"] + doc["timeseries"][0]["completed"]
    doc["worker"]["count"] = 3


def test_the_merged_document_follows_the_schema_and_renders(three, tmp_path):
    merged = merge_results(named(three))
    write_outputs(merged, str(tmp_path))
    back = load_result(tmp_path / "result.json")
    assert back["merge"] == json.loads(json.dumps(merged["merge"]))
    text = render_summary(back)
    assert "merged       3 result(s) of 3 workers, start spread" in text
    jsonschema = pytest.importorskip("jsonschema")  # an independent validator of the shipped schema
    for doc in (back, three[0]):
        jsonschema.validate(json.loads(json.dumps(doc)), result_schema(), cls=jsonschema.Draft202012Validator)
    assert text.count("\n  worker ") == 3


# ------------------------------------------------------------------------- validity

def test_a_missing_worker_is_named(three):
    merged = merge_results(named([three[0], three[2]]))
    assert not merged["valid"]
    assert merged["invalid_reasons"][0] == "worker 1 of 3 is missing: its share of the load is not in the figures"


def test_a_worker_given_twice_is_named(three):
    merged = merge_results(named(three) + [("again/result.json", three[1])])
    assert not merged["valid"]
    assert "worker 1 is given 2 times (w1/result.json, again/result.json)" in reasons_of(merged)


def test_an_interrupted_worker_is_named(three):
    t = time.monotonic()
    stopped = run_benchmark(RunOptions(scenario="poisson", sut="demo", target_qps=1500.0, duration_s=5.0,
                                       interval_s=0.1, latency_bound_ms=2.5, latency_percentile=50.0, workers=3, worker_index=1, **RELAXED),
                            stop_requested=lambda: time.monotonic() - t > 0.2)
    assert stopped["interrupted"]
    merged = merge_results(named([three[0], stopped, three[2]]))
    assert not merged["valid"] and merged["interrupted"]
    assert "worker 1 (w1/result.json) was interrupted before it finished" in reasons_of(merged)


def test_partial_and_late_workers_are_named(three):
    partial = copy.deepcopy(three[1])
    partial["partial"] = True
    late = copy.deepcopy(three[2])
    late["worker"].update(start_at=late["worker"]["started_at_epoch_s"] - 2.5, start_late_s=2.5)
    merged = merge_results(named([three[0], partial, late]))
    text = reasons_of(merged)
    assert "worker 1 (w1/result.json) is partial" in text
    assert "worker 2 of 3 started 2.500 s after --start-at" in text and "(w2/result.json)" in text


def test_workers_with_other_settings_are_named(three):
    other = worker_doc(2, sut="null")
    merged = merge_results(named([three[0], three[1], other]))
    assert "worker 2 (w2/result.json) has another SUT (null) than worker 0 (w0/result.json) (demo)" in reasons_of(merged)
    four = copy.deepcopy(three[2])
    four["worker"]["count"] = 4
    merged = merge_results(named([three[0], three[1], four]))
    assert "the workers disagree on --workers: 3 by worker 0 (w0/result.json), worker 1 (w1/result.json); " \
           "4 by worker 2 (w2/result.json)" in reasons_of(merged)
    figures = copy.deepcopy(three[2])
    figures["settings"]["effective"]["significant_figures"] = 2
    assert "has another --significant-figures (2)" in reasons_of(merge_results(named([three[0], three[1], figures])))


def test_an_undecodable_histogram_is_an_error_naming_the_file(three):
    bad = copy.deepcopy(three[1])
    bad["latency_ns"]["hdr"] = "bm90IGEgaGlzdG9ncmFt"
    with pytest.raises(ValueError, match=r"^w1/result.json: latency_ns.hdr is not an encoded histogram"):
        merge_results(named([three[0], bad, three[2]]))


# ---------------------------------------------------------------------------- sweeps

def make_sweep(root: Path, docs_by_point: Dict[str, Dict]) -> Path:
    """A sweep folder as `loadgen sweep` writes it: sweep.jsonl and points/NNN-<slug>/."""
    lines = []
    for name, doc in docs_by_point.items():
        write_outputs(doc, str(root / "points" / name))
        lines.append(json.dumps({**doc, "sweep": {**doc["sweep"], "dir": f"points/{name}"}}))
    (root / "sweep.jsonl").write_text("\n".join(lines) + "\n")
    return root


def with_sweep(doc: Dict, index: int, qps: float) -> Dict:
    doc = copy.deepcopy(doc)
    doc["sweep"] = {"index": index, "repeat": 0, "values": {"target_qps": qps}, "key": f"qps-{qps:g}",
                    "status": "done"}
    return doc


@pytest.fixture(scope="module")
def sweep_docs() -> Dict:
    """Two workers' results at two rates."""
    return {(i, qps): with_sweep(worker_doc(i, count=2, target_qps=qps, duration_s=0.2), k, qps)
            for k, qps in enumerate((400.0, 800.0)) for i in range(2)}


def test_sweeps_merge_point_by_point_by_key(sweep_docs, tmp_path):
    a = make_sweep(tmp_path / "a", {"000-qps-400": sweep_docs[(0, 400.0)], "001-qps-800": sweep_docs[(0, 800.0)]})
    # The other worker's folders are named otherwise: the points are matched by sweep.key.
    b = make_sweep(tmp_path / "b", {"007-x": sweep_docs[(1, 800.0)], "003-y": sweep_docs[(1, 400.0)]})
    sweeps = [[(str(p), load_result(p)) for p in sorted((folder / "points").glob("*/result.json"))]
              for folder in (a, b)]
    merged = dict(merge_sweeps(sweeps))
    assert sorted(merged) == ["000-qps-400", "001-qps-800"]
    for name, qps in (("000-qps-400", 400.0), ("001-qps-800", 800.0)):
        doc = merged[name]
        assert doc["valid"], doc["invalid_reasons"]
        assert doc["sweep"]["key"] == f"qps-{qps:g}"
        assert doc["settings"]["effective"]["target_qps"] == qps
        assert doc["counts"]["completed"] == sum(sweep_docs[(i, qps)]["counts"]["completed"] for i in range(2))
    assert sweep_key("x/points/000-a/result.json", {}) == "000-a"


def test_a_point_one_sweep_lacks_is_invalid_naming_the_worker(sweep_docs, tmp_path):
    a = make_sweep(tmp_path / "a", {"000-qps-400": sweep_docs[(0, 400.0)], "001-qps-800": sweep_docs[(0, 800.0)]})
    b = make_sweep(tmp_path / "b", {"000-qps-400": sweep_docs[(1, 400.0)]})
    proc = cli("merge", a, b, "--output", tmp_path / "out")
    assert proc.returncode == 1, proc.stderr
    assert "== 000-qps-400\nVALID" in proc.stdout and "== 001-qps-800\nINVALID" in proc.stdout
    assert "worker 1 of 2 is missing" in proc.stdout
    assert load_result(tmp_path / "out" / "points" / "000-qps-400" / "result.json")["valid"]
    assert not load_result(tmp_path / "out" / "points" / "001-qps-800" / "result.json")["valid"]


# ------------------------------------------------------------------------------ CLI

def cli(*args, timeout=60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOADGEN_")}
    return subprocess.run([sys.executable, "-m", "loadgen", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def write_workers(root: Path, docs) -> List[Path]:
    paths = []
    for i, doc in enumerate(docs):
        write_outputs(doc, str(root / f"w{i}"))
        paths.append(root / f"w{i}")
    return paths


@pytest.mark.integration
def test_cli_merge_exit_codes_outputs_and_json(three, tmp_path):
    w = write_workers(tmp_path / "in", three)
    proc = cli("merge", *w, "--output", tmp_path / "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("VALID  poisson on demo")
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"result.json", "summary.txt", "latency.hlog",
                                                                "results.csv", "report.html"}
    proc = cli("merge", tmp_path / "in" / "w0", tmp_path / "in" / "w2", "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["invalid_reasons"][0].startswith("worker 1 of 3 is missing")
    proc = cli("merge", tmp_path / "in")  # a folder holding the workers' folders
    assert proc.returncode == 0, proc.stdout


@pytest.mark.integration
def test_cli_merge_bad_input_is_exit_2_naming_the_file(three, tmp_path):
    w = write_workers(tmp_path, three[:1])
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    proc = cli("merge", w[0], junk)
    assert proc.returncode == 2 and str(junk) in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("merge", tmp_path / "nowhere.json")
    assert proc.returncode == 2 and "nowhere.json" in proc.stderr
    sweep = tmp_path / "s"
    (sweep / "points").mkdir(parents=True)
    proc = cli("merge", sweep, w[0])
    assert proc.returncode == 2 and "give sweep folders or results, not both" in proc.stderr
    proc = cli("merge", w[0], "--outptu", "x")
    assert proc.returncode == 2 and "did you mean --output" in proc.stderr


# ----------------------------------------------------------------- pods, for real

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
    merged_proc = cli("merge", tmp_path / "pods", "--output", tmp_path / "merged")
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
    proc = cli("merge", tmp_path / "pods")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "INVALID" in proc.stdout and "worker 1 of 3 is missing" in proc.stdout


# ------------------------------------------------------------------- telemetry

def _gpu(uuid_energy, status="ok"):
    return {"status": status, "reason": "", "devices": [{"uuid": u, "energy_j": {"total": e}} for u, e in uuid_energy],
            "energy_j_total": sum(e for _, e in uuid_energy)}


def test_gpu_energy_is_counted_once_per_gpu_and_per_query_over_the_merged_count(three):
    import copy

    docs = copy.deepcopy(three)
    docs[0]["gpu"] = _gpu([("GPU-a", 100.0), ("GPU-b", 50.0)])
    docs[1]["gpu"] = _gpu([("GPU-a", 101.0)])  # the same GPU, seen from a worker on the same node
    docs[2]["gpu"] = _gpu([("GPU-c", 30.0)])
    merged = merge_results(named(docs))
    gpu = merged["gpu"]
    completed = merged["counts"]["completed"]
    assert gpu["status"] == "ok" and gpu["energy_j_total"] == pytest.approx(101.0 + 50.0 + 30.0)
    assert gpu["energy_per_query_j"] == pytest.approx(181.0 / completed)
    assert gpu["queries_per_joule"] == pytest.approx(completed / 181.0)
    docs[2]["gpu"] = {"status": "unavailable", "reason": "no driver", "devices": []}
    partial = merge_results(named(docs))["gpu"]
    assert partial["status"] == "partial" and "1 of 3 workers" in partial["reason"]
    assert "gpu" not in merge_results(named(three)) or merge_results(named(three))["gpu"] is None


def test_a_saturated_worker_makes_the_merge_invalid_naming_it(three):
    import copy

    docs = copy.deepcopy(three)
    docs[2]["invalid_reasons"] = ["generator saturated: the event loop (dispatcher thread) was busier than 90% ..."]
    docs[2]["valid"] = False
    merged = merge_results(named(docs))
    assert not merged["valid"]
    assert "worker 2: generator saturated" in reasons_of(merged)
