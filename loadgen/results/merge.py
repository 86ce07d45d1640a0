"""Merging the results of the workers of one scaled-out run into one result: what
``loadgen merge`` does.

Histograms are added exactly (every histogram's encoded ``hdr`` payload decoded and
added; percentiles are never averaged), counts and the exact over-bound counts summed,
and the time series aligned on the wall clock. The merged parts make a
:class:`~loadgen.engine.RunResult` again, and the metric, validity and early stopping are
those of the scenario's own code over the whole, with the options of the total load (the
workers' ``worker.total``): the merged document is a ``loadgen.result/1`` document like
any run's, with a ``"merge"`` section of the workers' own figures.

The time series: interval lengths are the workers' ``--interval-s``. In a merged
interval the counts (issued, completed, failed, timed_out, tokens, errors by kind) and
``outstanding`` are summed and the latency percentiles come from the added interval
histograms; the issue delay and TTFT percentiles, which carry no interval histogram,
are the largest of the workers' (an upper bound; exact for ``issue_delay_max_ns``).
Worker w's
interval at ``t_s`` starts on the wall clock at ``started_at_epoch_s(w) + t_s``; it goes
to the merged interval k whose start ``t0 + k * interval_s`` is nearest, where ``t0`` is
the earliest worker's start. Workers that started within half an interval of each other
(``--start-at``) put their interval k in merged interval k.

Beside the engine's figures: the ``network`` section's counts are summed and its other
values kept per worker (:func:`merge_network`); an OpenAI target's ``llm`` section keeps
the first worker's workload with the requests' counts summed (:func:`merge_llm`); the server's metrics are counted once per
server, the servers summed, the gauges pooled and kept per worker
(:func:`merge_server_metrics`); a sweep's points merged are written as a sweep folder
(:func:`sweep_records`, :func:`merged_manifest`).

The merge is invalid, saying why, when a worker of ``0..N-1`` is missing or given twice,
when a worker was interrupted, is partial or started late, when the workers' settings
do not match (scenario, SUT, latency bounds, histogram layout, worker count, total
load), and by the scenario's rules on the merged figures. The merged result's diagnosis
(:mod:`loadgen.scenarios.diagnosis`) is made from the merged figures; each worker's own,
with its host figures, is in its entry of the ``"merge"`` section.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import os
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Tuple

from loadgen.engine import EngineSettings, RunResult
from loadgen.options import RunOptions, parse_stages
from loadgen.results.cost import add_cost
from loadgen.results.document import build_document
from loadgen.scenarios import get_scenario
from loadgen.scenarios.diagnosis import add_diagnosis
from loadgen.stats.histogram import HdrDecodeError, Histogram
from loadgen.sweep.files import MANIFEST_SCHEMA, POINTS_DIR
from loadgen.sut.report import NamedHistogram
from loadgen.units import s_to_ns
from loadgen.workers import late_start_reason

__all__ = ["Input", "merge_llm", "merge_network", "merge_results", "merge_server_metrics", "merge_sweeps", "merged_manifest",
           "sweep_key", "sweep_records"]

#: One result to merge: where it was read from, and the document.
Input = Tuple[str, Dict[str, Any]]

# The engine's histograms: document key -> RunResult attribute.
_ENGINE = {"latency_ns": "latency", "service_time_ns": "service_time", "issue_delay_ns": "issue_delay",
           "ttft_ns": "ttft", "tpot_ns": "tpot"}
# Counts that are extremes, not sums; and one the document derives again.
_EXTREMES = {"out_of_range_min_ns": min, "out_of_range_max_ns": max}
_DERIVED_COUNTS = ("samples_completed",)
_MAX_MESSAGES = 10


@dataclasses.dataclass
class _Worker:
    """One input, as the merge sees it."""

    path: str
    doc: Dict[str, Any]
    index: int
    count: int
    started: float

    @property
    def section(self) -> Dict[str, Any]:
        w: Dict[str, Any] = self.doc.get("worker") or {}
        return w


def _workers(inputs: Sequence[Input]) -> List[_Worker]:
    out = []
    for path, doc in inputs:
        w = doc.get("worker") or {}
        started = w.get("started_at_epoch_s", doc.get("started_at_epoch_s")) or 0.0
        out.append(_Worker(path, doc, int(w.get("index", 0)), int(w.get("count", 1)), float(started)))
    return out


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
    workers = sorted(_workers(inputs), key=lambda w: w.index)  # stable: as given within an index
    first = workers[0]
    try:
        scenario = get_scenario(str(first.doc["scenario"]))
    except ValueError as e:
        raise ValueError(f"{first.path}: {e}") from None
    expected = Counter(w.count for w in workers).most_common(1)[0][0]
    reasons = _roster_reasons(workers, expected) + _state_reasons(workers) + _mismatch_reasons(workers)
    histograms, layout_reasons = _merge_histograms(workers)
    reasons += layout_reasons
    o = _total_options(first, expected)
    t0 = min(w.started for w in workers)
    result = _run_result(workers, histograms, o, t0)
    sut = _MergedSUT(workers, histograms)
    doc = build_document(scenario, o, result, interrupted=result.interrupted,
                         given=dict(first.doc.get("settings", {}).get("given", {})), started_wall=t0, sut=sut)
    if "environment" in first.doc:
        doc["environment"] = first.doc["environment"]
    if "sweep" in first.doc:
        doc["sweep"] = _sweep_section(workers)
    reasons += _saturation_reasons(workers)
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
        "workers": [_worker_figures(w) for w in workers],
    }
    # From the merged figures and the final reasons (the workers' own are in "merge").
    return add_diagnosis(doc)


# ------------------------------------------------------------------------ validity

def _saturation_reasons(workers: Sequence[_Worker]) -> List[str]:
    """A worker whose event loop was saturated measured its own client: the merge says
    which (host figures are not merged, so the rule cannot be judged again on the whole)."""
    return [f"worker {w.index}: {r}" for w in workers for r in w.doc.get("invalid_reasons", [])
            if str(r).startswith("generator saturated")]


def merge_gpu(docs: Sequence[Dict[str, Any]], completed: int) -> Optional[Dict[str, Any]]:
    """The merged ``gpu`` section: the GPUs the workers sampled, each counted once (by
    UUID: workers on one node see the same GPUs over the same time; the largest energy
    reading of a GPU is kept), energy in all, per completed query and queries per joule
    over the merged count; None when no worker has GPU figures."""
    sections = [d.get("gpu") for d in docs]
    sampled = [g for g in sections if isinstance(g, dict) and g.get("status") in ("ok", "partial")]
    if not sampled:
        return None
    devices: Dict[str, Dict[str, Any]] = {}
    for g in sampled:
        for dev in g.get("devices") or []:
            energy = (dev.get("energy_j") or {}).get("total")
            kept = devices.get(dev["uuid"])
            if kept is None or (energy or 0.0) > ((kept.get("energy_j") or {}).get("total") or 0.0):
                devices[dev["uuid"]] = dev
    # A MIG device's energy is its GPU's: count each physical GPU once.
    energies = {d.get("parent_uuid") or uuid: (d.get("energy_j") or {}).get("total") for uuid, d in devices.items()}
    known = [e for e in energies.values() if e is not None]
    total = float(sum(known)) if known else None
    return {
        "status": "ok" if len(sampled) == len(sections) and all(g["status"] == "ok" for g in sampled) else "partial",
        "reason": "" if len(sampled) == len(sections) else
        f"{len(sections) - len(sampled)} of {len(sections)} workers have no GPU figures",
        "devices": list(devices.values()),
        "energy_j_total": total,
        "energy_per_query_j": total / completed if total is not None and completed else None,
        "queries_per_joule": completed / total if total else None,
        "workers": [g.get("status", "absent") if isinstance(g, dict) else "absent" for g in sections],
    }


def _name(w: _Worker) -> str:
    return f"worker {w.index} ({w.path})"


def _roster_reasons(workers: Sequence[_Worker], expected: int) -> List[str]:
    """Workers missing, given twice, out of range, or disagreeing on how many there are."""
    reasons = []
    counts = Counter(w.count for w in workers)
    if len(counts) > 1:
        said = "; ".join(f"{n} by {', '.join(_name(w) for w in workers if w.count == n)}" for n in sorted(counts))
        reasons.append(f"the workers disagree on --workers: {said}")
    by_index: Dict[int, List[_Worker]] = {}
    for w in workers:
        by_index.setdefault(w.index, []).append(w)
    for index, same in sorted(by_index.items()):
        if len(same) > 1:
            reasons.append(f"worker {index} is given {len(same)} times ({', '.join(w.path for w in same)}): "
                           "its figures are counted more than once")
        if index >= expected:
            reasons.append(f"{_name(same[0])} is not one of the {expected} workers 0..{expected - 1}")
    for index in range(expected):
        if index not in by_index:
            reasons.append(f"worker {index} of {expected} is missing: its share of the load is not in the figures")
    return reasons


def _state_reasons(workers: Sequence[_Worker]) -> List[str]:
    """Workers whose own run went wrong: partial, interrupted, started late."""
    reasons = []
    for w in workers:
        if w.doc.get("partial"):
            reasons.append(f"{_name(w)} is partial: its result document could not be built after the run")
        if w.doc.get("interrupted"):
            reasons.append(f"{_name(w)} was interrupted before it finished; its figures are partial")
        late = late_start_reason(w.section) if w.section else None
        if late is not None:
            reasons.append(f"{late} ({w.path})")
    return reasons


def _settings_of(w: _Worker) -> Dict[str, Any]:
    effective = w.doc.get("settings", {}).get("effective", {})
    return {
        "scenario": w.doc.get("scenario"),
        "SUT": w.doc.get("sut"),
        "latency bounds": [b.get("bound_ns") for b in w.doc.get("latency_bounds", [])],
        "--significant-figures": effective.get("significant_figures"),
        "--samples-per-query": effective.get("samples_per_query"),
        "--interval-s": effective.get("interval_s"),
        "total load": w.section.get("total"),
        "--start-at": w.section.get("start_at"),
    }


def _mismatch_reasons(workers: Sequence[_Worker]) -> List[str]:
    """Settings that differ from the first worker's: the results are not of one run."""
    reasons = []
    first = workers[0]
    mine = _settings_of(first)
    for w in workers[1:]:
        for what, value in _settings_of(w).items():
            if value != mine[what]:
                reasons.append(f"{_name(w)} has another {what} ({_text(value)}) than {_name(first)} "
                               f"({_text(mine[what])}): the results are not of one run")
    return reasons


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if not isinstance(value, str) else value


# ----------------------------------------------------------------------- histograms

def _histogram_keys(doc: Dict[str, Any]) -> List[str]:
    """The histograms of a document: those its index lists, else every ``*_ns`` summary."""
    index = doc.get("histograms")
    if isinstance(index, dict) and index:
        return [k for k in index if isinstance(doc.get(k), dict) and "hdr" in doc[k]]
    return [k for k, v in doc.items() if k.endswith("_ns") and isinstance(v, dict) and "hdr" in v]


def _decode(path: str, where: str, text: Any) -> Histogram:
    """A document's encoded histogram; ValueError naming the file and key when it is not one."""
    try:
        return Histogram.decode(text)
    except (HdrDecodeError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: {where} is not an encoded histogram: {e}") from None


def _merge_histograms(workers: Sequence[_Worker]) -> Tuple[Dict[str, Histogram], List[str]]:
    """Every histogram of the workers, added exactly; and the reasons for any that could
    not be (another layout: added at each bucket's lowest value; beyond the range: left
    out). ValueError naming the file for a payload that does not decode."""
    merged: Dict[str, Histogram] = {}
    reasons: List[str] = []
    for w in workers:
        for key in _histogram_keys(w.doc):
            h = _decode(w.path, f"{key}.hdr", w.doc[key]["hdr"])
            if key not in merged:
                merged[key] = h
                continue
            if not merged[key].same_layout(h):
                reasons.append(f"{_name(w)}'s {key} histogram has another layout (significant figures or "
                               "range) than the first worker's: it is added at bucket precision")
            try:
                merged[key].add(h)
            except ValueError as e:
                reasons.append(f"{_name(w)}'s {key} histogram cannot be added ({e}); it is left out")
    return merged, reasons


@dataclasses.dataclass
class _MergedSUT:
    """The SUT's side of the merged run, for :func:`build_document`: the workers' own
    histograms (a network client's) added, and the first worker's report with the
    connections and tokens of all."""

    workers: Sequence[_Worker]
    merged: Dict[str, Histogram]

    def histograms(self) -> Dict[str, NamedHistogram]:
        out: Dict[str, NamedHistogram] = {}
        for w in self.workers:
            for key, entry in (w.doc.get("histograms") or {}).items():
                if entry.get("source") != "sut" or key not in self.merged or key in out:
                    continue
                out[key] = NamedHistogram(self.merged[key], str(entry.get("unit", "")),
                                          float(entry.get("scale", 1.0)), str(entry.get("hdr_unit", "")))
        return out

    def report(self) -> Dict[str, Any]:
        out = merge_network(self.workers)
        llm = merge_llm([w.doc for w in self.workers])
        if out and llm is not None:
            out["llm"] = llm  # build_document makes it the document's "llm" section
        return out


# ------------------------------------------------------------------- LLM workload

_LLM_SUMS = ("input_tokens_sent", "reasoning_tokens", "embeddings")


def merge_llm(docs: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The merged ``llm`` section of OpenAI targets' workers: the first worker's workload,
    with ``requests``' counts (``input_tokens_sent``, ``reasoning_tokens``, ``embeddings``)
    summed and its ``output_tokens`` lengths pooled (count, sum, min, max, mean; their
    percentiles are the merged ``output_length_tokens`` histogram's); None when no worker
    has the section."""
    sections = [d["llm"] for d in docs if isinstance(d.get("llm"), dict)]
    if not sections:
        return None
    out = dict(sections[0])
    requests = [s["requests"] for s in sections if isinstance(s.get("requests"), dict)]
    if not requests:
        return out
    merged: Dict[str, Any] = {k: sum(int(r.get(k) or 0) for r in requests) for k in _LLM_SUMS}
    lengths = [r["output_tokens"] for r in requests if isinstance(r.get("output_tokens"), dict)
               and r["output_tokens"].get("count")]
    count = sum(int(x["count"]) for x in lengths)
    total = sum(x.get("sum") or 0 for x in lengths)
    merged["output_tokens"] = {"count": count, "sum": total, "min": min((x["min"] for x in lengths), default=None),
                               "max": max((x["max"] for x in lengths), default=None),
                               "mean": total / count if count else None}
    out["requests"] = merged
    return out


# ------------------------------------------------------------------ network counters

# Counts that are not summed: every worker counts the same things (its own copy of the
# requests read from --input), so a sum would count them once per worker.
_NET_NOT_SUMMED = ("payload.distinct_requests",)


def merge_network(workers: Sequence[_Worker]) -> Dict[str, Any]:
    """The merged ``network`` section (the SUT's report): every count (an integer) summed
    over the workers that report it (connections, connects, bytes_sent, responses,
    native.queued_in_client, tokens.output_tokens, ...; not ``payload.distinct_requests``),
    a value that every worker has alike kept, and any other (a time, a mean, a
    percentile, a text that differs, a count some workers lack) kept per worker in
    ``per_worker``: {dotted key: [{"worker": index, "value": ...}]}, with the largest
    number (the longest ``ready_wait_s``, the largest ``receive_wait_ns`` percentile: an
    upper bound), or the distinct texts joined, in its place. A time (a key ending in
    ``_ns``, ``_s``...) is never summed."""
    reports = [(w.index, w.doc["network"]) for w in workers if isinstance(w.doc.get("network"), dict)]
    if not reports:
        return {}
    per_worker: Dict[str, List[Dict[str, Any]]] = {}
    out: Dict[str, Any] = _merge_values(reports, "", per_worker, len(reports))
    out.pop("per_worker", None)  # a merged result's own, merged again
    if per_worker:
        out["per_worker"] = per_worker
    missing = [w.index for w in workers if not isinstance(w.doc.get("network"), dict)]
    if missing:
        out["workers_without_report"] = missing
    return out


def _is_time(key: str) -> bool:
    """Whether a dotted key is a time (``native.receive_wait_ns.p99``): not summed."""
    return any(part.endswith(("_ns", "_us", "_ms", "_s")) for part in key.split("."))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _merge_values(values: List[Tuple[int, Any]], path: str, per_worker: Dict[str, List[Dict[str, Any]]],
                  n: int) -> Any:
    """The workers' ``values`` (index, value) of one key of the network section, merged
    (see :func:`merge_network`); ``n``: how many workers have the section."""
    items = [v for _, v in values]
    if all(isinstance(v, dict) for v in items):
        keys = dict.fromkeys(k for v in items for k in v)
        return {k: _merge_values([(i, v[k]) for i, v in values if k in v], f"{path}{k}.", per_worker, n)
                for k in keys}
    key = path[:-1]
    if all(_is_count(v) for v in items) and key not in _NET_NOT_SUMMED and not _is_time(key):
        if len(items) < n:
            per_worker[key] = [{"worker": i, "value": v} for i, v in values]
        return sum(items)
    if len(items) == n and all(v == items[0] for v in items):
        return items[0]
    per_worker[key] = [{"worker": i, "value": v} for i, v in values]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        return max(items)
    if all(isinstance(v, str) for v in items):
        return ", ".join(dict.fromkeys(items))
    return items[0]


# -------------------------------------------------------------------- server metrics

def merge_server_metrics(workers: Sequence[_Worker], interval_s: float) -> Optional[Dict[str, Any]]:
    """The merged ``server_metrics`` section (``--server-metrics-url``); None when no
    worker scraped a server. Workers that scraped one URL saw one server, and those of
    different URLs different servers:

    - counters (``deltas``): one server's is its change from the earliest first scrape
      to the latest last one of the workers that scraped it (the largest counter at
      the end less the smallest at the start: the workers' own deltas overlap, each
      counting the others' requests too); the servers' changes are summed;
    - gauges: each with the fields of a run's (``first`` of the worker that started
      first, ``last`` of the one that ended last, ``min``, ``max``, ``mean`` over every
      sample of every worker, ``samples``), ``sum_of_server_means`` (each server's mean,
      summed over the servers: the queue of all, say) and ``workers``, each worker's own;
    - ``intervals`` on the wall clock, as the time series: per interval the counters'
      deltas of each server (the mean of its workers' deltas) summed, and the gauges'
      mean over the workers;
    - scrapes, failed scrapes and non-finite values summed, the workers' errors named,
      and ``workers``: each worker's URL, scrapes and own deltas."""
    sections = [(w, w.doc["server_metrics"]) for w in workers if isinstance(w.doc.get("server_metrics"), dict)]
    if not sections:
        return None
    servers: Dict[str, List[Tuple[_Worker, Dict[str, Any]]]] = {}
    for w, sm in sections:
        servers.setdefault(str(sm.get("url") or ""), []).append((w, sm))
    deltas: Dict[str, float] = {}
    before: Dict[str, float] = {}
    for group in servers.values():
        d, b = _server_counters([sm for _, sm in group])
        for target, part in ((deltas, d), (before, b)):
            for k, v in part.items():
                target[k] = target.get(k, 0.0) + v
    notes = [f"worker {w.index}: {n}" for w, sm in sections for n in sm.get("notes") or []]
    notes += [f"worker {w.index} has no server metrics: its server's figures are not in these"
              for w in workers if not isinstance(w.doc.get("server_metrics"), dict)]
    out: Dict[str, Any] = {
        "url": ", ".join(servers),
        "servers": len(servers),
        "scrapes": sum(int(sm.get("scrapes") or 0) for _, sm in sections),
        "failed_scrapes": sum(int(sm.get("failed_scrapes") or 0) for _, sm in sections),
        "errors": [f"worker {w.index}: {e}" for w, sm in sections for e in sm.get("errors") or []][:_MAX_MESSAGES],
        "deltas": {k: deltas[k] for k in sorted(deltas) if deltas[k]},
        "before": {k: before[k] for k in sorted(before)},
        "gauges": _merged_gauges(servers),
        "intervals": _merged_metric_intervals(servers, min(w.started for w in workers), interval_s),
        "series": max(int(sm.get("series") or 0) for _, sm in sections),
        "dropped_series": max(int(sm.get("dropped_series") or 0) for _, sm in sections),
        "non_finite_values": sum(int(sm.get("non_finite_values") or 0) for _, sm in sections),
        "workers": [{"worker": w.index, "url": sm.get("url"), "scrapes": sm.get("scrapes", 0),
                     "failed_scrapes": sm.get("failed_scrapes", 0), "deltas": sm.get("deltas") or {}}
                    for w, sm in sections],
        "merge": {"counters": "per server (URL): its change from the workers' earliest first scrape to their "
                              "latest last one; summed over the servers",
                  "gauges": "min, max and mean over every worker's samples; sum_of_server_means: each server's "
                            "mean summed over the servers; workers: each worker's own"},
    }
    if notes:
        out["notes"] = notes
    return out


def _server_counters(sections: Sequence[Dict[str, Any]]) -> Tuple[Dict[str, float], Dict[str, float]]:
    """One server's counters as several workers scraped it: (each counter's change over
    all their scrapes, its value at the earliest). A worker with fewer than two scrapes
    has no ``before``; without any that has, the largest of the workers' deltas."""
    spans = [sm for sm in sections if isinstance(sm.get("before"), dict)]
    if not spans:
        largest: Dict[str, float] = {}
        for sm in sections:
            for k, v in (sm.get("deltas") or {}).items():
                largest[k] = max(largest.get(k, v), v)
        return largest, {}
    keys = dict.fromkeys(k for sm in spans for k in list(sm["before"]) + list(sm.get("deltas") or {}))
    start = {k: min(float(sm["before"].get(k, 0.0)) for sm in spans) for k in keys}
    end = {k: max(float(sm["before"].get(k, 0.0)) + float((sm.get("deltas") or {}).get(k, 0.0)) for sm in spans)
           for k in keys}
    return {k: end[k] - start[k] for k in keys}, start


_GAUGE_FIELDS = ("first", "last", "min", "max", "mean", "samples")


def _merged_gauges(servers: Dict[str, List[Tuple[_Worker, Dict[str, Any]]]]) -> Dict[str, Dict[str, Any]]:
    """Each gauge over every worker and server (see :func:`merge_server_metrics`)."""
    seen: Dict[str, List[Tuple[_Worker, Dict[str, Any]]]] = {}
    server_means: Dict[str, List[float]] = {}
    for group in servers.values():
        pooled: Dict[str, List[Tuple[_Worker, Dict[str, Any]]]] = {}
        for w, sm in group:
            for key, g in (sm.get("gauges") or {}).items():
                if isinstance(g, dict) and g.get("samples"):
                    pooled.setdefault(key, []).append((w, g))
        for key, pairs in pooled.items():
            server_means.setdefault(key, []).append(_pooled_mean(pairs))
            seen.setdefault(key, []).extend(pairs)
    out: Dict[str, Dict[str, Any]] = {}
    for key in sorted(seen):
        pairs = seen[key]
        gauges = [g for _, g in pairs]
        out[key] = {
            "first": min(pairs, key=lambda p: p[0].started)[1]["first"],
            "last": max(pairs, key=lambda p: p[0].started + float(p[0].doc.get("duration_s", 0.0)))[1]["last"],
            "min": min(g["min"] for g in gauges), "max": max(g["max"] for g in gauges),
            "mean": _pooled_mean(pairs), "samples": sum(int(g["samples"]) for g in gauges),
            "sum_of_server_means": sum(server_means[key]),
            "workers": [{"worker": w.index, **{f: g.get(f) for f in _GAUGE_FIELDS}} for w, g in pairs],
        }
    return out


def _pooled_mean(pairs: Sequence[Tuple[_Worker, Dict[str, Any]]]) -> float:
    """The mean over every sample of the workers' gauge statistics."""
    return float(sum(g["mean"] * g["samples"] for _, g in pairs) / sum(g["samples"] for _, g in pairs))


def _merged_metric_intervals(servers: Dict[str, List[Tuple[_Worker, Dict[str, Any]]]], t0: float,
                             interval_s: float) -> List[Dict[str, Any]]:
    """The workers' scrape intervals on one wall clock (binned as the time series are):
    per interval, each server's counter deltas (the mean over its workers in the bin)
    summed over the servers, and each gauge's mean over the workers in the bin."""
    if interval_s <= 0:
        return []
    deltas: Dict[int, Dict[str, float]] = {}
    gauges: Dict[int, Dict[str, List[float]]] = {}
    for group in servers.values():
        server: Dict[int, Dict[str, List[float]]] = {}
        for w, sm in group:
            for p in sm.get("intervals") or []:
                k = max(0, round((w.started + float(p.get("t_s", 0.0)) - t0) / interval_s))
                for key, v in (p.get("deltas") or {}).items():
                    server.setdefault(k, {}).setdefault(key, []).append(float(v))
                for key, v in (p.get("gauges") or {}).items():
                    gauges.setdefault(k, {}).setdefault(key, []).append(float(v))
                server.setdefault(k, {})
        for k, by_key in server.items():
            bin_deltas = deltas.setdefault(k, {})
            for key, vs in by_key.items():
                bin_deltas[key] = bin_deltas.get(key, 0.0) + sum(vs) / len(vs)
    return [{"t_s": round(k * interval_s, 3), "deltas": deltas.get(k, {}),
             "gauges": {key: sum(vs) / len(vs) for key, vs in (gauges.get(k) or {}).items()}}
            for k in sorted(set(deltas) | set(gauges))]


# ------------------------------------------------------------------------ the run

def _total_options(first: _Worker, expected: int) -> RunOptions:
    """The effective options of the whole run: the first worker's, with the load of all
    workers together (its ``worker.total``)."""
    known = {f.name for f in dataclasses.fields(RunOptions)}
    effective = first.doc.get("settings", {}).get("effective", {})
    values = {k: v for k, v in effective.items() if k in known}
    if first.section:
        values.update({k: v for k, v in (first.section.get("total") or {}).items() if k in known})
        values.update(workers=expected, worker_index=None)
    return RunOptions(**values)


def _engine_settings(first: _Worker, o: RunOptions) -> EngineSettings:
    """The engine settings of the whole run: the first worker's, with the total load."""
    known = {f.name for f in dataclasses.fields(EngineSettings)}
    raw = {k: v for k, v in first.doc.get("settings", {}).get("engine", {}).items() if k in known}
    s = EngineSettings(**raw)
    s.latency_bounds_ns = tuple(int(b["bound_ns"]) for b in first.doc.get("latency_bounds", []))
    if not first.section or first.section.get("count", 1) <= 1:
        return s
    s.query_count, s.min_query_count = o.query_count, o.min_query_count or 0
    if s.mode in ("constant", "poisson"):
        s.target_qps = o.target_qps
    elif s.mode == "closed":
        s.concurrency = o.concurrency
    elif s.mode == "stages" and o.stages:
        s.stages = parse_stages(o.stages, o.ramp)
    return s


def _sum_counts(workers: Sequence[_Worker]) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for w in workers:
        for key, value in w.doc.get("counts", {}).items():
            if key in _DERIVED_COUNTS:
                continue
            if key in _EXTREMES:
                counts[key] = _EXTREMES[key](counts[key], value) if key in counts else value
            else:
                counts[key] = counts.get(key, 0) + value
    for key in ("issued", "completed", "failed", "timed_out", "cancelled"):
        counts.setdefault(key, 0)
    return counts


def _over_bound(workers: Sequence[_Worker], bounds: Sequence[int]) -> List[int]:
    """For each bound, the exact count over it summed over the workers that counted it."""
    over = {int(b): 0 for b in bounds}
    for w in workers:
        for entry in w.doc.get("latency_bounds", []):
            if int(entry["bound_ns"]) in over:
                over[int(entry["bound_ns"])] += int(entry["over"])
    return [over[int(b)] for b in bounds]


def _errors(workers: Sequence[_Worker]) -> Tuple[Dict[str, int], List[str]]:
    counts: Dict[str, int] = {}
    messages: List[str] = []
    for w in workers:
        errors = w.doc.get("errors") or {}
        for kind, n in (errors.get("counts") or {}).items():
            counts[kind] = counts.get(kind, 0) + n
        for message in errors.get("messages") or []:
            if message not in messages and len(messages) < _MAX_MESSAGES:
                messages.append(message)
    return counts, messages


def _run_result(workers: Sequence[_Worker], histograms: Dict[str, Histogram], o: RunOptions,
                t0: float) -> RunResult:
    """The merged parts as one :class:`RunResult`, for the scenario's rules and
    :func:`build_document`."""
    settings = _engine_settings(workers[0], o)
    empty = Histogram(significant_figures=settings.significant_figures)
    engine = {attr: histograms.get(key, empty).copy() for key, attr in _ENGINE.items()}
    errors, messages = _errors(workers)
    end = max(w.started + float(w.doc.get("duration_s", 0.0)) for w in workers)
    issue_end = max(w.started + float(w.doc.get("issue_duration_s", 0.0)) for w in workers)
    return RunResult(
        counts=_sum_counts(workers),
        timeseries=_merge_timeseries(workers, t0, float(settings.interval_s)),
        errors=errors,
        error_messages=messages,
        duration_s=max(end - t0, 0.0),
        issue_duration_s=max(issue_end - t0, 0.0),
        interrupted=any(bool(w.doc.get("interrupted")) for w in workers),
        settings=settings,
        samples_per_query=int(o.samples_per_query or 1),
        over_bound=_over_bound(workers, settings.latency_bounds_ns),
        sched_slice_applied=all(bool((w.doc.get("issuing") or {}).get("sched_slice_applied")) for w in workers),
        **engine,
    )


# Per-interval counts summed over the workers (``outstanding`` too: the queries every
# worker had in flight at the interval's end), and per-interval percentiles that no
# interval histogram is carried for: the merged point has the largest of the workers'
# (an upper bound of the whole's percentile, exact for the max).
_INTERVAL_SUMS = ("issued", "completed", "failed", "timed_out", "outstanding", "tokens")
_INTERVAL_MAXIMA = ("issue_delay_p50_ns", "issue_delay_p99_ns", "issue_delay_max_ns", "ttft_p50_ns", "ttft_p99_ns")


def _merge_timeseries(workers: Sequence[_Worker], t0: float, interval_s: float) -> List[Dict[str, Any]]:
    """The workers' time series on one wall clock, in the engine's form (see the module's
    docstring for the alignment rule): per merged interval, the counts (and errors by
    kind) summed, the latency histograms added, and for the issue delay and TTFT the
    largest of the workers' percentiles (see ``_INTERVAL_MAXIMA``)."""
    if interval_s <= 0:
        return []
    bins: Dict[int, Dict[str, Any]] = {}
    for w in workers:
        for i, p in enumerate(w.doc.get("timeseries") or []):
            k = max(0, round((w.started + float(p["t_s"]) - t0) / interval_s))
            b = bins.setdefault(k, {"length_s": 0.0, "hdr": None, "errors": {},
                                    **{key: 0 for key in _INTERVAL_SUMS + _INTERVAL_MAXIMA}})
            b["length_s"] = max(b["length_s"], float(p["length_s"]))
            for key in _INTERVAL_SUMS:
                b[key] += int(p.get(key, 0))
            for key in _INTERVAL_MAXIMA:
                b[key] = max(b[key], p.get(key, 0))
            for kind, n in (p.get("errors") or {}).items():
                b["errors"][kind] = b["errors"].get(kind, 0) + int(n)
            if p.get("latency_hdr"):
                h = _decode(w.path, f"timeseries[{i}].latency_hdr", p["latency_hdr"])
                try:
                    b["hdr"] = h if b["hdr"] is None else b["hdr"].add(h)
                except ValueError as e:
                    raise ValueError(f"{w.path}: timeseries[{i}].latency_hdr cannot be added: {e}") from None
    return [_merged_point(k, bins[k], interval_s) for k in sorted(bins)]


def _merged_point(k: int, b: Dict[str, Any], interval_s: float) -> Dict[str, Any]:
    """Merged interval ``k`` in the engine's form, from its bin of the workers' figures."""
    h = b["hdr"] or Histogram()
    p50, p90, p99 = h.values_at_percentiles([50.0, 90.0, 99.0]).tolist()
    return {
        "start_offset_ns": s_to_ns(k * interval_s), "length_ns": s_to_ns(b["length_s"]),
        **{key: b[key] for key in _INTERVAL_SUMS + _INTERVAL_MAXIMA},
        "latency_p50_ns": p50, "latency_p90_ns": p90, "latency_p99_ns": p99,
        "latency_max_ns": h.max, "latency_hdr": base64.b64decode(h.encode()), "errors": b["errors"],
    }


def _worker_figures(w: _Worker) -> Dict[str, Any]:
    """A worker's own figures, for the ``"merge"`` section."""
    section = w.section
    return {
        "index": w.index,
        "path": w.path,
        "hostname": section.get("hostname") or (w.doc.get("environment") or {}).get("hostname"),
        "pod": section.get("pod"),
        "completed": int(w.doc.get("counts", {}).get("completed", 0)),
        "qps": float((w.doc.get("throughput") or {}).get("completed_qps", 0.0)),
        "p99_ns": float((w.doc.get("latency_ns") or {}).get("p99", 0)),
        "valid": bool(w.doc.get("valid")),
        "invalid_reasons": list(w.doc.get("invalid_reasons", [])),
        # the worker's own diagnosis: the merged one lacks the workers' host figures
        "diagnosis": (w.doc.get("diagnosis") or {}).get("summary"),
        "start_late_s": section.get("start_late_s"),
        "started_at_epoch_s": w.started,
    }


# -------------------------------------------------------------------------- sweeps

def sweep_key(path: str, doc: Dict[str, Any]) -> str:
    """What identifies a sweep point across the workers' sweep folders: its
    ``sweep.key`` when the document has one, else the point's folder name
    (``points/NNN-<slug>``)."""
    sweep = doc.get("sweep")
    if isinstance(sweep, dict) and "key" in sweep:
        return json.dumps(sweep["key"], sort_keys=True)
    return os.path.basename(os.path.dirname(os.path.abspath(path)))


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


def _sweep_section(workers: Sequence[_Worker]) -> Dict[str, Any]:
    """A merged point's ``sweep`` section: the first worker's (index, values, key,
    repeat, seeds), with the status of the point on every worker: "done" when it is
    done on each, else the first other status (a worker's point failed or was
    interrupted)."""
    section: Dict[str, Any] = dict(workers[0].doc.get("sweep") or {})
    statuses = [str((w.doc.get("sweep") or {}).get("status", "done")) for w in workers]
    section["status"] = next((s for s in statuses if s != "done"), "done")
    section.pop("wall_s", None)
    return section


def sweep_records(merged: Sequence[Tuple[str, Dict[str, Any]]],
                  workers_records: Sequence[Sequence[Dict[str, Any]]] = ()) -> List[Dict[str, Any]]:
    """The merged points of :func:`merge_sweeps` as the lines of a sweep's sweep.jsonl
    (:mod:`loadgen.sweep.files`), in point order: each document with its ``sweep``
    section, complete (index, repeat, key, values, status, dir) also for points from
    results that lack one. ``workers_records``: the workers' own sweep.jsonl lines; a
    point that no worker has a result of (it failed everywhere: a hook, the server's
    readiness) is kept as the first worker's record of it, as a sweep keeps it."""
    keys = {str((doc.get("sweep") or {}).get("key")) for _, doc in merged}
    records = []
    for lines in workers_records:
        for record in lines:
            if str(record["sweep"]["key"]) not in keys and "schema" not in record:
                keys.add(str(record["sweep"]["key"]))
                records.append(record)
    for i, (name, doc) in enumerate(merged):
        section = dict(doc.get("sweep") or {})
        section.setdefault("index", i)
        section.setdefault("repeat", 0)
        section.setdefault("key", name)
        if not isinstance(section["key"], str):  # a sweep's keys are texts
            section["key"] = json.dumps(section["key"], sort_keys=True)
        section.setdefault("status", "done")
        if not isinstance(section.get("values"), dict) or not section["values"]:
            section["values"] = {"point": name}
        section["dir"] = f"{POINTS_DIR}/{name}"
        records.append({**doc, "sweep": section})
    return sorted(records, key=lambda r: (r["sweep"]["index"], r["sweep"]["repeat"]))


def merged_manifest(manifests: Sequence[Optional[Dict[str, Any]]], records: Sequence[Dict[str, Any]],
                    sources: Sequence[str]) -> Dict[str, Any]:
    """The sweep.json of a merged sweep: the first worker's manifest (its base options
    with the load of all workers, no worker index), the merged points, and
    ``merged_from``, the workers' sweep folders. A worker folder without a manifest
    gives one with the swept names of the points' values."""
    first = next((m for m in manifests if m), None)
    now = datetime.datetime.now(tz=datetime.timezone.utc).isoformat(timespec="seconds")
    manifest: Dict[str, Any] = dict(first) if first else {
        "schema": MANIFEST_SCHEMA, "created_at": now, "base": {},
        "swept": list(dict.fromkeys(k for r in records for k in r["sweep"]["values"]))}
    base = dict(manifest.get("base") or {})
    base.pop("worker_index", None)
    manifest.update(base=base, updated_at=now, merged_from=list(sources), points=[
        {k: r["sweep"][k] for k in ("index", "repeat", "key", "values", "dir", "seed") if k in r["sweep"]}
        for r in records])
    return manifest
