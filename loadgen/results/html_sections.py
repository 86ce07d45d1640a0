"""The sections of the HTML report (:mod:`loadgen.results.html`): each is (id, heading,
inner HTML), with the chart specs it places. Every value shown is escaped here."""

from __future__ import annotations

import html
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from loadgen.results import html_data as charts
from loadgen.results.cost import cost_text
from loadgen.results.html_data import Run, Spec
from loadgen.results.render import BREAKDOWN_PARTS, diagnosis_items
from loadgen.units import ns_to_ms, ns_to_us

__all__ = ["run_sections", "sweep_sections"]

Section = Tuple[str, str, str]
_SPECTRUM_NOTE = ('<p class="note">Each line is one histogram read at percentiles from p50 to p99.999; the x '
                  "axis is 1/(1-p), log-scaled, so that the tail gets the room. Lines end where the count "
                  "of values no longer supports the percentile.</p>")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any) -> str:
    """A number for people (thousands separated, 4 significant figures); text as is."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else ("yes" if value else "no")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:
            return "n/a"
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
    return str(value)


def _ms(ns: Any) -> str:
    return f"{ns_to_ms(ns):.4g} ms" if isinstance(ns, (int, float)) and not isinstance(ns, bool) else ""


def _table(headers: Sequence[Any], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    """A table; every cell formatted by :func:`_fmt` and escaped."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _plots(specs: Sequence[Spec]) -> str:
    return "".join(f'<div class="plot" id="{_e(s["id"])}"></div>' for s in specs)


def _note(text: str) -> str:
    return f'<p class="note">{_e(text)}</p>'


# ----------------------------------------------------------------------- verdicts

def _verdict(name: str, doc: Dict[str, Any], show_name: bool) -> str:
    """One run's banner: VALID or INVALID, what was measured, and every reason."""
    valid = bool(doc.get("valid"))
    failed = [t for t in doc.get("thresholds") or [] if isinstance(t, dict) and not t.get("passed", True)]
    metric = doc.get("metric") or {}
    what = f"{doc.get('scenario', '?')} on {doc.get('sut', '?')}"
    if metric:
        what += f": {metric.get('name', '')} = {_fmt(metric.get('value'))} {metric.get('unit', '')}"
    reasons = [str(r) for r in doc.get("invalid_reasons") or []]
    reasons += [f"threshold failed: {t.get('expr', t)}" for t in failed]
    notes = [f"{label}: {text}" for label, text in diagnosis_items(doc)]
    if doc.get("interrupted"):
        notes.append("interrupted: the run was stopped before its end")
    if doc.get("partial"):
        notes.append("partial: the document could not be completed after the run")
    cls = "valid" if valid and not failed else "invalid"
    word = "VALID" if valid else "INVALID"
    items = "".join(f"<li>{_e(r)}</li>" for r in reasons + notes)
    title = f'<span class="run">{_e(name)}</span> ' if show_name else ""
    return (f'<div class="banner {cls}"><div class="word">{word}</div><div>{title}{_e(what)}'
            f'{f"<ul class=reasons>{items}</ul>" if items else ""}</div></div>')


def _verdicts(runs: Sequence[Run]) -> str:
    return "".join(_verdict(name, doc, len(runs) > 1) for name, doc in runs)


# ----------------------------------------------------------------------- headline

def _headline_rows(doc: Dict[str, Any]) -> List[Tuple[str, str]]:
    """(figure, value) of one run's headline figures."""
    counts = doc.get("counts") or {}
    tput = doc.get("throughput") or {}
    lat = doc.get("latency_ns") or {}
    issued = counts.get("issued") or 0
    errors = (counts.get("failed") or 0) + (counts.get("timed_out") or 0)
    rows = [("scenario", f"{doc.get('scenario', '')} on {doc.get('sut', '')}"),
            ("started", str(doc.get("started_at", ""))),
            ("duration", f"{_fmt(doc.get('duration_s'))} s"),
            ("queries", f"{_fmt(issued)} issued, {_fmt(counts.get('completed'))} completed, "
                        f"{_fmt(counts.get('failed'))} failed, {_fmt(counts.get('timed_out'))} timed out"),
            ("throughput", f"{_fmt(tput.get('completed_qps'))} queries/s"
                           + (f" (target {_fmt(tput['target_qps'])})" if tput.get("target_qps") else "")),
            ("error rate", f"{errors / issued:.3%}" if issued else "")]
    if lat.get("count"):
        rows.append(("latency", ", ".join(f"{p} {_ms(lat.get(p))}" for p in ("p50", "p90", "p99", "p99.9", "max"))))
    for b in doc.get("latency_bounds") or []:
        rows.append(("over the bound", f"{_fmt(b.get('over'))} over {_ms(b.get('bound_ns'))} (exact)"))
    gpu = doc.get("gpu") or {}
    if gpu.get("energy_per_query_j") is not None:
        rows.append(("GPU energy", f"{_fmt(gpu.get('energy_j_total'))} J, {_fmt(gpu['energy_per_query_j'])} J/query"))
    if counts.get("tokens"):
        rows.append(("tokens", _fmt(counts["tokens"])))
    rows.extend(_llm_rows(doc))
    cost = cost_text(doc)
    if cost:
        rows.append(("cost", cost))
    early = doc.get("early_stopping") or {}
    if early.get("message"):
        rows.append(("early stopping", str(early["message"])))
    return rows


def _llm_rows(doc: Dict[str, Any]) -> List[Tuple[str, str]]:
    """Token streams' headline figures: TTFT, TPOT, token rates, goodput against the
    SLOs, and the prompts' and answers' lengths (each only when the run has it)."""
    rows: List[Tuple[str, str]] = []
    for key, name in (("ttft_ns", "TTFT"), ("tpot_ns", "TPOT")):
        summary = doc.get(key) or {}
        if summary.get("count"):
            rows.append((name, ", ".join(f"{p} {_ms(summary.get(p))}" for p in ("p50", "p90", "p99", "max"))))
    tput = doc.get("throughput") or {}
    if tput.get("output_tokens_per_s"):
        per_stream = tput.get("output_tokens_per_s_per_stream")
        rows.append(("output tokens/s", f"{_fmt(tput['output_tokens_per_s'])} in all"
                     + (f", {_fmt(per_stream)} per stream" if per_stream else "")))
    if tput.get("input_tokens_per_s"):
        rows.append(("input tokens/s", f"{_fmt(tput['input_tokens_per_s'])} sent"))
    goodput = doc.get("goodput") or {}
    if goodput.get("slos"):
        each = ", ".join(f"{name} {_fmt(100 * (v.get('fraction') or 0))}%"
                         for name, v in (goodput.get("per_slo") or {}).items())
        rows.append(("goodput", f"{_fmt(goodput.get('requests_per_s'))} requests/s met every SLO: "
                                f"{_fmt(goodput.get('met'))} of {_fmt(goodput.get('of'))} ({each})"))
    llm = doc.get("llm") or {}
    for label, stats in (("prompt tokens", (llm.get("prompts") or {}).get("input_tokens")),
                         ("output tokens", (llm.get("requests") or {}).get("output_tokens"))):
        if isinstance(stats, dict) and stats.get("count"):
            exact = "" if label == "output tokens" or llm.get("input_tokens_exact", True) else " (approximate)"
            rows.append((label, f"mean {_fmt(stats.get('mean'))}, p50 {_fmt(stats.get('p50'))}, "
                                f"p90 {_fmt(stats.get('p90'))}, max {_fmt(stats.get('max'))}{exact}"))
    sent = doc.get("input_length_tokens") or {}
    if sent.get("count"):
        rows.append(("input tokens sent", f"p50 {_fmt(sent.get('p50'))}, p99 {_fmt(sent.get('p99'))}, "
                                          f"max {_fmt(sent.get('max'))} per request"))
    conv = llm.get("conversations") or {}
    if "started" in conv:
        cut = conv.get("cut_short") or {}
        rows.append(("conversations", f"{_fmt(conv['started'])} started, {_fmt(conv.get('finished'))} finished, "
                                      f"{_fmt(cut.get('run_ended'))} cut by the run's end, "
                                      f"{_fmt(cut.get('failed_turn'))} by a failed turn; turns completed "
                                      + "/".join(str(n) for n in conv.get("turns_completed") or ())))
    return rows


def _headline(runs: Sequence[Run]) -> str:
    if len(runs) == 1:
        return _table(["figure", "value"], _headline_rows(runs[0][1]), "figures")
    per_run = [dict(_headline_rows(doc)) for _, doc in runs]
    keys: List[str] = []
    for d in per_run:
        keys.extend(k for k in d if k not in keys)
    return _table(["figure", *[n for n, _ in runs]], [[k, *[d.get(k, "") for d in per_run]] for k in keys], "figures")


# ----------------------------------------------------------------------- details

def _errors_html(runs: Sequence[Run]) -> str:
    parts = []
    for name, doc in runs:
        errors = doc.get("errors") or {}
        counts, messages = errors.get("counts") or {}, errors.get("messages") or []
        prefix = f"{name}: " if len(runs) > 1 else ""
        if not counts and not messages:
            parts.append(_note(f"{prefix}no errors."))
            continue
        parts.append(_table(["error kind", "count"], sorted(counts.items()), "small"))
        if messages:
            items = "".join(f"<li><code>{_e(m)}</code></li>" for m in messages)
            parts.append(f"<p>{_e(prefix)}messages (the first of each kind):</p><ul class=messages>{items}</ul>")
    return "".join(parts)


def _gpu_html(runs: Sequence[Run]) -> str:
    parts = []
    for name, doc in runs:
        gpu = doc.get("gpu") or {}
        prefix = f"{name}: " if len(runs) > 1 else ""
        devices = [d for d in gpu.get("devices") or [] if isinstance(d, dict)]
        if not devices:
            parts.append(_note(f"{prefix}no GPU sampled: {gpu.get('reason') or gpu.get('status') or 'no gpu section'}"))
            continue
        rows = []
        for d in devices:
            stat = (d.get("utilization_pct") or {}) if isinstance(d.get("utilization_pct"), dict) else {}
            power = (d.get("power_w") or {}) if isinstance(d.get("power_w"), dict) else {}
            rows.append([d.get("index"), d.get("name"), d.get("uuid"), stat.get("mean"), power.get("mean"),
                         d.get("energy_j"), d.get("status", "")])
        parts.append(_table(["index", "name", "UUID", "utilization % (mean)", "power W (mean)", "energy J", "status"],
                            rows, "small"))
    return "".join(parts)


def _host_html(runs: Sequence[Run]) -> str:
    parts = []
    for name, doc in runs:
        host = doc.get("host") or {}
        prefix = f"{name}: " if len(runs) > 1 else ""
        if not host:
            parts.append(_note(f"{prefix}no host figures."))
            continue
        cpu = host.get("cpu_s") or {}
        rss = host.get("peak_rss_bytes")
        text = f"{prefix}CPU seconds by thread role: {_fmt(cpu)}"
        if isinstance(rss, (int, float)):
            text += f"; peak RSS {rss / 2 ** 20:.0f} MiB"
        parts.append(_note(text))
        for s in host.get("saturated") or []:
            parts.append(_note(f"{prefix}saturated: {_fmt(s)}"))
    return "".join(parts)


def _metrics_html(runs: Sequence[Run], limit: int = 200) -> str:
    parts = []
    for name, doc in runs:
        sm = doc.get("server_metrics")
        prefix = f"{name}: " if len(runs) > 1 else ""
        if not isinstance(sm, dict):
            parts.append(_note(f"{prefix}the server's metrics were not scraped (--server-metrics-url)."))
            continue
        parts.append(_note(f"{prefix}{sm.get('url') or ''}: {_fmt(sm.get('scrapes'))} scrapes, "
                           f"{_fmt(sm.get('failed_scrapes'))} failed"))
        deltas = sorted((sm.get("deltas") or {}).items())
        if deltas:
            parts.append(_table(["counter", "increase over the run"], deltas[:limit], "small metrics"))
        gauges = sorted((sm.get("gauges") or {}).items())
        if gauges:
            rows = [[k, *[(g or {}).get(f) for f in ("first", "last", "min", "max", "mean")]] for k, g in gauges]
            parts.append(_table(["gauge", "first", "last", "min", "max", "mean"], rows[:limit], "small metrics"))
        parts.extend(_note(f"{prefix}{n}") for n in sm.get("notes") or [])
    return "".join(parts)


def _breakdown_html(runs: Sequence[Run]) -> str:
    """The server's own breakdown of its mean request time (``server_breakdown``), a row a run."""
    rows = [[name, b.get("requests"), b.get("batch_size"), *[ns_to_us(b.get(k, 0.0)) for k, _ in
                                                               (("request_ns", ""),) + BREAKDOWN_PARTS]]
            for name, doc in runs for b in [doc.get("server_breakdown")] if isinstance(b, dict)]
    if not rows:
        return ""
    headers = ["run", "requests", "batch size", "request (us)", *[f"{label} (us)" for _, label in BREAKDOWN_PARTS]]
    return "<h4>The server's time per request (its own statistics)</h4>" + _table(headers, rows, "small")


def _settings_html(runs: Sequence[Run]) -> str:
    parts = []
    for name, doc in runs:
        settings = doc.get("settings") or {}
        heading = f"<h3>{_e(name)}</h3>" if len(runs) > 1 else ""
        labels = doc.get("labels") or {}
        parts.append(heading + "<h4>Options given</h4>"
                     + _table(["option", "value"], sorted((settings.get("given") or {}).items()), "small"))
        parts.append("<h4>Labels</h4>" + (_table(["label", "value"], sorted(labels.items()), "small")
                                          if labels else _note("none")))
        merge = doc.get("merge")
        if isinstance(merge, dict):
            rows = [[w.get("index"), w.get("path"), w.get("hostname"), w.get("completed"), w.get("qps"),
                     w.get("valid"), "; ".join(map(str, w.get("invalid_reasons") or []))]
                    for w in merge.get("workers") or [] if isinstance(w, dict)]
            parts.append(f"<h4>Merged from {len(rows)} workers</h4>"
                         + _table(["worker", "path", "host", "completed", "queries/s", "valid", "why not"], rows,
                                  "small"))
        parts.append("<h4>Environment</h4>"
                     + _table(["key", "value"], sorted((doc.get("environment") or {}).items()), "small"))
        parts.append("<details><summary>Every effective option</summary>"
                     + _table(["option", "value"], sorted((settings.get("effective") or {}).items()), "small")
                     + "</details>")
    return "".join(parts)


def run_sections(runs: Sequence[Run]) -> Tuple[List[Section], List[Spec]]:
    """The sections of a report over runs, and their chart specs."""
    specs: List[Spec] = []
    sections: List[Section] = [("verdict", "Verdict", _verdicts(runs)), ("headline", "Headline figures",
                                                                         _headline(runs))]
    timeline = charts.time_charts(runs)
    parts: Tuple[Tuple[str, str, List[Spec], str], ...] = (
        ("timeline", "Over time", timeline, _note(charts.TIMELINE_NOTE if timeline else "This result has no time series.")),
        ("spectrum", "Percentile spectrum", charts.spectrum_charts(runs), _SPECTRUM_NOTE),
        ("errors", "Errors", charts.error_charts(runs), _errors_html(runs)),
        ("gpu", "GPU", charts.gpu_charts(runs), _gpu_html(runs)),
        ("host", "Generator host", charts.host_charts(runs), _host_html(runs)),
        ("server-metrics", "Server metrics", charts.metric_charts(runs), _metrics_html(runs) + _breakdown_html(runs)),
    )
    for sid, heading, chart_specs, extra in parts:
        specs.extend(chart_specs)
        sections.append((sid, heading, _plots(chart_specs) + extra))
    sections.append(("settings", "Settings, labels and environment", _settings_html(runs)))
    return sections, specs


# ----------------------------------------------------------------------- sweeps

def _point_name(sweep: str, record: Dict[str, Any], several: bool) -> str:
    s = record.get("sweep") or {}
    values = ", ".join(f"{k}={_fmt(v)}" for k, v in (s.get("values") or {}).items())
    name = f"{s.get('index', 0):03d} {values}" + (f" #{s['repeat']}" if s.get("repeat") else "")
    return f"{sweep}: {name}" if several else name


def _sweep_verdict(named: Sequence[Tuple[str, List[Dict[str, Any]]]]) -> str:
    records = [r for _, rs in named for r in rs]
    done = [r for r in records if (r.get("sweep") or {}).get("status") == "done"]
    valid = [r for r in done if r.get("valid")]
    ok = len(valid) == len(records) and records
    word = "VALID" if ok else "INVALID"
    items = []
    for sweep, rs in named:
        for r in rs:
            status = (r.get("sweep") or {}).get("status")
            if status != "done":
                items.append(f"{_point_name(sweep, r, len(named) > 1)}: {status}: {(r.get('sweep') or {}).get('error', '')}")
            elif not r.get("valid"):
                items.extend(f"{_point_name(sweep, r, len(named) > 1)}: {why}" for why in r.get("invalid_reasons") or [])
    text = (f"{len(records)} point runs: {len(done)} done ({len(valid)} valid, {len(done) - len(valid)} invalid), "
            f"{len(records) - len(done)} failed or interrupted")
    lis = "".join(f"<li>{_e(i)}</li>" for i in items)
    return (f'<div class="banner {"valid" if ok else "invalid"}"><div class="word">{word}</div><div>{_e(text)}'
            f'{f"<ul class=reasons>{lis}</ul>" if lis else ""}</div></div>')


def _points_table(named: Sequence[Tuple[str, List[Dict[str, Any]]]]) -> str:
    rows = []
    for sweep, rs in named:
        for r in rs:
            lat = r.get("latency_ns") or {}
            counts = r.get("counts") or {}
            issued = counts.get("issued") or 0
            err = ((counts.get("failed") or 0) + (counts.get("timed_out") or 0)) / issued if issued else None
            rows.append([_point_name(sweep, r, len(named) > 1), (r.get("sweep") or {}).get("status"),
                         r.get("valid"), (r.get("throughput") or {}).get("completed_qps"),
                         *[_ms(lat.get(p)) if lat.get("count") else "" for p in ("p50", "p90", "p99")], err])
    return _table(["point", "status", "valid", "queries/s", "p50", "p90", "p99", "error rate"], rows, "points")


def sweep_sections(named: Sequence[Tuple[str, List[Dict[str, Any]]]]) -> Tuple[List[Section], List[Spec]]:
    """The sections of a report over sweeps (their sweep.jsonl records), and the charts."""
    several = len(named) > 1
    records: List[Dict[str, Any]] = []
    for sweep, rs in named:
        for r in rs:
            labels = dict(r.get("labels") or {})
            if several:
                labels = {"sweep": sweep, **labels}
            records.append({**r, "labels": labels})
    curve: Optional[Spec] = charts.sweep_chart(records)
    tokens = charts.llm_sweep_charts(records)
    runs = [(_point_name(sweep, r, several), r) for sweep, rs in named for r in rs
            if (r.get("sweep") or {}).get("status") == "done" and "latency_ns" in r]
    spectra = charts.spectrum_charts(runs) if runs else []
    specs = ([curve] if curve else []) + tokens + spectra
    first = next((r for _, rs in named for r in rs if r.get("settings")), {})
    swept = sorted({k for _, rs in named for r in rs for k in ((r.get("sweep") or {}).get("values") or {})})
    settings = (_note("swept: " + ", ".join(swept)) + "<h4>Options given to the first point</h4>"
                + _table(["option", "value"], sorted(((first.get("settings") or {}).get("given") or {}).items()),
                         "small"))
    sections = [
        ("verdict", "Verdict", _sweep_verdict(named)),
        ("sweep", "Throughput and latency", _plots([curve] if curve else []) + (
            "" if curve else _note("No point has finished yet.")) + _points_table(named)),
        *([("tokens", "Output tokens/s against TTFT and TPOT", _plots(tokens) + _note(
            "One dot per point, labelled by its load: output tokens/s against the p99 of the time to first "
            "token and of the time per output token."))] if tokens else []),
        ("spectrum", "Percentile spectrum", _plots(spectra) + _SPECTRUM_NOTE),
        ("settings", "Settings, labels and environment", settings),
    ]
    return sections, specs
