"""The engine's figures of the merged run: histograms added exactly, counts and over-bound
counts summed, the time series on one wall clock, as one
:class:`~loadgen.engine.RunResult` with the options of the total load.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any, Dict, List, Sequence, Tuple

from loadgen.engine import EngineSettings, RunResult
from loadgen.options import RunOptions, parse_stages
from loadgen.results.merge.sections import merge_llm, merge_network
from loadgen.results.merge.workers import MAX_MESSAGES, Worker, worker_name
from loadgen.stats.histogram import HdrDecodeError, Histogram
from loadgen.sut.report import NamedHistogram
from loadgen.units import s_to_ns

__all__ = ["MergedSUT", "decode_histogram", "merge_histograms", "run_result", "total_options"]

# The engine's histograms: document key -> RunResult attribute.
_ENGINE = {"latency_ns": "latency", "service_time_ns": "service_time", "issue_delay_ns": "issue_delay",
           "ttft_ns": "ttft", "tpot_ns": "tpot"}
# Counts that are extremes, not sums; and one the document derives again.
_EXTREMES = {"out_of_range_min_ns": min, "out_of_range_max_ns": max}
_DERIVED_COUNTS = ("samples_completed",)


def _histogram_keys(doc: Dict[str, Any]) -> List[str]:
    """The histograms of a document: those its index lists, else every ``*_ns`` summary."""
    index = doc.get("histograms")
    if isinstance(index, dict) and index:
        return [k for k in index if isinstance(doc.get(k), dict) and "hdr" in doc[k]]
    return [k for k, v in doc.items() if k.endswith("_ns") and isinstance(v, dict) and "hdr" in v]


def decode_histogram(path: str, where: str, text: Any) -> Histogram:
    """A document's encoded histogram; ValueError naming the file and key when it is not one."""
    try:
        return Histogram.decode(text)
    except (HdrDecodeError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: {where} is not an encoded histogram: {e}") from None


def merge_histograms(workers: Sequence[Worker]) -> Tuple[Dict[str, Histogram], List[str]]:
    """Every histogram of the workers, added exactly; and the reasons for any that could
    not be (another layout: added at each bucket's lowest value; beyond the range: left
    out). ValueError naming the file for a payload that does not decode."""
    merged: Dict[str, Histogram] = {}
    reasons: List[str] = []
    for w in workers:
        for key in _histogram_keys(w.doc):
            h = decode_histogram(w.path, f"{key}.hdr", w.doc[key]["hdr"])
            if key not in merged:
                merged[key] = h
                continue
            if not merged[key].same_layout(h):
                reasons.append(f"{worker_name(w)}'s {key} histogram has another layout (significant figures or "
                               "range) than the first worker's: it is added at bucket precision")
            try:
                merged[key].add(h)
            except ValueError as e:
                reasons.append(f"{worker_name(w)}'s {key} histogram cannot be added ({e}); it is left out")
    return merged, reasons


@dataclasses.dataclass
class MergedSUT:
    """The SUT's side of the merged run, for :func:`build_document`: the workers' own
    histograms (a network client's) added, and the first worker's report with the
    connections and tokens of all."""

    workers: Sequence[Worker]
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


def total_options(first: Worker, expected: int) -> RunOptions:
    """The effective options of the whole run: the first worker's, with the load of all
    workers together (its ``worker.total``)."""
    known = {f.name for f in dataclasses.fields(RunOptions)}
    effective = first.doc.get("settings", {}).get("effective", {})
    values = {k: v for k, v in effective.items() if k in known}
    if first.section:
        values.update({k: v for k, v in (first.section.get("total") or {}).items() if k in known})
        values.update(workers=expected, worker_index=None)
    return RunOptions(**values)


def _engine_settings(first: Worker, o: RunOptions) -> EngineSettings:
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


def _sum_counts(workers: Sequence[Worker]) -> Dict[str, int]:
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


def _over_bound(workers: Sequence[Worker], bounds: Sequence[int]) -> List[int]:
    """For each bound, the exact count over it summed over the workers that counted it."""
    over = {int(b): 0 for b in bounds}
    for w in workers:
        for entry in w.doc.get("latency_bounds", []):
            if int(entry["bound_ns"]) in over:
                over[int(entry["bound_ns"])] += int(entry["over"])
    return [over[int(b)] for b in bounds]


def _errors(workers: Sequence[Worker]) -> Tuple[Dict[str, int], List[str]]:
    counts: Dict[str, int] = {}
    messages: List[str] = []
    for w in workers:
        errors = w.doc.get("errors") or {}
        for kind, n in (errors.get("counts") or {}).items():
            counts[kind] = counts.get(kind, 0) + n
        for message in errors.get("messages") or []:
            if message not in messages and len(messages) < MAX_MESSAGES:
                messages.append(message)
    return counts, messages


def run_result(workers: Sequence[Worker], histograms: Dict[str, Histogram], o: RunOptions,
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


def _merge_timeseries(workers: Sequence[Worker], t0: float, interval_s: float) -> List[Dict[str, Any]]:
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
                h = decode_histogram(w.path, f"timeseries[{i}].latency_hdr", p["latency_hdr"])
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
