"""``loadgen merge`` keeps everything a worker measured: the server's metrics (counters
once per server, gauges per worker and combined), the network counters summed, merged
sweeps as sweep folders that compare and load_sweep read, and --json/--quiet on every
command.

The server-metrics test runs three workers as CLI processes at once (--start-at) against
one real scripted server on 127.0.0.1, each scraping its /metrics: each worker's own
counter deltas overlap (each saw the others' requests too), so the merged count must be
the server's own, not their sum.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from loadgen import load_results, load_sweep
from loadgen.results import load_result
from loadgen.results.merge import merge_results
from loadgen.sweep.files import read_manifest, read_records
from tests.helpers import clean_env, run_cli
from tests.integration.test_merge import write_workers
from tests.unit.test_merge import named, worker_doc

INFER = 'scripted_requests_total{endpoint="infer"}'


@pytest.fixture(scope="module")
def three() -> List[Dict]:
    return [worker_doc(i) for i in range(3)]


# ------------------------------------------------------------ server metrics, for real

def start_workers(url: str, root: Path, lead_s: float = 3.0) -> List[subprocess.Popen]:
    start_at = time.time() + lead_s
    procs = []
    for i in range(3):
        cmd = [sys.executable, "-m", "loadgen", "run", "--sut", f"{url}/v2/models/m/infer", "--scenario",
               "constant", "--target-qps", "60", "--duration-s", "1.5", "--interval-s", "0.5",
               "--max-issue-delay-ms", "100", "--server-metrics-url", f"{url}/metrics", "--workers", "3",
               "--worker-index", str(i), "--start-at", f"{start_at:.3f}", "--start-tolerance-s", "10",
               "--output", str(root / f"w{i}"), "--no-html", "--quiet"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=clean_env()))
    return procs


@pytest.mark.integration
def test_three_workers_on_one_server_count_its_requests_once(tmp_path):
    from tests.servers.scripted_proc import start_scripted

    with start_scripted(tmp_path) as server:
        procs = start_workers(server.url, tmp_path / "pods")
        try:
            outs = [p.communicate(timeout=90) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
        assert [p.returncode for p in procs] == [0, 0, 0], outs
        served = server.stats()["infer_requests"]
    proc = run_cli("merge", tmp_path / "pods", "--output", tmp_path / "merged", "--no-html")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    merged = load_result(tmp_path / "merged" / "result.json")
    docs = [load_result(tmp_path / "pods" / f"w{i}" / "result.json") for i in range(3)]
    sm = merged["server_metrics"]
    assert sm["servers"] == 1 and sm["url"] == docs[0]["server_metrics"]["url"]
    # The server's own count, once: every request of every worker, from the earliest
    # scrape before a run to the latest after one. The workers' deltas overlap.
    assert sm["deltas"][INFER] == served == merged["counts"]["issued"] == merged["counts"]["completed"]
    assert sum(d["server_metrics"]["deltas"][INFER] for d in docs) > served
    assert [w["worker"] for w in sm["workers"]] == [0, 1, 2]
    assert [w["deltas"] for w in sm["workers"]] == [d["server_metrics"]["deltas"] for d in docs]
    assert sm["scrapes"] == sum(d["server_metrics"]["scrapes"] for d in docs)
    inflight = sm["gauges"]["scripted_inflight"]
    own = [d["server_metrics"]["gauges"]["scripted_inflight"] for d in docs]
    assert [w["worker"] for w in inflight["workers"]] == [0, 1, 2]
    assert [{k: v for k, v in w.items() if k != "worker"} for w in inflight["workers"]] == own
    assert inflight["samples"] == sum(g["samples"] for g in own)
    assert inflight["max"] == max(g["max"] for g in own) and inflight["min"] == min(g["min"] for g in own)
    assert inflight["mean"] == pytest.approx(sum(g["mean"] * g["samples"] for g in own) / inflight["samples"])
    assert inflight["sum_of_server_means"] == pytest.approx(inflight["mean"])  # one server
    assert sm["intervals"] and all(set(p) == {"t_s", "deltas", "gauges"} for p in sm["intervals"])
    # The network counters of all the workers, not worker 0's.
    net, nets = merged["network"], [d["network"] for d in docs]
    summed = [k for k in ("connections", "connects", "bytes_sent", "responses_checked") if k in nets[0]]
    assert "connections" in summed
    for key in summed:
        assert net[key] == sum(n[key] for n in nets), key
    if "native" in net:
        assert net["native"]["responses"] == sum(n["native"]["responses"] for n in nets) == served
        assert net["native"]["queued_in_client"] == sum(n["native"]["queued_in_client"] for n in nets)
    assert net["payload"]["distinct_requests"] == nets[0]["payload"]["distinct_requests"]  # the same requests
    waits = net["per_worker"]["ready_wait_s"]
    assert [w["worker"] for w in waits] == [0, 1, 2] and net["ready_wait_s"] == max(n["ready_wait_s"] for n in nets)
    summary = (tmp_path / "merged" / "summary.txt").read_text()
    assert f"{INFER} +{served:,}" in summary


# -------------------------------------------------------- server metrics, by the rules

def with_metrics(doc: Dict, url: str, before: float, delta: float, gauge: List[float]) -> Dict:
    doc = copy.deepcopy(doc)
    doc["worker"]["started_at_epoch_s"] = 1000.0  # the workers' intervals fall in the same bins
    doc["server_metrics"] = {
        "url": url, "scrapes": len(gauge), "failed_scrapes": 0, "errors": [], "deltas": {"req": delta},
        "before": {"req": before, "idle": 5.0}, "series": 3, "dropped_series": 0, "non_finite_values": 0,
        "gauges": {"queue": {"first": gauge[0], "last": gauge[-1], "min": min(gauge), "max": max(gauge),
                             "mean": sum(gauge) / len(gauge), "samples": len(gauge)}},
        "intervals": [{"t_s": 0.1 * (k + 1), "deltas": {"req": delta / 2}, "gauges": {"queue": v}}
                      for k, v in enumerate(gauge[1:])],
    }
    return doc


def test_counters_are_summed_over_servers_and_spanned_within_one(three):
    a, b, c = three
    # Workers 0 and 1 scraped one server (windows overlapping), worker 2 another.
    docs = [with_metrics(a, "http://s1/metrics", 100.0, 30.0, [1.0, 3.0]),
            with_metrics(b, "http://s1/metrics", 110.0, 35.0, [2.0, 4.0, 6.0]),
            with_metrics(c, "http://s2/metrics", 7.0, 12.0, [10.0, 20.0])]
    sm = merge_results(named(docs))["server_metrics"]
    # s1: from 100 (earliest) to 145 (latest end: 110 + 35); s2: 12. Summed: 57.
    assert sm["deltas"] == {"req": 57.0}
    assert sm["before"] == {"req": 107.0, "idle": 10.0}
    assert sm["servers"] == 2 and sm["url"] == "http://s1/metrics, http://s2/metrics"
    assert [w["deltas"] for w in sm["workers"]] == [{"req": 30.0}, {"req": 35.0}, {"req": 12.0}]
    q = sm["gauges"]["queue"]
    assert (q["min"], q["max"], q["samples"]) == (1.0, 20.0, 7)
    assert q["mean"] == pytest.approx((1 + 3 + 2 + 4 + 6 + 10 + 20) / 7)
    assert q["sum_of_server_means"] == pytest.approx((1 + 3 + 2 + 4 + 6) / 5 + 15.0)
    assert [(w["worker"], w["max"]) for w in q["workers"]] == [(0, 3.0), (1, 6.0), (2, 20.0)]
    assert "counters" in sm["merge"] and "gauges" in sm["merge"]
    # Per interval: each server's deltas (the mean of its workers') summed over the servers.
    assert [p["t_s"] for p in sm["intervals"]] == [0.1, 0.2]
    assert [p["deltas"]["req"] for p in sm["intervals"]] == [pytest.approx((15.0 + 17.5) / 2 + 6.0), 17.5]
    assert [p["gauges"]["queue"] for p in sm["intervals"]] == [pytest.approx((3 + 4 + 20) / 3), 6.0]


def test_a_worker_without_server_metrics_is_named(three):
    docs = [with_metrics(d, "http://s1/metrics", 0.0, 10.0, [1.0]) for d in three[:2]] + [three[2]]
    sm = merge_results(named(docs))["server_metrics"]
    assert any("worker 2 has no server metrics" in n for n in sm["notes"])
    assert "server_metrics" not in merge_results(named(three))


def test_network_counts_are_summed_and_the_rest_kept_per_worker(three):
    docs = copy.deepcopy(three)
    for i, d in enumerate(docs):
        d["network"] = {"target": f"http://h{i % 2}/infer", "protocol": "kserve_v2_http", "connections": 4 + i,
                        "ready_wait_s": 0.1 * (i + 1), "bytes_sent": 1000 * (i + 1),
                        "payload": {"source": "synthetic", "distinct_requests": 256, "request_bytes_mean": 500.0},
                        "native": {"queued_in_client": i, "responses": 10 * (i + 1),
                                   "receive_wait_ns": {"p99": 100 * (i + 1)}}}
    docs[1]["network"]["native"]["handed_to_io_thread"] = 7
    net = merge_results(named(docs))["network"]
    assert (net["connections"], net["bytes_sent"]) == (15, 6000)
    assert net["native"]["queued_in_client"] == 3 and net["native"]["responses"] == 60
    assert net["payload"] == {"source": "synthetic", "distinct_requests": 256, "request_bytes_mean": 500.0}
    assert net["ready_wait_s"] == pytest.approx(0.3)
    assert net["target"] == "http://h0/infer, http://h1/infer"
    pw = net["per_worker"]
    assert [w["worker"] for w in pw["ready_wait_s"]] == [0, 1, 2]
    assert [w["value"] for w in pw["native.receive_wait_ns.p99"]] == [100, 200, 300]
    assert pw["native.handed_to_io_thread"] == [{"worker": 1, "value": 7}]  # not every worker says it
    assert "connections" not in pw and "bytes_sent" not in pw


# ------------------------------------------------------------------------ sweeps

@pytest.mark.integration
def test_merged_sweep_has_a_sweeps_files_and_compare_and_load_sweep_read_it(tmp_path):
    for i in range(3):
        proc = run_cli("sweep", "--sut", "demo", "--scenario", "constant", "--target-qps", "300", "--vary",
                       "target_qps=300,600", "--duration-s", "0.2", "--interval-s", "0.1", "--max-issue-delay-ms",
                       "100", "--workers", "3", "--worker-index", str(i), "--output", tmp_path / f"w{i}",
                       "--no-html", "--quiet", timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "merged"
    proc = run_cli("merge", *(tmp_path / f"w{i}" for i in range(3)), "--output", out, "--quiet")
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
    assert {p.name for p in out.iterdir()} == {"sweep.json", "sweep.jsonl", "sweep.csv", "points", "report.html"}
    records = read_records(out)
    assert [r["sweep"]["values"] for r in records] == [{"target_qps": 300.0}, {"target_qps": 600.0}]
    workers = [read_records(tmp_path / f"w{i}") for i in range(3)]
    for k, r in enumerate(records):
        assert r["sweep"]["status"] == "done" and r["sweep"]["dir"] == f"points/{k:03d}-target_qps-{300 * (k + 1)}"
        assert r["counts"]["completed"] == sum(w[k]["counts"]["completed"] for w in workers)
        assert r["sweep"]["key"] == workers[0][k]["sweep"]["key"]
        assert load_result(out / r["sweep"]["dir"] / "result.json")["counts"] == r["counts"]
    manifest = read_manifest(out)
    assert manifest is not None and manifest["merged_from"] == [str(tmp_path / f"w{i}") for i in range(3)]
    assert "worker_index" not in manifest["base"] and [p["dir"] for p in manifest["points"]] == [
        r["sweep"]["dir"] for r in records]
    frame = load_sweep(out)
    assert list(frame["target_qps"]) == [300.0, 600.0]
    assert list(frame["counts.completed"]) == [r["counts"]["completed"] for r in records]
    assert len(load_results(out)) == 2
    csv_lines = (out / "sweep.csv").read_text().splitlines()
    assert len(csv_lines) == 3 and csv_lines[0].startswith("point,repeat,status,target_qps")
    # compare reads the merged sweep as a sweep: against one worker's, point by point.
    proc = run_cli("compare", tmp_path / "w0", out, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kind"] == "sweep" and not report["not_compared"].get("new")
    assert [c["point"]["values"] for c in report["comparisons"]] == [{"target_qps": 300.0}, {"target_qps": 600.0}]


# ------------------------------------------------------------- flags on every command

def commands() -> List[str]:
    from loadgen.cli import COMMANDS

    return list(COMMANDS)


def test_every_command_has_json_and_quiet():
    from loadgen.cli.common import COMMON_FLAGS

    assert len(commands()) >= 8
    for name in commands():
        proc = run_cli(name, "--help")
        assert proc.returncode == 0, proc.stderr
        for flag in COMMON_FLAGS:
            assert f"  {flag}" in proc.stdout, (name, flag)


@pytest.mark.integration
def test_quiet_prints_nothing_and_json_still_prints(three, tmp_path):
    w = write_workers(tmp_path / "in", three)
    result = w[0] / "result.json"
    cases = {
        "merge": ["merge", *w, "--output", tmp_path / "out", "--no-html"],
        "report": ["report", result],
        "compare": ["compare", result, w[1] / "result.json"],
        "hlog": ["hlog", w[0] / "latency.hlog"],
        "env": ["env"],
    }
    # The exit code is the command's own either way (a busy host may make a run, and so
    # the merge, invalid: exit 1 with or without --quiet).
    for name, args in cases.items():
        loud = run_cli(*args)
        assert loud.returncode in (0, 1) and loud.stdout, (name, loud.stderr)
        quiet = run_cli(*args, "--quiet")
        assert (quiet.returncode, quiet.stdout) == (loud.returncode, ""), (name, quiet.stdout, quiet.stderr)
    assert (tmp_path / "out" / "result.json").is_file()
    proc = run_cli("merge", *w, "--quiet", "--json")
    assert proc.returncode in (0, 1) and json.loads(proc.stdout)["merge"]["expected_workers"] == 3
    proc = run_cli("merge", *w, env=clean_env(LOADGEN_QUIET="1"))
    assert proc.returncode in (0, 1) and proc.stdout == ""
    proc = run_cli("merge", *w, "--quiet", "--no-such-flag")
    assert proc.returncode == 2 and "unknown option --no-such-flag" in proc.stderr


@pytest.mark.integration
def test_a_point_that_failed_on_every_worker_stays_in_the_merged_sweep(tmp_path):
    hook = 'test "$LOADGEN_POINT_INDEX" != 1'  # the second point's before-point hook fails
    for i in range(2):
        proc = run_cli("sweep", "--sut", "demo", "--scenario", "constant", "--vary", "target_qps=300,600",
                       "--duration-s", "0.2", "--max-issue-delay-ms", "100", "--workers", "2", "--worker-index",
                       str(i), "--before-point", hook, "--output", tmp_path / f"w{i}", "--no-html", "--quiet",
                       timeout=120)
        assert proc.returncode == 1, proc.stdout + proc.stderr
    out = tmp_path / "merged"
    proc = run_cli("merge", tmp_path / "w0", tmp_path / "w1", "--output", out, "--no-html")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED on every worker: the before-point hook exited 1" in proc.stdout
    records = read_records(out)
    assert [(r["sweep"]["index"], r["sweep"]["status"]) for r in records] == [(0, "done"), (1, "failed")]
    frame = load_sweep(out)
    assert list(frame["status"]) == ["done", "failed"] and list(frame["target_qps"]) == [300.0, 600.0]
    proc = run_cli("merge", tmp_path / "w0", tmp_path / "w1", "--json")
    assert [r["sweep"]["status"] for r in json.loads(proc.stdout)] == ["done", "failed"]
