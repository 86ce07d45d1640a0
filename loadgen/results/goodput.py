"""Goodput against service level objectives (``--slo ttft<=200ms``): how many requests
per second met every SLO, and the fraction meeting each.

The engine judges each measured query natively as it resolves it, on the query's own
times (never from a histogram): latency = completed - scheduled, TTFT = first token -
scheduled, TPOT = (completed - first token) / (output tokens - 1), integer ns. A query
with at most one output token has no TPOT and meets a TPOT SLO; one without a first token
fails a TTFT SLO. Failed, timed-out and cancelled queries meet none. This module reads
the SLOs and turns the engine's counts into the result's ``goodput`` section.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, Mapping, Optional, Sequence

from loadgen.units import TIME_UNITS, to_ns

__all__ = ["SLO_NAMES", "goodput_section", "parse_slo", "parse_slos"]

#: The SLOs the engine judges, in the order the result lists them.
SLO_NAMES = ("ttft", "tpot", "latency")
_MAX_NS = 10**17  # about 3 years, the engine's time range
_SLO = re.compile(r"^\s*(?P<name>[a-z_]+)\s*<=\s*(?P<bound>.*?)\s*$")
_BOUND = re.compile(r"(?P<value>[-+]?(?:inf(?:inity)?|nan|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|[0-9]+\.))"
                    r"\s*(?P<unit>[a-z]*)", re.IGNORECASE)
_ALLOWED = f"allowed: 1 ns to {_MAX_NS // 10**9:.0e} s, about 3 years".replace("e+0", "e")


def parse_slo(text: str) -> "tuple[str, int]":
    """'ttft<=200ms' -> ('ttft', 200000000). Raises ValueError naming what is wrong and,
    for a bound that is not a finite number in range, the allowed range."""
    m = _SLO.match(str(text))
    if not m or not m.group("bound"):
        raise ValueError(f"{text!r} is not NAME<=VALUE with a time unit, like ttft<=200ms or latency<=5s")
    name, bound = m.group("name"), m.group("bound")
    if name == "itl":
        raise ValueError(f"{text!r}: an itl SLO is not supported (the engine sees a request's first token "
                         f"and completion, not each gap); use tpot, the mean gap, instead")
    if name not in SLO_NAMES:
        raise ValueError(f"{text!r}: unknown SLO {name!r}; use one of {', '.join(SLO_NAMES)}")
    b = _BOUND.fullmatch(bound)
    if not b:
        raise ValueError(f"{text!r}: the bound {bound!r} is not a number and a time unit, like {name}<=200ms "
                         f"({_ALLOWED})")
    unit, value = b.group("unit"), float(b.group("value"))
    if not math.isfinite(value):
        raise ValueError(f"{text!r}: the bound must be a finite number ({_ALLOWED})")
    if unit not in TIME_UNITS:
        raise ValueError(f"{text!r}: give a time unit ({', '.join(TIME_UNITS)}), like {name}<=200ms")
    ns = to_ns(value, unit)
    if not 1 <= ns <= _MAX_NS:
        raise ValueError(f"{text!r}: the bound is out of range ({_ALLOWED})")
    return name, int(round(ns))


def parse_slos(texts: Sequence[str]) -> Dict[str, int]:
    """Every ``--slo`` as {name: bound in ns}; each name at most once."""
    out: Dict[str, int] = {}
    for text in texts:
        name, ns = parse_slo(text)
        if name in out:
            raise ValueError(f"{text!r}: the {name} SLO is given twice")
        out[name] = ns
    return out


def goodput_section(counts: Mapping[str, Any], slos: Sequence[str], duration_s: float) -> Optional[Dict[str, Any]]:
    """The result's ``goodput`` section from the engine's counts (``slo_*``, completed,
    failed, timed_out, cancelled) for the ``--slo`` texts ``slos``; None without SLOs.

    ``of`` is every measured query that resolved (completed, failed, timed out or
    cancelled); ``met`` those that completed meeting every SLO; ``requests_per_s`` is
    ``met`` per second of the measured duration (as completed_qps)."""
    bounds = parse_slos(slos)
    if not bounds:
        return None
    of = int(counts.get("slo_judged", 0)) + sum(int(counts.get(k, 0)) for k in ("failed", "timed_out", "cancelled"))
    met = int(counts.get("slo_met", 0))

    def frac(n: int) -> float:
        return n / of if of else 0.0

    per_slo = {}
    for name in SLO_NAMES:
        if name in bounds:
            n = int(counts.get(f"slo_met_{name}", 0))
            per_slo[name] = {"bound_ns": bounds[name], "met": n, "fraction": frac(n)}
    return {
        "slos": [f"{name}<={bounds[name]}ns" for name in SLO_NAMES if name in bounds],
        "requests_per_s": met / duration_s if duration_s > 0 else 0.0,
        "met": met,
        "of": of,
        "fraction": frac(met),
        "per_slo": per_slo,
    }
