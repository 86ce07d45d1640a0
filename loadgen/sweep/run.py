"""Running a sweep's points: for each point not finished before, the before hook, the
run (prepared anew, so a network SUT's readiness wait runs after the hook), its files,
the after hook, and its record; interrupted by SIGINT/SIGTERM between or within points."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from loadgen.net.options import Redactor, options_redactor
from loadgen.options import parse_labels
from loadgen.results.files import RESULT_FILE, atomic_write
from loadgen.runner import Progress, ResultError, prepare, run_benchmark
from loadgen.sweep.hooks import HookResult, hook_environment, run_hook
from loadgen.sweep.plan import PlannedRun
from loadgen.sweep.settings import SweepSettings
from loadgen.sweep.state import SweepState

if TYPE_CHECKING:
    from loadgen.telemetry.live import LiveMetrics

__all__ = ["Interruptible", "Reporter", "SweepContext", "SweepOutcome", "eta_s", "run_point", "run_sweep"]


class Interruptible(Protocol):
    """What the sweep reads of the command's signal handling: ``signal`` is set by the
    first SIGINT/SIGTERM while ``running``; while not ``running``, a signal raises
    KeyboardInterrupt at once (used while a point's SUT is prepared)."""

    signal: Optional[int]
    running: bool


class Reporter(Protocol):
    """Shows a sweep's progress."""

    def start(self, position: int, total: int, run: PlannedRun, eta_s: Optional[float]) -> None:
        """A point starts (``position`` counts from 1 among the ``total`` to run now)."""

    def end(self, position: int, total: int, run: PlannedRun, record: Dict[str, Any]) -> None:
        """A point ended with ``record``."""


#: Saves a point's document in its folder: (doc, folder, partial) -> (paths, failure).
Saver = Callable[[Dict[str, Any], str, bool], Tuple[List[str], Optional[str]]]


@dataclass
class SweepContext:
    """What every point of a sweep shares."""

    directory: str
    settings: SweepSettings
    interrupts: Interruptible
    save: Saver
    on_progress: Optional[Callable[[Progress], None]] = None
    progress_interval_s: float = 5.0
    #: The live metrics server of the whole sweep (``--metrics-port``): each point's run
    #: is served in turn, labelled ``point`` with its key.
    live: Optional[LiveMetrics] = None

    def stop_requested(self) -> bool:
        """A signal asked the sweep to stop."""
        return self.interrupts.signal is not None


@dataclass
class SweepOutcome:
    """What a sweep did: the runs it ran now, whether it was interrupted or stopped at
    a failed point, and the record of every planned run (None: not run)."""

    ran: int = 0
    skipped: int = 0
    interrupted: bool = False
    stopped: bool = False
    records: List[Optional[Dict[str, Any]]] = field(default_factory=list)
    paths: List[str] = field(default_factory=list)


def eta_s(remaining: Sequence[PlannedRun], walls: Sequence[float]) -> Optional[float]:
    """Time left: the mean wall time of the points run so far times the points left;
    before any, the sum of their planned lengths (None when one has none)."""
    if not remaining:
        return 0.0
    if walls:
        return sum(walls) / len(walls) * len(remaining)
    planned = [r.planned_s for r in remaining]
    return sum(p for p in planned if p is not None) if all(p is not None for p in planned) else None


def _hook(ctx: SweepContext, name: str, command: Optional[str], run: PlannedRun,
          point_dir: str) -> Optional[HookResult]:
    if not command:
        return None
    env = hook_environment(run.values, run.index, run.repeat, run.key, point_dir)
    return run_hook(name, command, env, ctx.settings.hook_timeout_s, point_dir, ctx.stop_requested)


def _measure(run: PlannedRun, ctx: SweepContext, point_dir: str) -> Tuple[Optional[Dict[str, Any]], str, str]:
    """Prepares the point's SUT (a network SUT waits for the server's readiness here,
    after the before hook) and runs it: (document, status, error). Per-request records
    go to the file's name in the point's folder."""
    options = run.options
    if options.record_requests:
        options = dataclasses.replace(
            options, record_requests=os.path.join(point_dir, os.path.basename(options.record_requests)))
    ctx.interrupts.running = False  # a signal while the SUT loads or the server is awaited: stop at once
    try:
        prepared = prepare(options)
    except KeyboardInterrupt:
        return None, "interrupted", "interrupted while the point's SUT was prepared"
    except Exception as e:  # the server never became ready, a SUT that does not load: this point failed
        return None, "failed", str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
    finally:
        ctx.interrupts.running = True
    if ctx.live is not None:
        ctx.live.point = run.key
    try:
        doc = run_benchmark(options, given=run.given, on_progress=ctx.on_progress,
                            progress_interval_s=ctx.progress_interval_s, stop_requested=ctx.stop_requested,
                            prepared=prepared, live=ctx.live)
    except ResultError as e:  # measured, but its document could not be built: kept, partial
        return e.doc, "failed", str(e)
    except Exception as e:
        return None, "failed", f"the run failed: {type(e).__name__}: {e}"
    if doc["interrupted"]:
        return doc, "interrupted", "the run was interrupted; its figures are partial"
    return doc, "done", ""


def _hook_status(ctx: SweepContext, hook: HookResult, section: Dict[str, Any]) -> Tuple[str, str]:
    section["hooks"][hook.name] = hook.as_dict()
    if hook.ok:
        return "done", ""
    return ("interrupted" if hook.interrupted else "failed"), hook.problem(ctx.settings.hook_timeout_s)


def run_point(run: PlannedRun, ctx: SweepContext) -> Dict[str, Any]:
    """Runs one point: before hook, run, after hook. Returns its record: the result
    document (a bare record when nothing was measured) with its ``sweep`` section. The
    point's files are saved as soon as the run ends, so the after hook can read them,
    and result.json is brought up to date if the after hook changes the point's status."""
    point_dir = os.path.join(ctx.directory, run.dir)
    os.makedirs(point_dir, exist_ok=True)
    # The point's secrets (credential headers, URL passwords and keys) stay out of its
    # record and files, as out of its result document.
    redactor = options_redactor(run.options)
    section: Dict[str, Any] = {"index": run.index, "repeat": run.repeat, "values": redactor.doc(run.values),
                               "key": run.key,
                               "seed": run.options.seed, "dir": run.dir, "status": "done",
                               "started_at": _dt.datetime.now(tz=_dt.timezone.utc).isoformat(), "hooks": {}}
    started = time.monotonic()
    doc: Optional[Dict[str, Any]] = None
    saved = ""
    status, error = "done", ""
    try:
        before = _hook(ctx, "before-point", ctx.settings.before_point, run, point_dir)
        if before is not None:
            status, error = _hook_status(ctx, before, section)
        if status == "done":
            doc, status, error = _measure(run, ctx, point_dir)
        if doc is not None:
            _record_seeds(section, doc)
        if doc is not None:
            saved = _save(ctx, doc, section, point_dir, status, error, time.monotonic() - started, redactor)
        if status == "done":
            after = _hook(ctx, "after-point", ctx.settings.after_point, run, point_dir)
            if after is not None:
                status, error = _hook_status(ctx, after, section)
    except KeyboardInterrupt:  # a second Ctrl-C: what was measured is still saved
        status, error = "interrupted", "interrupted"
    _finish(section, status, error, time.monotonic() - started)
    record = doc if doc is not None else _bare(run, error)
    record = dict(redactor.doc(record))
    record["sweep"] = redactor.doc(section)
    if doc is not None and saved != status:
        atomic_write(os.path.join(point_dir, RESULT_FILE), json.dumps(record, indent=2, default=str) + "\n")
    return record


def _record_seeds(section: Dict[str, Any], doc: Dict[str, Any]) -> None:
    """The seeds the point ran with (a repeat's own, :func:`loadgen.sweep.plan.repeat_seed`)."""
    effective = doc.get("settings", {}).get("effective", {})
    for name in ("schedule_seed", "sample_seed"):
        if effective.get(name) is not None:
            section[name] = effective[name]


def _finish(section: Dict[str, Any], status: str, error: str, wall_s: float) -> None:
    section.update(status=status, wall_s=wall_s)
    if error:
        section["error"] = error


def _save(ctx: SweepContext, doc: Dict[str, Any], section: Dict[str, Any], point_dir: str, status: str,
          error: str, wall_s: float, redactor: Redactor) -> str:
    """Saves the point's run files with its sweep section as it stands (redacted);
    returns the status saved."""
    _finish(section, status, error, wall_s)
    doc["sweep"] = section
    _, failure = ctx.save(redactor.doc(doc), point_dir, bool(doc.get("partial")))
    if failure:
        section["save_error"] = failure
    return status


def _bare(run: PlannedRun, error: str) -> Dict[str, Any]:
    """The record of a point that measured nothing (a hook failed, the server was not
    ready): its labels, invalid, with the error as the reason."""
    return {"scenario": run.options.scenario, "sut": run.options.sut, "labels": parse_labels(run.options.label),
            "valid": False, "invalid_reasons": [error] if error else []}


def start_times(todo: Sequence[PlannedRun], gap_s: float) -> List[PlannedRun]:
    """With ``--start-at T``: the runs to do, run k starting at T plus the planned
    lengths of the runs before it and ``gap_s`` after each. Every worker of a scaled-out
    sweep plans the same runs, so each point starts at the same time on all of them, with
    no coordinator; a point that overruns its slot makes the next start late (judged by
    --start-tolerance-s). Without --start-at: the runs as they are."""
    if not todo or todo[0].options.start_at is None:
        return list(todo)
    t = float(todo[0].options.start_at)
    out = []
    for run in todo:
        out.append(dataclasses.replace(run, options=dataclasses.replace(run.options, start_at=t)))
        t += float(run.planned_s or 0.0) + gap_s
    return out


def run_sweep(state: SweepState, ctx: SweepContext, reporter: Optional[Reporter] = None) -> SweepOutcome:
    """Runs the planned runs that are not finished, in order, writing the sweep's files
    after each. Stops at an interruption, or at a failed point with ``stop_on_error``.

    Returns:
        What ran, and every planned run's record.
    """
    todo = start_times([r for r in state.runs if not state.finished(r)], ctx.settings.point_gap_s)
    outcome = SweepOutcome(skipped=len(state.runs) - len(todo))
    walls: List[float] = []
    for position, run in enumerate(todo, 1):
        if ctx.stop_requested():
            outcome.interrupted = True
            break
        if reporter is not None:
            reporter.start(position, len(todo), run, eta_s(todo[position - 1:], walls))
        record = run_point(dataclasses.replace(run, dir=state.folder(run)), ctx)
        outcome.ran += 1
        walls.append(float(record["sweep"]["wall_s"]))
        outcome.paths = state.update(record)
        if reporter is not None:
            reporter.end(position, len(todo), run, record)
        status = record["sweep"]["status"]
        if status == "interrupted" or ctx.stop_requested():
            outcome.interrupted = True
            break
        if status == "failed" and ctx.settings.stop_on_error:
            outcome.stopped = True
            break
    outcome.records = state.planned_records()
    return outcome
