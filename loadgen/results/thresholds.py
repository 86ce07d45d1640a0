"""``--fail-if`` and ``--require``: threshold expressions on a result document
(``p99<5ms``, ``error_rate>0.01``), read and checked."""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, Callable, Dict, List, Sequence, Tuple

from loadgen.units import to_ns

__all__ = ["THRESHOLD_METRICS", "ThresholdError", "evaluate_thresholds", "parse_threshold"]


class ThresholdError(ValueError):
    """A --fail-if/--require expression that cannot be read."""


_EXPR = re.compile(
    r"^\s*(?P<metric>[a-z_][a-z0-9_.]*)\s*(?P<op><=|>=|==|!=|<|>)\s*"
    r"(?P<value>[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>ns|us|ms|s|%)?\s*$"
)
_LATENCY_METRICS = ("p50", "p90", "p95", "p99", "p99.9", "p99.99", "mean", "max", "min")
_OPS: Dict[str, Callable[[float, float], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}
THRESHOLD_METRICS = _LATENCY_METRICS + (
    "issue_delay_p99", "service_p99", "qps", "samples_per_s", "error_rate", "failed", "timed_out",
    "goodput", "goodput_fraction",
)
_FRACTIONS = ("error_rate", "goodput_fraction")  # also given in % (error_rate>1%)


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
    if metric in ("goodput", "goodput_fraction"):
        goodput = doc.get("goodput")
        if not goodput:  # no --slo (refused before a run): nothing met
            return 0.0
        return float(goodput["requests_per_s" if metric == "goodput" else "fraction"])
    if metric == "error_rate":
        return (counts["failed"] + counts["timed_out"]) / counts["issued"] if counts["issued"] else 0.0
    return float(counts[metric])


def parse_threshold(expr: str) -> Tuple[str, str, float]:
    """'p99<5ms' -> (metric, op, value in the metric's base unit). Raises ThresholdError."""
    m = _EXPR.match(expr)
    if not m:
        raise ThresholdError(
            f"{expr!r} is not METRIC OP VALUE[UNIT], like 'p99>5ms' or 'error_rate>0.01'"
        )
    metric, op, value, unit = m.group("metric"), m.group("op"), float(m.group("value")), m.group("unit")
    if metric not in THRESHOLD_METRICS:
        close = difflib.get_close_matches(metric, THRESHOLD_METRICS, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; use one of {', '.join(THRESHOLD_METRICS)}"
        raise ThresholdError(f"{expr!r}: unknown metric {metric!r}{hint}")
    is_latency = metric in _LATENCY_METRICS or metric in ("issue_delay_p99", "service_p99")
    if is_latency:
        if unit is None or unit == "%":
            raise ThresholdError(f"{expr!r}: {metric} is a latency; give a unit (ns, us, ms, s)")
        value = to_ns(value, unit)
    elif unit == "%" and metric in _FRACTIONS:
        value /= 100.0
    elif unit is not None:
        raise ThresholdError(f"{expr!r}: {metric} takes no unit{' but %' if metric in _FRACTIONS else ''}")
    if not math.isfinite(value):  # such as 1e400ms: no figure compares with it, and a result holds none
        raise ThresholdError(f"{expr!r}: the value is out of range (a finite number, below 1e308 in ns for a latency)")
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
