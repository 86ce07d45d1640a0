"""``loadgen merge`` (``loadgen.results.merge``): the workers' results of a scaled-out run
as one result.

Unit tests merge the documents of real runs made in this process (the native demo SUT,
0.2-0.3 s each): histograms added exactly, counts and over-bound counts summed, time
series aligned, validity recomputed on the whole, and every way a set of results can be
wrong (a worker missing, twice, interrupted, late, with other settings). Sweep folders
are hand-made from such results, in the layout ``loadgen sweep`` writes.

The integration test runs three workers as CLI processes, as an Indexed Job would, each
in a network namespace of its own, against a real MLServer over REST; see its docstring.

The tests that start processes or servers are in tests/integration/test_merge.py.
"""

from __future__ import annotations

import copy
import json
import time
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


# ------------------------------------------------------------------------------ CLI


# ----------------------------------------------------------------- pods, for real


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
