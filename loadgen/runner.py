"""One benchmark run from options to result document: what ``loadgen run`` does, usable
from Python as :func:`run_benchmark`."""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from loadgen import defaults
from loadgen.engine import Engine, EngineSettings, RunResult
from loadgen.engine.dispatch import SutExit
from loadgen.net import net_options, open_from_options
from loadgen.options import RunOptions, parse_labels
from loadgen.results.cost import add_cost
from loadgen.results.document import SCHEMA, build_document, histogram_summary, timeseries_point
from loadgen.scenarios import Scenario, get_scenario
from loadgen.units import ns_to_s
from loadgen.sut.spec import is_network_sut, load_sut
from loadgen.telemetry.run import RunTelemetry, check_gpus, place
from loadgen.workers import add_worker_section, total_load, wait_until, worker_section

if TYPE_CHECKING:
    from loadgen.net.metrics import MetricsScraper
    from loadgen.net.triton_stats import StatsWindow
    from loadgen.telemetry.live import LiveMetrics

__all__ = ["Progress", "ResultError", "plan", "prepare", "run_benchmark"]

#: What :func:`prepare` returns: the scenario, the effective options, the engine settings
#: and the SUT (any form :func:`loadgen.sut.classify_sut` accepts).
_Prepared = Tuple[Scenario, RunOptions, EngineSettings, Any]


class ResultError(RuntimeError):
    """The run finished but its result document could not be built, or the SUT ended it
    by calling ``sys.exit()`` outside a query (:class:`~loadgen.engine.dispatch.SutExit`).
    :attr:`doc` holds what was measured, marked invalid, so that nothing measured is
    lost: save it, then fail. A document that could not be built holds the counts,
    durations and the engine's histograms, marked ``"partial": true``."""

    def __init__(self, message: str, doc: Dict[str, Any]) -> None:
        super().__init__(message)
        self.doc = doc


@dataclasses.dataclass
class Progress:
    """A snapshot for progress displays."""

    elapsed_s: float
    issued: int
    completed: int
    qps: float
    p99_ns: int


def plan(options: RunOptions) -> Tuple[Scenario, RunOptions, EngineSettings]:
    """Scenario, effective options and engine settings for ``options``, checked without
    loading a Python SUT or contacting a server: what can be known about a run before
    anything starts (``loadgen sweep`` checks every point with it first).

    Raises:
        ValueError: an option is unusable; the message names it.
    """
    scenario = get_scenario(options.scenario)
    effective = scenario.for_worker(options)  # a plain run's effective options, or a worker's share
    settings = scenario.engine_settings(effective)
    settings.record_requests = effective.record_requests  # checked by validate(): the format
    settings.record_worker_index = effective.worker_index or 0
    place(effective, settings)  # --pin: the issue thread's and the dispatcher's CPUs
    settings.validate()  # the SUT is not loaded (nor the server contacted) for bad settings
    if is_network_sut(effective.sut):
        from loadgen.net.targets import parse_target

        parse_target(effective.sut, template=bool(effective.request_template))
    elif any(getattr(effective, name) for name in _NETWORK_ONLY):
        given = [name for name in _NETWORK_ONLY if getattr(effective, name)]
        raise ValueError(f"--{given[0].replace('_', '-')} applies to network targets (--sut URL), "
                         f"not to --sut {effective.sut}")
    _check_live(effective)
    from loadgen.net.triton_stats import check_options

    check_options(effective)  # --server-stats-url: its form, and a target with a model
    return scenario, effective, settings


def _check_live(o: RunOptions) -> None:
    """--metrics-addr and --metrics-linger-s need --metrics-port."""
    if o.metrics_port is None:
        for name, default in (("metrics_addr", defaults.METRICS_ADDR), ("metrics_linger_s", defaults.METRICS_LINGER_S)):
            if getattr(o, name) != default:
                raise ValueError(f"--{name.replace('_', '-')} needs --metrics-port (the live metrics server)")


def prepare(options: RunOptions) -> _Prepared:
    """Scenario, effective options, engine settings and SUT for ``options``: :func:`plan`,
    then the SUT loaded, or the server's readiness awaited (``--ready-timeout-s``) and
    its requests prepared.

    Raises:
        ValueError: an option or the SUT is unusable; the message names it.
    """
    scenario, effective, settings = plan(options)
    if is_network_sut(effective.sut):
        sut = open_from_options(effective, settings)
    else:
        sut = load_sut(effective.sut)
    _scraper(effective, check=True)
    check_gpus(effective)  # a --gpus index or UUID that no device has: a usage error
    return scenario, effective, settings, sut


_NETWORK_ONLY = ("input", "payload", "request_template", "header", "secret_header", "ca_file", "insecure",
                 "connections", "model")


def run_benchmark(
    options: RunOptions,
    *,
    given: Optional[Dict[str, Any]] = None,
    on_progress: Optional[Callable[[Progress], None]] = None,
    progress_interval_s: float = 1.0,
    stop_requested: Optional[Callable[[], bool]] = None,
    prepared: Optional[_Prepared] = None,
    finish_when: Optional[Callable[[List[Dict[str, Any]]], bool]] = None,
    live: Optional[LiveMetrics] = None,
    freeze_gc: bool = True,
    on_measured: Optional[Callable[[RunResult], None]] = None,
) -> Dict[str, Any]:
    """Runs one benchmark and returns its result document.

    Raises:
        ResultError: the run finished, but building its document failed, or the SUT
            called ``sys.exit()`` while a loop or callback SUT was opened or closed (the
            run then ended at once); the error's ``doc`` holds the measured result,
            invalid.

    Args:
        options: the run's options.
        given: the options as the user gave them (recorded in the document).
        on_progress: called about every ``progress_interval_s`` with a :class:`Progress`.
        stop_requested: polled a few times a second; when it returns True the run is
            stopped (outstanding queries get up to a second, then are cancelled) and the
            document is marked interrupted and invalid.
        prepared: what :func:`prepare` returned for these options, so that the SUT is
            not loaded twice.
        finish_when: called with the time series so far (the document's ``timeseries``
            entries) each time an interval ends; when it returns True the run ends as if
            its duration had passed (issuing stops, outstanding queries get the grace
            period), not as an interruption. Needs ``--interval-s`` above 0.
        live: a :class:`~loadgen.telemetry.live.LiveMetrics` server that serves this
            run's figures (the caller closes it). Without one, ``--metrics-port`` makes a
            server for this run alone, kept for ``--metrics-linger-s`` after it (ended
            early by ``stop_requested``), then closed.
        freeze_gc: collect, then freeze (``gc.freeze()``) what exists before the run and
            unfreeze it after, so that a collection during the run walks only what the
            run made. The freeze is process-wide: an embedding server passes False
            (:func:`loadgen.run` does, unless asked).
        on_measured: called with what the engine measured (a
            :class:`~loadgen.engine.RunResult`) once the run has ended, before the
            document is built from it.

    Nothing else of the process is changed: no signal handler is installed (the CLI
    installs its own), and ``--pin`` pins only the threads the run starts. Any thread
    may call it, and several runs may go on at once.

    With ``--start-at`` the run waits, prepared, until that wall-clock time; a stop
    requested meanwhile raises KeyboardInterrupt (nothing was measured yet).
    """
    if live is not None or options.metrics_port is None:
        return _run_benchmark(options, given, on_progress, progress_interval_s, stop_requested, prepared,
                              finish_when, live, freeze_gc, on_measured)
    from loadgen.telemetry.live import LiveMetrics

    with LiveMetrics.serve(options) as own:
        doc = _run_benchmark(options, given, on_progress, progress_interval_s, stop_requested, prepared,
                             finish_when, own, freeze_gc, on_measured)
        own.linger(options.metrics_linger_s, stop_requested)
    return doc


def _run_benchmark(
    options: RunOptions, given: Optional[Dict[str, Any]], on_progress: Optional[Callable[[Progress], None]],
    progress_interval_s: float, stop_requested: Optional[Callable[[], bool]], prepared: Optional[_Prepared],
    finish_when: Optional[Callable[[List[Dict[str, Any]]], bool]], live: Optional[LiveMetrics],
    freeze_gc: bool = True, on_measured: Optional[Callable[[RunResult], None]] = None,
) -> Dict[str, Any]:
    """:func:`run_benchmark` with its live metrics server (or none) decided."""
    scenario, effective, settings, sut = prepared if prepared is not None else prepare(options)
    placement = place(effective, dataclasses.replace(settings))  # the record; plan() applied it
    engine = Engine(settings, sut)
    telemetry = RunTelemetry(effective, settings)
    scraper = _scraper(effective, check=False)
    server_stats = _server_stats(effective)
    if effective.start_at is not None:
        _wait_for_start(effective.start_at, stop_requested, freeze_gc)
    started_wall = time.time()
    clock_offset_s = started_wall - ns_to_s(time.monotonic_ns())  # wall clock minus the engine's clock
    if scraper is not None:
        scraper.start()
    # What exists now (modules, the prepared requests) lives through the run: moved out of
    # the collector's reach, a full collection during the run only walks what the run made,
    # and pauses Python SUTs and network clients for less.
    if freeze_gc:
        gc.collect()
        gc.freeze()
    if live is not None:
        live.attach(engine, effective, settings, sut, telemetry.gpu)
    telemetry.start(engine)
    sut_exit: Optional[SutExit] = None
    if server_stats is not None:
        server_stats.begin()  # without a warm-up, the server's statistics before the first query
    try:
        engine.start()  # a loop or callback SUT is opened here
        if server_stats is not None:
            server_stats.measuring(lambda: engine.measure_start_ns)
        interrupted = _watch(engine, on_progress, progress_interval_s, stop_requested, finish_when,
                             telemetry.poll)
    except SutExit as e:  # the SUT called sys.exit() opening or closing: what was measured is kept
        engine.close()
        sut_exit, interrupted = e, not e.after_run
    except BaseException:
        engine.close()
        raise
    finally:
        if freeze_gc:
            gc.unfreeze()
        telemetry.stop()
        if scraper is not None:
            scraper.finish()
        if server_stats is not None:
            server_stats.stop()
        if live is not None:
            live.finish()  # the final values, served until the next run or the server's end
    result = _measured_intervals(engine.result())
    if sut_exit is None:  # stopped by its own SUT's KeyboardInterrupt (an embedded run, or Ctrl-C ignored)
        interrupted = interrupted or result.interrupted
    if server_stats is not None:
        server_stats.end(result.counts["completed"] + result.counts["failed"])
    if on_measured is not None:
        on_measured(result)
    requests = engine.requests_section(clock_offset_s)
    started = clock_offset_s + ns_to_s(engine.start_ns) if engine.start_ns else started_wall
    worker = _worker(scenario, options, effective, started)
    try:
        doc = build_document(scenario, effective, result, interrupted=interrupted,
                             given=given or {}, started_wall=started_wall, sut=sut)
        add_worker_section(doc, worker)
        telemetry.add_to(doc, placement)
        add_cost(doc, effective.price_per_hour)  # with the GPUs sampled, for a per-GPU price
        if server_stats is not None:
            server_stats.add_to(doc, interrupted)
        if live is not None:
            doc["live_metrics"] = live.where()
        if requests is not None:
            doc["requests"] = requests
        if sut_exit is not None:
            doc["valid"] = False
            doc["invalid_reasons"].append(str(sut_exit))
    except Exception as e:
        # Whatever fails after the run, what was measured is handed back to be saved.
        doc = _partial_document(scenario, effective, result, interrupted, given or {}, started_wall, e)
        if sut_exit is not None:
            doc["invalid_reasons"].insert(0, str(sut_exit))
        message = str(doc["invalid_reasons"][-1])
        add_worker_section(doc, worker)
        if requests is not None:
            doc["requests"] = requests
        # Secrets (headers, URL passwords, the metrics URL's) never reach a document.
        doc = net_options(effective).redactor().doc(doc)
        raise ResultError(message, doc) from e
    if scraper is not None:
        try:
            doc["server_metrics"] = scraper.report()
        except Exception as e:  # the run's own figures stand without the server's
            doc["server_metrics"] = {"url": effective.server_metrics_url, "scrapes": 0, "failed_scrapes": 0,
                                     "errors": [f"reporting the scrapes failed: {type(e).__name__}: {e}"],
                                     "deltas": {}, "gauges": {}, "intervals": []}
    redacted: Dict[str, Any] = net_options(effective).redactor().doc(doc)
    if sut_exit is not None:  # an error, with the measured result to save
        raise ResultError(str(sut_exit), redacted) from sut_exit
    return redacted


def _measured_intervals(result: Any) -> Any:
    """``result`` without the time series' intervals of negative length: a run stopped
    during its warm-up ends before its measurement was to start, and the engine's last
    interval then runs from that start back to the end. Nothing was measured in it."""
    kept = [p for p in result.timeseries if p["length_ns"] >= 0]
    if len(kept) == len(result.timeseries):
        return result
    return dataclasses.replace(result, timeseries=kept)


def _wait_for_start(start_at: float, stop_requested: Optional[Callable[[], bool]], freeze_gc: bool = True) -> None:
    """Waits for ``--start-at``; KeyboardInterrupt when a stop is requested first. The
    full collection before the run is made (and frozen, with ``freeze_gc``) before the
    wait, so that the one after it walks only what the wait made and the run starts on
    time."""
    if freeze_gc:
        gc.collect()
        gc.freeze()
    try:
        started = wait_until(start_at, stop_requested)
    except BaseException:
        if freeze_gc:
            gc.unfreeze()
        raise
    if not started:
        if freeze_gc:
            gc.unfreeze()
        raise KeyboardInterrupt("stopped while waiting for --start-at")


def _worker(scenario: Scenario, options: RunOptions, effective: RunOptions,
            started_at_epoch_s: float) -> Optional[Dict[str, Any]]:
    """The result's ``"worker"`` section (:func:`loadgen.workers.worker_section`) of a
    worker of several or a run with ``--start-at``; None for a plain run."""
    if effective.workers <= 1 and effective.start_at is None:
        return None
    seed_given = {"schedule": options.schedule_seed is not None, "sample": options.sample_seed is not None}
    return worker_section(effective, seed_given, total_load(scenario.effective(options)), started_at_epoch_s)


def _partial_document(scenario: Scenario, o: RunOptions, result: Any, interrupted: bool,
                      given: Dict[str, Any], started_wall: float, error: BaseException) -> Dict[str, Any]:
    """The measured part of a result whose document could not be built: counts,
    durations and the engine's histograms, invalid, with the error as the reason."""
    reasons = ["the run was interrupted before it finished; its figures are partial"] if interrupted else []
    reasons.append(f"building the result document failed after the run ({type(error).__name__}: {error}); "
                   "this partial document holds what was measured")
    doc: Dict[str, Any] = {
        "schema": SCHEMA, "scenario": scenario.name, "sut": o.sut, "valid": False,
        "invalid_reasons": reasons, "interrupted": interrupted, "partial": True, "labels": parse_labels(o.label),
        "started_at_epoch_s": started_wall,
        "duration_s": result.duration_s, "issue_duration_s": result.issue_duration_s,
        "settings": {"given": dict(given), "effective": o.as_dict()},
        "counts": dict(result.counts),
        "thresholds": [],
    }
    for key, attr in (("latency_ns", "latency"), ("service_time_ns", "service_time"),
                      ("issue_delay_ns", "issue_delay")):
        try:
            doc[key] = histogram_summary(getattr(result, attr))
        except Exception:  # keep what can be kept
            pass
    try:
        doc["errors"] = {"counts": result.errors, "messages": result.error_messages}
    except Exception:
        pass
    return doc


def _watch(engine: Engine, on_progress: Optional[Callable[[Progress], None]], interval_s: float,
           stop_requested: Optional[Callable[[], bool]],
           finish_when: Optional[Callable[[List[Dict[str, Any]]], bool]] = None,
           poll: Callable[[], None] = lambda: None) -> bool:
    """Waits for the run to end, reporting progress, stopping it when asked and ending it
    when ``finish_when`` says so (``poll`` is called every 0.1 s meanwhile); returns
    whether it was stopped early."""
    interrupted = False
    last_progress = time.monotonic()
    last_completed = 0
    intervals = 0
    while not engine.wait(0.1):
        poll()
        if stop_requested is not None and stop_requested() and not interrupted:
            interrupted = True
            engine.stop()
            if not engine.wait(1.0):
                engine.abort()
        if finish_when is not None:
            points = engine.timeseries()
            if len(points) != intervals:
                intervals = len(points)
                if finish_when([timeseries_point(p) for p in points]):
                    finish_when = None
                    engine.finish()
        now = time.monotonic()
        if on_progress is not None and now - last_progress >= interval_s:
            c = engine.counts()
            on_progress(Progress(
                elapsed_s=engine.elapsed_s(), issued=c["issued"], completed=c["completed"],
                qps=(c["completed"] - last_completed) / (now - last_progress),
                p99_ns=engine.latency().value_at_percentile(99.0),
            ))
            last_progress, last_completed = now, c["completed"]
    return interrupted


def _server_stats(o: RunOptions) -> Optional[StatsWindow]:
    """The reads of a Triton server's model statistics (None where there are none to
    read); a server that cannot be asked is a warning of the result, not an error."""
    from loadgen.net.triton_stats import stats_window

    return stats_window(o)


def _scraper(o: RunOptions, check: bool) -> Optional[MetricsScraper]:
    """The Prometheus scraper of ``--server-metrics-url`` (None without one); with
    ``check``, one scrape first, raising ValueError when the endpoint does not answer."""
    if not o.server_metrics_url:
        return None
    from loadgen.net.metrics import MetricsScraper
    from loadgen.net.options import parse_header

    redactor = net_options(o).redactor()
    scraper = MetricsScraper(o.server_metrics_url, o.interval_s, [parse_header(h) for h in o.header])
    if check:
        try:
            scraper.check()
        except ValueError as e:
            raise ValueError(redactor.text(str(e))) from None
    return scraper
