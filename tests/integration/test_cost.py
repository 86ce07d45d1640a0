"""Cost per point: --price-per-hour read and checked, the result's ``cost`` section (its
arithmetic on hand-made documents and on real runs, against the scripted server's own
token counts), the same figures in the summary, the HTML report, sweep.csv and
``loadgen compare``, and ``loadgen sweep --pick`` on real sweeps with a price per point.

The tests that start processes; the in-process ones are in tests/unit/test_cost.py."""

from __future__ import annotations

import csv
import json

import pytest

from loadgen.options import OptionError, resolve
from loadgen.results.compare import METRICS, interval_values
from loadgen.results.cost import cost_figures
from loadgen.results.html import render_html
from loadgen.results.render import render_summary
from loadgen.results.schema import SchemaError, check_result
from tests.helpers import run_cli, run_json, write
from tests.servers.scripted_proc import start_scripted

LOAD = ("--scenario", "concurrency", "--concurrency", "2", "--max-issue-delay-ms", "1000")


@pytest.mark.parametrize("price", ["-1", "nan", "2/tpu", "2/gpu:-1"])
def test_a_bad_price_is_a_one_line_error_exit_2(price):
    proc = run_cli("run", "--duration-s", "0.2", "--price-per-hour", price)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "--price-per-hour" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_the_price_comes_from_the_config_and_the_environment(tmp_path):
    config = write(tmp_path / "c.toml", "price-per-hour = 2.5\n")
    options, _ = resolve({"config": str(config)}, environ={})
    assert options.price_per_hour == "2.5/node"
    options, _ = resolve({"config": str(config)}, environ={"LOADGEN_PRICE_PER_HOUR": "1.5/gpu:2"})
    assert options.price_per_hour == "1.5/gpu:2"
    bad = write(tmp_path / "bad.toml", 'price-per-hour = "1/rack"\n')
    with pytest.raises(OptionError, match=r"--price-per-hour \(config .*unknown unit 'rack'"):
        resolve({"config": str(bad)}, environ={})


def test_a_run_costs_its_price_over_its_queries():
    """A real run: the section follows from the document's own duration and counts,
    is in the schema, and is in the summary and the HTML report."""
    _, doc = run_json(*LOAD, "--query-count", "300", "--price-per-hour", "7.2/gpu:3", expect=0)
    c = doc["cost"]
    assert c["hourly"] == pytest.approx(21.6) and c["units"] == 3
    assert c["run_cost"] == pytest.approx(21.6 * doc["duration_s"] / 3600, rel=1e-12)
    assert c["per_1k_queries"] == pytest.approx(c["run_cost"] / doc["counts"]["completed"] * 1000, rel=1e-12)
    assert doc["counts"]["completed"] == 300
    check_result(doc)
    assert f"cost         {c['per_1k_queries']:.4g} per 1,000 queries" in render_summary(doc)
    assert f"{c['per_1k_queries']:.4g} per 1,000 queries" in render_html([("run", doc)])
    bad = json.loads(json.dumps(doc))
    bad["cost"]["per_1k_queries"] = -1.0
    with pytest.raises(SchemaError, match="per_1k_queries"):
        check_result(bad)


def test_token_costs_against_the_servers_own_counts(tmp_path):
    with start_scripted(tmp_path, "--ttft-ms", "1", "--itl-ms", "0", "--tokens-per-chunk", "64") as srv:
        _, doc = run_json(*LOAD, "--sut", f"openai+{srv.url}/v1/completions", "--query-count", "60",
                          "--input-tokens", "30", "--output-tokens", "25", "--ignore-eos", "--price-per-hour", "4",
                          expect=0, cwd=str(tmp_path))
        log = srv.stats()["completion_log"]
    served = sum(e["completion_tokens"] for e in log)
    prompts = sum(e["prompt_words"] for e in log)
    assert served == 60 * 25 and len(log) == 60
    c = doc["cost"]
    assert c["per_million_tokens"]["output"] == pytest.approx(c["run_cost"] / served * 1e6, rel=1e-12)
    assert c["per_million_tokens"]["input"] == pytest.approx(c["run_cost"] / prompts * 1e6, rel=1e-12)
    assert c["per_million_tokens"]["total"] == pytest.approx(c["run_cost"] / (served + prompts) * 1e6, rel=1e-12)
    check_result(doc)
    assert cost_figures(doc)["cost.per_million_output_tokens"] == c["per_million_tokens"]["output"]


def test_compare_has_the_cost_and_judges_it_per_interval(tmp_path):
    docs = []
    for name, price in (("a", "1"), ("b", "3/gpu:2")):
        proc = run_cli("run", *LOAD, "--duration-s", "1.2", "--interval-s", "0.2", "--price-per-hour", price,
                       "--output", str(tmp_path / name))
        assert proc.returncode in (0, 1), proc.stderr
        docs.append(json.loads((tmp_path / name / "result.json").read_text()))
    proc = run_cli("compare", tmp_path / "a", tmp_path / "b", "--json", "--fail-if-regression", "cost_per_1k>+50%")
    report = json.loads(proc.stdout)
    row = next(r for r in report["comparisons"][0]["metrics"] if r["metric"] == "cost_per_1k")
    assert (row["base"], row["new"]) == (docs[0]["cost"]["per_1k_queries"], docs[1]["cost"]["per_1k_queries"])
    # six times the price at about the same throughput: a regression past +50%
    assert row["change_pct"] > 50 and proc.returncode == 1, (row, proc.stderr)
    assert report["regression"] is True
    # each interval's cost: the price of its length over its queries
    metric = next(m for m in METRICS if m.name == "cost_per_1k")
    values = interval_values(docs[1], metric)
    expected = [6.0 * p["length_s"] / 3600 / p["completed"] * 1000 for p in docs[1]["timeseries"]
                if p["completed"] and p["length_s"] >= 0.9 * 0.2]
    assert values and values == pytest.approx(expected[:len(values)], rel=1e-12)
    text = run_cli("compare", tmp_path / "a", tmp_path / "b").stdout
    assert "cost/1k queries" in text


POINTS = """\
points = [{"label.instance" = "small", price-per-hour = "1.0"},
          {"label.instance" = "big", price-per-hour = "0.5/gpu:8"}]
"""


def _sweep(tmp_path, *extra, timeout=240):
    points = write(tmp_path / "points.toml", POINTS)
    return run_cli("sweep", *LOAD, "--duration-s", "0.4", "--vary", "concurrency=1,4", "--points", points,
                   "--output", tmp_path / "sw", *extra, timeout=timeout, cwd=str(tmp_path))


def _rows(tmp_path):
    with open(tmp_path / "sw" / "sweep.csv", newline="") as f:
        return list(csv.DictReader(f))


def _cheapest(rows, meets):
    ok = [r for r in rows if r["valid"] == "True" and meets(r)]
    return min(ok, key=lambda r: float(r["cost.per_1k_queries"]))


def test_sweep_with_a_price_per_point_and_pick(tmp_path):
    proc = _sweep(tmp_path, "--pick", "p99<1000s", "--json")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    report = json.loads(lines[-1])  # after the points' records, the pick
    rows = _rows(tmp_path)
    assert len(rows) == 4 and len(lines) == 5
    for row in rows:
        doc = json.loads((tmp_path / "sw" / row["dir"] / "result.json").read_text())
        hourly = 1.0 if row["labels.instance"] == "small" else 4.0
        assert doc["cost"]["hourly"] == float(row["cost.hourly"]) == hourly
        assert float(row["cost.per_1k_queries"]) == doc["cost"]["per_1k_queries"]
        assert doc["cost"]["per_1k_queries"] == pytest.approx(
            hourly * doc["duration_s"] / 3600 / doc["counts"]["completed"] * 1000, rel=1e-12)
    best = _cheapest(rows, lambda r: True)
    assert report["pick"]["point"] == int(best["point"])
    assert report["pick"]["cost"] == float(best["cost.per_1k_queries"])
    assert sum(p["meets"] for p in report["points"]) == sum(r["valid"] == "True" for r in rows)

    # On the folder: a rule that the fastest point's p99 breaks excludes it, and says why.
    p99s = sorted(float(r["latency_p99_ms"]) for r in rows if r["valid"] == "True")
    bound = (p99s[-1] + p99s[-2]) / 2
    proc = run_cli("sweep", "--pick", f"p99<{bound}ms", "--output", tmp_path / "sw", cwd=str(tmp_path))
    best = _cheapest(rows, lambda r: float(r["latency_p99_ms"]) < bound)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"pick: point {best['point']} (")
    slow = next(r for r in rows if float(r["latency_p99_ms"]) == p99s[-1])
    assert f"point {slow['point']} (" in proc.stdout and f"p99<{bound}ms does not hold: p99 is" in proc.stdout

    # None meets: exit 3, every point named with its reason.
    proc = run_cli("sweep", "--pick", "p99<1ns", "--output", tmp_path / "sw", cwd=str(tmp_path))
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("pick: no point meets p99<1ns") and proc.stdout.count("does not hold") == 4

    # Priced anew: one price for every point, so the highest throughput is the cheapest.
    proc = run_cli("sweep", "--pick", "p99<1000s", "--price-per-hour", "2/gpu:2", "--json",
                   "--output", tmp_path / "sw", cwd=str(tmp_path))
    report = json.loads(proc.stdout)
    fastest = max((r for r in rows if r["valid"] == "True"), key=lambda r: float(r["completed_qps"]))
    assert report["pick"]["point"] == int(fastest["point"]) and report["pick"]["basis"].startswith("4 an hour")


def test_pick_refuses_what_it_cannot_judge(tmp_path):
    proc = run_cli("sweep", "--pick", "p99<5ms", "--output", tmp_path / "none", cwd=str(tmp_path))
    assert proc.returncode == 2 and "no sweep there" in proc.stderr
    proc = run_cli("sweep", *LOAD, "--pick", "p98<5ms", "--vary", "concurrency=1", "--output", tmp_path / "x",
                   cwd=str(tmp_path))
    assert proc.returncode == 2 and "unknown metric 'p98'" in proc.stderr
    # a sweep without a price: refused before it runs
    proc = run_cli("sweep", *LOAD, "--pick", "p99<5ms", "--vary", "concurrency=1", "--output", tmp_path / "x",
                   cwd=str(tmp_path))
    assert proc.returncode == 2 and "needs a price" in proc.stderr and not (tmp_path / "x" / "sweep.jsonl").exists()
