"""Bursty arrivals (--burstiness: gamma-distributed gaps drawn by the native schedule) and
goodput against --slo (judged per query by the engine), the latter recounted from the
per-request records (--record-requests), which are the truth it must equal exactly.

The tests that start processes; the in-process ones are in tests/unit/test_burst_goodput.py."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from loadgen.results import load_result
from tests.helpers import run_cli
from tests.servers.scripted_proc import start_scripted


@pytest.mark.parametrize("args,words", [
    (["--scenario", "server", "--burstiness", "0.5"], "--burstiness does not apply to the server scenario"),
    (["--scenario", "ramp", "--stages", "1s:100", "--burstiness", "0.5"], "add --poisson-arrivals"),
    (["--scenario", "poisson", "--burstiness", "0"], "--burstiness"),
    (["--scenario", "poisson", "--slo", "itl<=5ms"], "not supported"),
    (["--scenario", "poisson", "--fail-if", "goodput<10"], "needs at least one --slo"),
])
def test_bad_burstiness_and_slo_flags_are_usage_errors(tmp_path, args, words):
    proc = run_cli("run", "--sut", "null", "--duration-s", "0.1", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _recount(records, slos):
    """Goodput from per-request truth: (met, of, {name: met})."""
    met, each = 0, {name: 0 for name in slos}
    measured = [r for r in records if not r["warmup"]]
    for r in measured:
        if r["status"] != "ok":
            continue
        ok = {}
        first, done, tokens = r["first_token_ns"], r["completed_ns"], r["output_tokens"] or 0
        if "latency" in slos:
            ok["latency"] = 0 <= done - r["scheduled_ns"] <= slos["latency"]
        if "ttft" in slos:
            ok["ttft"] = first is not None and 0 <= first - r["scheduled_ns"] <= slos["ttft"]
        if "tpot" in slos:
            ok["tpot"] = tokens <= 1 or (first is not None and done >= first
                                         and (done - first) // (tokens - 1) <= slos["tpot"])
        for name, v in ok.items():
            each[name] += v
        met += all(ok.values())
    return met, len(measured), each


def test_goodput_equals_a_recount_from_the_records_on_a_bursty_native_run(tmp_path):
    recs = tmp_path / "r.jsonl"
    proc = run_cli("run", "--json", "--scenario", "poisson", "--sut", "demo", "--target-qps", "3000",
                   "--duration-s", "0.6", "--burstiness", "0.3", "--slo", "latency<=2.5ms",
                   "--record-requests", recs, "--max-issue-delay-ms", "50", "--output", tmp_path / "out",
                   "--no-html", cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    assert load_result(tmp_path / "out" / "result.json")["goodput"] == doc["goodput"]  # the schema reads it
    g = doc["goodput"]
    met, of, each = _recount(_records(recs), {"latency": 2_500_000})
    assert (g["met"], g["of"], g["per_slo"]["latency"]["met"]) == (met, of, each["latency"])
    assert 0 < met < of  # the demo SUT's latencies straddle 2.5 ms
    assert g["requests_per_s"] == pytest.approx(met / doc["duration_s"])
    assert doc["settings"]["engine"]["burstiness"] == 0.3


@pytest.mark.integration
def test_goodput_against_a_streaming_server_equals_the_recount_and_drives_fail_if(tmp_path):
    # One connection at a rate near its capacity, with bursty arrivals: requests queue
    # for different times, so some meet the SLOs and some do not.
    recs, out = tmp_path / "r.jsonl", tmp_path / "out"
    slos = {"ttft": 12_000_000, "tpot": 2_000_000, "latency": 25_000_000}
    with start_scripted(tmp_path, "--ttft-ms", "5", "--itl-ms", "1", "--tokens", "8") as srv:
        proc = run_cli("run", "--json", "--scenario", "poisson", "--sut", f"openai+{srv.url}/v1/completions",
                       "--model", "m", "--target-qps", "30", "--burstiness", "0.25", "--duration-s", "2",
                       "--max-in-flight", "1", "--grace-s", "5", "--max-issue-delay-ms", "1000",
                       "--slo", "ttft<=12ms", "--slo", "tpot<=2ms", "--slo", "latency<=25ms",
                       "--record-requests", recs, "--output", out,
                       "--fail-if", "goodput<1000", "--fail-if", "goodput_fraction<0.5%",
                       timeout=60, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    g = doc["goodput"]
    met, of, each = _recount(_records(recs), slos)
    assert (g["met"], g["of"]) == (met, of)
    assert {name: s["met"] for name, s in g["per_slo"].items()} == each
    assert 0 < met < of, g
    assert doc["counts"]["tokens"] == 8 * doc["counts"]["completed"]
    assert doc["throughput"]["output_tokens_per_s"] == pytest.approx(doc["counts"]["tokens"] / doc["duration_s"])
    rates = [r["output_tokens"] * 1e9 / (r["completed_ns"] - r["first_token_ns"]) for r in _records(recs)
             if r["status"] == "ok" and r["first_token_ns"] and r["completed_ns"] > r["first_token_ns"]]
    assert doc["throughput"]["output_tokens_per_s_per_stream"] == pytest.approx(np.mean(rates), rel=1e-6)
    # goodput < 1000 requests/s holds, so that threshold fails the run; the fraction one does not.
    assert [t["passed"] for t in doc["thresholds"]] == [False, g["fraction"] >= 0.005]
    assert proc.returncode == 1
    row = next(csv.DictReader((out / "results.csv").open()))
    assert float(row["goodput.requests_per_s"]) == pytest.approx(g["requests_per_s"])
    assert float(row["ttft_ns.p50"]) == doc["ttft_ns"]["p50"]
    summary = (out / "summary.txt").read_text()
    assert f"{met:,} of {of:,}" in summary and "ttft<=12.000 ms" in summary
