"""When a run of a peak search holds, fails, or says nothing of the SUT: a verdict read
from the run's result document alone.

A run **fails** when the SUT missed a criterion: the latency bound, the error rate, a
query the SUT did not answer in time, any other reason the run is invalid that is not the
generator's, a ``--require``/``--fail-if`` threshold, the goodput target of ``--slo``
(``--min-goodput``), or keeping up: a run whose diagnosis warns that the server saturated
(``server_saturated``: its outstanding queries and latency grew over the run while issuing
kept to the schedule) fails even within the bound, since a backlog that grows over a
probe grows without end over a long run at that rate. A run is **inconclusive** when the only thing wrong is the load
generator or its client (the document's ``diagnosis`` names the ``generator`` or the
``client`` as the cause of an invalid run, or, in documents without one, an invalid
reason starts with ``generator overload:`` or ``generator saturated``): the load was not offered as scheduled, so the
run says nothing of what the SUT can take. The search retries such a run and never takes
it for the SUT's limit.

Latency is measured from the scheduled time, so a late generator raises it: in a run the
generator made late, a missed latency bound counts against the SUT only when the latency
at the percentile less the p99 issue delay is still over the bound (the lateness does not
explain it). On a busy machine a stalled generator otherwise fails a rate the SUT holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from loadgen.units import ns_to_ms, to_ns

__all__ = ["GENERATOR_CAUSES", "GENERATOR_PREFIXES", "Judgement", "goodput_target", "judge_run", "threshold_failure"]

#: The causes of a document's ``diagnosis`` that are the load generator's, not the SUT's.
GENERATOR_CAUSES = ("generator", "client")
#: Invalid reasons that are the generator's (documents without a ``diagnosis``).
GENERATOR_PREFIXES = ("generator overload:", "generator saturated")
_LATENCY_METRICS = ("p50", "p90", "p95", "p99", "p99.9", "p99.99", "mean", "max", "min", "issue_delay_p99",
                    "service_p99")


@dataclass(frozen=True)
class Judgement:
    """A run's verdict.

    Attributes:
        holds: the SUT met every criterion and the run is valid.
        inconclusive: the run failed for the generator or the client alone.
        cause: ``generator`` or ``client`` when inconclusive, ``server`` when it failed,
            empty when it held.
        why: what failed, as a sentence (every failed criterion, joined by ``; ``);
            empty when it held.
        failed: each failed criterion of the SUT, as a sentence.
    """

    holds: bool
    inconclusive: bool = False
    cause: str = ""
    why: str = ""
    failed: List[str] = field(default_factory=list)


def goodput_target(slos: Sequence[str], require: Sequence[str], fail_if: Sequence[str],
                   min_goodput: Optional[float], default: float) -> Optional[float]:
    """The goodput fraction a run must reach: ``min_goodput`` when given; with ``--slo``
    and no ``--require``/``--fail-if`` on goodput, ``default``; else None (the thresholds,
    if any, say it)."""
    if min_goodput is not None:
        return min_goodput
    if not slos:
        return None
    if any(expr.strip().startswith("goodput") for expr in [*require, *fail_if]):
        return None
    return default


def _generator_reason(reason: str) -> bool:
    return reason.startswith(GENERATOR_PREFIXES)


def _server_reason(reason: str) -> bool:
    """An invalid reason that is a criterion of the SUT: the bound, errors, queries it
    left unanswered."""
    return (reason.startswith("latency bound missed") or "(--max-error-rate)" in reason
            or "were cancelled" in reason)


def _number(metric: str, value: float) -> str:
    if metric in _LATENCY_METRICS:
        return f"{ns_to_ms(value):,.3f} ms"
    if metric in ("goodput_fraction", "error_rate"):
        return f"{value:.3g}"
    return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.1f}"


def threshold_failure(t: Dict[str, Any]) -> str:
    """A failed ``--require``/``--fail-if`` entry of ``doc["thresholds"]`` as a sentence,
    like ``goodput_fraction 0.81 below --require goodput_fraction>=0.95``."""
    metric, expr, actual = t["metric"], t["expr"], float(t["actual"])
    shown = f"{metric} {_number(metric, actual)}"
    if t["kind"] == "require":
        op = expr.replace(" ", "")[len(metric):][:2]
        word = "below" if op.startswith(">") else "above" if op.startswith("<") else "fails"
        return f"{shown} {word} --require {expr}"
    return f"{shown}: --fail-if {expr} holds"


def _explained_by_lateness(doc: Dict[str, Any], percentile: Optional[float], bound_ms: Optional[float]) -> bool:
    """Whether the latency at ``percentile`` less the p99 issue delay is within the bound."""
    if percentile is None or bound_ms is None:
        return False
    from loadgen.peak.report import latency_at

    latency = latency_at(doc, percentile)
    delay = (doc.get("issue_delay_ns") or {}).get("p99")
    if latency is None or delay is None:
        return False
    return latency - float(delay) <= to_ns(bound_ms, "ms")


def judge_run(doc: Dict[str, Any], *, goodput_fraction: Optional[float] = None, percentile: Optional[float] = None,
              latency_bound_ms: Optional[float] = None) -> Judgement:
    """The verdict on one run's result document (see the module).

    Args:
        doc: the run's result document.
        goodput_fraction: the fraction of its requests that must meet every ``--slo``
            (None: no goodput target beyond the thresholds).
        percentile, latency_bound_ms: the run's latency bound, to tell a bound missed for
            the generator's lateness from one the SUT missed (None: every miss counts).
    """
    reasons = [str(r) for r in doc.get("invalid_reasons", [])]
    if doc.get("interrupted"):
        return Judgement(False, False, "server", reasons[0] if reasons else "the run was interrupted",
                         reasons[:1])
    diagnosis = doc.get("diagnosis")
    cause = ""
    if isinstance(diagnosis, dict) and diagnosis.get("invalid") and diagnosis.get("cause") in GENERATOR_CAUSES:
        cause = str(diagnosis["cause"])
    elif not doc.get("valid", False) and any(_generator_reason(r) for r in reasons):
        cause = "generator"
    failed = [r for r in reasons if _server_reason(r)]
    if cause and _explained_by_lateness(doc, percentile, latency_bound_ms):
        failed = [r for r in failed if not r.startswith("latency bound missed")]
    if not cause:  # every other reason a run is invalid counts against the SUT
        failed += [r for r in reasons if not _server_reason(r) and not _generator_reason(r)]
    failed += [threshold_failure(t) for t in doc.get("thresholds", []) if not t.get("passed", True)]
    failed += [str(w.get("message") or "the server saturated") for w in doc.get("warnings") or []
               if isinstance(w, dict) and w.get("name") == "server_saturated"]
    goodput = doc.get("goodput")
    if goodput_fraction is not None:
        fraction = float(goodput["fraction"]) if goodput else 0.0
        if fraction < goodput_fraction:
            slos = ", ".join(goodput["slos"]) if goodput else "--slo"
            failed.append(f"goodput {fraction:.3g} of requests met every SLO ({slos}), below --min-goodput "
                          f"{goodput_fraction:g}")
    if failed:
        return Judgement(False, False, "server", "; ".join(failed), failed)
    if cause:
        summary = diagnosis.get("summary") if isinstance(diagnosis, dict) else None
        generator = [r for r in reasons if _generator_reason(r)]
        why = str(summary) if summary else (generator[0] if generator else f"the {cause} failed")
        return Judgement(False, True, cause, why)
    if not doc.get("valid", False):  # invalid with no reason given
        return Judgement(False, False, "server", "the run is invalid", ["the run is invalid"])
    return Judgement(True)
