"""``loadgen compare`` (``loadgen.results.compare``) and its Mann-Whitney test.

The tests that start processes; the in-process ones are in tests/unit/test_compare.py."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.cli import main
from tests.helpers import RELAXED, clean_env, run_cli
from tests.unit import test_compare as unit
from tests.unit.test_compare import BASE_US, SLOWER_US, run_to

runs = unit.runs  # the unit tests' fixture

COMMON = ["--interval-s", "0.25", "--quiet", *RELAXED]


CONSTANT = ["--scenario", "constant", "--target-qps", "200"]


RUN = [*CONSTANT, *COMMON]


def compare(tmp_path: Path, *args) -> subprocess.CompletedProcess:
    """``loadgen compare ARGS`` run in this process: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["compare", *map(str, args)])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def compare_json(tmp_path: Path, *args) -> tuple:
    proc = compare(tmp_path, *args, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def rows_of(report: dict, index: int = 0) -> dict:
    return {r["metric"]: r for r in report["comparisons"][index]["metrics"]}


def test_a_planted_20pct_latency_regression_is_flagged_and_exits_1(runs, tmp_path):
    rc, report = compare_json(tmp_path, runs["base"], runs["slower"], "--fail-if-regression", "p99>+10%")
    assert rc == 1, report
    rows = rows_of(report)
    for name in ("p50", "p90", "p99", "mean"):
        assert rows[name]["verdict"] == "worse", rows[name]
        assert rows[name]["p_value"] < 0.01
    assert rows["p50"]["change_pct"] == pytest.approx(20, abs=2)
    assert report["regression"] is True
    assert [f["rule"] for f in report["comparisons"][0]["fired"]] == ["p99>+10%"]
    assert report["comparisons"][0]["settings_differ"] == {"sut": [f"sleep:{BASE_US}", f"sleep:{SLOWER_US}"]}
    text = run_cli("compare", runs["base"], runs["slower"], "--fail-if-regression", "p99>+10%", cwd=tmp_path)
    assert text.returncode == 1, text.stderr
    assert "REGRESSION: p99>+10% fired" in text.stdout and "latency p99" in text.stdout
    # the other way round it is an improvement: no regression, and "better"
    rc, report = compare_json(tmp_path, runs["slower"], runs["base"], "--fail-if-regression", "p99>+10%")
    assert rc == 0 and rows_of(report)["p50"]["verdict"] == "better"


def test_two_reruns_of_one_configuration_pass(runs, tmp_path):
    for a, b in (("base", "rerun"), ("rerun", "base")):
        rc, report = compare_json(tmp_path, runs[a], runs[b], "--fail-if-regression", "p99>+10%,p50>+5%,qps<-5%")
        assert rc == 0, report["comparisons"][0]["metrics"]
        rows = rows_of(report)
        assert rows["p50"]["verdict"] in ("no significant change", "better", "worse")
        assert abs(rows["p50"]["change_pct"]) < 5 and rows["p50"]["intervals"][0] >= 8
        assert not report["comparisons"][0]["fired"]


def test_the_qps_rule_fires_on_a_throughput_drop(tmp_path):
    base = run_to(tmp_path / "fast", 20_000, 2.0, scenario="concurrency", concurrency=4)
    slow = run_to(tmp_path / "slow", 30_000, 2.0, scenario="concurrency", concurrency=4)
    rc, report = compare_json(tmp_path, base, slow, "--fail-if-regression", "qps<-5%")
    rows = rows_of(report)
    assert rc == 1 and rows["qps"]["verdict"] == "worse" and rows["qps"]["change_pct"] < -10, json.dumps(rows["qps"])
    rc, _ = compare_json(tmp_path, base, slow, "--fail-if-regression", "qps<-60%")  # not that much
    assert rc == 0


def test_few_intervals_warn(runs, tmp_path):
    short = run_to(tmp_path / "short", BASE_US, duration_s=0.8)
    proc = compare(tmp_path, runs["base"], short)
    assert proc.returncode == 0
    assert "fewer than 5" in proc.stderr


def sweep_to(folder: Path, delay_us: int, rates: str) -> Path:
    proc = run_cli("sweep", *RUN, "--sut", f"sleep:{delay_us}", "--duration-s", "1.5", "--vary",
                   f"target_qps={rates}", "--output", folder, cwd=folder.parent, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return folder


def test_sweeps_compare_point_by_point(runs, tmp_path):
    base = sweep_to(tmp_path / "base", BASE_US, "100,200")
    new = sweep_to(tmp_path / "new", SLOWER_US, "100,300")
    rc, report = compare_json(tmp_path, base, new, "--fail-if-regression", "p50>+10%")
    assert rc == 1 and report["kind"] == "sweep"
    [one] = report["comparisons"]
    assert one["point"]["values"] == {"target_qps": 100.0} and one["fired"]
    assert report["not_compared"] == {"base": ["target_qps=200.0: not in NEW"], "new": ["target_qps=300.0: not in BASE"]}
    text = compare(tmp_path, base, new).stdout
    assert "== point target_qps=100.0" in text and "not compared (new): target_qps=300.0: not in BASE" in text
    proc = compare(tmp_path, base, runs["base"])
    assert proc.returncode == 2 and "is a sweep and NEW" in proc.stderr


def run_workers(folder: Path, delay_us: int) -> Path:
    """Two workers of one run, started together as a scaled-out run's pods would be, merged."""
    procs = [subprocess.Popen([sys.executable, "-m", "loadgen", "run", *RUN, "--sut", f"sleep:{delay_us}",
                               "--duration-s", "1.5", "--workers", "2", "--worker-index", str(i),
                               "--output", str(folder / f"w{i}")], cwd=folder.parent, env=clean_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for p in procs:
        try:
            _, err = p.communicate(timeout=30)
        finally:
            p.kill()
        assert p.returncode in (0, 1), err  # valid or not (a late start on a busy machine): it ran
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["merge", str(folder / "w0"), str(folder / "w1"), "--output", str(folder / "merged")]) in (0, 1)
    return folder / "merged"


def test_merged_results_compare_and_kinds_must_match(runs, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    base, new = run_workers(tmp_path / "a", BASE_US), run_workers(tmp_path / "b", SLOWER_US)
    rc, report = compare_json(tmp_path, base, new, "--fail-if-regression", "p50>+10%")
    assert report["kind"] == "merged result" and report["comparisons"][0]["base_run"]["merged_workers"] == 2
    assert rc == 1 and rows_of(report)["p50"]["verdict"] == "worse", json.dumps(report["comparisons"])
    proc = compare(tmp_path, base, runs["base"])
    assert proc.returncode == 2 and "is a merged result and NEW" in proc.stderr
