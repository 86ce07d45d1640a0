"""The result document of a run, and everything rendered from it.

One versioned JSON document per run (``"schema": "loadgen.result/1"``) holds the
settings, counts, every histogram (percentiles and the encoded HDR payload), the time
series, validity with reasons, errors and the environment. The text summary, the HDR
interval log, the CSV row and the pandas view are all rendered from it.
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import re
import sys
import tempfile
from typing import Any, Dict, Iterable, List, Sequence, Union

from loadgen.stats.histogram import Histogram

__all__ = [
    "SCHEMA",
    "ThresholdError",
    "environment",
    "evaluate_thresholds",
    "histogram_summary",
    "load_results",
    "render_summary",
    "write_outputs",
]

SCHEMA = "loadgen.result/1"
_PCT_KEYS = {50.0: "p50", 90.0: "p90", 95.0: "p95", 99.0: "p99", 99.9: "p99.9", 99.99: "p99.99"}


def histogram_summary(h: Histogram) -> Dict[str, Any]:
    """count, min, mean, max, stddev, p50..p99.99 (ns) and the base64 V2 ``hdr``."""
    out: Dict[str, Any] = {
        "count": h.total_count,
        "min": h.min,
        "mean": h.mean,
        "max": h.max,
        "stddev": h.stddev,
    }
    values = h.values_at_percentiles(list(_PCT_KEYS))
    for key, value in zip(_PCT_KEYS.values(), values.tolist()):
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
    """Where the run happened: versions, platform, CPU and the affinity used."""
    from loadgen._version import __version__

    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        affinity = list(range(os.cpu_count() or 1))
    return {
        "loadgen_version": __version__,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity": affinity,
        "issue_thread_cpus": list(pin_cpus),
    }


# ------------------------------------------------------------------------- thresholds

class ThresholdError(ValueError):
    """A --fail-if/--require expression that cannot be read."""


_EXPR = re.compile(
    r"^\s*(?P<metric>[a-z_][a-z0-9_.]*)\s*(?P<op><=|>=|==|!=|<|>)\s*"
    r"(?P<value>[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>ns|us|ms|s|%)?\s*$"
)
_LATENCY_METRICS = ("p50", "p90", "p95", "p99", "p99.9", "p99.99", "mean", "max", "min")
_UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
_OPS = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}
THRESHOLD_METRICS = _LATENCY_METRICS + (
    "issue_delay_p99", "service_p99", "qps", "samples_per_s", "error_rate", "failed", "timed_out",
)


def _metric_value(doc: Dict[str, Any], metric: str) -> float:
    counts = doc["counts"]
    if metric in _LATENCY_METRICS:
        return float(doc["latency_ns"][metric])
    if metric == "issue_delay_p99":
        return float(doc["issue_delay_ns"]["p99"])
    if metric == "service_p99":
        return float(doc["service_time_ns"]["p99"])
    if metric == "qps":
        return float(doc["throughput"]["completed_qps"])
    if metric == "samples_per_s":
        return float(doc["throughput"]["samples_per_s"])
    if metric == "error_rate":
        return (counts["failed"] + counts["timed_out"]) / counts["issued"] if counts["issued"] else 0.0
    return float(counts[metric])


def parse_threshold(expr: str) -> tuple:
    """'p99<5ms' -> (metric, op, value in the metric's base unit). Raises ThresholdError."""
    m = _EXPR.match(expr)
    if not m:
        raise ThresholdError(
            f"{expr!r} is not METRIC OP VALUE[UNIT], like 'p99>5ms' or 'error_rate>0.01'"
        )
    metric, op, value, unit = m.group("metric"), m.group("op"), float(m.group("value")), m.group("unit")
    if metric not in THRESHOLD_METRICS:
        import difflib

        close = difflib.get_close_matches(metric, THRESHOLD_METRICS, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; use one of {', '.join(THRESHOLD_METRICS)}"
        raise ThresholdError(f"{expr!r}: unknown metric {metric!r}{hint}")
    is_latency = metric in _LATENCY_METRICS or metric in ("issue_delay_p99", "service_p99")
    if is_latency:
        if unit is None or unit == "%":
            raise ThresholdError(f"{expr!r}: {metric} is a latency; give a unit (ns, us, ms, s)")
        value *= _UNIT_NS[unit]
    elif unit == "%" and metric == "error_rate":
        value /= 100.0
    elif unit is not None:
        raise ThresholdError(f"{expr!r}: {metric} takes no unit{' but %' if metric == 'error_rate' else ''}")
    return metric, op, value


def evaluate_thresholds(doc: Dict[str, Any], fail_if: Sequence[str], require: Sequence[str]) -> List[Dict[str, Any]]:
    """Checks --fail-if (fails when true) and --require (fails when false) expressions."""
    out = []
    for kind, exprs in (("fail_if", fail_if), ("require", require)):
        for expr in exprs:
            metric, op, value = parse_threshold(expr)
            actual = _metric_value(doc, metric)
            holds = _OPS[op](actual, value)
            failed = holds if kind == "fail_if" else not holds
            out.append({"kind": kind, "expr": expr, "metric": metric, "actual": actual,
                        "threshold": value, "passed": not failed})
    return out


# ---------------------------------------------------------------------------- summary

def _fmt_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"


def render_summary(doc: Dict[str, Any]) -> str:
    """The human summary: VALID/INVALID and the reasons first, then the figures."""
    lines: List[str] = []
    verdict = "VALID" if doc["valid"] else "INVALID"
    m = doc["metric"]
    lines.append(f"{verdict}  {doc['scenario']} on {doc['sut']}: {m['name']} = {m['value']:,.3f} {m['unit']}")
    for reason in doc["invalid_reasons"]:
        lines.append(f"  - {reason}")
    for t in doc.get("thresholds", []):
        mark = "ok  " if t["passed"] else "FAIL"
        lines.append(f"  {mark} {'--fail-if' if t['kind'] == 'fail_if' else '--require'} {t['expr']}")
    c, tp = doc["counts"], doc["throughput"]
    lines.append("")
    lines.append(f"duration     {doc['duration_s']:.2f} s (issuing {doc['issue_duration_s']:.2f} s), started {doc['started_at']}")
    lines.append(
        f"queries      {c['issued']:,} issued, {c['completed']:,} completed, {c['failed']:,} failed, "
        f"{c['timed_out']:,} timed out, {c['cancelled']:,} cancelled"
    )
    target = f" (target {tp['target_qps']:,.1f})" if tp.get("target_qps") else ""
    lines.append(f"throughput   {tp['completed_qps']:,.1f} queries/s{target}, {tp['samples_per_s']:,.1f} samples/s")
    for key, label in (("latency_ns", "latency"), ("service_time_ns", "service"), ("issue_delay_ns", "issue delay"),
                       ("ttft_ns", "ttft"), ("itl_ns", "inter-token"), ("tpot_ns", "tpot")):
        h = doc.get(key)
        if not h or not h["count"]:
            continue
        lines.append(
            f"{label:<12} p50 {_fmt_ns(h['p50'])}, p90 {_fmt_ns(h['p90'])}, p99 {_fmt_ns(h['p99'])}, "
            f"p99.9 {_fmt_ns(h['p99.9'])}, max {_fmt_ns(h['max'])}"
        )
    tps = doc.get("output_tokens_per_s")
    if tps and tps.get("count"):
        lines.append(f"tokens/s     p50 {tps['p50']:,.1f}, p10 of requests below "
                     f"{_low_percentile(tps):,.1f} (output tokens per second, per request)")
    lines += _network_lines(doc)
    es = doc.get("early_stopping")
    if es:
        lines.append(f"early stop   {es['message']}")
    errors = doc.get("errors", {})
    if errors.get("counts"):
        lines.append("errors       " + ", ".join(f"{k}: {v}" for k, v in errors["counts"].items()))
        for msg in errors.get("messages", [])[:5]:
            lines.append(f"             {msg}")
    return "\n".join(lines) + "\n"


def _low_percentile(summary: Dict[str, Any]) -> float:
    """The 10th percentile of the tokens/s histogram (kept in milli-tokens/s)."""
    return Histogram.decode(summary["hdr"]).value_at_percentile(10.0) / 1000.0


def _network_lines(doc: Dict[str, Any]) -> List[str]:
    net = doc.get("network")
    if not net:
        return []
    lines = [f"server       {net['protocol']} at {net['target']}, {net['connections']} connection(s), "
             f"ready after {net['ready_wait_s']:.2f} s; payload {net['payload']['source']}"]
    tokens = net.get("tokens")
    if tokens:
        lines.append(f"tokens       {tokens['output_tokens']:,} output tokens, counted from {tokens['source']}")
    sm = doc.get("server_metrics")
    if sm:
        deltas = sm.get("deltas", {})
        shown = sorted(deltas.items(), key=lambda kv: ("request" not in kv[0], kv[0]))[:4]
        text = ", ".join(f"{k} +{v:,.0f}" for k, v in shown) or "no counter changed"
        lines.append(f"server says  {text} ({sm['scrapes']} scrapes, {sm['failed_scrapes']} failed)")
    return lines


# ----------------------------------------------------------------------------- writing

def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _atomic_write(path: str, data: Union[str, bytes]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; results are for sharing
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _hlog_text(doc: Dict[str, Any]) -> str:
    from loadgen.stats.hdrlog import HistogramLogWriter

    buf = io.StringIO()
    w = HistogramLogWriter(buf)
    w.write_header(doc.get("started_at_epoch_s", 0.0))
    w.write_comment(f"[loadgen {doc['environment']['loadgen_version']} {doc['scenario']} on {doc['sut']}]")
    for point in doc.get("timeseries", []):
        if point.get("latency_hdr"):
            w.write_interval(Histogram.decode(point["latency_hdr"]), start_s=point["t_s"],
                             interval_s=point["length_s"], tag="latency")
    return buf.getvalue()


CSV_COLUMNS = (
    "started_at", "scenario", "sut", "valid", "metric.name", "metric.value", "duration_s",
    "counts.issued", "counts.completed", "counts.failed", "counts.timed_out", "counts.cancelled",
    "throughput.completed_qps", "throughput.samples_per_s", "throughput.target_qps",
    "latency_ns.p50", "latency_ns.p90", "latency_ns.p99", "latency_ns.p99.9", "latency_ns.max",
    "issue_delay_ns.p99", "invalid_reasons",
)


def csv_row(doc: Dict[str, Any]) -> Dict[str, Any]:
    flat = flatten(doc)
    row = {k: flat.get(k, "") for k in CSV_COLUMNS}
    row["invalid_reasons"] = " | ".join(doc["invalid_reasons"])
    return row


def write_outputs(doc: Dict[str, Any], directory: str) -> List[str]:
    """Writes result.json, summary.txt, latency.hlog and appends to results.csv in
    ``directory`` (created if needed), each atomically. Returns the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for name, data in (
        ("result.json", json.dumps(doc, indent=2, sort_keys=False) + "\n"),
        ("summary.txt", render_summary(doc)),
        ("latency.hlog", _hlog_text(doc)),
    ):
        path = os.path.join(directory, name)
        _atomic_write(path, data)
        paths.append(path)
    csv_path = os.path.join(directory, "results.csv")
    existing = ""
    if os.path.exists(csv_path):
        with open(csv_path, encoding="utf-8") as f:
            existing = f.read()
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS))
    if not existing:
        writer.writeheader()
    writer.writerow(csv_row(doc))
    _atomic_write(csv_path, existing + buf.getvalue())
    paths.append(csv_path)
    return paths


# ---------------------------------------------------------------------------- reading

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


def _result_files(paths: Iterable[Union[str, os.PathLike]]) -> List[str]:
    files: List[str] = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            for root, _, names in sorted(os.walk(p)):
                files.extend(os.path.join(root, n) for n in sorted(names) if n == "result.json")
        else:
            files.append(p)
    return files


def load_result(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Reads one result document; ValueError when it is not one."""
    with open(path, encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{os.fspath(path)} is not JSON: {e}") from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("loadgen.result/"):
        raise ValueError(f"{os.fspath(path)} is not a loadgen result (no 'schema': '{SCHEMA}')")
    return doc


def load_results(paths: Union[str, os.PathLike, Iterable[Union[str, os.PathLike]]]):
    """A pandas DataFrame with one row per result file and flattened keys as columns.

    Args:
        paths: result.json files and/or folders (searched recursively for result.json).

    Raises:
        ImportError: pandas is not installed (``pip install pandas``).
        ValueError: a file is not a loadgen result.
    """
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("load_results needs pandas: pip install pandas") from None
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    rows = []
    for path in _result_files(paths):
        row = flatten(load_result(path))
        row["path"] = path
        rows.append(row)
    return pd.DataFrame(rows)
