"""The merges themselves: the workers' results of one run into one result document, and
the workers' sweeps point by point.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Dict, List, Sequence, Tuple

from loadgen.results.cost import add_cost
from loadgen.results.document import build_document
from loadgen.results.merge.figures import MergedSUT, merge_histograms, run_result, total_options
from loadgen.results.merge.sections import merge_gpu, merge_server_metrics
from loadgen.results.merge.sweeps import sweep_key, sweep_section
from loadgen.results.merge.workers import (
    Input, mismatch_reasons, read_workers, roster_reasons, saturation_reasons, state_reasons, worker_figures,
)
from loadgen.scenarios import get_scenario
from loadgen.scenarios.diagnosis import add_diagnosis
from loadgen.sweep.files import POINTS_DIR

__all__ = ["merge_results", "merge_sweeps"]


def merge_results(inputs: Sequence[Input]) -> Dict[str, Any]:
    """The merged ``loadgen.result/1`` document of the workers' results ``inputs``.

    Raises:
        ValueError: there is nothing to merge, or a result cannot be merged at all (an
            unknown scenario); a result that can be merged but should not (a worker
            missing, twice, late, interrupted, or with other settings) makes the merged
            document invalid instead, with the reason.
    """
    if not inputs:
        raise ValueError("no results to merge")
    workers = sorted(read_workers(inputs), key=lambda w: w.index)  # stable: as given within an index
    first = workers[0]
    try:
        scenario = get_scenario(str(first.doc["scenario"]))
    except ValueError as e:
        raise ValueError(f"{first.path}: {e}") from None
    expected = Counter(w.count for w in workers).most_common(1)[0][0]
    reasons = roster_reasons(workers, expected) + state_reasons(workers) + mismatch_reasons(workers)
    histograms, layout_reasons = merge_histograms(workers)
    reasons += layout_reasons
    o = total_options(first, expected)
    t0 = min(w.started for w in workers)
    result = run_result(workers, histograms, o, t0)
    sut = MergedSUT(workers, histograms)
    doc = build_document(scenario, o, result, interrupted=result.interrupted,
                         given=dict(first.doc.get("settings", {}).get("given", {})), started_wall=t0, sut=sut)
    if "environment" in first.doc:
        doc["environment"] = first.doc["environment"]
    if "sweep" in first.doc:
        doc["sweep"] = sweep_section(workers)
    reasons += saturation_reasons(workers)
    server_metrics = merge_server_metrics(workers, float(result.settings.interval_s))
    if server_metrics is not None:
        doc["server_metrics"] = server_metrics
    gpu = merge_gpu([w.doc for w in workers], int(doc["counts"]["completed"]))
    if gpu is not None:
        doc["gpu"] = gpu
    add_cost(doc, o.price_per_hour)  # priced again: a per-GPU price counts the GPUs the workers sampled
    from loadgen.net.triton_stats import merge_breakdowns

    breakdown = merge_breakdowns([w.doc for w in workers])
    if breakdown is not None:
        doc["server_breakdown"] = breakdown
    doc["invalid_reasons"] = reasons + [r for r in doc["invalid_reasons"] if r not in reasons]
    doc["valid"] = not doc["invalid_reasons"]
    doc["merge"] = {
        "expected_workers": expected,
        "start_spread_s": max(w.started for w in workers) - t0,
        "workers": [worker_figures(w) for w in workers],
    }
    # From the merged figures and the final reasons (the workers' own are in "merge").
    return add_diagnosis(doc)


def merge_sweeps(sweeps: Sequence[Sequence[Input]]) -> List[Tuple[str, Dict[str, Any]]]:
    """Merges the workers' sweeps point by point: each sweep is the results of one
    worker's sweep folder; points are matched by :func:`sweep_key`. Returns (the point's
    folder name, the merged document) in the first sweep's order; a point some workers
    lack is merged from those that have it, and is invalid naming the missing ones."""
    groups: Dict[str, List[Input]] = {}
    for sweep in sweeps:
        for path, doc in sweep:
            groups.setdefault(sweep_key(path, doc), []).append((path, doc))
    out = []
    for inputs in groups.values():
        name = os.path.basename(os.path.dirname(os.path.abspath(inputs[0][0])))
        doc = merge_results(inputs)
        if isinstance(doc.get("sweep"), dict):
            doc["sweep"]["dir"] = f"{POINTS_DIR}/{name}"
        out.append((name, doc))
    return out
