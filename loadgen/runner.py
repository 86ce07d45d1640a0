"""One benchmark run from options to result document: what ``loadgen run`` does, usable
from Python as :func:`run_benchmark`."""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from loadgen.engine import Engine, EngineSettings
from loadgen.net import net_options, open_from_options
from loadgen.options import RunOptions, parse_labels
from loadgen.results.document import SCHEMA, build_document, histogram_summary, timeseries_point
from loadgen.scenarios import Scenario, get_scenario
from loadgen.sut.spec import is_network_sut, load_sut

if TYPE_CHECKING:
    from loadgen.net.metrics import MetricsScraper

__all__ = ["Progress", "ResultError", "prepare", "run_benchmark"]

#: What :func:`prepare` returns: the scenario, the effective options, the engine settings
#: and the SUT (any form :func:`loadgen.sut.classify_sut` accepts).
_Prepared = Tuple[Scenario, RunOptions, EngineSettings, Any]


class ResultError(RuntimeError):
    """The run finished but its result document could not be built. :attr:`doc` holds
    what was measured (counts, durations, the engine's histograms), marked invalid and
    ``"partial": true``, so that nothing measured is lost: save it, then fail."""

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


def prepare(options: RunOptions) -> _Prepared:
    """Scenario, effective options, engine settings and SUT for ``options``.

    Raises:
        ValueError: an option or the SUT is unusable; the message names it.
    """
    scenario = get_scenario(options.scenario)
    effective = scenario.effective(options)
    settings = scenario.engine_settings(effective)
    settings.validate()  # the SUT is not loaded (nor the server contacted) for bad settings
    if is_network_sut(effective.sut):
        sut = open_from_options(effective, settings)
    else:
        if any(getattr(effective, name) for name in _NETWORK_ONLY):
            given = [name for name in _NETWORK_ONLY if getattr(effective, name)]
            raise ValueError(f"--{given[0].replace('_', '-')} applies to network targets (--sut URL), "
                             f"not to --sut {effective.sut}")
        sut = load_sut(effective.sut)
    _scraper(effective, check=True)
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
) -> Dict[str, Any]:
    """Runs one benchmark and returns its result document.

    Raises:
        ResultError: the run finished, but building its document failed; the error's
            ``doc`` holds the measured result.

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
    """
    scenario, effective, settings, sut = prepared if prepared is not None else prepare(options)
    engine = Engine(settings, sut)
    scraper = _scraper(effective, check=False)
    started_wall = time.time()
    if scraper is not None:
        scraper.start()
    # What exists now (modules, the prepared requests) lives through the run: moved out of
    # the collector's reach, a full collection during the run only walks what the run made,
    # and pauses Python SUTs and network clients for less.
    gc.collect()
    gc.freeze()
    engine.start()
    try:
        interrupted = _watch(engine, on_progress, progress_interval_s, stop_requested, finish_when)
    except BaseException:
        engine.close()
        raise
    finally:
        gc.unfreeze()
        if scraper is not None:
            scraper.finish()
    result = engine.result()
    try:
        doc = build_document(scenario, effective, result, interrupted=interrupted,
                             given=given or {}, started_wall=started_wall, sut=sut)
    except Exception as e:
        # Whatever fails after the run, what was measured is handed back to be saved.
        doc = _partial_document(scenario, effective, result, interrupted, given or {}, started_wall, e)
        # Secrets (headers, URL passwords, the metrics URL's) never reach a document.
        doc = net_options(effective).redactor().doc(doc)
        raise ResultError(str(doc["invalid_reasons"][-1]), doc) from e
    if scraper is not None:
        try:
            doc["server_metrics"] = scraper.report()
        except Exception as e:  # the run's own figures stand without the server's
            doc["server_metrics"] = {"url": effective.server_metrics_url, "scrapes": 0, "failed_scrapes": 0,
                                     "errors": [f"reporting the scrapes failed: {type(e).__name__}: {e}"],
                                     "deltas": {}, "intervals": []}
    redacted: Dict[str, Any] = net_options(effective).redactor().doc(doc)
    return redacted


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
           finish_when: Optional[Callable[[List[Dict[str, Any]]], bool]] = None) -> bool:
    """Waits for the run to end, reporting progress, stopping it when asked and ending it
    when ``finish_when`` says so; returns whether it was stopped early."""
    interrupted = False
    last_progress = time.monotonic()
    last_completed = 0
    intervals = 0
    while not engine.wait(0.1):
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
