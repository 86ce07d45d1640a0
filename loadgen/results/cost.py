"""Cost per point: ``--price-per-hour`` turned into what a run's work costs.

A price is ``PRICE`` or ``PRICE/node`` (the whole node, an hour), ``PRICE/gpu`` (one
GPU, an hour, times the GPUs the run sampled: the result's ``gpu`` section) or
``PRICE/gpu:N`` (times N GPUs, for a server whose GPUs the generator does not see). The
currency is the price's own; the figures are in it.

The result's ``cost`` section: the hardware's price for the run's ``duration_s``
(``run_cost``) over the queries it completed (failed and timed-out queries cost time but
count for nothing), per 1,000 queries; and over its tokens, per million: ``output`` (the
tokens of the answers, ``counts.tokens``), ``input`` (the prompt tokens sent,
``llm.requests.input_tokens_sent``) and ``total`` (both), each where the run has it.
The same as price per hour over work done per hour at the run's throughput.

``loadgen sweep --pick RULE`` names the cheapest point that meets every rule
(:func:`pick_cheapest`); the rules are ``--require`` expressions
(:mod:`loadgen.results.thresholds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from loadgen.results.thresholds import ThresholdError, evaluate_thresholds, parse_threshold
from loadgen.units import format_ns

__all__ = ["PICK_BY", "Price", "PriceError", "add_cost", "cost_figures", "cost_text", "parse_price",
           "pick_cheapest", "render_pick"]

MAX_PRICE = 1e9     # an hour, in any currency
MAX_GPUS = 1 << 16
_PER = ("node", "gpu")
_TIME_METRICS = ("p50", "p90", "p95", "p99", "p99.9", "p99.99", "mean", "max", "min", "issue_delay_p99", "service_p99")
#: ``--pick-by``: the cost the cheapest point is chosen by -> its key in the cost section.
PICK_BY = {"queries": ("per_1k_queries",), "output-tokens": ("per_million_tokens", "output"),
           "tokens": ("per_million_tokens", "total")}
_PICK_BY_LABEL = {"queries": "per 1,000 queries", "output-tokens": "per million output tokens",
                  "tokens": "per million tokens"}


class PriceError(ValueError):
    """A --price-per-hour that cannot be read; the message says what is allowed."""


_SYNTAX = "PRICE or PRICE/node (the node an hour), PRICE/gpu (a GPU an hour, times the GPUs sampled) or PRICE/gpu:N"


@dataclass(frozen=True)
class Price:
    """A parsed ``--price-per-hour``: ``amount`` per ``per`` (node or gpu) an hour, and
    the GPUs given (``gpus``; None: those the run sampled)."""

    amount: float
    per: str
    gpus: Optional[int]

    @property
    def text(self) -> str:
        return f"{self.amount:g}/{self.per}" + (f":{self.gpus}" if self.gpus is not None else "")


def parse_price(value: Any) -> Price:
    """'3.2', '3.2/node', '2.1/gpu', '2.1/gpu:8' (a TOML number too) -> Price. PriceError
    for a negative, zero, non-finite or unreadable price, an unknown unit or a bad count."""
    if isinstance(value, bool):
        raise PriceError(f"must be {_SYNTAX}; got {value!r}")
    text = str(value).strip()
    amount_text, slash, unit = text.partition("/")
    per, colon, count = unit.strip().partition(":")
    per = per.strip().lower() if slash else "node"
    try:
        amount = float(amount_text)
    except ValueError:
        raise PriceError(f"must be {_SYNTAX}, like 3.20 or 2.10/gpu; got {value!r}") from None
    if not (math.isfinite(amount) and 0 < amount <= MAX_PRICE):
        raise PriceError(f"the price must be a finite number > 0 and <= {MAX_PRICE:g}; got {value!r}")
    if per not in _PER:
        raise PriceError(f"unknown unit {per!r} in {value!r}: the price is per node or per gpu ({_SYNTAX})")
    gpus: Optional[int] = None
    if colon:
        if per != "gpu":
            raise PriceError(f"{value!r}: only a per-gpu price takes a count (PRICE/gpu:N)")
        if not count.strip().isdigit() or not 1 <= int(count) <= MAX_GPUS:
            raise PriceError(f"{value!r}: the GPU count must be an integer from 1 to {MAX_GPUS}")
        gpus = int(count)
    return Price(amount, per, gpus)


def _sampled_gpus(doc: Dict[str, Any]) -> int:
    """The GPUs the run sampled (a GPU split into MIG devices counts once), by UUID where
    the devices have one: a merged result's GPUs come from several nodes, each with its GPU 0."""
    gpu = doc.get("gpu")
    if not isinstance(gpu, dict) or gpu.get("status") not in ("ok", "partial"):
        return 0
    devices = [d for d in gpu.get("devices") or [] if isinstance(d, dict)]
    return len({d.get("parent_uuid") or d.get("uuid") or ("index", d.get("index", k)) for k, d in enumerate(devices)})


def _per(run_cost: float, amount: float, scale: float) -> Optional[float]:
    return run_cost / amount * scale if amount > 0 else None


def add_cost(doc: Dict[str, Any], price_text: Optional[str]) -> None:
    """Puts the ``cost`` section in ``doc`` (replacing one there) from ``price_text``
    (``--price-per-hour``); none without a price."""
    if not price_text:
        doc.pop("cost", None)
        return
    price = parse_price(price_text)
    if price.per == "node":
        units, source = 1, "node"
    elif price.gpus is not None:
        units, source = price.gpus, "given"
    else:
        units, source = _sampled_gpus(doc), "sampled"
    hourly = price.amount * units
    duration = float(doc.get("duration_s") or 0.0)
    run_cost = hourly * duration / 3600.0
    counts = doc.get("counts") or {}
    each = "" if price.per == "node" else f" ({units} GPU{'' if units == 1 else 's'} {source}, {price.amount:g} each)"
    section: Dict[str, Any] = {
        "price_per_hour": price.amount, "per": price.per, "given": price.text, "units": units,
        "units_from": source, "hourly": hourly, "basis": f"{hourly:g} an hour for the {price.per}{each}",
        "run_cost": run_cost, "per_1k_queries": _per(run_cost, float(counts.get("completed") or 0), 1e3),
    }
    requests = ((doc.get("llm") or {}).get("requests") or {}) if isinstance(doc.get("llm"), dict) else {}
    tokens = {"output": float(counts.get("tokens") or 0), "input": float(requests.get("input_tokens_sent") or 0)}
    if any(tokens.values()):
        tokens["total"] = tokens["output"] + tokens["input"]
        section["per_million_tokens"] = {k: _per(run_cost, n, 1e6) for k, n in tokens.items() if n > 0}
    if units == 0:
        section["note"] = ("no GPUs were sampled (no NVML, or --gpus none): the GPUs' price is unknown; "
                           "give PRICE/gpu:N for N GPUs")
        section["per_1k_queries"] = None
        section.pop("per_million_tokens", None)
    doc["cost"] = section


def _money(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if x >= 1e-4 else f"{x:.2e}"


def cost_text(doc: Dict[str, Any]) -> Optional[str]:
    """The cost in a line (for the summary and the report); None without one."""
    c = doc.get("cost")
    if not isinstance(c, dict):
        return None
    if c.get("note"):
        return f"{c['note']} ({c.get('given')})"
    parts = [f"{_money(c.get('per_1k_queries'))} per 1,000 queries"]
    names = {"output": "output tokens", "input": "input tokens", "total": "tokens in all"}
    parts += [f"{_money(v)} per million {names[k]}" for k, v in (c.get("per_million_tokens") or {}).items()
              if k in names]
    return f"{', '.join(parts)} ({c.get('basis')}; {_money(c.get('run_cost'))} for this run)"


def cost_figures(record: Dict[str, Any]) -> Dict[str, Any]:
    """A document's cost as flat columns (sweep.csv): ``cost.hourly``, ``cost.basis``,
    ``cost.per_1k_queries`` and ``cost.per_million_{output,input}_tokens`` /
    ``cost.per_million_tokens`` (input and output) where the run has them."""
    c = record.get("cost")
    if not isinstance(c, dict):
        return {}
    row = {"cost.hourly": c.get("hourly"), "cost.basis": c.get("basis"), "cost.per_1k_queries": c.get("per_1k_queries")}
    for key, value in (c.get("per_million_tokens") or {}).items():
        row["cost.per_million_tokens" if key == "total" else f"cost.per_million_{key}_tokens"] = value
    return row


# ---------------------------------------------------------------------------- --pick

def _cost_by(doc: Dict[str, Any], by: str) -> Optional[float]:
    value: Any = doc.get("cost")
    for key in PICK_BY[by]:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _describe(values: Dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items())


def _why_not(record: Dict[str, Any], rules: Sequence[str], by: str) -> Tuple[Optional[str], Optional[float]]:
    """Why one run of a point does not meet the rules (None when it does), and its cost."""
    sweep = record.get("sweep") or {}
    if sweep.get("status") != "done":
        return f"{sweep.get('status')}: {sweep.get('error') or 'no result'}", None
    if not record.get("valid"):
        return f"invalid: {(record.get('invalid_reasons') or ['?'])[0]}", None
    for t in record.get("thresholds") or []:
        if not t.get("passed"):
            return f"its own threshold {t.get('expr')} failed", None
    for t in evaluate_thresholds(record, [], rules):
        if not t["passed"]:
            metric, actual = t["metric"], t["actual"]
            shown = format_ns(actual) if metric in _TIME_METRICS else f"{actual:.6g}"
            return f"{t['expr']} does not hold: {metric} is {shown}", None
    cost = _cost_by(record, by)
    if cost is None:
        section = record.get("cost")
        if not isinstance(section, dict):
            return "no cost: it ran without --price-per-hour", None
        return f"no cost {_PICK_BY_LABEL[by]}: {section.get('note') or 'the run has no such figure'}", None
    return None, cost


def _priced(record: Dict[str, Any], price: str) -> Dict[str, Any]:
    """A copy of a sweep record with the cost at ``price`` (a point that measured nothing as it is)."""
    if "schema" not in record:
        return record
    out = dict(record)
    add_cost(out, price)
    return out


def pick_cheapest(records: Sequence[Dict[str, Any]], rules: Sequence[str], by: str = "queries",
                  price: Optional[str] = None) -> Dict[str, Any]:
    """The cheapest point of a sweep's records that meets every rule in ``rules``.

    A point meets the rules when every run of it (its repeats) finished, is valid,
    passed its own thresholds and holds each rule; its cost is the mean of its runs'
    cost ``by`` (:data:`PICK_BY`). ``price`` (a --price-per-hour) prices every run anew.

    Returns ``{"rules", "by", "pick": the cheapest point or None, "points": every point
    with "meets", "cost", "why"}``; a point is ``{"point", "values", "runs", ...}``.

    Raises:
        ThresholdError: a rule cannot be read.
    """
    for rule in rules:
        parse_threshold(rule)
    if by not in PICK_BY:
        raise ThresholdError(f"--pick-by must be one of {', '.join(PICK_BY)}; got {by!r}")
    grouped: Dict[int, List[Dict[str, Any]]] = {}
    for record in records:
        grouped.setdefault(int(record["sweep"]["index"]), []).append(record)
    points: List[Dict[str, Any]] = []
    for index, runs in sorted(grouped.items()):
        why, costs = None, []
        if price is not None:
            runs = [_priced(r, price) for r in runs]
        for record in runs:
            reason, cost = _why_not(record, rules, by)
            if reason is not None:
                why = reason if len(runs) == 1 else f"repeat {record['sweep'].get('repeat')}: {reason}"
                break
            costs.append(float(cost or 0.0))
        first = runs[0]
        points.append({"point": index, "values": dict(first["sweep"].get("values") or {}),
                       "labels": dict(first.get("labels") or {}), "runs": len(runs), "meets": why is None,
                       "cost": sum(costs) / len(costs) if why is None else None, "why": why,
                       "basis": (first.get("cost") or {}).get("basis")})
    meeting = [p for p in points if p["meets"]]
    best = min(meeting, key=lambda p: (p["cost"], p["point"])) if meeting else None
    for p in meeting:
        if p is not best and best is not None:
            more = (p["cost"] / best["cost"] - 1) * 100 if best["cost"] else math.inf
            p["why"] = f"meets the rules, at {_money(p['cost'])} {_PICK_BY_LABEL[by]} ({more:+.0f}%)"
    return {"rules": list(rules), "by": by, "by_label": _PICK_BY_LABEL[by], "pick": best, "points": points}


def render_pick(report: Dict[str, Any]) -> str:
    """The text of a :func:`pick_cheapest` report: the pick, then why each other point
    was not picked."""
    rules = " and ".join(report["rules"]) or "no rule"
    best = report["pick"]
    if best is None:
        lines = [f"pick: no point meets {rules}"]
    else:
        lines = [f"pick: point {best['point']} ({_describe(best['values'])}): {_money(best['cost'])} "
                 f"{report['by_label']} ({best['basis']}); meets {rules}"]
    others = [p for p in report["points"] if p is not best]
    if others:
        lines.append("not picked:")
        lines += [f"  point {p['point']} ({_describe(p['values'])}): {p['why']}" for p in others]
    return "\n".join(lines) + "\n"
