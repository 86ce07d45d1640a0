"""The workers' results as the merge sees them, and what makes a merge invalid before any
figure is added: workers missing, given twice, partial, interrupted, late, saturated,
or with other settings.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any, Dict, List, Sequence, Tuple

from loadgen.workers import late_start_reason

__all__ = ["MAX_MESSAGES", "Input", "Worker", "mismatch_reasons", "read_workers", "roster_reasons", "saturation_reasons",
           "state_reasons", "worker_figures", "worker_name"]

#: Error messages a merged document keeps (the first ones, each once).
MAX_MESSAGES = 10

#: One result to merge: where it was read from, and the document.
Input = Tuple[str, Dict[str, Any]]


@dataclasses.dataclass
class Worker:
    """One input, as the merge sees it."""

    path: str
    doc: Dict[str, Any]
    index: int
    count: int
    started: float

    @property
    def section(self) -> Dict[str, Any]:
        w: Dict[str, Any] = self.doc.get("worker") or {}
        return w


def read_workers(inputs: Sequence[Input]) -> List[Worker]:
    """The inputs as workers: index, count and start time from each document's ``worker``
    section (one worker of one when it has none)."""
    out = []
    for path, doc in inputs:
        w = doc.get("worker") or {}
        started = w.get("started_at_epoch_s", doc.get("started_at_epoch_s")) or 0.0
        out.append(Worker(path, doc, int(w.get("index", 0)), int(w.get("count", 1)), float(started)))
    return out


def saturation_reasons(workers: Sequence[Worker]) -> List[str]:
    """A worker whose event loop was saturated measured its own client: the merge says
    which (host figures are not merged, so the rule cannot be judged again on the whole)."""
    return [f"worker {w.index}: {r}" for w in workers for r in w.doc.get("invalid_reasons", [])
            if str(r).startswith("generator saturated")]


def worker_name(w: Worker) -> str:
    """How a reason names a worker: its index and file."""
    return f"worker {w.index} ({w.path})"


def roster_reasons(workers: Sequence[Worker], expected: int) -> List[str]:
    """Workers missing, given twice, out of range, or disagreeing on how many there are."""
    reasons = []
    counts = Counter(w.count for w in workers)
    if len(counts) > 1:
        said = "; ".join(f"{n} by {', '.join(worker_name(w) for w in workers if w.count == n)}" for n in sorted(counts))
        reasons.append(f"the workers disagree on --workers: {said}")
    by_index: Dict[int, List[Worker]] = {}
    for w in workers:
        by_index.setdefault(w.index, []).append(w)
    for index, same in sorted(by_index.items()):
        if len(same) > 1:
            reasons.append(f"worker {index} is given {len(same)} times ({', '.join(w.path for w in same)}): "
                           "its figures are counted more than once")
        if index >= expected:
            reasons.append(f"{worker_name(same[0])} is not one of the {expected} workers 0..{expected - 1}")
    for index in range(expected):
        if index not in by_index:
            reasons.append(f"worker {index} of {expected} is missing: its share of the load is not in the figures")
    return reasons


def state_reasons(workers: Sequence[Worker]) -> List[str]:
    """Workers whose own run went wrong: partial, interrupted, started late."""
    reasons = []
    for w in workers:
        if w.doc.get("partial"):
            reasons.append(f"{worker_name(w)} is partial: its result document could not be built after the run")
        if w.doc.get("interrupted"):
            reasons.append(f"{worker_name(w)} was interrupted before it finished; its figures are partial")
        late = late_start_reason(w.section) if w.section else None
        if late is not None:
            reasons.append(f"{late} ({w.path})")
    return reasons


def _settings_of(w: Worker) -> Dict[str, Any]:
    effective = w.doc.get("settings", {}).get("effective", {})
    return {
        "scenario": w.doc.get("scenario"),
        "SUT": w.doc.get("sut"),
        "latency bounds": [b.get("bound_ns") for b in w.doc.get("latency_bounds", [])],
        "--significant-figures": effective.get("significant_figures"),
        "--samples-per-query": effective.get("samples_per_query"),
        "--interval-s": effective.get("interval_s"),
        "total load": w.section.get("total"),
        "--start-at": w.section.get("start_at"),
    }


def mismatch_reasons(workers: Sequence[Worker]) -> List[str]:
    """Settings that differ from the first worker's: the results are not of one run."""
    reasons = []
    first = workers[0]
    mine = _settings_of(first)
    for w in workers[1:]:
        for what, value in _settings_of(w).items():
            if value != mine[what]:
                reasons.append(f"{worker_name(w)} has another {what} ({_text(value)}) than {worker_name(first)} "
                               f"({_text(mine[what])}): the results are not of one run")
    return reasons


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if not isinstance(value, str) else value


def worker_figures(w: Worker) -> Dict[str, Any]:
    """A worker's own figures, for the ``"merge"`` section."""
    section = w.section
    return {
        "index": w.index,
        "path": w.path,
        "hostname": section.get("hostname") or (w.doc.get("environment") or {}).get("hostname"),
        "pod": section.get("pod"),
        "completed": int(w.doc.get("counts", {}).get("completed", 0)),
        "qps": float((w.doc.get("throughput") or {}).get("completed_qps", 0.0)),
        "p99_ns": float((w.doc.get("latency_ns") or {}).get("p99", 0)),
        "valid": bool(w.doc.get("valid")),
        "invalid_reasons": list(w.doc.get("invalid_reasons", [])),
        # the worker's own diagnosis: the merged one lacks the workers' host figures
        "diagnosis": (w.doc.get("diagnosis") or {}).get("summary"),
        "start_late_s": section.get("start_late_s"),
        "started_at_epoch_s": w.started,
    }
