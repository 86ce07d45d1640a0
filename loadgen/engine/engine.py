"""The issue engine from Python: running a SUT, and what a run measured.

The engine itself is native (``loadgen._core.Engine``): a dedicated thread follows the
schedule and never calls into Python per query. Python SUTs are fed by a
:class:`~loadgen.engine.dispatch.Dispatcher`; native SUTs run inside the core.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from loadgen import _core
from loadgen.engine.dispatch import DISPATCHED_FORMS, Dispatcher
from loadgen.engine.records import ParquetConversion, requests_section
from loadgen.engine.records import sink as records_sink
from loadgen.engine.settings import EngineSettings
from loadgen.stats.histogram import Histogram
from loadgen.sut.forms import classify_sut
from loadgen.units import ns_to_s

if TYPE_CHECKING:
    from loadgen.result import Result

__all__ = ["Engine", "RunResult", "run"]


@dataclass
class RunResult:
    """What one run measured. Histograms hold nanoseconds.

    Attributes:
        counts: issued, completed, failed, timed_out, cancelled, outstanding, cap_waits,
            tokens; the completions (or failures) of ids not in flight, which are in no
            other count: duplicate_completions (a query the SUT had completed or failed
            already), unknown_completions (an id never issued) and late_completions (a
            query timed out or cancelled, or too far back to tell); and the warm-up's warmup_issued,
            warmup_completed, warmup_failed (in no other count). issued equals completed + failed +
            timed_out + cancelled once the run has ended.
        latency: completed - scheduled, per completed query.
        service_time: completed - issued.
        issue_delay: issued - scheduled (the generator's own health).
        ttft, tpot: time to first token (from scheduled) and time per output token.
        timeseries: one dict per interval (start_offset_ns, length_ns, issued,
            completed, latency_p50_ns, latency_p90_ns, latency_p99_ns, latency_max_ns,
            latency_hdr; failed, timed_out, errors {kind: count}, outstanding at its
            end; issue_delay_p50_ns, issue_delay_p99_ns, issue_delay_max_ns; ttft_p50_ns,
            ttft_p99_ns and tokens, 0 without first tokens), cut natively at each
            interval's end.
        errors: failure counts by kind; error_messages: the first few messages.
        duration_s: from the first scheduled time to the end of the run.
        issue_duration_s: from the first scheduled time to the last issue.
        interrupted: the run was stopped early (stop(), Ctrl-C, an error, a SUT that
            raised KeyboardInterrupt).
        settings: the settings the run used.
        sched_slice_applied: the kernel took the issue thread's scheduler slice request
            (``settings.sched_slice_us``; Linux 6.12 and later).
        over_bound: for each of ``settings.latency_bounds_ns``, the exact number of
            latencies strictly greater than it.
    """

    counts: Dict[str, int]
    latency: Histogram
    service_time: Histogram
    issue_delay: Histogram
    ttft: Histogram
    tpot: Histogram
    timeseries: List[Dict[str, Any]]
    errors: Dict[str, int]
    error_messages: List[str]
    duration_s: float
    issue_duration_s: float
    interrupted: bool
    settings: EngineSettings
    samples_per_query: int = 1
    over_bound: List[int] = field(default_factory=list)
    sched_slice_applied: bool = False

    @property
    def completed_qps(self) -> float:
        """Completed queries per second over the run."""
        return self.counts["completed"] / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.completed_qps * self.samples_per_query



class Engine:
    """One run of the native engine against a SUT.

    Args:
        settings: an :class:`EngineSettings`.
        sut: a SUT in any form :func:`loadgen.sut.classify_sut` accepts.

    Use :meth:`run` (blocking), or :meth:`start` then :meth:`wait`; :meth:`stop` from
    any thread ends the run early. Usable as a context manager (aborts on exit).
    """

    def __init__(self, settings: EngineSettings, sut: Any) -> None:
        self.settings = settings
        self.sut = sut
        self.sut_form = classify_sut(sut)
        self._core = _core.Engine(settings.to_core(self.sut_form, sut))
        self._parquet: Optional[ParquetConversion] = None
        if settings.record_requests and records_sink(settings.record_requests) == _core.RecordSink.spool:
            self._parquet = ParquetConversion(settings.record_requests, settings.record_worker_index)
        self._dispatcher: Optional[Dispatcher] = None
        self._checker: Any = None  # the native HTTP client's response checker
        self._stopped = False

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        """Starts the run; Python SUTs are driven from a background thread. A loop SUT is
        opened on its loop first (connections made), so that the first scheduled time
        comes after it is ready, not during its setup."""
        if self.sut_form not in ("loop", "callback"):
            # A loop or callback SUT's dispatcher opens the SUT, then starts the run itself: no hand-off
            # between threads (and their wait for the GIL) sits between the first
            # scheduled time and the first issue.
            self._core.start()
        if self.sut_form == "native_client":
            # The SUT brings its own response checker: the engine knows no network client.
            self._checker = self.sut.start_checker(self._core)
        if self.sut_form in DISPATCHED_FORMS:
            self._dispatcher = Dispatcher(self._core, self.sut, self.sut_form, self.settings)
            self._dispatcher.start()

    def stop(self) -> None:
        """Stops issuing; outstanding queries get the grace period. Any thread."""
        self._stopped = True
        self._core.stop()

    def finish(self) -> None:
        """Stops issuing now, as if the run's duration had passed: outstanding queries get
        the grace period, and the run does not count as stopped early. Any thread."""
        self._core.stop()

    def abort(self) -> None:
        """Ends the run now, cancelling what is outstanding."""
        self._stopped = True
        self._core.abort()

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Waits for the run to end. Returns False on timeout.

        Raises:
            BaseException: whatever fatal error ended the SUT driver (re-raised here).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        # Wait in short slices so that Ctrl-C reaches Python promptly.
        while True:
            remaining = 0.2 if deadline is None else min(0.2, max(0.0, deadline - time.monotonic()))
            if self._core.wait(remaining):
                break
            if deadline is not None and time.monotonic() >= deadline:
                return False
        if self._dispatcher is not None:
            # The run is over. A Python SUT call may still be running on the dispatcher
            # thread; it gets a second to return. Every query is resolved by now, so the
            # dispatcher is only finishing a call whose query already timed out or was
            # cancelled.
            self._dispatcher.join(1.0)
            if self._dispatcher.error is not None:
                raise self._dispatcher.error
        if self._checker is not None:
            self._checker.join(5.0)  # it ends once the client has closed and every response is judged
            if self._checker.error is not None:
                raise self._checker.error
        error = self._core.run_error
        if error:
            raise ValueError(error)
        return True

    def close(self) -> None:
        """Aborts the run if it is still going and waits until it has ended; raises
        nothing. What a ``with`` block does on exit."""
        self.abort()
        self._core.wait(None)
        if self._dispatcher is not None:
            self._dispatcher.join(1.0)  # see wait(): a stuck SUT call cannot be interrupted
        if self._checker is not None:
            self._checker.join(5.0)
        self.write_records()

    def write_records(self) -> None:
        """Once the run has ended, writes the Parquet file of ``--record-requests`` from
        the spool the engine wrote during the run (see
        :class:`loadgen.engine.records.ParquetConversion`); nothing for JSON lines (the
        engine has written them), before the run has ended, or a second time. Raises
        nothing: a failure is the ``error`` of :meth:`requests_section`. :meth:`run`,
        :meth:`close` and :meth:`requests_section` call it."""
        if self._parquet is not None and self._core.finished:
            self._parquet.run(self._core.record_kinds(), self._core.records_stats()["error"])

    def run(self) -> RunResult:
        """Starts, waits, and returns the result. Ctrl-C aborts the run and re-raises."""
        self.start()
        try:
            self.wait()
        except KeyboardInterrupt:
            self.close()
            raise
        self.write_records()
        return self.result()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- results

    @property
    def start_ns(self) -> int:
        """When the run started (its first scheduled time), on the monotonic ns clock; 0
        before it has."""
        return self._core.start_ns

    @property
    def measure_start_ns(self) -> int:
        """When measuring began (the start plus any warm-up), on the monotonic ns clock;
        0 before the run started."""
        return self._core.measure_start_ns

    @property
    def issue_end_ns(self) -> int:
        """When issuing ended, on the monotonic ns clock; 0 while it goes on."""
        return self._core.issue_end_ns

    def requests_section(self, clock_offset_s: float) -> Optional[Dict[str, Any]]:
        """The result document's ``requests`` section (see
        :func:`loadgen.engine.records.requests_section`), None without records; after the
        run, once :meth:`write_records` has written a Parquet file (it is called here).
        ``clock_offset_s`` is the wall clock minus the engine's clock, in seconds."""
        if not self.settings.record_requests:
            return None
        self.write_records()
        return requests_section(self._core, self.settings.record_requests, self._parquet,
                                self._core.measure_start_ns, clock_offset_s)

    def dispatcher_thread_id(self) -> Optional[int]:
        """The kernel thread id of the Python dispatcher (which runs the event loop of
        network and async SUTs); None for native SUTs or before it started."""
        return self._dispatcher.thread_id if self._dispatcher is not None else None

    def elapsed_s(self) -> float:
        """Seconds since the run started (0 before it has)."""
        start = self._core.start_ns
        return ns_to_s(time.monotonic_ns() - start) if start else 0.0

    def latency(self) -> Histogram:
        """The latency histogram so far (ns, a snapshot), for progress displays."""
        return Histogram.from_core(self._core.recorder.latency())

    def histogram(self, name: str) -> Histogram:
        """One of the run's histograms so far (ns, a snapshot): ``latency``,
        ``service_time``, ``issue_delay``, ``ttft`` or ``tpot``. Any thread."""
        if name not in ("latency", "service_time", "issue_delay", "ttft", "tpot"):
            raise ValueError(f"no histogram {name!r}")
        return Histogram.from_core(getattr(self._core.recorder, name)())

    def counts(self) -> Dict[str, int]:
        """The counts so far (see :class:`RunResult`). Cheap (atomic loads, no lock) and
        safe from any thread while the run goes on."""
        return self._core.counts()

    def error_counts(self) -> Dict[str, int]:
        """Failures so far by kind. Cheap (a copy of at most 65 counts) and safe from any
        thread while the run goes on."""
        return self._core.error_counts()

    def timeseries(self) -> List[Dict[str, Any]]:
        """The intervals of the time series so far (see :class:`RunResult`)."""
        return self._core.timeseries()

    def last_interval(self) -> Optional[Dict[str, Any]]:
        """The newest interval of the time series, as :meth:`timeseries` gives it, or None
        before the first has ended. Cheap (one point copied) and safe from any thread
        while the run goes on: what a live reader polls."""
        return self._core.last_interval()

    def result(self) -> RunResult:
        """What the run measured (complete once :meth:`wait` returned True)."""
        c = self._core
        rec = c.recorder
        # Durations count from the end of the warm-up (the start when there is none).
        start, end, issue_end = c.measure_start_ns, c.end_ns, c.issue_end_ns
        if not end:
            end = _core.now_ns()
        return RunResult(
            counts=c.counts(),
            latency=Histogram.from_core(rec.latency()),
            service_time=Histogram.from_core(rec.service_time()),
            issue_delay=Histogram.from_core(rec.issue_delay()),
            ttft=Histogram.from_core(rec.ttft()),
            tpot=Histogram.from_core(rec.tpot()),
            timeseries=c.timeseries(),
            errors=c.error_counts(),
            error_messages=c.error_messages(),
            duration_s=ns_to_s(max(end - start, 0)) if start else 0.0,
            issue_duration_s=ns_to_s(max(issue_end - start, 0)) if start and issue_end else 0.0,
            interrupted=self._stopped or (self._dispatcher is not None and self._dispatcher.interrupted),
            settings=self.settings,
            samples_per_query=self.settings.samples_per_query,
            over_bound=list(rec.over_bound()),
            sched_slice_applied=c.sched_slice_applied,
        )


def run(settings: Any = None, sut: Any = None, **overrides: Any) -> Result:
    """Runs once and returns what it measured, with its verdict: a
    :class:`loadgen.result.Result` (a :class:`RunResult` with ``valid``, ``reasons``,
    ``summary()``, ``to_dict()``, ``to_frame()``).

    Two forms:

    - ``run(EngineSettings(...), sut, **overrides)``: the engine alone; the verdict is
      the rules of the scenario that matches ``settings.mode``;
    - ``run(sut=model, scenario="poisson", target_qps=200, duration_s=10, ...)`` (or
      ``run(RunOptions(...), model)``): the run ``loadgen run`` makes with those options
      (every option of the command by its long name, like ``fail_if=["p99>5ms"]``,
      ``slo``, ``latency_bound_ms``; ``sut_name`` names a Python SUT in the document;
      ``freeze_gc=True`` freezes the collector during the run as the command does;
      ``stop_requested``, polled a few times a second, stops the run when it returns
      True, as Ctrl-C does: the result is interrupted and INVALID).
      ``sut`` may also be a ``--sut`` string (a URL, ``demo``).

    Callable from any thread; it installs no signal handler and changes no process-wide
    state (see :mod:`loadgen.result`).

    Args:
        settings: an :class:`EngineSettings` (default ``EngineSettings()``), or a
            :class:`loadgen.options.RunOptions`.
        sut: the system under test (default :class:`loadgen.NullSUT`).
        **overrides: EngineSettings fields to change, e.g. ``target_qps=1000``; with
            ``scenario``, ``loadgen run``'s options.

    Raises:
        ValueError: a setting or the SUT is invalid; the message names it.
    """
    from loadgen import result as _result
    from loadgen.options import RunOptions
    from loadgen.sut.forms import NullSUT

    if isinstance(settings, RunOptions) or (settings is None and "scenario" in overrides):
        freeze_gc = bool(overrides.pop("freeze_gc", False))
        stop_requested = overrides.pop("stop_requested", None)
        if isinstance(settings, RunOptions):
            if overrides:
                raise ValueError(f"run(RunOptions, ...) takes no other options (got {', '.join(sorted(overrides))})")
            options = settings
        else:
            options, sut = _result.options_of(sut, overrides)
        return _result.run_options(options, sut, freeze_gc=freeze_gc, stop_requested=stop_requested)
    if "scenario" in overrides:
        raise ValueError("give scenario with loadgen run's options, not with EngineSettings")
    settings = settings or EngineSettings()
    if overrides:
        known = {f.name for f in fields(EngineSettings)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}")
        settings = EngineSettings(**{**settings.__dict__, **overrides})
    return _result.run_engine(settings, NullSUT() if sut is None else sut)

