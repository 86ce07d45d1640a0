"""One benchmark run from options to result document: what ``loadgen run`` does, usable
from Python as :func:`run_benchmark`."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import gc
import time
from typing import Any, Callable, Dict, Optional

from loadgen.engine import Engine, RunResult
from loadgen.options import RunOptions
from loadgen.results import SCHEMA, environment, evaluate_thresholds, histogram_summary
from loadgen.scenarios import Scenario, get_scenario
from loadgen.scenarios.base import common_invalid_reasons
from loadgen.net import is_network_sut, open_from_options
from loadgen.sut.spec import load_sut

__all__ = ["Progress", "prepare", "run_benchmark", "build_document"]


@dataclasses.dataclass
class Progress:
    """A snapshot for progress displays."""

    elapsed_s: float
    issued: int
    completed: int
    qps: float
    p99_ns: int


def prepare(options: RunOptions):
    """Scenario, effective options, engine settings and SUT for ``options``.

    Raises:
        ValueError: an option or the SUT is unusable; the message names it.
    """
    scenario = get_scenario(options.scenario)
    effective = scenario.effective(options)
    settings = scenario.engine_settings(effective)
    settings.validate()
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
    prepared: Optional[tuple] = None,
) -> Dict[str, Any]:
    """Runs one benchmark and returns its result document.

    Args:
        options: the run's options.
        given: the options as the user gave them (recorded in the document).
        on_progress: called about every ``progress_interval_s`` with a :class:`Progress`.
        stop_requested: polled a few times a second; when it returns True the run is
            stopped (outstanding queries get up to a second, then are cancelled) and the
            document is marked interrupted and invalid.
        prepared: what :func:`prepare` returned for these options, so that the SUT is
            not loaded twice.
    """
    scenario, effective, settings, sut = prepared if prepared is not None else prepare(options)
    engine = Engine(settings, sut)
    scraper = _scraper(effective, check=False)
    started_wall = time.time()
    interrupted = False
    if scraper is not None:
        scraper.start()
    # What exists now (modules, the prepared requests) lives through the run: moved out of
    # the collector's reach, a full collection during the run only walks what the run made,
    # and pauses Python SUTs and network clients for less.
    gc.collect()
    gc.freeze()
    engine.start()
    try:
        last_progress = time.monotonic()
        last_completed = 0
        while not engine.wait(0.1):
            if stop_requested is not None and stop_requested() and not interrupted:
                interrupted = True
                engine.stop()
                if not engine.wait(1.0):
                    engine.abort()
            now = time.monotonic()
            if on_progress is not None and now - last_progress >= progress_interval_s:
                c = engine.counts()
                p99 = engine._core.latency().value_at_percentile(99.0)
                on_progress(Progress(
                    elapsed_s=(time.monotonic_ns() - engine._core.start_ns) / 1e9,
                    issued=c["issued"], completed=c["completed"],
                    qps=(c["completed"] - last_completed) / (now - last_progress), p99_ns=p99,
                ))
                last_progress, last_completed = now, c["completed"]
    except BaseException:
        engine.abort()
        engine._core.wait(None)
        raise
    finally:
        gc.unfreeze()
        if scraper is not None:
            scraper.finish()
    result = engine.result()
    doc = build_document(scenario, effective, result, interrupted=interrupted,
                         given=given or {}, started_wall=started_wall, sut=sut)
    if scraper is not None:
        doc["server_metrics"] = scraper.report()
    if is_network_sut(effective.sut):
        from loadgen.net import net_options

        doc = net_options(effective).redactor().doc(doc)
    return doc


def _scraper(o: RunOptions, check: bool):
    """The Prometheus scraper of ``--server-metrics-url`` (None without one); with
    ``check``, one scrape first, raising ValueError when the endpoint does not answer."""
    if not o.server_metrics_url:
        return None
    from loadgen.net import net_options
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


def build_document(scenario: Scenario, o: RunOptions, result: RunResult, *, interrupted: bool,
                   given: Dict[str, Any], started_wall: float, sut: Any = None) -> Dict[str, Any]:
    """The ``loadgen.result/1`` document of a finished run."""
    c = dict(result.counts)
    c["samples_completed"] = c["completed"] * o.samples_per_query
    reasons = common_invalid_reasons(scenario, result, o, interrupted)
    reasons += [r for r in scenario.invalid_reasons(result, o) if r not in reasons]
    doc: Dict[str, Any] = {
        "schema": SCHEMA,
        "scenario": scenario.name,
        "sut": o.sut,
        "valid": not reasons,
        "invalid_reasons": reasons,
        "interrupted": interrupted,
        "metric": scenario.metric(result, o),
        "started_at": _dt.datetime.fromtimestamp(started_wall, tz=_dt.timezone.utc).isoformat(),
        "started_at_epoch_s": started_wall,
        "duration_s": result.duration_s,
        "issue_duration_s": result.issue_duration_s,
        "settings": {
            "given": {k: v for k, v in given.items()},
            "effective": o.as_dict(),
            "engine": {k: (list(v) if isinstance(v, tuple) else v)
                       for k, v in dataclasses.asdict(result.settings).items()
                       if k != "trace_offsets_ns"},
        },
        "counts": c,
        "throughput": {
            "completed_qps": result.completed_qps,
            "samples_per_s": result.samples_per_s,
            "target_qps": o.target_qps,
            "scheduled_qps": c["issued"] / result.issue_duration_s if result.issue_duration_s > 0 else 0.0,
        },
        "latency_ns": histogram_summary(result.latency),
        "service_time_ns": histogram_summary(result.service_time),
        "issue_delay_ns": histogram_summary(result.issue_delay),
    }
    if result.ttft.total_count:
        doc["ttft_ns"] = histogram_summary(result.ttft)
    if result.tpot.total_count:
        doc["tpot_ns"] = histogram_summary(result.tpot)
    itl = getattr(sut, "itl", None)
    if itl is not None and itl.total_count:
        doc["itl_ns"] = histogram_summary(itl)
    tps = getattr(sut, "tokens_per_s", None)
    if tps is not None and tps.total_count:
        summary = histogram_summary(tps)
        doc["output_tokens_per_s"] = {
            k: (v / 1000.0 if k not in ("count", "hdr") else v) for k, v in summary.items()
        }
        doc["output_tokens_per_s"]["hdr_unit"] = "milli-tokens/s"
    report = getattr(sut, "report", None)
    if callable(report):
        doc["network"] = report()
    es = scenario.early_stopping(result, o)
    if es is not None:
        doc["early_stopping"] = es
    doc["timeseries"] = [
        {
            "t_s": p["start_offset_ns"] / 1e9,
            "length_s": p["length_ns"] / 1e9,
            "issued": p["issued"],
            "completed": p["completed"],
            "qps": p["completed"] / (p["length_ns"] / 1e9) if p["length_ns"] > 0 else 0.0,
            "p50_ns": p["latency_p50_ns"],
            "p99_ns": p["latency_p99_ns"],
            "max_ns": p["latency_max_ns"],
            "latency_hdr": _b64(p["latency_hdr"]),
        }
        for p in result.timeseries
    ]
    doc["errors"] = {"counts": result.errors, "messages": result.error_messages}
    doc["environment"] = environment(o.pin_cpus)
    doc["thresholds"] = evaluate_thresholds(doc, o.fail_if, o.require)
    return doc


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode("ascii")
