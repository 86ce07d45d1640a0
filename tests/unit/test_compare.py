"""``loadgen compare`` (``loadgen.results.compare``) and its Mann-Whitney test.

The runs are real: the native fixed-delay SUT (``sleep:<us>``) at a constant rate,
1.5-2.5 s with 0.25 s intervals, made in this process (sweeps and scaled-out workers as
CLI subprocesses in tmp_path); the command runs in this process, and once as a
subprocess for its exit code. The delay is 100 ms so that
the scheduling hiccups of the shared two-core test machine (a few ms at worst) stay well
under the 10% a rule asks for; a planted regression is the same run with a 20% longer
delay. Reruns of one configuration must pass: the rule needs the whole-run change, the
intervals' median and the test to agree.

The tests that start processes or servers are in tests/integration/test_compare.py.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from scipy.stats import mannwhitneyu

from loadgen.cli import main
from loadgen.options import RunOptions
from loadgen.results import load_result, write_outputs
from loadgen.results.compare import METRICS, CompareError, compare_documents, parse_rules
from loadgen.runner import run_benchmark
from loadgen.stats.mann_whitney import mann_whitney_u

BASE_US, SLOWER_US = 100_000, 120_000  # a planted 20% latency regression


def run_to(folder: Path, delay_us: int, duration_s: float = 2.5, **scenario) -> Path:
    """One run, in this process, its files written to ``folder``."""
    settings = scenario or {"scenario": "constant", "target_qps": 200.0}
    doc = run_benchmark(RunOptions(sut=f"sleep:{delay_us}", duration_s=duration_s, interval_s=0.25,
                                   max_issue_delay_ms=100.0, **settings))
    write_outputs(doc, str(folder))
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Two runs of one configuration, and the same with the slower SUT."""
    root = tmp_path_factory.mktemp("runs")
    return {name: run_to(root / name, delay) for name, delay in
            (("base", BASE_US), ("rerun", BASE_US), ("slower", SLOWER_US))}


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


