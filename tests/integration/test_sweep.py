"""``loadgen sweep``: parsing a grid or a list of points (unit), and real sweeps as a CLI
subprocess against the demo SUT, the scripted server and a real MLServer: folders and
tables, pandas, resuming after Ctrl-C, a changed configuration refused, hooks (their
environment, failures, timeouts, --stop-on-error), repeats and a shuffled order.

The tests that start processes; the in-process ones are in tests/unit/test_sweep.py."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

import loadgen
from loadgen.sweep.files import csv_table, read_records
from loadgen.sweep.plan import plan_runs
from loadgen.sweep.settings import SweepSettings
from tests.helpers import clean_env, run_cli
from tests.servers.mlserver import running_mlserver
from tests.servers.procs import free_port

# Short points; the generator-overload rule relaxed, as the machine is small and shared.
DEMO = ["--scenario", "concurrency", "--duration-s", "0.2", "--max-issue-delay-ms", "100"]


GRID = ["--vary", "concurrency=1,2,4", "--vary", "label.config=a,b"]


SCRIPTED = Path(__file__).resolve().parents[1] / "servers" / "scripted.py"


def sweep(*args: Any, timeout: float = 90, **kw: Any) -> subprocess.CompletedProcess:
    return run_cli("sweep", *args, timeout=timeout, **kw)


def records(directory: Path) -> List[Dict[str, Any]]:
    return read_records(directory)


def started_lines(stdout: str) -> List[str]:
    """The progress lines of points that started ('[k/n] point i: ...')."""
    return [line for line in stdout.splitlines() if line.startswith("[") and "] point " in line]


@pytest.mark.integration
def test_a_grid_sweep_writes_a_folder_per_point_and_one_table(tmp_path):
    out = tmp_path / "sweep"
    proc = sweep(*DEMO, *GRID, "--label", "host=ci", "--output", out)
    assert proc.returncode == 0, proc.stderr
    assert len(started_lines(proc.stdout)) == 6 and "[6/6] point 5: concurrency=4 label.config=b" in proc.stdout
    folders = sorted(p.name for p in (out / "points").iterdir())
    assert folders == [f"{i:03d}-concurrency-{c}_config-{x}" for i, (c, x) in
                       enumerate((c, x) for c in (1, 2, 4) for x in "ab")]
    for name in folders:
        assert {"result.json", "summary.txt", "latency.hlog", "results.csv"} <= set(os.listdir(out / "points" / name))
    lines = records(out)
    assert [r["sweep"]["index"] for r in lines] == list(range(6))
    assert all(r["sweep"]["status"] == "done" and r["valid"] for r in lines)
    assert lines[3]["sweep"]["values"] == {"concurrency": 2, "label.config": "b"}
    assert lines[3]["labels"] == {"host": "ci", "config": "b"}
    assert lines[3]["settings"]["effective"]["concurrency"] == 2
    with open(out / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:6] == ["point", "repeat", "status", "concurrency", "labels.host", "labels.config"]
    assert {"valid", "completed_qps", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "latency_p99.9_ms",
            "error_rate"} <= set(rows[0])
    assert not any(k.startswith(("ttft", "tpot", "gpu")) for k in rows[0])  # none in these documents
    assert [(r["concurrency"], r["labels.config"]) for r in rows] == [(c, x) for c in "124" for x in "ab"]
    # token histograms and a GPU section, where a document has them, become columns too
    tokens = {**lines[0], "ttft_ns": lines[0]["latency_ns"],
              "gpu": {"status": "ok", "energy_j_total": 30.0, "energy_per_query_j": 0.01, "queries_per_joule": 100.0,
                      "devices": [{"index": 0, "utilization_pct": {"mean": 51.5}, "power_w": {"mean": 300.0},
                                   "memory_used_bytes": {"max": 7}}]}}
    columns, table = csv_table([lines[1], tokens])
    assert {"ttft_p50_ms", "ttft_p99_ms", "gpu.energy_per_query_j", "gpu0.util_mean_pct", "gpu0.power_mean_w",
            "gpu0.memory_max_bytes"} <= set(columns)
    assert str(table[1]["ttft_p99_ms"]) == rows[0]["latency_p99_ms"] and table[1]["gpu0.util_mean_pct"] == 51.5
    assert table[0]["ttft_p50_ms"] == "" and columns.index("ttft_p50_ms") < columns.index("invalid_reasons")
    df = loadgen.load_results(out)
    assert len(df) == 6 and list(df["concurrency"]) == [1, 1, 2, 2, 4, 4]
    assert list(df["labels.config"]) == list("ababab") and set(df["status"]) == {"done"}
    assert (df["throughput.completed_qps"] > 0).all() and all(os.path.isfile(p) for p in df["path"])
    assert loadgen.load_sweep(out)[["concurrency", "labels.config"]].equals(df[["concurrency", "labels.config"]])
    plain = loadgen.load_results(out / "points")  # a plain folder: a row per result.json, as before
    assert len(plain) == 6 and "concurrency" not in plain.columns


def _interrupt_after(cmd: List[str], out: Path, done: int, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """Starts the sweep, sends SIGINT once `done` points are finished in sweep.jsonl,
    and returns the ended process."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                finished = sum(r["sweep"]["status"] == "done" for r in records(out))
            except (OSError, ValueError):  # not written yet
                finished = 0
            if finished >= done:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _check_resume(cmd: List[str], out: Path) -> List[Dict[str, Any]]:
    """Interrupts the sweep after its 2nd point, checks exit 130 and what is kept, reruns
    it, checks only the unfinished points ran; returns the final records."""
    first = _interrupt_after(cmd, out, done=2)
    assert first.returncode == 130, (first.returncode, first.stderr[-2000:])
    assert "interrupted" in first.stderr
    kept = records(out)
    done_before = {r["sweep"]["key"]: r["sweep"]["started_at"] for r in kept if r["sweep"]["status"] == "done"}
    assert 2 <= len(done_before) < 6
    assert all(r["sweep"]["status"] in ("done", "interrupted") for r in kept)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=clean_env())
    assert second.returncode == 0, second.stderr[-2000:]
    assert len(started_lines(second.stdout)) == 6 - len(done_before), second.stdout
    assert f"{len(done_before)} done earlier, {6 - len(done_before)} to run" in second.stdout
    final = records(out)
    assert [r["sweep"]["status"] for r in final] == ["done"] * 6
    for r in final:  # the points finished before were not run again
        if r["sweep"]["key"] in done_before:
            assert r["sweep"]["started_at"] == done_before[r["sweep"]["key"]]
    return final


@pytest.mark.integration
def test_ctrl_c_keeps_the_finished_points_and_a_rerun_runs_only_the_rest(tmp_path):
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "loadgen", "sweep", "--scenario", "concurrency", "--duration-s", "0.4",
           "--max-issue-delay-ms", "100", *GRID, "--output", str(out)]
    _check_resume(cmd, out)


@pytest.mark.integration
def test_a_changed_configuration_is_refused_unless_restarted_or_mixed(tmp_path):
    out = tmp_path / "sweep"
    common = ["--scenario", "concurrency", "--max-issue-delay-ms", "100", "--output", out]
    two = ["--vary", "concurrency=1,2"]
    assert sweep(*common, *two, "--duration-s", "0.1").returncode == 0
    proc = sweep(*common, *two, "--duration-s", "0.2")
    assert proc.returncode == 2 and "--duration-s was 0.1, now 0.2" in proc.stderr and "--restart" in proc.stderr
    assert len(records(out)) == 2
    # more points over the same base options are no change: only the new one runs
    proc = sweep(*common, "--vary", "concurrency=1,2,3", "--duration-s", "0.1")
    assert proc.returncode == 0 and len(started_lines(proc.stdout)) == 1 and len(records(out)) == 3
    mixed = sweep(*common, *two, "--duration-s", "0.2", "--force-mix")
    assert mixed.returncode == 0, mixed.stderr
    durations = [r["settings"]["effective"]["duration_s"] for r in records(out)]
    assert durations == [0.2, 0.2, 0.1, 0.1, 0.1]  # this sweep's points first, then the earlier ones
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["base"]["duration_s"] == 0.2 and manifest["earlier_bases"][0]["duration_s"] == 0.1
    restarted = sweep(*common, *two, "--duration-s", "0.3", "--restart")
    assert restarted.returncode == 0 and len(started_lines(restarted.stdout)) == 2
    assert [r["settings"]["effective"]["duration_s"] for r in records(out)] == [0.3, 0.3]
    [aside] = [p for p in out.iterdir() if p.name.startswith("restarted-")]
    assert len(records(aside)) == 5 and (aside / "points").is_dir()
    assert sweep(*common, *two, "--restart", "--force-mix").returncode == 2


@pytest.mark.integration
def test_hooks_see_the_points_values_and_a_failing_hook_fails_only_its_point(tmp_path):
    out = tmp_path / "sweep"
    hook = ('env | grep ^LOADGEN_POINT_ | sort > "$LOADGEN_POINT_DIR/env.txt"; '
            'if [ "$LOADGEN_POINT_CONCURRENCY" = 2 ] && [ ! -f ../fixed ]; then echo "no room for 2" >&2; exit 3; fi')
    after = 'test -f "$LOADGEN_POINT_DIR/result.json" && echo after > "$LOADGEN_POINT_DIR/after.txt"'
    args = [*DEMO, *GRID, "--before-point", hook, "--after-point", after, "--output", out]
    (tmp_path / "work").mkdir()
    proc = sweep(*args, cwd=tmp_path / "work")
    assert proc.returncode == 1, proc.stderr
    lines = records(out)
    assert [r["sweep"]["status"] for r in lines] == ["done", "done", "failed", "failed", "done", "done"]
    failed = lines[2]["sweep"]
    assert failed["hooks"]["before-point"]["exit_code"] == 3
    assert "no room for 2" in failed["hooks"]["before-point"]["stderr_tail"]
    assert failed["error"] == "the before-point hook exited 3: no room for 2"
    assert "schema" not in lines[2] and lines[2]["labels"] == {"config": "a"}
    env = dict(line.split("=", 1) for line in (out / lines[5]["sweep"]["dir"] / "env.txt").read_text().splitlines())
    assert env["LOADGEN_POINT_CONCURRENCY"] == "4" and env["LOADGEN_POINT_LABEL_CONFIG"] == "b"
    assert env["LOADGEN_POINT_INDEX"] == "5" and env["LOADGEN_POINT_REPEAT"] == "0"
    assert env["LOADGEN_POINT_DIR"] == str((out / lines[5]["sweep"]["dir"]).resolve())
    assert env["LOADGEN_POINT_KEY"] == lines[5]["sweep"]["key"]
    assert (out / lines[0]["sweep"]["dir"] / "after.txt").is_file()  # after the run's files were written
    assert not (out / lines[2]["sweep"]["dir"] / "after.txt").exists()
    with open(out / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[2]["status"] == "failed" and rows[2]["hook_exit_code"] == "3" and rows[2]["valid"] == "False"
    # failed points are retried on resume, and only they
    (tmp_path / "fixed").write_text("")
    proc = sweep(*args, cwd=tmp_path / "work")
    assert proc.returncode == 0 and len(started_lines(proc.stdout)) == 2, proc.stderr
    assert [r["sweep"]["status"] for r in records(out)] == ["done"] * 6


@pytest.mark.integration
def test_stop_on_error_stops_at_the_failed_point_and_a_slow_hook_is_killed(tmp_path):
    out = tmp_path / "sweep"
    hook = '[ "$LOADGEN_POINT_CONCURRENCY" != 2 ] || sleep 30'
    started = time.monotonic()
    proc = sweep(*DEMO, "--vary", "concurrency=1,2,4", "--before-point", hook, "--hook-timeout-s", "0.5",
                 "--stop-on-error", "--output", out)
    assert time.monotonic() - started < 20  # the 30 s hook was killed
    assert proc.returncode == 1 and "--stop-on-error" in proc.stderr
    lines = records(out)
    assert [r["sweep"]["status"] for r in lines] == ["done", "failed"]
    hook_record = lines[1]["sweep"]["hooks"]["before-point"]
    assert hook_record["timed_out"] and hook_record["exit_code"] is None and hook_record["wall_s"] < 10
    assert "longer than --hook-timeout-s 0.5" in lines[1]["sweep"]["error"]


@pytest.mark.integration
def test_repeats_and_a_shuffled_order_as_planned(tmp_path):
    out = tmp_path / "sweep"
    proc = sweep("--scenario", "concurrency", "--duration-s", "0.05", "--max-issue-delay-ms", "100",
                 "--vary", "concurrency=1,2,3", "--repeat", "2", "--order", "shuffled", "--order-seed", "7",
                 "--output", out)
    assert proc.returncode == 0, proc.stderr
    lines = records(out)
    assert [(r["sweep"]["index"], r["sweep"]["repeat"]) for r in lines] == [(i, k) for i in range(3) for k in (0, 1)]
    ran = [(r["sweep"]["index"], r["sweep"]["repeat"]) for r in sorted(lines, key=lambda r: r["sweep"]["started_at"])]
    planned = plan_runs({"scenario": "concurrency", "duration_s": "0.05", "max_issue_delay_ms": "100"},
                        [{"concurrency": c} for c in (1, 2, 3)],
                        SweepSettings(repeat=2, order="shuffled", order_seed=7), environ={})[1]
    assert ran == [(r.index, r.repeat) for r in planned]
    assert list(loadgen.load_sweep(out)["repeat"]) == [0, 1, 0, 1, 0, 1]
    # Each repeat ran with its own seeds, recorded in its result and in the sweep's records.
    for r, p in zip(lines, sorted(planned, key=lambda r: (r.index, r.repeat))):
        effective = r["settings"]["effective"]
        assert r["sweep"]["seed"] == effective["seed"] == p.options.seed
        assert (r["sweep"]["schedule_seed"], r["sweep"]["sample_seed"]) == (effective["schedule_seed"],
                                                                          effective["sample_seed"])
    for i in range(3):
        pair = [r["settings"]["effective"] for r in lines if r["sweep"]["index"] == i]
        assert pair[0]["schedule_seed"] != pair[1]["schedule_seed"] and pair[0]["sample_seed"] != pair[1]["sample_seed"]
    with open(out / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["schedule_seed"] for row in rows] == [str(r["sweep"]["schedule_seed"]) for r in lines]


@pytest.mark.integration
def test_a_config_file_sweep_and_bad_points_fail_before_anything_runs(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text('scenario = "concurrency"\nduration-s = 0.1\nmax-issue-delay-ms = 100\n\n[sweep]\n'
                      'vary = {label.config = ["a", "b"]}\npoints = [{concurrency = 1}, {concurrency = 3}]\n')
    out = tmp_path / "sweep"
    proc = sweep("--config", config, "--output", out, "--json")
    assert proc.returncode == 0, proc.stderr
    printed = [json.loads(line) for line in proc.stdout.splitlines()]  # --json: a record a line, nothing else
    assert [r["sweep"]["values"] for r in printed] == [
        {"concurrency": c, "label.config": x} for c in (1, 3) for x in "ab"]
    assert records(out) == printed
    refused = run_cli("run", "--config", config)
    assert refused.returncode == 2 and "[sweep] table is read by 'loadgen sweep'" in refused.stderr
    bad = tmp_path / "bad"
    proc = sweep(*DEMO, "--vary", "sut=null,demo,sleep:x", "--output", bad)
    assert proc.returncode == 2 and "point 2 (sut=sleep:x)" in proc.stderr and not bad.exists()
    proc = sweep("--vary", "concurrency=1,2", "--output", bad)  # the server scenario has no concurrency
    assert proc.returncode == 2 and "--concurrency does not apply to the server scenario" in proc.stderr
    assert sweep(*DEMO, "--vary", "concurrency=1").returncode == 2  # no --output
    assert sweep(*DEMO, "--output", bad).returncode == 2  # nothing to sweep


@pytest.mark.integration
def test_the_servers_readiness_is_awaited_after_the_before_hook_at_every_point(tmp_path):
    # The before hook starts a fresh server that answers "not ready" for 0.5 s; the after
    # hook stops it. Each point's run still starts only once that server is ready.
    port = free_port()
    before = (f'{sys.executable} {SCRIPTED} --port {port} --ready-after-s 0.5 --max-runtime-s 60 '
              '> "$LOADGEN_POINT_DIR/server.log" 2>&1 & echo $! > "$LOADGEN_POINT_DIR/server.pid"')
    after = 'kill "$(cat "$LOADGEN_POINT_DIR/server.pid")"'
    out = tmp_path / "sweep"
    try:
        proc = sweep("--sut", f"http://127.0.0.1:{port}/v2/models/add_one/infer", "--scenario", "concurrency",
                     "--duration-s", "0.2", "--max-issue-delay-ms", "100", "--vary", "concurrency=1,2",
                     "--before-point", before, "--after-point", after, "--output", out)
    finally:  # a server a failed hook left behind
        for pid_file in out.glob("points/*/server.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    assert proc.returncode == 0, proc.stderr
    for r in records(out):
        assert r["network"]["ready_wait_s"] >= 0.3, r["network"]  # awaited, after the hook started it
        assert r["counts"]["completed"] > 0 and r["counts"]["failed"] == 0


@pytest.fixture
def mlserver(tmp_path):
    yield from running_mlserver(str(tmp_path / "mlserver"))


@pytest.mark.integration
def test_a_sweep_against_mlserver_gives_a_row_per_point_and_resumes_after_ctrl_c(tmp_path, mlserver):
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "loadgen", "sweep", "--sut", f"{mlserver.http_url}/v2/models/add_one/infer",
           "--scenario", "concurrency", "--duration-s", "0.5", "--max-issue-delay-ms", "100", *GRID,
           "--output", str(out)]
    _check_resume(cmd, out)
    df = loadgen.load_results(out)
    assert len(df) == 6
    assert {"point", "repeat", "status", "concurrency", "labels.config", "valid", "throughput.completed_qps",
            "latency_ns.p99", "network.protocol", "path"} <= set(df.columns)
    assert list(zip(df["concurrency"], df["labels.config"])) == [(c, x) for c in (1, 2, 4) for x in "ab"]
    assert df["valid"].all() and (df["counts.completed"] > 0).all() and (df["counts.failed"] == 0).all()
    assert set(df["settings.effective.concurrency"]) == {1, 2, 4}


@pytest.mark.integration
def test_two_workers_sweep_together_and_merge_point_by_point(tmp_path):
    start = round(time.time() + 5.0, 3)  # both processes started and prepared by then, even on a busy machine
    procs = []
    for i in range(2):
        env = {**clean_env(), "LOADGEN_WORKERS": "2", "JOB_COMPLETION_INDEX": str(i)}
        cmd = [sys.executable, "-m", "loadgen", "sweep", "--scenario", "poisson", "--duration-s", "0.4",
               "--vary", "target-qps=200,400", "--start-at", str(start), "--point-gap-s", "0.5",
               "--max-issue-delay-ms", "50",  # lockstep and merging are checked here, not issue precision
               "--output", str(tmp_path / f"w{i}"), "--quiet"]
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    merged = run_cli("merge", tmp_path / "w0", tmp_path / "w1", "--output", tmp_path / "m", "--json")
    assert merged.returncode == 0, merged.stderr
    docs = json.loads(merged.stdout)
    assert len(docs) == 2 and all(d["valid"] for d in docs)
    for doc, qps in zip(docs, (200, 400)):
        assert doc["merge"]["start_spread_s"] < 0.2
        assert doc["throughput"]["target_qps"] == qps
        assert doc["counts"]["completed"] == sum(w["completed"] for w in doc["merge"]["workers"])
