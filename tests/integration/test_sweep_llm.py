"""LLM figures beyond one run: a sweep of streamed OpenAI runs against the scripted server
(tests/servers/scripted.py: exact token timing), its sweep.csv and pandas columns against
each point's result.json, two LLM workers merged, and ``loadgen compare`` over them. The
CLI runs as a subprocess; the server is ended by its PID."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from typing import Any, Dict

import pytest

import loadgen
from loadgen.sweep.files import read_records
from tests.helpers import clean_env, run_cli
from tests.servers.scripted_proc import start_scripted

pytestmark = pytest.mark.integration

SERVER = ("--ttft-ms", "20", "--itl-ms", "2", "--tokens", "16", "--reasoning-tokens", "4")
LLM = ("--model", "m", "--scenario", "concurrency", "--ramp-up-s", "0", "--slo", "ttft<=500ms",
       "--max-issue-delay-ms", "100")


def _close(a: Any, b: Any) -> bool:
    return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))


def _expected(doc: Dict[str, Any]) -> Dict[str, Any]:
    """sweep.csv's LLM columns as read by hand from a point's result.json."""
    out = {
        "output_tokens_per_s": doc["throughput"]["output_tokens_per_s"],
        "input_tokens_per_s": doc["llm"]["requests"]["input_tokens_sent"] / doc["duration_s"],
        "goodput_requests_per_s": doc["goodput"]["requests_per_s"],
        "goodput_fraction": doc["goodput"]["fraction"],
        "reasoning_tokens": doc["network"]["tokens"]["reasoning_tokens"],
    }
    for key, pcts in (("ttft", ("p50", "p90", "p99")), ("tpot", ("p50", "p90", "p99")), ("itl", ("p50", "p99")),
                      ("itl_per_token", ("p50", "p99")), ("ttfat", ("p50", "p99"))):
        for p in pcts:
            out[f"{key}_{p}_ms"] = doc[f"{key}_ns"][p] / 1e6
    return out


def test_an_llm_sweep_carries_the_token_figures_of_each_point(tmp_path):
    with start_scripted(tmp_path, *SERVER) as srv:
        proc = run_cli("sweep", "--sut", f"openai+{srv.url}/v1/chat/completions", *LLM, "--duration-s", "1",
                       "--vary", "concurrency=2,4", "--output", tmp_path / "sw", "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "sw" / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    records = read_records(tmp_path / "sw")
    frame = loadgen.load_results(tmp_path / "sw")
    assert len(rows) == len(records) == len(frame) == 2
    for row, record, (_, frow) in zip(rows, records, frame.iterrows()):
        with open(tmp_path / "sw" / record["sweep"]["dir"] / "result.json") as f:
            doc = json.load(f)
        assert doc["counts"]["tokens"] == 16 * doc["counts"]["completed"] > 0
        assert doc["network"]["tokens"]["reasoning_tokens"] == 4 * doc["counts"]["completed"]
        for column, value in _expected(doc).items():
            assert _close(row[column], value), (column, row[column], value)
            if not column.endswith("_ms"):  # pandas has the rates by name, the percentiles as ttft_ns.p99 ...
                assert _close(frow[column], value), (column, frow[column], value)
        # sweep.jsonl holds the point's document itself
        assert record["ttft_ns"]["p99"] == doc["ttft_ns"]["p99"]
        assert frow["ttft_ns.p99"] == doc["ttft_ns"]["p99"]
        assert frow["throughput.output_tokens_per_s"] == doc["throughput"]["output_tokens_per_s"]
    _check_compare(tmp_path / "sw", records)
    _check_chart(tmp_path / "sw", records)


def _check_chart(sweep_dir, records):
    """The sweep's report.html has output tokens/s against TTFT p99 and TPOT p99, a dot
    per point at the point's figures, labelled by its concurrency; drawn in headless
    Chromium without an error where Chromium is installed."""
    from tests.servers.chromium import Browser, find_chromium

    html = (sweep_dir / "report.html").read_text()
    tag = '<script type="application/json" id="loadgen-charts">'
    start = html.index(tag) + len(tag)
    specs = {s["id"]: s for s in json.loads(html[start:html.index("</script>", start)])}
    for cid, key in (("chart-sweep-ttft", "ttft_ns"), ("chart-sweep-tpot", "tpot_ns")):
        (series,) = specs[cid]["series"]
        points = sorted(records, key=lambda r: r["throughput"]["output_tokens_per_s"])
        assert series["labels"] == [f"concurrency={r['sweep']['values']['concurrency']}" for r in points]
        assert series["x"] == [float(f"{r['throughput']['output_tokens_per_s']:.4g}") for r in points]
        assert series["y"] == [float(f"{r[key]['p99'] / 1e6:.4g}") for r in points]
    binary = find_chromium()
    if binary is None:
        return
    from tests.integration.test_html_report import check_page

    with Browser(binary) as browser:
        check_page(browser, sweep_dir / "report.html", ["sweep", "tokens"], ["chart-sweep-ttft", "chart-sweep-tpot"])
        texts = browser.evaluate("Bokeh.documents[0].roots().filter(p => p.name === 'chart-sweep-ttft')"
                                 ".map(p => p.center.filter(m => m.type === 'LabelSet')"
                                 ".map(m => Array.from(m.source.data.text)))")
        assert texts == [[specs["chart-sweep-ttft"]["series"][0]["labels"]]], texts


LLM_ROWS = {"ttft_p50": "lower", "ttft_p90": "lower", "ttft_p99": "lower", "tpot_p50": "lower", "tpot_p90": "lower",
            "tpot_p99": "lower", "itl_p50": "lower", "itl_p99": "lower", "itl_per_token_p50": "lower",
            "itl_per_token_p99": "lower", "ttfat_p99": "lower", "tokens_per_s": "higher",
            "input_tokens_per_s": "higher", "goodput": "higher", "goodput_fraction": "higher"}


def _check_compare(sweep_dir, records):
    """``loadgen compare`` of the two points, and of the sweep with itself: every LLM row
    with its direction and its change from the two documents."""
    docs = []
    for r in records:
        with open(sweep_dir / r["sweep"]["dir"] / "result.json") as f:
            docs.append(json.load(f))
    paths = [sweep_dir / r["sweep"]["dir"] / "result.json" for r in records]
    proc = run_cli("compare", *paths, "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {m["metric"]: m for m in json.loads(proc.stdout)["comparisons"][0]["metrics"]}
    for name, better in LLM_ROWS.items():
        assert rows[name]["better"] == better, name
    base, new = docs
    assert _close(rows["ttft_p99"]["change"], new["ttft_ns"]["p99"] - base["ttft_ns"]["p99"])
    assert _close(rows["tokens_per_s"]["new"], new["counts"]["tokens"] / new["duration_s"])
    assert _close(rows["goodput"]["base"], base["goodput"]["requests_per_s"])
    text = run_cli("compare", *paths)
    assert "TTFT p99" in text.stdout and "input tokens/s" in text.stdout and "goodput fraction" in text.stdout
    both = run_cli("compare", sweep_dir, sweep_dir, "--json")
    assert both.returncode == 0, both.stderr
    comparisons = json.loads(both.stdout)["comparisons"]
    assert len(comparisons) == 2
    for c in comparisons:
        rows = {m["metric"]: m for m in c["metrics"]}
        assert set(LLM_ROWS) <= set(rows) and rows["tpot_p99"]["change"] == 0


def test_a_sweep_without_llm_points_has_no_llm_columns(tmp_path):
    proc = run_cli("sweep", "--scenario", "concurrency", "--duration-s", "0.2", "--max-issue-delay-ms", "100",
                   "--vary", "concurrency=1,2", "--output", tmp_path / "sw", "--quiet")
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "sw" / "sweep.csv", newline="") as f:
        header = next(csv.reader(f))
    assert "completed_qps" in header
    assert not [c for c in header if "token" in c or c.startswith(("ttft", "tpot", "itl", "goodput"))], header


def test_record_requests_into_an_output_folder_not_yet_made(tmp_path):
    out = tmp_path / "new" / "out"
    proc = run_cli("run", "--scenario", "concurrency", "--duration-s", "0.2", "--max-issue-delay-ms", "100",
                   "--output", out,
                   "--record-requests", out / "requests.jsonl", "--quiet")
    assert proc.returncode == 0, proc.stderr
    with open(out / "result.json") as f:
        completed = json.load(f)["counts"]["completed"]
    with open(out / "requests.jsonl") as f:
        assert sum(1 for line in f if line.strip()) >= completed > 0


def test_merging_two_llm_workers_keeps_the_token_figures_exactly(tmp_path):
    with start_scripted(tmp_path, *SERVER) as srv:
        worker = [sys.executable, "-m", "loadgen", "run", "--sut", f"openai+{srv.url}/v1/chat/completions", *LLM,
                  "--concurrency", "4", "--duration-s", "1", "--workers", "2", "--quiet", "--worker-index"]
        # both workers at once, as pods would run
        running = [subprocess.Popen(worker + [str(i), "--output", str(tmp_path / f"w{i}")], env=clean_env(),
                                    stderr=subprocess.PIPE, text=True) for i in range(2)]
        errors = [(p.communicate(timeout=90)[1], p.returncode) for p in running]
    assert [rc for _, rc in errors] == [0, 0], errors
    merged = run_cli("merge", tmp_path / "w0", tmp_path / "w1", "--output", tmp_path / "m", "--json")
    assert merged.returncode == 0, merged.stderr
    doc = json.loads(merged.stdout)
    workers = []
    for i in range(2):
        with open(tmp_path / f"w{i}" / "result.json") as f:
            workers.append(json.load(f))
    assert doc["counts"]["tokens"] == sum(w["counts"]["tokens"] for w in workers) > 0
    for key in ("ttft_ns", "tpot_ns", "itl_ns", "itl_per_token_ns", "ttfat_ns", "output_tokens_per_s"):
        assert doc[key]["count"] == sum(w[key]["count"] for w in workers), key
        assert min(w[key]["max"] for w in workers) <= doc[key]["max"] == max(w[key]["max"] for w in workers), key
    assert doc["throughput"]["output_tokens_per_s"] == pytest.approx(doc["counts"]["tokens"] / doc["duration_s"])
    for key in ("output_tokens", "reasoning_tokens"):
        assert doc["network"]["tokens"][key] == sum(w["network"]["tokens"][key] for w in workers), key
    assert doc["llm"]["requests"]["input_tokens_sent"] == sum(w["llm"]["requests"]["input_tokens_sent"]
                                                             for w in workers)
    assert doc["goodput"]["met"] == sum(w["goodput"]["met"] for w in workers)


def test_a_merged_llm_sweep_keeps_the_token_columns(tmp_path):
    with start_scripted(tmp_path, *SERVER) as srv:
        start = round(time.time() + 5.0, 3)  # both sweeps started and prepared by then, even on a busy machine
        cmd = [sys.executable, "-m", "loadgen", "sweep", "--sut", f"openai+{srv.url}/v1/chat/completions", *LLM,
               "--duration-s", "0.5", "--vary", "concurrency=2,4", "--start-at", str(start), "--point-gap-s", "0.5",
               "--quiet", "--output"]
        running = [subprocess.Popen(cmd + [str(tmp_path / f"w{i}")], stderr=subprocess.PIPE, text=True,
                                    env={**clean_env(), "LOADGEN_WORKERS": "2", "JOB_COMPLETION_INDEX": str(i)})
                   for i in range(2)]
        errors = [(p.communicate(timeout=90)[1], p.returncode) for p in running]
    assert [rc for _, rc in errors] == [0, 0], errors
    merged = run_cli("merge", tmp_path / "w0", tmp_path / "w1", "--output", tmp_path / "m", "--quiet")
    assert merged.returncode == 0, merged.stderr
    with open(tmp_path / "m" / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    workers = [read_records(tmp_path / f"w{i}") for i in range(2)]
    assert len(rows) == 2
    for k, (row, record) in enumerate(zip(rows, read_records(tmp_path / "m"))):
        assert record["counts"]["tokens"] == sum(w[k]["counts"]["tokens"] for w in workers) > 0
        assert record["ttft_ns"]["count"] == sum(w[k]["ttft_ns"]["count"] for w in workers)
        assert _close(row["output_tokens_per_s"], record["counts"]["tokens"] / record["duration_s"])
        assert _close(row["ttft_p99_ms"], record["ttft_ns"]["p99"] / 1e6)
        assert int(row["reasoning_tokens"]) == sum(w[k]["network"]["tokens"]["reasoning_tokens"] for w in workers)
        assert _close(row["input_tokens_per_s"], record["llm"]["requests"]["input_tokens_sent"] / record["duration_s"])
