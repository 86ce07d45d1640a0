"""``loadgen compare`` (``loadgen.results.compare``) and its Mann-Whitney test.

The runs are real: the native fixed-delay SUT (``sleep:<us>``) at a constant rate,
1.5-2.5 s with 0.25 s intervals, made in this process (sweeps and scaled-out workers as
CLI subprocesses in tmp_path); the command runs in this process, and once as a
subprocess for its exit code. The delay is 100 ms so that
the scheduling hiccups of the shared two-core test machine (a few ms at worst) stay well
under the 10% a rule asks for; a planted regression is the same run with a 20% longer
delay. Reruns of one configuration must pass: the rule needs the whole-run change, the
intervals' median and the test to agree.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import mannwhitneyu

from loadgen.cli import main
from loadgen.options import RunOptions
from loadgen.results import load_result, write_outputs
from loadgen.runner import run_benchmark
from loadgen.results.compare import METRICS, CompareError, compare_documents, parse_rules
from loadgen.stats.mann_whitney import mann_whitney_u
from tests.helpers import clean_env, RELAXED, run_cli

BASE_US, SLOWER_US = 100_000, 120_000  # a planted 20% latency regression
COMMON = ["--interval-s", "0.25", "--quiet", *RELAXED]
CONSTANT = ["--scenario", "constant", "--target-qps", "200"]
RUN = [*CONSTANT, *COMMON]


def run_to(folder: Path, delay_us: int, duration_s: float = 2.5, **scenario) -> Path:
    """One run, in this process, its files written to ``folder``."""
    settings = scenario or {"scenario": "constant", "target_qps": 200.0}
    doc = run_benchmark(RunOptions(sut=f"sleep:{delay_us}", duration_s=duration_s, interval_s=0.25,
                                   max_issue_delay_ms=100.0, **settings))
    write_outputs(doc, str(folder))
    return folder


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


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Two runs of one configuration, and the same with the slower SUT."""
    root = tmp_path_factory.mktemp("runs")
    return {name: run_to(root / name, delay) for name, delay in
            (("base", BASE_US), ("rerun", BASE_US), ("slower", SLOWER_US))}


def rows_of(report: dict, index: int = 0) -> dict:
    return {r["metric"]: r for r in report["comparisons"][index]["metrics"]}


# ------------------------------------------------------------------ Mann-Whitney

def test_mann_whitney_agrees_with_scipy_on_random_samples_with_ties():
    rng = random.Random(7)
    for _ in range(400):
        n1, n2 = rng.randint(1, 25), rng.randint(1, 25)
        spread = rng.choice([2, 5, 1000])  # 2 and 5: many ties; 1000: few or none (exact p-values)
        x = [rng.randint(0, spread) for _ in range(n1)]
        y = [rng.randint(0, spread) + rng.choice([0, 1]) for _ in range(n2)]
        ours, theirs = mann_whitney_u(x, y), mannwhitneyu(x, y, alternative="two-sided")
        assert ours.u == pytest.approx(theirs.statistic)
        assert ours.p_value == pytest.approx(theirs.pvalue, rel=1e-9, abs=1e-12), (x, y, ours.method)


def test_mann_whitney_edges():
    assert mann_whitney_u([1.0, 1.0], [1.0, 1.0, 1.0]).p_value == 1.0  # nothing tells them apart
    small = mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert small.method == "exact" and small.p_value == pytest.approx(0.1)  # 2 of 20 orderings
    with pytest.raises(ValueError, match="at least one value"):
        mann_whitney_u([], [1])
    with pytest.raises(ValueError, match="NaN"):
        mann_whitney_u([float("nan")], [1])


# ------------------------------------------------------------------ results

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


def test_figures_without_intervals_are_not_judged_unless_a_rule_crosses(runs):
    base, slower = load_result(runs["base"] / "result.json"), load_result(runs["slower"] / "result.json")
    out = compare_documents(base, slower, parse_rules(["p99.9>-100%"]))
    rows = {r["metric"]: r for r in out["metrics"]}
    assert rows["p99.9"]["verdict"] == "not judged" and rows["p99.9"]["p_value"] is None
    assert rows["issue_delay_p99"]["p_value"] is not None  # the time series carries it: judged per interval
    assert [f["judged_on"] for f in out["fired"]] == ["whole run only"]
    # an absolute amount in a unit: p50 moved by 20 ms
    assert compare_documents(base, slower, parse_rules(["p50>+15ms"]))["fired"]
    assert not compare_documents(base, slower, parse_rules(["p50>+25ms"]))["fired"]


def test_few_intervals_warn(runs, tmp_path):
    short = run_to(tmp_path / "short", BASE_US, duration_s=0.8)
    proc = compare(tmp_path, runs["base"], short)
    assert proc.returncode == 0
    assert "fewer than 5" in proc.stderr


# ------------------------------------------------------------------ usage

@pytest.mark.parametrize("expr, message", [
    ("p98>+10%", "unknown metric 'p98'; did you mean p99? known: qps, mean"),
    ("p99>=10%", "is not METRIC OP CHANGE"),
    ("p99>+10", "give p99's change as a percent (like +10%) or as ns or us or ms or s"),
    ("qps<-5ms", "give qps's change as a percent"),
    ("", None),
])
def test_bad_rules_are_exit_2_naming_them(runs, capsys, expr, message):
    code = main(["compare", str(runs["base"]), str(runs["rerun"]), "--fail-if-regression", expr])
    err = capsys.readouterr().err
    if message is None:  # an empty rule list is no rule
        assert code == 0, err
        return
    assert code == 2 and "--fail-if-regression" in err and message in err, err
    with pytest.raises(CompareError):
        parse_rules([expr])


def test_bad_inputs_are_exit_2(runs, tmp_path, capsys):
    for args, message in (
        ((runs["base"], tmp_path / "missing"), "no such file or folder"),
        ((runs["base"], runs["base"].parent), "holds 3 result.json files"),
        ((runs["base"], runs["rerun"], "--alpha", "1.5"), "--alpha must be between 0 and 1"),
        ((runs["base"], runs["rerun"], "--min-effect", "x"), "--min-effect"),
        ((runs["base"], runs["rerun"], "--fail-if-regresion", "p99>+1%"), "--fail-if-regression"),
    ):
        code = main(["compare", *map(str, args)])
        err = capsys.readouterr().err
        assert code == 2 and message in err, (args, err)


def test_every_metric_has_a_rule_name_the_help_lists(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    for metric in METRICS:
        assert metric.name in flat


# ------------------------------------------------------------------ sweeps, merged results

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
