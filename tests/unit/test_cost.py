"""Cost per point: --price-per-hour read and checked, the result's ``cost`` section (its
arithmetic on hand-made documents and on real runs, against the scripted server's own
token counts), the same figures in the summary, the HTML report, sweep.csv and
``loadgen compare``, and ``loadgen sweep --pick`` on real sweeps with a price per point.

The tests that start processes or servers are in tests/integration/test_cost.py."""

from __future__ import annotations

import math

import pytest

from loadgen.results.cost import PriceError, add_cost, parse_price, pick_cheapest
from loadgen.results.schema import check_result

# ------------------------------------------------------------------ the price

@pytest.mark.parametrize("text, amount, per, gpus, normal", [
    ("3.20", 3.2, "node", None, "3.2/node"),
    ("3.2/node", 3.2, "node", None, "3.2/node"),
    (" 2.10/GPU ", 2.1, "gpu", None, "2.1/gpu"),
    ("2.1/gpu:8", 2.1, "gpu", 8, "2.1/gpu:8"),
    (4, 4.0, "node", None, "4/node"),      # a TOML number
    ("1e-3/gpu:1", 0.001, "gpu", 1, "0.001/gpu:1"),
])
def test_prices_are_read(text, amount, per, gpus, normal):
    p = parse_price(text)
    assert (p.amount, p.per, p.gpus, p.text) == (amount, per, gpus, normal)
    assert parse_price(p.text) == p


@pytest.mark.parametrize("text, says", [
    ("-3", "> 0"), ("0", "> 0"), ("nan", "finite"), ("inf/gpu", "finite"), ("1e10", "<= 1e+09"),
    ("3/tpu", "unknown unit 'tpu'"), ("3/hour", "unknown unit"), ("three", "PRICE/gpu"), ("", "PRICE"),
    ("2/gpu:0", "GPU count"), ("2/gpu:x", "GPU count"), ("2/node:4", "only a per-gpu price"), (True, "PRICE"),
])
def test_bad_prices_are_refused(text, says):
    with pytest.raises(PriceError, match=".*" + says.replace("+", r"\+").replace("(", r"\(")):
        parse_price(text)


# ------------------------------------------------------------------ the arithmetic

def _doc(**extra):
    """A document with the figures the cost reads: 10 s, 3,600 queries completed (and
    400 that failed, which count for nothing)."""
    doc = {"duration_s": 10.0, "counts": {"issued": 4000, "completed": 3600, "failed": 400, "timed_out": 0}}
    doc.update(extra)
    return doc


def test_cost_per_node_is_the_price_of_the_run_over_its_work():
    doc = _doc(counts={"issued": 3600, "completed": 3600, "failed": 0, "timed_out": 0, "tokens": 7200},
               llm={"requests": {"input_tokens_sent": 36000}})
    add_cost(doc, "3.6")
    c = doc["cost"]
    # 3.6 an hour for 10 s is 0.01; 3,600 queries: 0.01 / 3.6 per 1,000.
    assert c["run_cost"] == pytest.approx(0.01, rel=1e-15)
    assert c["per_1k_queries"] == pytest.approx(0.01 / 3.6, rel=1e-15)
    assert c["per_million_tokens"] == pytest.approx({"output": 0.01 / 7200 * 1e6, "input": 0.01 / 36000 * 1e6,
                                                     "total": 0.01 / 43200 * 1e6}, rel=1e-15)
    assert (c["per"], c["units"], c["units_from"], c["hourly"], c["given"]) == ("node", 1, "node", 3.6, "3.6/node")
    # the same as the price an hour over the queries done in an hour
    assert c["per_1k_queries"] == pytest.approx(3.6 / (3600 / 10.0 * 3600) * 1000, rel=1e-12)


def test_cost_per_gpu_counts_the_gpus_given_or_sampled():
    doc = _doc()
    add_cost(doc, "2/gpu:4")
    assert (doc["cost"]["hourly"], doc["cost"]["units_from"]) == (8.0, "given")
    assert doc["cost"]["per_1k_queries"] == pytest.approx(8.0 * 10 / 3600 / 3600 * 1000, rel=1e-15)
    assert "per_million_tokens" not in doc["cost"]  # no tokens: no token cost
    # sampled: three devices, two of them MIG devices of GPU 1 (one GPU's price)
    devices = [{"index": 0}, {"index": 1, "mig_index": 0}, {"index": 1, "mig_index": 1}]
    doc = _doc(gpu={"status": "ok", "devices": devices})
    add_cost(doc, "2/gpu")
    assert (doc["cost"]["units"], doc["cost"]["hourly"], doc["cost"]["units_from"]) == (2, 4.0, "sampled")
    assert "2 GPUs sampled" in doc["cost"]["basis"]
    # none sampled: no figure, and a note saying what to give
    doc = _doc(gpu={"status": "unavailable", "devices": []})
    add_cost(doc, "2/gpu")
    assert doc["cost"]["per_1k_queries"] is None and "PRICE/gpu:N" in doc["cost"]["note"]
    add_cost(doc, None)
    assert "cost" not in doc


def test_a_merged_run_prices_the_whole_load():
    """The merge prices the whole load: the hardware's price over the merged duration and
    every worker's queries."""
    from loadgen.options import RunOptions
    from loadgen.results.merge import merge_results
    from loadgen.runner import run_benchmark

    docs = [run_benchmark(RunOptions(scenario="poisson", target_qps=600.0, duration_s=0.3, workers=2,
                                     worker_index=i, max_issue_delay_ms=100.0, price_per_hour="3/gpu:2"))
            for i in range(2)]
    merged = merge_results([(f"w{i}", d) for i, d in enumerate(docs)])
    c = merged["cost"]
    assert c["hourly"] == 6.0 and merged["counts"]["completed"] == sum(d["counts"]["completed"] for d in docs)
    assert c["per_1k_queries"] == pytest.approx(6.0 * merged["duration_s"] / 3600 / merged["counts"]["completed"]
                                                * 1000, rel=1e-12)
    check_result(merged)


# ------------------------------------------------------------------ compare


# ------------------------------------------------------------------ sweeps and --pick


def test_pick_takes_every_repeat_and_skips_failed_points():
    def record(index, repeat, p99, cost, status="done", valid=True):
        return {"schema": "loadgen.result/1", "valid": valid, "invalid_reasons": [] if valid else ["too slow"],
                "latency_ns": {"p99": p99}, "thresholds": [], "cost": {"per_1k_queries": cost},
                "sweep": {"index": index, "repeat": repeat, "values": {"concurrency": index}, "status": status,
                          "error": "hook failed" if status != "done" else ""},
                "counts": {"issued": 1, "completed": 1, "failed": 0, "timed_out": 0}}
    records = [record(0, 0, 1e6, 3.0), record(0, 1, 2e6, 1.0),        # meets, mean cost 2
               record(1, 0, 1e6, 1.0), record(1, 1, 9e6, 1.0),        # a repeat breaks the rule
               record(2, 0, 1e6, 0.5, valid=False),                   # invalid
               record(3, 0, 1e6, 0.1, status="failed"),               # failed
               record(4, 0, 1e6, 2.5)]                                # meets, dearer
    report = pick_cheapest(records, ["p99<5ms"])
    assert report["pick"]["point"] == 0 and report["pick"]["cost"] == 2.0
    why = {p["point"]: p["why"] for p in report["points"]}
    assert why[1].startswith("repeat 1: p99<5ms does not hold: p99 is 9.000 ms")
    assert why[2] == "invalid: too slow" and why[3] == "failed: hook failed"
    assert why[4] == "meets the rules, at 2.5 per 1,000 queries (+25%)"
    assert math.isclose(report["points"][0]["cost"], 2.0)


def test_a_merged_run_prices_the_gpus_its_workers_sampled():
    """A per-GPU price without a count, merged: the GPUs every worker sampled, each
    counted once (two nodes' GPU 0 are two GPUs; one node's GPU seen by two workers, one)."""
    from loadgen.options import RunOptions
    from loadgen.results.merge import merge_results
    from loadgen.runner import run_benchmark

    docs = [run_benchmark(RunOptions(scenario="poisson", target_qps=600.0, duration_s=0.3, workers=2,
                                     worker_index=i, max_issue_delay_ms=100.0, price_per_hour="3/gpu", gpus="none"))
            for i in range(2)]
    assert all(d["cost"]["units"] == 0 for d in docs)  # no worker sampled a GPU here

    def gpu(*uuids):
        return {"status": "ok", "devices": [{"index": 0, "uuid": u, "name": "H100", "energy_j": {"total": 50.0}}
                                            for u in uuids]}

    for sections, units in (((gpu("GPU-a"), gpu("GPU-b")), 2), ((gpu("GPU-a"), gpu("GPU-a")), 1),
                            ((gpu("GPU-a", "GPU-b"), gpu("GPU-c")), 3)):
        for doc, section in zip(docs, sections):
            doc["gpu"] = section
        merged = merge_results([(f"w{i}", d) for i, d in enumerate(docs)])
        assert len(merged["gpu"]["devices"]) == units
        c = merged["cost"]
        assert (c["units"], c["units_from"], c["hourly"]) == (units, "sampled", 3.0 * units)
        assert c["per_1k_queries"] == pytest.approx(3.0 * units * merged["duration_s"] / 3600
                                                    / merged["counts"]["completed"] * 1000, rel=1e-12)
        assert f"{units} GPU" in c["basis"] and "note" not in c
