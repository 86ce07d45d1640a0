"""What a peak search reports: one summary per run (``probes.jsonl`` and the ``peak``
section's ``runs``), the ``peak`` section of the final document, and its text (a table
of the runs, then the answer line)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from loadgen.options import RunOptions
from loadgen.peak.criteria import judge_run
from loadgen.peak.search import Search
from loadgen.stats.histogram import Histogram
from loadgen.results.render import format_setting, peak_lines
from loadgen.units import ns_to_ms

if TYPE_CHECKING:
    from loadgen.peak.driver import PeakSearch, PeakSettings

__all__ = ["UNITS", "latency_at", "peak_section", "render_peak", "run_summary", "setting_value"]

#: The unit of the answer, by what was searched over.
UNITS = {"rate": "queries/s", "concurrency": "queries in flight"}
_PERCENTILE_KEYS = {50.0: "p50", 90.0: "p90", 95.0: "p95", 99.0: "p99", 99.9: "p99.9", 99.99: "p99.99"}


def setting_value(over: str, x: Optional[float]) -> Optional[float]:
    """A setting as the document holds it: a concurrency as an integer, a rate as is."""
    if x is None or over != "concurrency":
        return x
    return int(x)


def latency_at(doc: Dict[str, Any], percentile: float) -> Optional[int]:
    """The run's latency at ``percentile`` in ns (None when nothing was recorded)."""
    h = doc.get("latency_ns")
    if not h or not h.get("count"):
        return None
    key = _PERCENTILE_KEYS.get(float(percentile))
    if key is not None and key in h:
        return int(h[key])
    return int(Histogram.decode(h["hdr"]).value_at_percentile(percentile))


def run_summary(doc: Dict[str, Any], index: int, phase: str, x: float, options: RunOptions,
                settings: PeakSettings, folder: Optional[str], *,
                min_goodput: Optional[float] = None) -> Dict[str, Any]:
    """One run of a search as a line of ``probes.jsonl``: its setting and phase, whether
    it held and why not (:func:`loadgen.peak.criteria.judge_run`: ``outcome`` is
    ``holds``, ``fails`` or ``inconclusive``, ``cause`` whose failure it was), the latency
    at the percentile, error rate, goodput, throughput and duration; for a concurrency
    probe its windows and whether they were stable."""
    effective = doc.get("settings", {}).get("effective", {})
    percentile = float(effective.get("latency_percentile") or options.latency_percentile or 99.0)
    counts = doc.get("counts", {})
    issued = counts.get("issued", 0)
    judged = judge_run(doc, goodput_fraction=min_goodput, percentile=percentile,
                       latency_bound_ms=effective.get("latency_bound_ms", options.latency_bound_ms))
    summary: Dict[str, Any] = {
        "index": index,
        "phase": phase,
        "x": setting_value(settings.over, x),
        "holds": judged.holds,
        "why": judged.why,
        "outcome": "holds" if judged.holds else "inconclusive" if judged.inconclusive else "fails",
        "cause": judged.cause,
        "valid": bool(doc.get("valid")),
        "percentile": percentile,
        "latency_ns": latency_at(doc, percentile),
        "error_rate": (counts.get("failed", 0) + counts.get("timed_out", 0)) / issued if issued else 0.0,
        "qps": float(doc.get("throughput", {}).get("completed_qps", 0.0)),
        "duration_s": float(doc.get("duration_s", 0.0)),
        "interrupted": bool(doc.get("interrupted")),
        "folder": folder,
    }
    goodput = doc.get("goodput")
    if goodput:
        summary["goodput_fraction"] = float(goodput.get("fraction", 0.0))
    if settings.over == "concurrency" and phase != "confirm":
        summary.update(_windows(doc, settings))
    return summary


def _windows(doc: Dict[str, Any], settings: PeakSettings) -> Dict[str, Any]:
    """A concurrency probe's windows: how many full ones, whether the last 3 agreed, and
    its throughput: the mean of those 3 (the whole run's when there are fewer)."""
    from loadgen.peak.driver import full_windows, windows_done

    full = full_windows(doc.get("timeseries", []), settings)
    qps = [float(p["qps"]) for p in full]
    out: Dict[str, Any] = {"windows": len(full), "stable": windows_done(full, settings)}
    if len(qps) >= 3:
        out["qps"] = sum(qps[-3:]) / 3
    return out


def peak_section(ps: PeakSearch, search: Search, outcome: Dict[str, Any], confirmed: bool,
                 wall_s: float) -> Dict[str, Any]:
    """The ``peak`` section of the final document."""
    s = ps.settings
    confirmation = outcome["confirmation"]
    bracket = outcome["bracket"]
    settings = dataclasses.asdict(s)
    settings.update(start=ps.start, window_s=s.window if s.over == "concurrency" else None,
                    confirm_duration_s=ps.confirm_s)
    return {
        "over": s.over,
        "answer": setting_value(s.over, confirmation.answer) if confirmed else None,
        "candidate": setting_value(s.over, confirmation.answer) if confirmation is not None else None,
        "unit": UNITS[s.over],
        "confirmed": confirmed,
        "reason": outcome["reason"],
        "scenario": ps.options.scenario,
        "percentile": ps.runs[0]["percentile"] if ps.runs else ps.options.latency_percentile,
        "latency_bound_ms": ps.options.latency_bound_ms,
        "probes": search.probes,
        "confirmation_runs": sum(1 for r in ps.runs if r["phase"] == "confirm"),
        "step_downs": max(0, confirmation.attempts - 1) if confirmation is not None else 0,
        "limited_by": outcome.get("limited_by"),
        "lower_bound": setting_value(s.over, outcome.get("lower_bound")),
        "inconclusive_runs": sum(1 for r in ps.runs if r.get("outcome") == "inconclusive"),
        "bracket": [setting_value(s.over, bracket.lo), setting_value(s.over, bracket.hi)] if bracket else None,
        "precision": s.precision,
        "search_wall_s": wall_s,
        "interrupted": bool(outcome["interrupted"]),
        "settings": settings,
        "runs": list(ps.runs),
    }


def render_peak(doc: Dict[str, Any]) -> str:
    """The text of a search: a table of its runs, then the answer line (and the reason)."""
    peak = doc["peak"]
    over = peak["over"]
    head = "rate q/s" if over == "rate" else "in flight"
    pct = f"p{peak['percentile']:g}"
    lines = [f"{'#':>3}  {'phase':<8}{head:>12}  {pct + ' ms':>10}  {'errors':>7}  {'done q/s':>11}  "
             f"{'time s':>7}  verdict"]
    for r in peak["runs"]:
        latency = f"{ns_to_ms(r['latency_ns']):.3f}" if r["latency_ns"] is not None else "-"
        verdict = _verdict(r, peak["runs"])
        if "stable" in r and not r["stable"]:
            verdict += f" (unstable after {r['windows']} windows)"
        lines.append(f"{r['index']:>3}  {r['phase']:<8}{format_setting(r['x']):>12}  {latency:>10}  "
                     f"{r['error_rate']:>7.2%}  {r['qps']:>11,.1f}  {r['duration_s']:>7.2f}  {_cut(verdict)}")
    lines.append("")
    lines += peak_lines(doc)
    return "\n".join(lines) + "\n"


def _verdict(r: Dict[str, Any], runs: List[Dict[str, Any]]) -> str:
    """A run's verdict in the table. A run that failed only for the generator or the
    client is "not judged"; a failure its recheck overruled, "flipped"; a concurrency
    probe on the plateau "holds" (the run held: it is the knee's rule that stops there)."""
    outcome = r.get("outcome", "holds" if r["holds"] else "fails")
    if outcome == "inconclusive":
        return f"not judged ({r.get('cause') or 'generator'}): {r['why']}"
    if outcome == "plateau":
        return f"holds, on the plateau: {r.get('note', '')}"
    if outcome == "holds":
        return "holds"
    after = next((o for o in runs if o["index"] > r["index"] and o["x"] == r["x"] and o["phase"] == r["phase"]), None)
    if after is not None and after.get("attempt", 1) > r.get("attempt", 1) and after["holds"] and r["phase"] != "confirm":
        return f"flipped (held on recheck): {r['why']}"
    return f"fails: {r['why']}"


def _cut(text: str, width: int = 110) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
