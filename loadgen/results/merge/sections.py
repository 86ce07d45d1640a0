"""The sections beside the engine's figures, merged: the GPUs sampled (each counted once),
the network report, an OpenAI target's ``llm`` section and the server's metrics.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from loadgen.results.merge.workers import MAX_MESSAGES, Worker

__all__ = ["merge_gpu", "merge_llm", "merge_network", "merge_server_metrics"]


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


def merge_network(workers: Sequence[Worker]) -> Dict[str, Any]:
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


def merge_server_metrics(workers: Sequence[Worker], interval_s: float) -> Optional[Dict[str, Any]]:
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
    servers: Dict[str, List[Tuple[Worker, Dict[str, Any]]]] = {}
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
        "errors": [f"worker {w.index}: {e}" for w, sm in sections for e in sm.get("errors") or []][:MAX_MESSAGES],
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


def _merged_gauges(servers: Dict[str, List[Tuple[Worker, Dict[str, Any]]]]) -> Dict[str, Dict[str, Any]]:
    """Each gauge over every worker and server (see :func:`merge_server_metrics`)."""
    seen: Dict[str, List[Tuple[Worker, Dict[str, Any]]]] = {}
    server_means: Dict[str, List[float]] = {}
    for group in servers.values():
        pooled: Dict[str, List[Tuple[Worker, Dict[str, Any]]]] = {}
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


def _pooled_mean(pairs: Sequence[Tuple[Worker, Dict[str, Any]]]) -> float:
    """The mean over every sample of the workers' gauge statistics."""
    return float(sum(g["mean"] * g["samples"] for _, g in pairs) / sum(g["samples"] for _, g in pairs))


def _merged_metric_intervals(servers: Dict[str, List[Tuple[Worker, Dict[str, Any]]]], t0: float,
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
