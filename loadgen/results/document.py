"""The result document of a run: one versioned JSON document (``"schema":
"loadgen.result/1"``) holding the settings, counts, every histogram (percentiles and the
encoded HDR payload, and a ``"histograms"`` index of their units), the time series,
validity with reasons, the diagnosis (which side limited the run, with its numbers) and
named warnings, errors and the environment. Everything else is rendered from it
(:mod:`loadgen.results.render`).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import os
import platform
import sys
from typing import Any, Dict, Sequence

from loadgen._version import __version__
from loadgen.engine import RunResult
from loadgen.engine.settings import allowed_cpus
from loadgen.options import RunOptions, parse_labels
from loadgen.results.cost import add_cost
from loadgen.results.goodput import goodput_section
from loadgen.results.thresholds import evaluate_thresholds
from loadgen.scenarios import Scenario
from loadgen.scenarios.base import common_invalid_reasons, require
from loadgen.scenarios.diagnosis import add_diagnosis
from loadgen.stats.histogram import Histogram
from loadgen.sut.report import NamedHistogram, ReportingSUT
from loadgen.units import ns_to_s

__all__ = ["SCHEMA", "build_document", "environment", "histogram_summary", "named_histogram_summary",
           "timeseries_point"]

SCHEMA = "loadgen.result/1"
_PCT_KEYS = {50.0: "p50", 90.0: "p90", 95.0: "p95", 99.0: "p99", 99.9: "p99.9", 99.99: "p99.99"}

# The engine's histograms: document key -> RunResult attribute. The first three are
# always in the document; the token ones when something was recorded.
_ENGINE_HISTOGRAMS = {"latency_ns": "latency", "service_time_ns": "service_time",
                      "issue_delay_ns": "issue_delay", "ttft_ns": "ttft", "tpot_ns": "tpot"}
_ALWAYS = ("latency_ns", "service_time_ns", "issue_delay_ns")
# The engine's per-interval figures a timeseries point carries under the same name.
INTERVAL_FIGURES = ("issue_delay_p50_ns", "issue_delay_p99_ns", "issue_delay_max_ns",
                    "ttft_p50_ns", "ttft_p99_ns", "tokens")
# The warm-up's counts: in the document's "warmup" section, not in "counts".
_WARMUP_COUNTS = ("warmup_issued", "warmup_completed", "warmup_failed")


def histogram_summary(h: Histogram) -> Dict[str, Any]:
    """count, min, mean, max, stddev, p50..p99.99 (ns) and the base64 V2 ``hdr``."""
    out: Dict[str, Any] = {
        "count": h.total_count,
        "min": h.min,
        "mean": h.mean,
        "max": h.max,
        "stddev": h.stddev,
    }
    for key, value in zip(_PCT_KEYS.values(), h.percentiles(_PCT_KEYS).values()):
        out[key] = value
    out["hdr"] = h.encode()
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(pin_cpus: Sequence[int] = ()) -> Dict[str, Any]:
    """Where the run happened: versions, platform, kernel, CPU model and governor, the
    affinity, the usable CPUs (affinity and cgroup cpuset) and the NUMA nodes."""
    from loadgen import placement

    topo = placement.read_topology(gpus=[])
    return {
        "loadgen_version": __version__,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity": allowed_cpus(),
        "issue_thread_cpus": list(pin_cpus),
        "kernel": platform.release(),
        "cpu_governor": placement.cpu_governor(),
        "usable_cpus": topo.usable,
        "cgroup_cpus": topo.cgroup_cpus,
        "physical_cores": len(topo.cores),
        "numa_nodes": {str(node): cpus for node, cpus in topo.numa_nodes.items()},
    }


def named_histogram_summary(named: NamedHistogram) -> Dict[str, Any]:
    """:func:`histogram_summary` of a SUT's histogram, its figures in ``named.unit``: a
    scaled histogram's figures are divided by its scale, and ``hdr_unit`` says what the
    encoded ``hdr`` holds."""
    summary = histogram_summary(named.histogram)
    if named.scale == 1:
        return summary
    out = {k: (v / named.scale if k not in ("count", "hdr") else v) for k, v in summary.items()}
    out["hdr_unit"] = named.recorded_unit
    return out


def build_document(scenario: Scenario, o: RunOptions, result: RunResult, *, interrupted: bool,
                   given: Dict[str, Any], started_wall: float, sut: Any = None) -> Dict[str, Any]:
    """The ``loadgen.result/1`` document of a finished run.

    Args:
        scenario: the scenario that ran; its metric, validity rules and early stopping.
        o: the effective options.
        result: what the engine measured.
        interrupted: the run was stopped early.
        given: the options as the user gave them.
        started_wall: the wall-clock start, in seconds since the epoch. The document's
            ``started_at`` is when measuring began: this plus any warm-up.
        sut: the SUT; a :class:`~loadgen.sut.ReportingSUT` adds its histograms and its
            report (the ``"network"`` section).
    """
    c = dict(result.counts)
    warmup = {key[len("warmup_"):]: c.pop(key) for key in _WARMUP_COUNTS if key in c}
    # The engine's per-query SLO and stream-rate sums (merge adds them up), only where used.
    for prefix, used in (("slo_", bool(o.slo)), ("stream_rate_", bool(c.get("stream_rate_count")))):
        for key in [key for key in c if key.startswith(prefix) and not used]:
            del c[key]
    c["samples_completed"] = c["completed"] * require(o.samples_per_query, "--samples-per-query")
    reasons = common_invalid_reasons(scenario, result, o, interrupted)
    reasons += [r for r in scenario.invalid_reasons(result, o) if r not in reasons]
    doc: Dict[str, Any] = {
        "schema": SCHEMA,
        "scenario": scenario.name,
        "sut": o.sut,
        "valid": not reasons,
        "invalid_reasons": reasons,
        "interrupted": interrupted,
        "labels": parse_labels(o.label),
        "metric": scenario.metric(result, o),
        "started_at": _dt.datetime.fromtimestamp(started_wall + o.unmeasured_s, tz=_dt.timezone.utc).isoformat(),
        "started_at_epoch_s": started_wall + o.unmeasured_s,
        "duration_s": result.duration_s,
        "issue_duration_s": result.issue_duration_s,
        "settings": _settings_section(o, result, given),
        # How the issue thread was set up: its scheduler slice request and whether the
        # kernel took it (a busy node's neighbours preempt it otherwise).
        "issuing": {"sched_slice_us": o.sched_slice_us, "sched_slice_applied": result.sched_slice_applied},
        "counts": c,
        "throughput": _throughput_section(o, result),
        **({"warmup": {"duration_s": o.unmeasured_s, **warmup,
                       **({"ramp_up_s": o.ramp_up_s} if o.ramp_up_s else {})}} if o.unmeasured_s > 0 else {}),
        # Exact counts kept by the engine as it recorded (never a bucket estimate).
        "latency_bounds": [
            {"bound_ns": int(bound), "over": int(over)}
            for bound, over in zip(result.settings.latency_bounds_ns, result.over_bound)
        ],
    }
    goodput = goodput_section(c, o.slo, result.duration_s)
    if goodput is not None:
        doc["goodput"] = goodput
    index = _add_engine_histograms(doc, result)
    if isinstance(sut, ReportingSUT):
        index.update(_add_sut_histograms(doc, sut.histograms()))
        report = sut.report()
        if report:
            llm = report.pop("llm", None)  # an OpenAI target's workload: a section of its own
            doc["network"] = report
            if llm is not None:
                doc["llm"] = llm
                _add_input_rate(doc["throughput"], llm, result.duration_s)
    doc["histograms"] = index
    es = scenario.early_stopping(result, o)
    if es is not None:
        doc["early_stopping"] = es
    doc["timeseries"] = [timeseries_point(p) for p in result.timeseries]
    doc["errors"] = {"counts": result.errors, "messages": result.error_messages}
    doc["environment"] = environment(o.pin_cpus)
    doc["thresholds"] = evaluate_thresholds(doc, o.fail_if, o.require)
    add_cost(doc, o.price_per_hour)  # a per-GPU price is priced again once the GPUs sampled are in
    # Which side limited the run; diagnosed again when the host's figures are added.
    return add_diagnosis(doc)


def _settings_section(o: RunOptions, result: RunResult, given: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "given": dict(given),
        "effective": o.as_dict(),
        "engine": {k: (list(v) if isinstance(v, tuple) else v)
                   for k, v in dataclasses.asdict(result.settings).items() if k != "trace_offsets_ns"},
    }


def _throughput_section(o: RunOptions, result: RunResult) -> Dict[str, Any]:
    issued = result.counts["issued"]
    tokens = int(result.counts.get("tokens", 0))
    streams = int(result.counts.get("stream_rate_count", 0))
    return {
        "completed_qps": result.completed_qps,
        "samples_per_s": result.samples_per_s,
        "target_qps": o.target_qps,
        "scheduled_qps": issued / result.issue_duration_s if result.issue_duration_s > 0 else 0.0,
        **({"output_tokens_per_s": tokens / result.duration_s} if tokens > 0 and result.duration_s > 0 else {}),
        # the mean over requests of tokens / (completed - first token)
        **({"output_tokens_per_s_per_stream": result.counts["stream_rate_milli_sum"] / streams / 1000.0}
           if streams else {}),
    }


def _add_input_rate(throughput: Dict[str, Any], llm: Dict[str, Any], duration_s: float) -> None:
    """``input_tokens_per_s``: the input tokens of the requests sent (an LLM target's
    ``llm.requests.input_tokens_sent``, when its workload knows them) per second of the run;
    an embeddings run's token throughput (it has no output tokens)."""
    sent = (llm.get("requests") or {}).get("input_tokens_sent") or 0
    if sent > 0 and duration_s > 0:
        throughput["input_tokens_per_s"] = sent / duration_s


def _add_engine_histograms(doc: Dict[str, Any], result: RunResult) -> Dict[str, Dict[str, Any]]:
    """Puts the engine's histograms in ``doc``; returns their index entries."""
    index = {}
    for key, attr in _ENGINE_HISTOGRAMS.items():
        h: Histogram = getattr(result, attr)
        if key in _ALWAYS or h.total_count:
            doc[key] = histogram_summary(h)
            index[key] = {"unit": "ns", "source": "engine"}
    return index


def _add_sut_histograms(doc: Dict[str, Any], named: Dict[str, NamedHistogram]) -> Dict[str, Dict[str, Any]]:
    """Puts a SUT's non-empty histograms in ``doc`` under keys it does not have yet;
    returns their index entries."""
    index = {}
    for key, nh in named.items():
        if key in doc or not nh.histogram.total_count:
            continue
        doc[key] = named_histogram_summary(nh)
        entry: Dict[str, Any] = {"unit": nh.unit, "source": "sut"}
        if nh.scale != 1:
            entry.update(scale=nh.scale, hdr_unit=nh.recorded_unit)
        index[key] = entry
    return index


def timeseries_point(p: Dict[str, Any]) -> Dict[str, Any]:
    """One interval of the engine's time series as the document's ``timeseries`` holds it.
    Points from before the richer series (a merge of older documents) get 0 and ``{}``
    for the figures they lack."""
    length_s = ns_to_s(p["length_ns"])
    return {
        "t_s": ns_to_s(p["start_offset_ns"]),
        "length_s": length_s,
        "issued": p["issued"],
        "completed": p["completed"],
        "qps": p["completed"] / length_s if p["length_ns"] > 0 else 0.0,
        "p50_ns": p["latency_p50_ns"],
        "p90_ns": p.get("latency_p90_ns", 0),
        "p99_ns": p["latency_p99_ns"],
        "max_ns": p["latency_max_ns"],
        "failed": p.get("failed", 0),
        "timed_out": p.get("timed_out", 0),
        "errors": dict(p.get("errors") or {}),
        "outstanding": p.get("outstanding", 0),
        **{key: p.get(key, 0) for key in INTERVAL_FIGURES},
        "latency_hdr": base64.b64encode(p["latency_hdr"]).decode("ascii"),
    }
