"""Renderers of a result document: the text summary, the CSV row, the HdrHistogram
interval log, and the flat view pandas loads. Each reads the document alone."""

from __future__ import annotations

import io
from typing import Any, Dict, List, Optional, Tuple

from loadgen.results.cost import cost_text
from loadgen.stats.hdrlog import HistogramLogWriter
from loadgen.stats.histogram import Histogram
from loadgen.units import format_ns

__all__ = ["BREAKDOWN_PARTS", "CSV_COLUMNS", "breakdown_lines", "csv_row", "diagnosis_items", "diagnosis_lines", "flatten", "format_setting", "hlog_text", "peak_lines", "render_summary",
           "timeseries_rows"]

# The engine's histograms in the summary, in order, with their labels (and an OpenAI
# stream's: time to first reasoning / answer token, the gap between token chunks, the
# per-token inter-token latency); a SUT's other histograms in ns follow, labelled by their key.
_SUMMARY_HISTOGRAMS = (("latency_ns", "latency"), ("service_time_ns", "service"),
                       ("issue_delay_ns", "issue delay"), ("ttft_ns", "ttft"), ("ttfrt_ns", "ttfrt"),
                       ("ttfat_ns", "ttfat"), ("itl_ns", "chunk gap"), ("itl_per_token_ns", "itl/token"),
                       ("tpot_ns", "tpot"))


def render_summary(doc: Dict[str, Any]) -> str:
    """The human summary: VALID/INVALID and the reasons first, then the figures."""
    lines = _verdict_lines(doc) + peak_lines(doc) + [""] + _run_lines(doc) + _histogram_lines(doc)
    lines += _network_lines(doc) + breakdown_lines(doc)
    lines += _gpu_lines(doc)
    lines += _host_lines(doc) + _merge_lines(doc)
    es = doc.get("early_stopping")
    if es:
        lines.append(f"early stop   {es['message']}")
    lines += _error_lines(doc)
    return "\n".join(lines) + "\n"


def _gpu_lines(doc: Dict[str, Any]) -> List[str]:
    """A GPU line per device (utilization, power, memory, energy), then energy per query;
    or why there are no GPU figures."""
    gpu = doc.get("gpu")
    if not gpu:
        return []
    if gpu["status"] == "unavailable":
        return [f"gpu          none sampled: {gpu['reason']}"]
    lines = []
    for d in gpu["devices"]:
        util = d.get("utilization_pct") or {}
        power = d.get("power_w") or {}
        mem = d.get("memory_used_bytes") or {}
        parts = [f"gpu {d.get('index', '?')}        {d.get('name', '')} {d['uuid'][:12]}"]
        if util.get("mean") is not None:
            parts.append(f"util {util['mean']:.0f}% (p99 {util['p99']:.0f}%)")
        elif util.get("supported") is False:
            parts.append(f"util not supported ({util.get('why', '')})")
        if power.get("mean") is not None:
            parts.append(f"power {power['mean']:.0f} W (max {power['max']:.0f})")
        if mem.get("max") is not None:
            parts.append(f"memory {mem['max'] / 2**30:.1f} GiB max")
        energy = (d.get("energy_j") or {}).get("total")
        if energy is not None:
            parts.append(f"energy {energy:,.1f} J")
        if d.get("throttle_reasons"):
            parts.append("throttled: " + ", ".join(d["throttle_reasons"]))
        if d.get("lost"):
            parts.append(f"LOST: {d['lost'].get('reason', '')}")
        lines.append(", ".join(parts))
    if gpu.get("energy_j_total") is not None:
        per_q = gpu.get("energy_per_query_j")
        qpj = gpu.get("queries_per_joule")
        lines.append(f"energy       {gpu['energy_j_total']:,.1f} J in all"
                     + (f", {per_q * 1e3:,.3f} mJ per query, {qpj:,.2f} queries per J" if per_q and qpj else ""))
    if gpu["status"] == "partial" and gpu.get("reason"):
        lines.append(f"             {gpu['reason']}")
    return lines


def _host_lines(doc: Dict[str, Any]) -> List[str]:
    """The generator's own CPU per thread role, its peak memory and the machine's busy
    and steal time; the placement applied."""
    lines = []
    host = doc.get("host")
    if host and host.get("intervals"):
        total_s = sum(iv["length_s"] for iv in host["intervals"]) or 1.0
        roles = ", ".join(f"{role} {cpu / total_s:.0%}" for role, cpu in host["cpu_s"].items() if cpu > 0)
        busy = [iv["machine_busy"] for iv in host["intervals"] if "machine_busy" in iv]
        steal = [iv["machine_steal"] for iv in host["intervals"] if "machine_steal" in iv]
        machine = (f"; machine busy {sum(busy) / len(busy):.0%}, steal {max(steal):.0%} at most"
                   if busy and steal else "")
        rss = host.get("peak_rss_bytes")
        lines.append(f"generator    cpu {roles or 'idle'} (of one CPU); peak RSS "
                     f"{rss / 2**20:,.0f} MiB{machine}" if rss else f"generator    cpu {roles or 'idle'}{machine}")
    pl = doc.get("placement")
    if pl:
        applied = pl["applied"]
        if pl["plan"]["ok"]:
            lines.append(f"placement    --pin {pl['pin']}: issue thread on CPU {applied['issue_thread']}, dispatcher on "
                         f"{applied['dispatcher'] or 'none (native SUT)'}, in-process SUT on "
                         f"{applied.get('sut') or 'any CPU (none left for it)'}")
        else:
            lines.append(f"placement    --pin {pl['pin']}: no plan, nothing pinned: {pl['plan']['why']}")
    return lines


def _verdict_lines(doc: Dict[str, Any]) -> List[str]:
    verdict = "VALID" if doc["valid"] else "INVALID"
    m = doc["metric"]
    lines = [f"{verdict}  {doc['scenario']} on {doc['sut']}: {m['name']} = {m['value']:,.3f} {m['unit']}"]
    lines += [f"  - {reason}" for reason in doc["invalid_reasons"]]
    for t in doc.get("thresholds", []):
        mark = "ok  " if t["passed"] else "FAIL"
        lines.append(f"  {mark} {'--fail-if' if t['kind'] == 'fail_if' else '--require'} {t['expr']}")
    return lines + diagnosis_lines(doc)


# The warning that says again what a diagnosis of that cause says.
_CAUSE_WARNING = {"generator": "generator_late", "client": "client_saturated", "server": "server_saturated"}


def diagnosis_items(doc: Dict[str, Any]) -> List[Tuple[str, str]]:
    """(label, text) of the diagnosis (which side limited the run, with its numbers) and
    of each named warning it does not already say; none for a document from before
    diagnoses."""
    d = doc.get("diagnosis")
    if not isinstance(d, dict) or not d.get("summary"):
        return []
    said = _CAUSE_WARNING.get(str(d.get("cause")))
    return [("diagnosis", str(d["summary"]))] + [(f"warning {w.get('name')}", str(w.get("message")))
                                                  for w in doc.get("warnings") or []
                                                  if isinstance(w, dict) and w.get("name") != said]


def diagnosis_lines(doc: Dict[str, Any]) -> List[str]:
    """The summary's lines of :func:`diagnosis_items`."""
    return [f"{'diagnosis' if label == 'diagnosis' else 'warning':<12} "
            f"{text if label == 'diagnosis' else label[len('warning '):] + ': ' + text}"
            for label, text in diagnosis_items(doc)]


def _warmup_lines(doc: Dict[str, Any]) -> List[str]:
    w = doc.get("warmup")
    if not w:
        return []
    return [f"warm-up      {w['duration_s']:g} s first, not recorded: {w['issued']:,} issued, "
            f"{w['completed']:,} completed, {w['failed']:,} failed or timed out"]


def _run_lines(doc: Dict[str, Any]) -> List[str]:
    c, tp = doc["counts"], doc["throughput"]
    target = f" (target {tp['target_qps']:,.1f})" if tp.get("target_qps") else ""
    lines = [
        f"duration     {doc['duration_s']:.2f} s (issuing {doc['issue_duration_s']:.2f} s), "
        f"started {doc['started_at']}",
        f"queries      {c['issued']:,} issued, {c['completed']:,} completed, {c['failed']:,} failed, "
        f"{c['timed_out']:,} timed out, {c['cancelled']:,} cancelled",
        f"throughput   {tp['completed_qps']:,.1f} queries/s{target}, {tp['samples_per_s']:,.1f} samples/s",
        *([f"labels       {' '.join(f'{k}={v}' for k, v in doc['labels'].items())}"] if doc.get("labels") else []),
        *_warmup_lines(doc),
        *_worker_lines(doc),
    ]
    stray = [f"{c[key]:,} {what}" for key, what in (("duplicate_completions", "duplicate"),
                                                    ("unknown_completions", "unknown"),
                                                    ("late_completions", "late")) if c.get(key)]
    if stray:
        lines.append("completions  " + ", ".join(stray) + " (of queries not in flight: already resolved, "
                     "never issued, or timed out)")
    unrecorded = [f"{c[key]:,} {what}" for key, what in _UNRECORDED if c.get(key)]
    if unrecorded:
        lines.append("unrecorded   " + ", ".join(unrecorded) + " (impossible times from the SUT)")
    for bound in doc.get("latency_bounds", []):
        lines.append(f"over bound   {bound['over']:,} latencies over {format_ns(bound['bound_ns'])} (exact)")
    if tp.get("output_tokens_per_s"):
        per_stream = tp.get("output_tokens_per_s_per_stream")
        each = f", {per_stream:,.1f} per stream (mean of tokens / (completed - first token))" if per_stream else ""
        lines.append(f"tokens       {tp['output_tokens_per_s']:,.1f} output tokens/s in all{each}")
    if tp.get("input_tokens_per_s"):
        lines.append(f"input        {tp['input_tokens_per_s']:,.1f} input tokens/s sent")
    cost = cost_text(doc)
    return lines + _goodput_lines(doc) + ([f"cost         {cost}"] if cost else [])


def _goodput_lines(doc: Dict[str, Any]) -> List[str]:
    """Goodput against --slo: requests/s meeting every SLO, then each SLO's share."""
    g = doc.get("goodput")
    if not g:
        return []
    each = ", ".join(f"{name}<={format_ns(s['bound_ns'])} {s['fraction']:.1%}" for name, s in g["per_slo"].items())
    return [f"goodput      {g['requests_per_s']:,.1f} requests/s met every SLO: {g['met']:,} of {g['of']:,} "
            f"({g['fraction']:.1%}); {each}"]


def _worker_lines(doc: Dict[str, Any]) -> List[str]:
    """One line on which worker of how many this was, where, and when it started."""
    w = doc.get("worker")
    if not w:
        return []
    where = f"pod {w['pod']} on {w['hostname']}" if w.get("pod") and w["pod"] != w.get("hostname") \
        else f"host {w.get('hostname')}"
    if w.get("start_late_s") is not None and w.get("start_at") is not None:
        when = f"started {w['start_late_s']:.3f} s after --start-at {w['start_at']:.3f}"
    else:
        when = f"started at {w['started_at_epoch_s']:.3f}"
    seeds = w.get("seeds", {})
    return [f"worker       {w['index']} of {w['count']} ({where}), {when}, "
            f"seeds {seeds.get('schedule')}/{seeds.get('sample')}"]


# Counts of reported times the histograms could not hold, as the summary names them.
_UNRECORDED = (("out_of_range", "completions"), ("first_token_out_of_range", "first tokens"))


def _histogram_lines(doc: Dict[str, Any]) -> List[str]:
    shown = list(_SUMMARY_HISTOGRAMS)
    known = {key for key, _ in shown}
    for key, entry in doc.get("histograms", {}).items():
        if key not in known and entry.get("unit") == "ns" and key.endswith("_ns"):
            shown.append((key, key[:-3].replace("_", " ")))
    lines = []
    for key, label in shown:
        h = doc.get(key)
        if not h or not h["count"]:
            continue
        lines.append(
            f"{label:<12} p50 {format_ns(h['p50'])}, p90 {format_ns(h['p90'])}, p99 {format_ns(h['p99'])}, "
            f"p99.9 {format_ns(h['p99.9'])}, max {format_ns(h['max'])}"
        )
    tps = doc.get("output_tokens_per_s")
    if tps and tps.get("count"):
        lines.append(f"tokens/s     p50 {tps['p50']:,.1f}, p10 of requests below "
                     f"{_low_percentile(tps):,.1f} (output tokens per second, per request)")
    lengths = [f"{name} p50 {h['p50']:,}, p99 {h['p99']:,}, max {h['max']:,}"
               for name, h in (("input", doc.get("input_length_tokens")), ("output", doc.get("output_length_tokens")))
               if h and h.get("count")]
    if lengths:
        lines.append(f"lengths      {'; '.join(lengths)} (tokens per request)")
    conv = (doc.get("llm") or {}).get("conversations")
    if conv and "started" in conv:
        cut = conv.get("cut_short") or {}
        lines.append(f"turns        {conv['started']:,} conversations started, {conv['finished']:,} finished, "
                     f"{cut.get('run_ended', 0):,} cut short by the run's end, {cut.get('failed_turn', 0):,} by a "
                     f"failed turn; turns completed by index {'/'.join(map(str, conv['turns_completed']))}")
    return lines


def _low_percentile(summary: Dict[str, Any]) -> float:
    """The 10th percentile of the tokens/s histogram (kept in milli-tokens/s)."""
    return Histogram.decode(summary["hdr"]).value_at_percentile(10.0) / 1000.0


def peak_lines(doc: Dict[str, Any]) -> List[str]:
    """A ``loadgen find-peak`` result's answer line, like ``peak: 1,234 queries/s at p99
    <= 5 ms (confirmed by 2 runs)``, then why and how the search ended; or ``no peak:
    why``. Nothing for a document without a ``peak`` section."""
    if "peak" not in doc:
        return []
    peak = doc["peak"]
    bound = peak["latency_bound_ms"]
    within = f" at p{peak['percentile']:g} <= {bound:g} ms" if bound is not None else ""
    bracket = peak["bracket"]
    how = (f"{_plural(peak['probes'], 'probe')} and {_plural(peak['confirmation_runs'], 'confirmation run')} "
           f"in {peak['search_wall_s']:.1f} s")
    if bracket is not None:
        how = f"bracket [{format_setting(bracket[0])}, {format_setting(bracket[1])}), " + how
    if not peak["confirmed"]:
        return [f"no peak: {peak['reason']}", f"  {how}"]
    confirmed = f"(confirmed by {_plural(peak['settings']['confirm_runs'], 'run')}"
    confirmed += f", after {_plural(peak['step_downs'], 'step-down')})" if peak["step_downs"] else ")"
    latency = doc.get("latency_ns", {})
    if peak["over"] == "rate":
        first = f"peak: {format_setting(peak['answer'])} queries/s{within} {confirmed}"
    else:
        tp = doc.get("throughput", {}).get("completed_qps", 0.0)
        first = (f"peak: concurrency {format_setting(peak['answer'])} ({tp:,.1f} queries/s, p99 "
                 f"{format_ns(latency.get('p99', 0))}){within} {confirmed}")
    return [first, f"  {peak['reason']}", f"  {how}"]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def format_setting(x: Optional[float]) -> str:
    """A rate or concurrency for people: '1,234.5', '12', '-' for none."""
    if x is None:
        return "-"
    if float(x).is_integer():
        return f"{x:,.0f}"
    return f"{x:,.3f}".rstrip("0").rstrip(".")


def _network_lines(doc: Dict[str, Any]) -> List[str]:
    lines: List[str] = []
    net = doc.get("network")
    if net:
        client = ""
        if net.get("http_engine") == "native":
            native = net.get("native") or {}
            threads, in_python = net.get("io_threads", 1), native.get("checked_in_python", 0)
            client = (f", native client ({threads} I/O thread(s); streams read natively, {in_python:,} failed "
                      "ones worded in Python)" if net.get("protocol") == "openai_stream" else
                      f", native client ({threads} I/O thread(s); {native.get('verdict_cache_hits', 0):,} verdicts "
                      f"cached, {in_python:,} checked in Python)")
        elif net.get("grpc_engine"):
            client = f", {net['grpc_engine']} gRPC client"
        lines.append(f"server       {net['protocol']} at {net['target']}, {net['connections']} connection(s){client}, "
                     f"ready after {net['ready_wait_s']:.2f} s; payload {net['payload']['source']}")
        tokens = net.get("tokens")
        if tokens:
            line = f"tokens       {tokens['output_tokens']:,} output tokens, counted from {tokens['source']}"
            if tokens.get("reasoning_tokens"):
                line += f"; {tokens['reasoning_tokens']:,} of them reasoning, counted from {tokens['reasoning_source']}"
            if tokens.get("tool_calls"):
                line += f"; {tokens['tool_calls']:,} tool calls in {tokens['tool_call_requests']:,} answers"
            lines.append(line)
    sm = doc.get("server_metrics")
    if sm:
        deltas = sm.get("deltas", {})
        shown = sorted(deltas.items(), key=lambda kv: ("request" not in kv[0], kv[0]))[:4]
        text = ", ".join(f"{k} +{v:,.0f}" for k, v in shown) or "no counter changed"
        dropped = f", {sm['dropped_series']:,} series over the limit dropped" if sm.get("dropped_series") else ""
        lines.append(f"server says  {text} ({sm['scrapes']} scrapes, {sm['failed_scrapes']} failed{dropped})")
        # GPU figures first: the reason to read a server's gauges during a load test.
        gauges = sorted(sm.get("gauges", {}).items(), key=lambda kv: ("gpu" not in kv[0], kv[0]))
        if gauges:
            more = f" (+{len(gauges) - 3} more)" if len(gauges) > 3 else ""
            lines.append("gauges       " + ", ".join(
                f"{k} mean {g['mean']:,.4g} ({g['min']:,.4g}..{g['max']:,.4g})" for k, g in gauges[:3]) + more)
    return lines


#: The server's request-time parts in its breakdown (``server_breakdown``), with labels.
BREAKDOWN_PARTS = (("queue_ns", "queue"), ("compute_input_ns", "compute input"), ("compute_infer_ns", "compute infer"),
                   ("compute_output_ns", "compute output"), ("overhead_ns", "overhead"))


def breakdown_lines(doc: Dict[str, Any]) -> List[str]:
    """The server's own breakdown of its mean request time, as perf_analyzer prints it."""
    b = doc.get("server_breakdown")
    if not b:
        return []
    parts = " + ".join(f"{label} {format_ns(b.get(key, 0.0))}" for key, label in BREAKDOWN_PARTS)
    return [f"server time  {format_ns(b['request_ns'])} a request = {parts}",
            f"             {b['requests']:,} requests ({b.get('failed', 0):,} failed), {b.get('executions', 0):,} "
            f"executions, batch size {b.get('batch_size', 0.0):.2f}; {b['source']} statistics of {b['model']}"]


def _merge_lines(doc: Dict[str, Any]) -> List[str]:
    """A merged result's workers: how many, how far apart they started, each one's figures."""
    m = doc.get("merge")
    if not m:
        return []
    lines = [f"merged       {len(m['workers'])} result(s) of {m['expected_workers']} workers, "
             f"start spread {m.get('start_spread_s', 0.0):.3f} s"]
    for w in m["workers"]:
        late = w.get("start_late_s")
        when = f", started {late:.3f} s late" if late is not None else ""
        lines.append(f"  worker {w['index']:<4} {w.get('hostname') or '?'}: {w['completed']:,} completed, "
                     f"{w.get('qps', 0.0):,.1f} queries/s, p99 {format_ns(w.get('p99_ns', 0))}{when}, "
                     f"{'VALID' if w['valid'] else 'INVALID'}")
    return lines


def _error_lines(doc: Dict[str, Any]) -> List[str]:
    errors = doc.get("errors", {})
    if not errors.get("counts"):
        return []
    lines = ["errors       " + ", ".join(f"{k}: {v}" for k, v in errors["counts"].items())]
    lines += [f"             {msg}" for msg in errors.get("messages", [])[:5]]
    return lines


CSV_COLUMNS = (
    "started_at", "scenario", "sut", "valid", "metric.name", "metric.value", "duration_s",
    "counts.issued", "counts.completed", "counts.failed", "counts.timed_out", "counts.cancelled",
    "throughput.completed_qps", "throughput.samples_per_s", "throughput.target_qps",
    "latency_ns.p50", "latency_ns.p90", "latency_ns.p99", "latency_ns.p99.9", "latency_ns.max",
    "issue_delay_ns.p99", "invalid_reasons",
    # LLM targets and --slo (empty otherwise)
    "ttft_ns.p50", "ttft_ns.p99", "tpot_ns.p50", "tpot_ns.p99", "throughput.output_tokens_per_s",
    "throughput.output_tokens_per_s_per_stream",
    "goodput.requests_per_s", "goodput.fraction",
)


def csv_row(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The document's row of results.csv: :data:`CSV_COLUMNS` of its flat view."""
    flat = flatten(doc)
    row = {k: flat.get(k, "") for k in CSV_COLUMNS}
    row["invalid_reasons"] = " | ".join(doc["invalid_reasons"])
    return row


def hlog_text(doc: Dict[str, Any]) -> str:
    """The latency time series as an HdrHistogram interval log (one interval per point)."""
    buf = io.StringIO()
    w = HistogramLogWriter(buf)
    w.write_header(doc.get("started_at_epoch_s", 0.0))
    w.write_comment(f"[loadgen {doc['environment']['loadgen_version']} {doc['scenario']} on {doc['sut']}]")
    for point in doc.get("timeseries", []):
        if point.get("latency_hdr"):
            w.write_interval(Histogram.decode(point["latency_hdr"]), start_s=point["t_s"],
                             interval_s=point["length_s"], tag="latency")
    return buf.getvalue()


def flatten(doc: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Nested keys joined with '.', leaving out the bulky parts (HDR payloads, time
    series, environment lists)."""
    out: Dict[str, Any] = {}
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if key in ("hdr", "timeseries", "latency_hdr"):
            continue
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, list):
            if key == "invalid_reasons":
                out[name] = " | ".join(map(str, value))
            elif all(isinstance(v, (int, float, str, bool)) for v in value):
                out[name] = ",".join(map(str, value))
        else:
            out[name] = value
    return out


def timeseries_rows(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The document's time series as flat rows, one per interval: every figure of a
    point (``errors`` as ``errors.<kind>`` columns, per-interval ``gpu`` figures as
    ``gpu.<uuid>.<figure>``), without the encoded ``latency_hdr``."""
    rows = []
    for point in doc.get("timeseries", []):
        row = flatten({k: v for k, v in point.items() if k != "errors"})
        row.update({f"errors.{kind}": n for kind, n in (point.get("errors") or {}).items()})
        rows.append(row)
    return rows
