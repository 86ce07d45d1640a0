"""What the HTML report's charts show, computed from result documents: chart specs
(plain dicts, serialized to JSON and drawn by ``report.js`` with BokehJS).

A chart spec is ``{"id", "title", "x_label", "y_label", "series": [{"name", "x", "y",
"color", ...}], ...}`` (see ``report.js`` for every key). Values are rounded to four
significant figures and missing ones are None (a gap in a line), so that a one-hour run
with 1 s intervals stays small. Nothing here escapes text: the page escapes every string
it writes (:mod:`loadgen.results.html`).

The rules every time chart follows (:data:`TIMELINE_NOTE` says them on the page): an
interval shorter than half the run's longest (the last one, cut short by the run's end)
is left out; an interval without a value (no query completed, no first token) is a gap,
None, never 0; a chart is drawn only for figures the run has (no TTFT chart without first
tokens, no errors chart without errors); with several runs, each run keeps one colour in
every chart and its lines differ by dash, with one run each line has its own colour.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from loadgen.stats.histogram import Histogram
from loadgen.units import NS_PER, ns_to_ms

__all__ = ["MAX_POINTS", "PALETTE", "PARTIAL_SHARE", "Run", "TIMELINE_NOTE", "drawn_intervals", "error_charts", "gpu_charts", "host_charts", "latency_chart",
           "llm_sweep_charts", "metric_charts", "rate_chart", "spectrum_charts", "sweep_chart", "time_charts"]

Run = Tuple[str, Dict[str, Any]]  # (the name shown for a run, its result document)
Spec = Dict[str, Any]

#: The most points a time-series line keeps; longer series are thinned by buckets
#: (the peak of each bucket for latencies and errors, the mean for rates and readings).
MAX_POINTS = 4000
#: Colors of the lines, in order (Bokeh's Category10 without its grey, which axes and text use).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
#: Dashes of a run's lines when several runs share a chart (Bokeh's names, then on/off patterns).
_DASHES = ("solid", "dashed", "dotted", "dotdash", "dashdot", "2 6", "12 4 2 4 2 4", "16 4")
#: An interval shorter than this share of the run's longest is not drawn: rates and
#: percentiles over the few milliseconds between the last full interval and the run's end
#: would be noise (a spike in every chart). The whole-run figures count it.
PARTIAL_SHARE = 0.5
TIMELINE_NOTE = ("Each point is one interval, at its middle. An interval shorter than half the run's longest "
                 "(the last one, cut short by the run's end) is left out of every time chart: rates and "
                 "percentiles over a few milliseconds would be noise; the whole-run figures count it. An "
                 "interval without a value (no query completed, no first token) is a gap in the line. Server "
                 "counters' rates follow the same rule over the time between scrapes. With several runs, "
                 "each run has one colour in every chart, and its lines differ by dash.")
#: The spectrum's x values, 1/(1-p): from p50 (2) to p99.999 (1e5), 12 per decade.
_SPECTRUM_X = [10 ** (math.log10(2) + i * (5 - math.log10(2)) / 56) for i in range(57)]
#: Histograms shown as spectra, in this order, and their names (others of a time unit follow).
_SPECTRA = {"latency_ns": "latency", "service_time_ns": "service time", "issue_delay_ns": "issue delay",
            "ttft_ns": "TTFT", "ttfrt_ns": "time to first reasoning token", "ttfat_ns": "time to first answer token",
            "itl_ns": "ITL between chunks", "itl_per_token_ns": "ITL per token", "tpot_ns": "TPOT"}
_TIME_GROUP = "time"


def _r(v: Any, digits: int = 4) -> Optional[float]:
    """``v`` rounded to ``digits`` significant figures; None for what is not a finite number."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(f"{v:.{digits}g}")


def _ms(ns: Any) -> Optional[float]:
    return _r(ns / NS_PER["ms"]) if isinstance(ns, (int, float)) and not isinstance(ns, bool) else None


def _thin(x: List[float], ys: Sequence[List[Optional[float]]], peak: bool) -> Tuple[List[float], List[List[Any]]]:
    """At most :data:`MAX_POINTS` points: each bucket's first x and its peak (or mean) y."""
    n = len(x)
    if n <= MAX_POINTS:
        return x, [list(y) for y in ys]
    step = math.ceil(n / MAX_POINTS)
    xs = [x[i] for i in range(0, n, step)]
    out: List[List[Any]] = []
    for y in ys:
        col: List[Any] = []
        for i in range(0, n, step):
            vals = [v for v in y[i:i + step] if v is not None]
            col.append(None if not vals else max(vals) if peak else _r(sum(vals) / len(vals)))
        out.append(col)
    return xs, out


Getter = Callable[[Dict[str, Any]], Any]


def _same(v: Any) -> Any:
    return v


def _times(factor: float) -> Callable[[Any], Optional[float]]:
    """A scale: the value times ``factor``, rounded (None stays None)."""
    def scale(v: Any) -> Optional[float]:
        return None if not isinstance(v, (int, float)) else _r(v * factor)
    return scale


def _at(*path: str, scale: Callable[[Any], Any] = _same, default: Any = None) -> Getter:
    """A getter of ``point[path[0]][path[1]]...`` (``default`` when absent), scaled."""
    def get(point: Dict[str, Any]) -> Any:
        v: Any = point
        for key in path:
            v = v.get(key) if isinstance(v, dict) else None
        return scale(default if v is None else v)
    return get


def _mid(point: Dict[str, Any]) -> float:
    """An interval's middle, in seconds from the start of measuring."""
    return round(float(point.get("t_s", 0.0)) + float(point.get("length_s", 0.0)) / 2, 3)


def _length(point: Dict[str, Any]) -> float:
    v = point.get("length_s")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0.0


def drawn_intervals(points: Any) -> List[Dict[str, Any]]:
    """The intervals a time chart draws: every one at least :data:`PARTIAL_SHARE` of the
    longest (``length_s``) long. The last interval, cut short by the run's end, is left
    out; a run of one short interval keeps it (it is the longest)."""
    kept = [p for p in points or [] if isinstance(p, dict)]
    longest = max((_length(p) for p in kept), default=0.0)
    return [p for p in kept if _length(p) >= PARTIAL_SHARE * longest]


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _style(runs: Sequence[Run], i: int, j: int, dashes: Sequence[str] = ()) -> Tuple[str, str]:
    """(colour, dash) of line ``j`` of run ``i``: with several runs the run's own colour,
    the same in every chart, and a dash per line; with one run a colour per line. A chart's
    own ``dashes`` (one per line) hold in both."""
    dash = dashes[j] if j < len(dashes) else _DASHES[j % len(_DASHES)] if len(runs) > 1 else "solid"
    return (_color(i), dash) if len(runs) > 1 else (_color(j), dash)


def _series(name: str, x: List[float], y: List[Any], color: str, dash: str = "solid") -> Dict[str, Any]:
    return {"name": name, "x": x, "y": y, "color": color, "dash": dash}


def _time_spec(cid: str, title: str, y_label: str, series: List[Dict[str, Any]], **extra: Any) -> Spec:
    spec: Spec = {"id": cid, "title": title, "x_label": "time since the start of measuring (s)",
                  "y_label": y_label, "series": series, "group": _TIME_GROUP}
    spec.update(extra)
    return spec


def _columns(points: List[Dict[str, Any]], getters: Sequence[Callable[[Dict[str, Any]], Any]],
             peak: bool) -> Tuple[List[float], List[List[Any]]]:
    """The middles of the intervals and one column per getter, thinned."""
    x = [_mid(p) for p in points]
    return _thin(x, [[g(p) for p in points] for g in getters], peak)


def _if_any(count: str, get: Getter) -> Getter:
    """``get``, or None (a gap) in an interval whose ``count`` is 0: nothing was measured
    there (the engine writes 0 for a percentile of no values)."""
    def gated(point: Dict[str, Any]) -> Any:
        n = point.get(count)
        return None if isinstance(n, (int, float)) and not isinstance(n, bool) and n <= 0 else get(point)
    return gated


def _nonzero(get: Getter) -> Getter:
    """``get``, or None where it reads 0: a figure whose 0 means "none in this interval"."""
    def gated(point: Dict[str, Any]) -> Any:
        v = get(point)
        return None if v == 0 else v
    return gated


def _p90_ns(point: Dict[str, Any]) -> Optional[float]:
    """An interval's p90: its own key, or decoded from its latency histogram."""
    if "p90_ns" in point:
        return float(point["p90_ns"])
    hdr = point.get("latency_hdr")
    if not hdr:
        return None
    try:
        h = Histogram.decode(hdr)
    except ValueError:
        return None
    return float(h.value_at_percentile(90.0)) if h.total_count else None


def _prefix(name: str, runs: Sequence[Run]) -> str:
    return f"{name}: " if len(runs) > 1 else ""


def _bounds_ms(doc: Dict[str, Any]) -> List[float]:
    bounds = [_ms(b.get("bound_ns")) for b in doc.get("latency_bounds") or [] if isinstance(b, dict)]
    return [b for b in bounds if b is not None]


def _has_value(y: Sequence[Any], zero: bool = True) -> bool:
    """Whether a column has a value to draw (``zero``: a 0 counts as one)."""
    return any(v is not None and (zero or v != 0) for v in y)


def _run_lines(runs: Sequence[Run], points_of: Callable[[Dict[str, Any]], Any],
               getters: Callable[[Dict[str, Any], List[Dict[str, Any]]], Sequence[Tuple[str, Getter]]],
               peak: bool, zero: bool = True, dashes: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """The lines of a time chart: for each run, its drawn intervals (``points_of(doc)``)
    read by each of ``getters(doc, points)`` (label, getter); a line with no value
    (``zero``: 0 is a value) is not drawn. Styled by :func:`_style`."""
    series: List[Dict[str, Any]] = []
    for i, (name, doc) in enumerate(runs):
        points = drawn_intervals(points_of(doc))
        named = list(getters(doc, points)) if points else []
        if not named:
            continue
        x, cols = _columns(points, [g for _, g in named], peak=peak)
        for j, ((label, _), y) in enumerate(zip(named, cols)):
            if _has_value(y, zero):
                series.append(_series(_prefix(name, runs) + label, x, y, *_style(runs, i, j, dashes)))
    return series


def _timeseries(doc: Dict[str, Any]) -> Any:
    return doc.get("timeseries")


def latency_chart(runs: Sequence[Run]) -> Optional[Spec]:
    """Latency per interval: p50, p90, p99 and max (with several runs, p50 and p99 of
    each), and the latency bounds as lines. An interval where nothing completed is a gap."""
    keys: List[Tuple[str, Getter]] = [
        ("p50", lambda p: _ms(p.get("p50_ns"))), ("p90", lambda p: _ms(_p90_ns(p))),
        ("p99", lambda p: _ms(p.get("p99_ns"))), ("max", lambda p: _ms(p.get("max_ns")))]
    if len(runs) > 1:
        keys = [keys[0], keys[2]]
    keys = [(label, _if_any("completed", g)) for label, g in keys]
    series = _run_lines(runs, _timeseries, lambda doc, points: keys, peak=True)
    if not series:
        return None
    spans = [{"y": b, "label": f"{_prefix(name, runs)}bound {b:g} ms"}
             for name, doc in runs if drawn_intervals(_timeseries(doc)) for b in _bounds_ms(doc)]
    return _time_spec("chart-latency", "Latency per interval", "latency (ms)", series, spans=spans)


def rate_chart(runs: Sequence[Run]) -> Optional[Spec]:
    """Issued and completed queries per second, per interval (issued dashed)."""
    keys: List[Tuple[str, Getter]] = [
        ("issued", lambda p: _r(p["issued"] / p["length_s"]) if p.get("length_s") and "issued" in p else None),
        ("completed", lambda p: _r(p.get("qps")))]
    series = _run_lines(runs, _timeseries, lambda doc, points: keys, peak=False, dashes=("dashed", "solid"))
    return _time_spec("chart-rate", "Issued and completed per second", "queries/s", series) if series else None


def _extra_time_chart(runs: Sequence[Run], cid: str, title: str, y_label: str,
                      keys: Sequence[Tuple[str, Getter]]) -> Optional[Spec]:
    """A per-interval chart of optional figures: drawn only for the lines with a value."""
    series = _run_lines(runs, _timeseries, lambda doc, points: keys, peak=True)
    return _time_spec(cid, title, y_label, series) if series else None


def time_charts(runs: Sequence[Run]) -> List[Spec]:
    """The per-interval charts of the engine's figures: latency, rates, and, where the
    documents have them, issue delay, TTFT (only where first tokens were seen: its 0
    means none) and queries outstanding."""
    delay = [(label, _if_any("issued", _at(key, scale=_ms))) for label, key in
             (("p50", "issue_delay_p50_ns"), ("p99", "issue_delay_p99_ns"), ("max", "issue_delay_max_ns"))]
    ttft = [(label, _nonzero(_at(key, scale=_ms))) for label, key in (("p50", "ttft_p50_ns"), ("p99", "ttft_p99_ns"))]
    charts = [latency_chart(runs), rate_chart(runs),
              _extra_time_chart(runs, "chart-issue-delay", "Issue delay per interval", "issue delay (ms)", delay),
              _extra_time_chart(runs, "chart-ttft", "Time to first token per interval", "TTFT (ms)", ttft),
              _extra_time_chart(runs, "chart-outstanding", "Queries outstanding", "queries",
                                [("outstanding", _at("outstanding", scale=_r))])]
    return [c for c in charts if c is not None]


def _error_kinds(points: List[Dict[str, Any]]) -> List[str]:
    kinds: List[str] = []
    for p in points:
        for kind in p.get("errors") or {}:
            if kind not in kinds:
                kinds.append(str(kind))
    return kinds


def _error_getters(doc: Dict[str, Any], points: List[Dict[str, Any]]) -> List[Tuple[str, Getter]]:
    """(label, getter) of the error classes the intervals count: ``errors`` by kind (and
    ``timed_out``), else ``failed`` and ``timed_out``."""
    kinds = _error_kinds(points)
    getters: List[Tuple[str, Getter]] = [(k, _at("errors", k, default=0)) for k in kinds]
    if not kinds:
        getters = [(k, _at(k)) for k in ("failed", "timed_out") if any(k in p for p in points)]
    elif any("timed_out" in p for p in points) and "timed_out" not in kinds:
        getters.append(("timed_out", _at("timed_out")))
    return getters


def error_charts(runs: Sequence[Run]) -> List[Spec]:
    """Errors by class over time when the intervals drawn count any; otherwise the run's
    totals by class, as bars (a bar per class, in the run's colour); none without errors."""
    series = _run_lines(runs, _timeseries, _error_getters, peak=True, zero=False)
    if series:
        return [_time_spec("chart-errors", "Errors by class per interval", "errors", series, markers=True)]
    bars: List[Dict[str, Any]] = []
    for i, (name, doc) in enumerate(runs):
        totals: Dict[str, float] = {}
        for kind, n in ((doc.get("errors") or {}).get("counts") or {}).items():
            totals[_prefix(name, runs) + str(kind)] = n
        timed_out = (doc.get("counts") or {}).get("timed_out", 0)
        if timed_out:
            totals[_prefix(name, runs) + "timed_out"] = timed_out
        names = sorted(k for k, n in totals.items() if n)
        if names:
            bars.append({"name": name if len(runs) > 1 else "errors", "x": names, "y": [totals[n] for n in names],
                         "color": _color(i)})
    if not bars:
        return []
    return [{"id": "chart-errors", "title": "Errors by class (whole run)", "x_label": "", "y_label": "errors",
             "kind": "bar", "categories": [c for b in bars for c in b["x"]], "series": bars}]


def _spectrum(summary: Dict[str, Any], to_ms: float) -> Optional[Tuple[List[float], List[Any]]]:
    """(1/(1-p), value in ms) over the grid, up to what the count supports."""
    try:
        h = Histogram.decode(summary["hdr"])
    except (KeyError, TypeError, ValueError):
        return None
    count = h.total_count
    xs = [x for x in _SPECTRUM_X if x <= max(count, 2)]
    if count < 2 or not xs:
        return None
    values = h.values_at_percentiles([100.0 * (1.0 - 1.0 / x) for x in xs]).tolist()
    return [_r(x) or 0.0 for x in xs], [_r(v * to_ms) for v in values]


def _spectrum_keys(runs: Sequence[Run]) -> List[Tuple[str, str]]:
    """(document key, name) of every histogram of a time unit in the documents."""
    keys = [(k, n) for k, n in _SPECTRA.items() if any(k in doc for _, doc in runs)]
    for _, doc in runs:
        for key, entry in (doc.get("histograms") or {}).items():
            if isinstance(entry, dict) and entry.get("unit") in NS_PER and key not in dict(keys):
                keys.append((key, key[:-3] if key.endswith("_ns") else key))
    return keys


def _to_ms(doc: Dict[str, Any], key: str) -> float:
    """The factor from a histogram's recorded values to ms."""
    entry = (doc.get("histograms") or {}).get(key) or {"unit": "ns"}
    unit = entry.get("hdr_unit") or entry.get("unit") or "ns"
    scale = float(entry.get("scale", 1)) if entry.get("hdr_unit") else 1.0
    if unit not in NS_PER:  # a scaled histogram: the recorded values over the scale are in "unit"
        return ns_to_ms(NS_PER.get(str(entry.get("unit")), 1)) / scale
    return ns_to_ms(NS_PER[unit])


def spectrum_charts(runs: Sequence[Run]) -> List[Spec]:
    """The percentile spectrum (x: 1/(1-p), log, p50 to p99.999) of each time
    histogram (latency, service time, issue delay, TTFT, ITL, ...), every run overlaid."""
    charts: List[Spec] = []
    for key, label in _spectrum_keys(runs):
        series = []
        for i, (name, doc) in enumerate(runs):
            if not isinstance(doc.get(key), dict):
                continue
            got = _spectrum(doc[key], _to_ms(doc, key))
            if got is not None:
                series.append(_series(name if len(runs) > 1 else label, got[0], got[1], _color(i)))
        if series:
            spans = [{"y": b, "label": f"bound {b:g} ms"} for b in _bounds_ms(runs[0][1])] \
                if key == "latency_ns" and len(runs) == 1 else []
            charts.append({"id": f"chart-spectrum-{len(charts)}", "title": f"{label} by percentile",
                           "x_label": "percentile", "y_label": f"{label} (ms)", "x_log": True,
                           "x_ticks": _percentile_ticks(), "series": series, "spans": spans, "markers": True})
    return charts


def _percentile_ticks() -> Dict[str, Any]:
    values = [2, 10, 100, 1000, 10000, 100000]
    return {"values": values, "labels": ["p50", "p90", "p99", "p99.9", "p99.99", "p99.999"]}


def _devices(doc: Dict[str, Any]) -> Dict[str, str]:
    """GPU UUID -> a short name (index and model)."""
    out = {}
    for d in (doc.get("gpu") or {}).get("devices") or []:
        if isinstance(d, dict) and "uuid" in d:
            out[str(d["uuid"])] = f"GPU {d.get('index', '?')} {d.get('name', '')}".strip()
    return out


def gpu_charts(runs: Sequence[Run]) -> List[Spec]:
    """GPU utilization, power and memory per interval, a line per device (and run); a
    chart only for a reading some device gave."""
    readings = (("utilization_pct", "GPU utilization", "%", 1.0, False),
                ("power_w", "GPU power", "W", 1.0, False),
                ("memory_used_bytes", "GPU memory used", "GiB", 1 / 2 ** 30, True))
    charts = []
    for key, title, unit, factor, peak in readings:
        def devices(doc: Dict[str, Any], points: List[Dict[str, Any]], key: str = key,
                    factor: float = factor) -> List[Tuple[str, Getter]]:
            uuids: List[str] = []
            for p in points:
                uuids.extend(u for u in (p.get("gpu") or {}) if u not in uuids)
            names = _devices(doc)
            return [(names.get(u, u), _at("gpu", u, key, scale=_times(factor))) for u in uuids]
        series = _run_lines(runs, _timeseries, devices, peak=peak)
        if series:
            charts.append(_time_spec(f"chart-gpu-{key}", title, f"{title.split()[-1]} ({unit})", series))
    return charts


def _host_getters(doc: Dict[str, Any], intervals: List[Dict[str, Any]]) -> List[Tuple[str, Getter]]:
    roles: List[str] = []
    for p in intervals:
        roles.extend(r for r in p.get("cpu") or {} if r not in roles)
    getters = [(f"{r} (% of a core)", _at("cpu", r, scale=_times(100))) for r in roles]
    return getters + [("machine busy (% of all CPUs)", _at("machine_busy", scale=_times(100)))]


def host_charts(runs: Sequence[Run]) -> List[Spec]:
    """The generator host's CPU per thread role (% of one core) and the machine's busy
    share (% of all CPUs), per interval; a role that used no CPU is not drawn."""
    series = _run_lines(runs, lambda doc: (doc.get("host") or {}).get("intervals"), _host_getters, peak=False,
                        zero=False)
    return [_time_spec("chart-host", "Generator host CPU", "CPU (%)", series)] if series else []


def _scrape_rates(intervals: List[Dict[str, Any]], x: List[float], key: str) -> Tuple[List[float], List[Any]]:
    """A counter's rate between scrapes (an interval's delta over the time since the
    scrape before; a counter absent from a delta did not change). A gap between scrapes
    shorter than :data:`PARTIAL_SHARE` of the longest (the last scrape, at the run's end)
    is left out, like a partial interval."""
    gaps = [x[j] - x[j - 1] if j else x[0] for j in range(len(x))]
    longest = max(gaps, default=0.0)
    xs: List[float] = []
    ys: List[Any] = []
    for p, t, dt in zip(intervals, x, gaps):
        if dt > 0 and dt >= PARTIAL_SHARE * longest:
            v = (p.get("deltas") or {}).get(key, 0.0)
            xs.append(t)
            ys.append(_r(v / dt) if isinstance(v, (int, float)) else None)
    return xs, ys


def metric_charts(runs: Sequence[Run], limit: int = 10) -> List[Spec]:
    """The server's gauges over the scrapes (the first ``limit`` series of each run), and
    its counters' rates, from ``server_metrics.intervals``."""
    gauges: List[Dict[str, Any]] = []
    rates: List[Dict[str, Any]] = []
    for i, (name, doc) in enumerate(runs):
        intervals = [p for p in (doc.get("server_metrics") or {}).get("intervals") or [] if isinstance(p, dict)]
        if not intervals:
            continue
        x = [_r(float(p.get("t_s", 0.0))) or 0.0 for p in intervals]
        for target, field in ((gauges, "gauges"), (rates, "deltas")):
            keys: List[str] = []
            for p in intervals:
                keys.extend(k for k in p.get(field) or {} if k not in keys)
            for j, k in enumerate(keys[:limit]):
                if field == "deltas":
                    xs, y = _scrape_rates(intervals, x, k)
                else:
                    xs, y = x, [_r((p.get(field) or {}).get(k)) for p in intervals]
                if _has_value(y):
                    target.append(_series(_prefix(name, runs) + k, xs, y, *_style(runs, i, j)))
    x_label = "time since the first scrape (s)"
    charts = []
    if gauges:
        charts.append({"id": "chart-metrics-gauges", "title": "Server gauges", "x_label": x_label,
                       "y_label": "value", "series": gauges, "markers": True})
    if rates:
        charts.append({"id": "chart-metrics-rates", "title": "Server counters (per second)", "x_label": x_label,
                       "y_label": "per second", "series": rates, "markers": True})
    return charts


def _label_set(record: Dict[str, Any], load_keys: Iterable[str]) -> str:
    """A sweep point's line: its labels and the swept values that are not the load."""
    parts = [f"{k}={v}" for k, v in sorted((record.get("labels") or {}).items())]
    values = (record.get("sweep") or {}).get("values") or {}
    parts += [f"{k}={v}" for k, v in sorted(values.items())
              if k not in load_keys and not str(k).startswith("label.")]
    return ", ".join(parts) or "all points"


def sweep_chart(records: Sequence[Dict[str, Any]]) -> Optional[Spec]:
    """Throughput against latency p50/p90/p99 over a sweep's finished points (the
    "hockey stick"): a line per label set and percentile, in order of throughput."""
    load_keys = {"target_qps", "concurrency", "max_in_flight", "stages"}
    groups: Dict[str, List[Tuple[float, Dict[str, Any]]]] = {}
    for r in records:
        if (r.get("sweep") or {}).get("status") != "done" or "throughput" not in r:
            continue
        qps = float(r["throughput"].get("completed_qps") or 0.0)
        groups.setdefault(_label_set(r, load_keys), []).append((qps, r.get("latency_ns") or {}))
    series = []
    for i, (label, points) in enumerate(sorted(groups.items())):
        points.sort(key=lambda t: t[0])
        x = [_r(q) or 0.0 for q, _ in points]
        for j, pct in enumerate(("p50", "p90", "p99")):
            y = [_ms(lat.get(pct)) if lat.get("count") else None for _, lat in points]
            series.append(_series(f"{label} {pct}", x, y, _color(i), _DASHES[2 - j]))
    if not series:
        return None
    return {"id": "chart-sweep", "title": "Throughput against latency over the points", "x_label":
            "completed queries/s", "y_label": "latency (ms)", "series": series, "markers": True}


def _load_text(record: Dict[str, Any], load_keys: Iterable[str]) -> str:
    """A point's label on a chart: its swept load (``concurrency=8``), else all its swept values."""
    values = (record.get("sweep") or {}).get("values") or {}
    shown = {k: v for k, v in values.items() if k in load_keys} or values
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or str((record.get("sweep") or {}).get("index", ""))


def llm_sweep_charts(records: Sequence[Dict[str, Any]]) -> List[Spec]:
    """Over a sweep's finished LLM points: output tokens/s against TTFT p99 and against
    TPOT p99 (ms), one dot per point labelled by its swept load, a line per label set in
    order of throughput; none when no point has output tokens/s."""
    load_keys = {"target_qps", "concurrency", "max_in_flight", "stages"}
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for r in records:
        if (r.get("sweep") or {}).get("status") == "done" and (r.get("throughput") or {}).get("output_tokens_per_s"):
            groups.setdefault(_label_set(r, load_keys), []).append(r)
    charts: List[Spec] = []
    for key, name in (("ttft_ns", "TTFT"), ("tpot_ns", "TPOT")):
        series = []
        for i, (label, points) in enumerate(sorted(groups.items())):
            points = sorted(points, key=lambda r: float(r["throughput"]["output_tokens_per_s"]))
            y = [_ms((r.get(key) or {}).get("p99")) if (r.get(key) or {}).get("count") else None for r in points]
            if _has_value(y):
                s = _series(f"{label} {name} p99", [_r(float(r["throughput"]["output_tokens_per_s"])) or 0.0
                                                     for r in points], y, _color(i))
                s["labels"] = [_load_text(r, load_keys) for r in points]
                series.append(s)
        if series:
            charts.append({"id": f"chart-sweep-{name.lower()}", "title": f"Output tokens/s against {name} p99 over "
                           "the points", "x_label": "output tokens/s", "y_label": f"{name} p99 (ms)",
                           "series": series, "markers": True})
    return charts
