"""``loadgen compare``: two results (or two sweeps, point by point) side by side, with a
verdict per headline figure that only calls a change larger than the run's own noise.

The noise comes from the time series: each interval of a run gives one value of a
figure (its p99, its throughput, ...). A figure's change is called (``better`` or
``worse``, by the direction that is good for it) when

- the two-sided Mann-Whitney U test of BASE's interval values against NEW's gives
  p < ``alpha`` (:mod:`loadgen.stats.mann_whitney`),
- the whole-run value and the intervals' median both moved by at least
  ``min_effect_pct`` percent, the same way;

otherwise ``no significant change``. A figure without per-interval values on both sides
(p99.9 of intervals too short to hold one, an error rate) is ``not judged``.

A ``--fail-if-regression`` threshold (:class:`RegressionRule`, ``p99>+10%``,
``qps<-500qps``) fires when the whole-run change crosses it and, for a figure with
per-interval values, the intervals' median change crosses it too and the test gives
p < alpha; for a figure without them the whole-run crossing alone fires it.
"""

from __future__ import annotations

import base64
import difflib
import json
import math
import re
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from loadgen.stats.histogram import Histogram
from loadgen.stats.mann_whitney import mann_whitney_u
from loadgen.units import NS_PER, format_ns

__all__ = ["DEFAULT_ALPHA", "DEFAULT_MIN_EFFECT_PCT", "METRICS", "MIN_INTERVALS", "SCHEMA", "VERDICTS",
           "TEST_NAME", "CompareError", "Metric", "RegressionRule", "compare_documents", "compare_points", "interval_values",
           "parse_rules", "render_comparison"]

SCHEMA = "loadgen.compare/1"
DEFAULT_ALPHA = 0.05
DEFAULT_MIN_EFFECT_PCT = 2.0
#: Fewer intervals than this on a side gives a warning: the test has little power.
MIN_INTERVALS = 5
VERDICTS = ("better", "worse", "no significant change", "not judged")
TEST_NAME = "two-sided Mann-Whitney U test over per-interval values"

Doc = Dict[str, Any]
Point = Dict[str, Any]


class CompareError(ValueError):
    """Inputs or a rule that cannot be compared; the message says what is wrong."""


class _Interval:
    """One interval of a time series, its histogram decoded when first asked for."""

    __slots__ = ("_hist", "point")

    def __init__(self, point: Point) -> None:
        self.point = point
        self._hist: Optional[Histogram] = None

    def histogram(self) -> Optional[Histogram]:
        if self._hist is None and isinstance(self.point.get("latency_hdr"), str):
            try:
                self._hist = Histogram.decode(base64.b64decode(self.point["latency_hdr"]))
            except ValueError:
                return None
        return self._hist


def _whole_summary(key: str, stat: str) -> Callable[[Doc], Optional[float]]:
    def get(doc: Doc) -> Optional[float]:
        summary = doc.get(key)
        if not isinstance(summary, dict) or not summary.get("count") or stat not in summary:
            return None
        return float(summary[stat])
    return get


def _interval_key(key: str) -> Callable[[_Interval], Optional[float]]:
    def get(iv: _Interval) -> Optional[float]:
        value = iv.point.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        return float(value)
    return get


def _interval_latency(key: Optional[str], percentile: Optional[float]) -> Callable[[_Interval], Optional[float]]:
    """An interval's latency figure: its ``key`` when the time series has it, else from its
    histogram (the mean when ``percentile`` is None), where the interval holds at least
    1 / (1 - q) latencies, so that its q-quantile is not just its largest value."""
    def get(iv: _Interval) -> Optional[float]:
        if not iv.point.get("completed"):
            return None
        if key is not None and key in iv.point:
            return _interval_key(key)(iv)
        h = iv.histogram()
        if h is None or not h.total_count:
            return None
        if percentile is None:
            return h.mean
        if h.total_count * (1 - percentile / 100) < 1:
            return None
        return float(h.value_at_percentile(percentile))
    return get


def _error_rate(doc: Doc) -> Optional[float]:
    counts = doc["counts"]
    return (counts["failed"] + counts["timed_out"]) / counts["issued"] if counts["issued"] else 0.0


def _interval_error_rate(iv: _Interval) -> Optional[float]:
    p = iv.point
    if "failed" not in p or not p.get("issued"):
        return None
    return float(p["failed"] + p.get("timed_out", 0)) / float(p["issued"])


def _tokens_per_s(doc: Doc) -> Optional[float]:
    tokens = doc["counts"].get("tokens", 0)
    return tokens / doc["duration_s"] if tokens and doc["duration_s"] > 0 else None


def _interval_tokens_per_s(iv: _Interval) -> Optional[float]:
    p = iv.point
    return float(p["tokens"]) / p["length_s"] if "tokens" in p and p.get("length_s") else None


def _input_tokens_per_s(doc: Doc) -> Optional[float]:
    """The prompt tokens sent (``llm.requests.input_tokens_sent``) per second of the run."""
    sent = ((doc.get("llm") or {}).get("requests") or {}).get("input_tokens_sent")
    return float(sent) / doc["duration_s"] if sent and doc.get("duration_s", 0) > 0 else None


def _goodput(key: str) -> Callable[[Doc], Optional[float]]:
    """A figure of the document's ``goodput`` section (--slo)."""
    def get(doc: Doc) -> Optional[float]:
        value = (doc.get("goodput") or {}).get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return get


def _energy_per_query(doc: Doc) -> Optional[float]:
    gpu = doc.get("gpu")
    if not isinstance(gpu, dict) or not isinstance(gpu.get("energy_per_query_j"), (int, float)):
        return None
    return float(gpu["energy_per_query_j"])


def _interval_energy_per_query(iv: _Interval) -> Optional[float]:
    """The interval's GPU energy over its completed queries; None when a device has no
    energy reading in it."""
    figures = iv.point.get("gpu")
    if not isinstance(figures, dict) or not figures or not iv.point.get("completed"):
        return None
    energies = [float(d["energy_j"]) for d in figures.values()
                if isinstance(d, dict) and isinstance(d.get("energy_j"), (int, float))]
    if len(energies) != len(figures):
        return None
    return sum(energies) / float(iv.point["completed"])


@dataclass(frozen=True)
class Metric:
    """A headline figure: its rule name, its label, its unit (``ns``, ``qps``,
    ``fraction``, ``tokens/s``, ``J``, ``cost``), whether lower is better, how to read it from a
    document, and how to read it from one interval (None where intervals never have it)."""

    name: str
    label: str
    unit: str
    lower_is_better: bool
    whole: Callable[[Doc], Optional[float]]
    interval: Optional[Callable[[_Interval], Optional[float]]]
    #: What each interval's value is multiplied by, from its document (a cost's hourly price).
    factor: Optional[Callable[[Doc], Optional[float]]] = None


def _cost(*keys: str) -> Callable[[Doc], Optional[float]]:
    """A figure of the document's ``cost`` section (--price-per-hour)."""
    def get(doc: Doc) -> Optional[float]:
        value: Any = doc.get("cost")
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return get


def _interval_hours_per(key: str, scale: float) -> Callable[[_Interval], Optional[float]]:
    """Hours the interval took per ``scale`` of its ``key`` (queries, tokens): its cost at
    a price of 1 an hour."""
    def get(iv: _Interval) -> Optional[float]:
        n = iv.point.get(key)
        if not isinstance(n, (int, float)) or not n or not iv.point.get("length_s"):
            return None
        return float(iv.point["length_s"]) / 3600.0 / float(n) * scale
    return get


def _latency(name: str, stat: str, key: Optional[str], percentile: Optional[float]) -> Metric:
    return Metric(name, f"latency {name}", "ns", True, _whole_summary("latency_ns", stat),
                  _interval_latency(key, percentile))


#: The figures compared, in table order. A figure a document does not have is left out.
METRICS: Tuple[Metric, ...] = (
    Metric("qps", "completed qps", "qps", False, lambda d: float(d["throughput"]["completed_qps"]),
           _interval_key("qps")),
    _latency("mean", "mean", None, None),
    _latency("p50", "p50", "p50_ns", 50.0),
    _latency("p90", "p90", "p90_ns", 90.0),
    _latency("p99", "p99", "p99_ns", 99.0),
    _latency("p99.9", "p99.9", "p99.9_ns", 99.9),
    _latency("max", "max", "max_ns", 100.0),
    Metric("issue_delay_p99", "issue delay p99", "ns", True, _whole_summary("issue_delay_ns", "p99"),
           _interval_key("issue_delay_p99_ns")),
    Metric("error_rate", "error rate", "fraction", True, _error_rate, _interval_error_rate),
    Metric("ttft_p50", "TTFT p50", "ns", True, _whole_summary("ttft_ns", "p50"), _interval_key("ttft_p50_ns")),
    Metric("ttft_p90", "TTFT p90", "ns", True, _whole_summary("ttft_ns", "p90"), None),
    Metric("ttft_p99", "TTFT p99", "ns", True, _whole_summary("ttft_ns", "p99"), _interval_key("ttft_p99_ns")),
    Metric("tpot_p50", "TPOT p50", "ns", True, _whole_summary("tpot_ns", "p50"), None),
    Metric("tpot_p90", "TPOT p90", "ns", True, _whole_summary("tpot_ns", "p90"), None),
    Metric("tpot_p99", "TPOT p99", "ns", True, _whole_summary("tpot_ns", "p99"), _interval_key("tpot_p99_ns")),
    Metric("itl_p50", "ITL p50 (chunks)", "ns", True, _whole_summary("itl_ns", "p50"), None),
    Metric("itl_p99", "ITL p99 (chunks)", "ns", True, _whole_summary("itl_ns", "p99"), None),
    Metric("itl_per_token_p50", "ITL p50 (per token)", "ns", True, _whole_summary("itl_per_token_ns", "p50"), None),
    Metric("itl_per_token_p99", "ITL p99 (per token)", "ns", True, _whole_summary("itl_per_token_ns", "p99"), None),
    Metric("ttfat_p99", "TTFAT p99", "ns", True, _whole_summary("ttfat_ns", "p99"), None),
    Metric("tokens_per_s", "tokens/s", "tokens/s", False, _tokens_per_s, _interval_tokens_per_s),
    Metric("input_tokens_per_s", "input tokens/s", "tokens/s", False, _input_tokens_per_s, None),
    Metric("goodput", "goodput (requests/s)", "qps", False, _goodput("requests_per_s"), None),
    Metric("goodput_fraction", "goodput fraction", "fraction", False, _goodput("fraction"), None),
    Metric("energy_per_query", "GPU energy/query", "J", True, _energy_per_query, _interval_energy_per_query),
    Metric("cost_per_1k", "cost/1k queries", "cost", True, _cost("per_1k_queries"),
           _interval_hours_per("completed", 1e3), _cost("hourly")),
    Metric("cost_per_mtok", "cost/M output tokens", "cost", True, _cost("per_million_tokens", "output"),
           _interval_hours_per("tokens", 1e6), _cost("hourly")),
)
_BY_NAME = {m.name: m for m in METRICS}


# ------------------------------------------------------------------ rules

@dataclass(frozen=True)
class RegressionRule:
    """A ``--fail-if-regression`` rule: fires when ``metric``'s change is above (``>``) or
    below (``<``) ``amount``, a percent of BASE's value when ``relative``, else an amount
    in the metric's own unit (ns for latencies)."""

    expr: str
    metric: str
    op: str
    amount: float
    relative: bool

    def crossed(self, change: float, change_pct: float) -> bool:
        """Whether a change (absolute, and in percent) crosses the rule's amount."""
        value = change_pct if self.relative else change
        return value > self.amount if self.op == ">" else value < self.amount


_RULE = re.compile(r"^\s*(?P<metric>[a-z_][a-z0-9_.]*)\s*(?P<op>[<>])\s*(?P<value>[-+]?[0-9]*\.?[0-9]+"
                   r"(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>%|ns|us|ms|s|qps|J|tok/s)?\s*$")
#: The units an absolute amount may be given in, per metric unit (None: a bare number).
_ABSOLUTE_UNITS = {"ns": tuple(NS_PER), "qps": ("qps", None), "fraction": (None,), "tokens/s": ("tok/s", None),
                   "J": ("J", None), "cost": (None,)}


def _parse_rule(expr: str) -> RegressionRule:
    m = _RULE.match(expr)
    if not m:
        raise CompareError(f"{expr!r} is not METRIC OP CHANGE, like 'p99>+10%', 'p99>+2ms' or 'qps<-5%'")
    name, op, value, unit = m.group("metric"), m.group("op"), float(m.group("value")), m.group("unit")
    metric = _BY_NAME.get(name)
    if metric is None:
        close = difflib.get_close_matches(name, list(_BY_NAME), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise CompareError(f"{expr!r}: unknown metric {name!r}; {hint}known: {', '.join(_BY_NAME)}")
    if unit == "%":
        return RegressionRule(expr.strip(), name, op, value, True)
    allowed = _ABSOLUTE_UNITS[metric.unit]
    if unit not in allowed:
        spelled = " or ".join(u or "a bare number" for u in allowed)
        raise CompareError(f"{expr!r}: give {name}'s change as a percent (like +10%) or as {spelled}")
    amount = value * NS_PER[unit] if metric.unit == "ns" and unit else value
    return RegressionRule(expr.strip(), name, op, amount, False)


def parse_rules(exprs: Sequence[str]) -> List[RegressionRule]:
    """The rules of ``--fail-if-regression`` values (each one rule or a comma list).

    Raises:
        CompareError: a rule cannot be read; the message names it and what was wrong.
    """
    return [_parse_rule(part) for expr in exprs for part in expr.split(",") if part.strip()]


# ------------------------------------------------------------------ comparing

def _full_intervals(doc: Doc) -> List[_Interval]:
    """The document's intervals that ran about their whole length: at least 90% of the
    median length (a short last one is left out)."""
    points = [p for p in doc.get("timeseries") or [] if isinstance(p, dict)]
    lengths = [float(p.get("length_s") or 0.0) for p in points]
    typical = statistics.median(lengths) if lengths else 0.0
    return [_Interval(p) for p, length in zip(points, lengths) if typical > 0 and length >= 0.9 * typical]


def _has_mig(doc: Doc) -> bool:
    devices = (doc.get("gpu") or {}).get("devices") or []
    return any(isinstance(d, dict) and d.get("mig_index") is not None for d in devices)


def interval_values(doc: Doc, metric: Metric) -> List[float]:
    """``metric``'s value in each whole interval of ``doc``'s time series that has one."""
    if metric.interval is None or (metric.name == "energy_per_query" and _has_mig(doc)):
        return []  # a MIG device's interval energy is its whole GPU's, shared with the GPU's other MIG devices
    get, factor = metric.interval, (metric.factor(doc) if metric.factor is not None else 1.0)
    if factor is None:
        return []
    return [v * factor for v in (get(iv) for iv in _full_intervals(doc)) if v is not None and math.isfinite(v)]


def _spread_pct(values: Sequence[float]) -> Optional[float]:
    """The intervals' noise: their median absolute deviation, scaled to a standard
    deviation (x 1.4826), in percent of their median."""
    if len(values) < 2:
        return None
    mid = statistics.median(values)
    if mid == 0:
        return None
    return 1.4826 * statistics.median(abs(v - mid) for v in values) / abs(mid) * 100


def _relative(base: float, change: float) -> float:
    if base:
        return change / abs(base) * 100
    return 0.0 if change == 0 else math.copysign(math.inf, change)


def _row(metric: Metric, base: Doc, new: Doc, alpha: float, min_effect_pct: float) -> Optional[Dict[str, Any]]:
    b, n = metric.whole(base), metric.whole(new)
    if b is None and n is None:
        return None
    row: Dict[str, Any] = {"metric": metric.name, "label": metric.label, "unit": metric.unit,
                           "better": "lower" if metric.lower_is_better else "higher", "base": b, "new": n,
                           "change": None, "change_pct": None, "p_value": None, "intervals": [0, 0],
                           "interval_shift": None, "interval_shift_pct": None,
                           "noise_pct": None, "significant": False, "verdict": "not judged"}
    if b is None or n is None:
        return row
    change = n - b
    rel = _relative(b, change)
    row.update(change=change, change_pct=rel if math.isfinite(rel) else None)
    xs, ys = interval_values(base, metric), interval_values(new, metric)
    row["intervals"] = [len(xs), len(ys)]
    if len(xs) < 2 or len(ys) < 2:
        return row
    test = mann_whitney_u(xs, ys)
    base_mid = statistics.median(xs)
    shift = statistics.median(ys) - base_mid
    shift_rel = _relative(base_mid, shift)
    significant = test.p_value < alpha and change * shift > 0
    row.update(p_value=test.p_value, noise_pct=_spread_pct(xs), significant=significant, interval_shift=shift,
               interval_shift_pct=shift_rel if math.isfinite(shift_rel) else None)
    if significant and min(abs(rel), abs(shift_rel)) >= min_effect_pct:
        row["verdict"] = "worse" if (change > 0) == metric.lower_is_better else "better"
    else:
        row["verdict"] = "no significant change"
    return row


def _shift_pct(row: Dict[str, Any]) -> float:
    pct = row["interval_shift_pct"]
    if pct is not None:
        return float(pct)
    return math.copysign(math.inf, row["interval_shift"]) if row["interval_shift"] else 0.0


def _fired(rules: Sequence[RegressionRule], rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    by_metric = {r["metric"]: r for r in rows}
    fired = []
    for rule in rules:
        row = by_metric.get(rule.metric)
        if row is None or row["change"] is None:
            continue
        if not rule.crossed(row["change"], _relative(row["base"], row["change"])):
            continue
        sampled = row["p_value"] is not None
        if sampled and not (row["significant"] and rule.crossed(row["interval_shift"], _shift_pct(row))):
            continue
        fired.append({"rule": rule.expr, "metric": rule.metric, "change": row["change"],
                      "change_pct": row["change_pct"], "p_value": row["p_value"],
                      "judged_on": "whole run and intervals" if sampled else "whole run only"})
    return fired


def _describe(doc: Doc) -> Dict[str, Any]:
    ivs = _full_intervals(doc)
    return {"scenario": doc.get("scenario"), "sut": doc.get("sut"), "valid": doc.get("valid"),
            "intervals": len(ivs), "interval_s": float(ivs[0].point.get("length_s") or 0.0) if ivs else None,
            "merged_workers": len(doc["merge"].get("workers") or []) if isinstance(doc.get("merge"), dict) else None}


_SETTINGS_IGNORED = ("output", "json", "quiet", "config", "label", "start_at")


def _settings_differ(base: Doc, new: Doc) -> Dict[str, List[Any]]:
    """The effective options that differ between the two runs: {name: [base, new]}."""
    b = (base.get("settings") or {}).get("effective") or {}
    n = (new.get("settings") or {}).get("effective") or {}
    return {k: [b.get(k), n.get(k)] for k in sorted(set(b) | set(n))
            if k not in _SETTINGS_IGNORED and b.get(k) != n.get(k)}


def _warnings(base: Doc, new: Doc, rows: Sequence[Dict[str, Any]]) -> List[str]:
    out = []
    for side, doc in (("BASE", base), ("NEW", new)):
        if not doc.get("valid", False):
            out.append(f"{side} is an INVALID run: " + "; ".join(map(str, doc.get("invalid_reasons") or [])))
        if doc.get("interrupted"):
            out.append(f"{side} was interrupted: its figures cover part of the run")
    sampled = [r["intervals"] for r in rows if r["metric"] == "p99"]
    fewest = min(sampled[0]) if sampled else 0
    if fewest < MIN_INTERVALS:
        out.append(f"a side has {fewest} whole interval(s) (fewer than {MIN_INTERVALS}): the test can hardly "
                   "call a change; run longer or with a shorter --interval-s")
    return out


def compare_documents(base: Doc, new: Doc, rules: Sequence[RegressionRule] = (), *,
                      alpha: float = DEFAULT_ALPHA, min_effect_pct: float = DEFAULT_MIN_EFFECT_PCT) -> Dict[str, Any]:
    """Two result documents compared: the BASE and NEW runs described, a row per headline
    figure (values, change, p-value, noise, verdict), the rules that fired, warnings and
    the options the runs differ in."""
    rows = [r for r in (_row(m, base, new, alpha, min_effect_pct) for m in METRICS) if r is not None]
    return {"base_run": _describe(base), "new_run": _describe(new), "metrics": rows,
            "fired": _fired(rules, rows), "warnings": _warnings(base, new, rows),
            "settings_differ": _settings_differ(base, new)}


def _point_name(values: Dict[str, Any], repeat: int) -> str:
    name = ", ".join(f"{k}={v}" for k, v in values.items()) or "(no swept values)"
    return name + (f" (repeat {repeat})" if repeat else "")


def compare_points(base: Sequence[Doc], new: Sequence[Doc], rules: Sequence[RegressionRule] = (), *,
                   alpha: float = DEFAULT_ALPHA,
                   min_effect_pct: float = DEFAULT_MIN_EFFECT_PCT) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """Two sweeps' records (sweep.jsonl lines) compared point by point, matched by their
    swept values and repeat. Returns the comparisons (each with ``point``, its name and
    values) and what was not compared: {"base": [...], "new": [...]} of point names that
    are on one side only or did not run to the end, with why."""
    def index(records: Sequence[Doc]) -> Dict[str, Doc]:
        return {json.dumps([r["sweep"]["values"], r["sweep"]["repeat"]], sort_keys=True, default=str): r
                for r in records}

    b_index, n_index = index(base), index(new)
    comparisons: List[Dict[str, Any]] = []
    skipped: Dict[str, List[str]] = {"base": [], "new": []}
    for key, record in b_index.items():
        name = _point_name(record["sweep"]["values"], record["sweep"]["repeat"])
        other = n_index.get(key)
        if other is None:
            skipped["base"].append(f"{name}: not in NEW")
            continue
        not_run = [f"{side} {r['sweep']['status']}" for side, r in (("BASE", record), ("NEW", other))
                   if r["sweep"]["status"] != "done" or "schema" not in r]
        if not_run:
            skipped["base"].append(f"{name}: {', '.join(not_run)}")
            continue
        docs = [{k: v for k, v in r.items() if k != "sweep"} for r in (record, other)]
        one = compare_documents(docs[0], docs[1], rules, alpha=alpha, min_effect_pct=min_effect_pct)
        comparisons.append({"point": {"name": name, "values": record["sweep"]["values"],
                                      "repeat": record["sweep"]["repeat"]}, **one})
    skipped["new"] = [f"{_point_name(r['sweep']['values'], r['sweep']['repeat'])}: not in BASE"
                      for key, r in n_index.items() if key not in b_index]
    return comparisons, skipped


# ------------------------------------------------------------------ text

def _amount(unit: str, value: Optional[float], signed: bool = False) -> str:
    if value is None:
        return "-"
    sign = ("+" if value > 0 else "-" if value < 0 else "") if signed else ""
    v = abs(value) if signed else value
    if unit == "ns":
        return sign + format_ns(v)
    if unit == "fraction":
        return f"{sign}{v * 100:.3f}%"
    if unit == "J":
        return f"{sign}{v:.4g} J"
    if unit == "cost":
        return f"{sign}{v:.4g}"
    return f"{sign}{v:,.1f}"


def _cells(row: Dict[str, Any]) -> List[str]:
    pct = row["change_pct"]
    if pct is None and row["change"]:
        pct_text = "new" if row["base"] == 0 else "-"
    else:
        pct_text = "-" if pct is None else f"{pct:+.1f}%"
    p = row["p_value"]
    return [row["label"], _amount(row["unit"], row["base"]), _amount(row["unit"], row["new"]),
            _amount(row["unit"], row["change"], signed=True), pct_text,
            "-" if row["noise_pct"] is None else f"±{row['noise_pct']:.1f}%",
            "-" if p is None else (f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}"), row["verdict"]]


_HEADER = ["metric", "base", "new", "change", "change %", "noise", "p", "verdict"]


def _table(rows: Sequence[Dict[str, Any]]) -> List[str]:
    cells = [_HEADER] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(_HEADER))]
    lines = []
    for c in cells:
        lines.append("  ".join(c[i].ljust(widths[i]) if i in (0, 7) else c[i].rjust(widths[i])
                               for i in range(len(_HEADER))).rstrip())
    return lines


def _run_line(side: str, path: str, run: Dict[str, Any]) -> str:
    ivs = f"{run['intervals']} intervals of {run['interval_s']:.3g} s" if run["interval_s"] else "no intervals"
    merged = f", merged from {run['merged_workers']} workers" if run["merged_workers"] else ""
    valid = "" if run["valid"] else ", INVALID"
    return f"{side:<5}{path}: {run['scenario']} on {run['sut']}, {ivs}{merged}{valid}"


def _comparison_lines(one: Dict[str, Any]) -> List[str]:
    lines = _table(one["metrics"])
    for name, (b, n) in one["settings_differ"].items():
        lines.append(f"differs: {name}: {b!r} -> {n!r}")
    for fired in one["fired"]:
        lines.append(f"REGRESSION: {fired['rule']} fired ({fired['judged_on']})")
    return lines


def render_comparison(report: Dict[str, Any]) -> str:
    """The text of a comparison report (as :func:`loadgen.cli.compare` builds it)."""
    out = [f"test  {TEST_NAME}; a change is called at p < {report['alpha']:g} and "
           f"at least {report['min_effect_pct']:g}% (noise: the intervals' spread in BASE)"]
    for one in report["comparisons"]:
        out.append("")
        if one.get("point"):
            out.append(f"== point {one['point']['name']}")
        out.append(_run_line("base", report["base"], one["base_run"]))
        out.append(_run_line("new", report["new"], one["new_run"]))
        out.extend(_comparison_lines(one))
    for side, names in (report.get("not_compared") or {}).items():
        for name in names:
            out.append(f"not compared ({side}): {name}")
    out.append("")
    rules = ", ".join(report["rules"]) or "none given"
    out.append(("REGRESSION" if report["regression"] else "no regression") + f" (rules: {rules})")
    return "\n".join(out) + "\n"
