"""``loadgen find-peak``: the highest rate a SUT sustains within a latency bound, or the
concurrency where its throughput stops growing; every probe kept."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Callable, Dict, List, Tuple

from loadgen.cli.common import (
    EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK, Interrupts, UsageError, add_run_options, after_run_failure, check_applies,
    check_output, check_thresholds, exit_code_for, linger_live, loading_sut, run_flags, serve_live, show_json, warn,
)
from loadgen.options import OPTION_SPECS, OptionError, resolve, unknown_environment
from loadgen.results import ThresholdError

__all__ = ["EXIT_GENERATOR_LIMIT", "PEAK_FLAGS", "register"]

#: No answer: the generator (or its client) could not offer the load on this machine, so
#: the search could not tell where the SUT's limit is; the SUT's peak is at least the
#: ``lower_bound`` of the ``peak`` section.
EXIT_GENERATOR_LIMIT = 3

# flag, PeakSettings field, type, metavar, help. None of them is a `loadgen run` flag.
PEAK_FLAGS: Tuple[Tuple[str, str, Callable[[str], Any], str, str], ...] = (
    ("--over", "over", str, "rate|concurrency", "what to search: the highest open-loop rate within the bound "
     "(rate, default) or the concurrency where throughput stops growing (concurrency)"),
    ("--precision", "precision", float, "REL", "stop when the bracket is this close, relative (default 0.05)"),
    ("--probe-s", "probe_s", float, "S", "each search probe runs at least this long (default 5)"),
    ("--start", "start", float, "X", "the first rate (queries/s) or concurrency probed (default: rate "
     "500 / --latency-bound-ms, at least 100 queries per probe; concurrency 1)"),
    ("--growth", "growth", float, "FACTOR", "widen by this factor until a probe fails (default 2)"),
    ("--confirm-runs", "confirm_runs", int, "N", "runs at the answer, each --duration-s long (default: "
     "the larger of --probe-s and 10 s), that must all hold (default 2)"),
    ("--max-probes", "max_probes", int, "N", "at most this many search probes (default 30)"),
    ("--max-step-downs", "max_step_downs", int, "N", "at most this many failed confirmations, each followed "
     "by a bisection below it with full-length runs (default 5)"),
    ("--retries", "retries", int, "N", "a run that failed only for the generator or the client is tried this "
     "many more times; then the search ends, exit 3 (default 2)"),
    ("--max-search-s", "max_search_s", float, "S", "no run of the search starts later than this (default 3600)"),
    ("--min-goodput", "min_goodput", float, "FRACTION", "with --slo: a run holds only when this fraction of its "
     "requests meets every SLO (default 0.95, unless a --require/--fail-if names goodput)"),
    ("--min-gain", "min_gain", float, "REL", "concurrency: throughput must grow this much per step; the "
     "answer is the lowest concurrency within it of the best throughput (default 0.05)"),
    ("--window-s", "window_s", float, "S", "concurrency: measurement window (default: --probe-s / 3)"),
    ("--stability", "stability", float, "REL", "concurrency: a probe is stable when its last 3 windows' "
     "throughput and p99 each lie within this of their mean (default 0.1)"),
    ("--max-windows", "max_windows", int, "N", "concurrency: an unstable probe runs up to this many "
     "windows (default 10)"),
)

# Run options the search sets itself: as flags they are an error saying what to use.
_SET_BY_SEARCH = {
    "target_qps": "find-peak chooses the rate; give the first one with --start",
    "concurrency": "find-peak chooses the concurrency; give the first one with --start",
    "query_count": "find-peak's runs are timed: --probe-s for probes, --duration-s for confirmations",
    "min_duration_s": "find-peak sets the run length: --probe-s for probes, --duration-s for confirmations",
}


def register(sub: Any) -> Dict[str, Any]:
    """Adds ``find-peak``; returns {name: (handler, known flags)}."""
    parser = sub.add_parser(
        "find-peak", help="find the highest rate (or the concurrency) a SUT sustains within a bound",
        description="Searches the highest rate whose runs hold (--over rate, open loop): valid, the "
        "latency at --latency-percentile within --latency-bound-ms, every --require/--fail-if met, "
        "and with --slo at least --min-goodput of the requests meeting every SLO; or the concurrency "
        "where throughput stops growing (--over concurrency, closed loop). It widens from --start by "
        "--growth until a probe fails, bisects to --precision, then confirms the answer with "
        "--confirm-runs runs of --duration-s; a failed confirmation is bisected below with full-length "
        "runs. A run that failed only for the generator or the client is retried (--retries), never "
        "taken for the SUT's limit. Exit 0 with a confirmed answer, 1 without one, 3 when the generator "
        "could not offer the load. The run options are those of 'loadgen run'.",
        argument_default=argparse.SUPPRESS,
    )
    add_run_options(parser)
    group = parser.add_argument_group("search")
    for flag, dest, kind, metavar, text in PEAK_FLAGS:
        if dest == "over":
            group.add_argument(flag, dest="peak_" + dest, choices=("rate", "concurrency"), help=text)
        else:
            group.add_argument(flag, dest="peak_" + dest, type=kind, metavar=metavar, help=text)
    known = [spec.flag for spec in OPTION_SPECS] + [flag for flag, *_ in PEAK_FLAGS]
    return {"find-peak": (cmd_find_peak, known)}


def _settings(args: argparse.Namespace) -> Any:
    from loadgen.peak.driver import PeakSettings

    given = {dest: getattr(args, "peak_" + dest) for _, dest, *_ in PEAK_FLAGS if hasattr(args, "peak_" + dest)}
    return PeakSettings(**given)


def _check_set_by_search(flags: Dict[str, Any], given: Dict[str, Any], over: str) -> None:
    """The run options the search sets itself: an error as flags, ignored (with a
    warning) from the config file or the environment."""
    searched = "target_qps" if over == "rate" else "concurrency"
    for name, why in _SET_BY_SEARCH.items():
        if name in ("target_qps", "concurrency") and name != searched:
            continue  # the other one: check_applies says it does not apply
        flag = "--" + name.replace("_", "-")
        if name in flags:
            raise UsageError(f"{flag}: {why}")
        if name in given:
            warn(f"{flag} from the config file or the environment is ignored: {why}")


def _check_earlier_search(output: Any) -> None:
    """Warns when ``--output`` holds an earlier search's runs, which this one's replace."""
    from loadgen.peak.driver import PROBES_DIR, PROBES_FILE

    probes = os.path.join(output or "", PROBES_DIR)
    if output and os.path.isdir(probes) and os.listdir(probes):
        warn(f"--output {output} holds an earlier search's runs: this search's runs replace those of the "
             f"same number in {probes}, and {PROBES_FILE} is written anew; give each search its own folder "
             "to keep both")


def cmd_find_peak(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:  # the live metrics server of the whole search
        return _cmd_find_peak(args, stack)


def _cmd_find_peak(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    from loadgen.peak.driver import PeakSearch, search_options
    from loadgen.storage import publish, stage_output

    flags = run_flags(args)
    for warning in unknown_environment():
        warn(warning)
    with Interrupts() as interrupts:  # before the first probe, a signal ends the command at once
        try:
            settings = _settings(args)
            options, given = resolve(flags)
            _check_set_by_search(flags, given, settings.over)
            check_thresholds(options)
            check_applies(search_options(options, settings, given), flags, given)
            check_output(options.output)
            remote = stage_output(options, options.storage_option, stack)  # a URL: staged here
            _check_earlier_search(options.output)
            live = serve_live(options, stack)  # before the SUT: a port in use fails at once
            with loading_sut(interrupts, options.sut):
                search = PeakSearch(options, settings, given)  # every option and the SUT checked
            search.live = live
        except (OptionError, ThresholdError, ValueError) as e:
            raise UsageError(str(e)) from None
        show = not options.quiet  # progress goes to stderr: with --json, stdout holds the document alone
        interrupts.running = True
        doc = search.run(say=_say if show else None, stop_requested=lambda: interrupts.signal is not None)
        # Within the signal handling: a signal now is taken as during the search, once shown.
        code = publish(remote, lambda: _report(doc, options.json, options.quiet, search.write_error, options.output),
                       options.quiet or options.json, options.json)
        if interrupts.signal is None:
            linger_live(live, options)
        elif code != EXIT_INVALID:  # an error showing the result (1) stands
            code = exit_code_for(interrupts.signal)
    return code


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass


def _report(doc: Dict[str, Any], as_json: bool, quiet: bool, write_error: str, output: Any) -> int:
    from loadgen.peak.driver import PROBES_DIR, PROBES_FILE
    from loadgen.peak.report import render_peak

    if write_error:  # nothing measured is lost: the final document holds every run's summary
        return after_run_failure(doc, write_error, [], as_json)
    if as_json:
        code = show_json(doc, [os.path.join(output, "result.json")] if output else [])
        if code is not None:
            return code
    elif not quiet:
        sys.stdout.write(render_peak(doc))
        if output:
            runs: List[Dict[str, Any]] = doc["peak"]["runs"]
            print(f"wrote {os.path.join(output, 'result.json')}, {os.path.join(output, PROBES_FILE)} and "
                  f"{len(runs)} run folders in {os.path.join(output, PROBES_DIR)}")
    peak = doc["peak"]
    if peak["interrupted"]:
        return EXIT_INTERRUPTED  # the command's signal decides: 129 for SIGHUP
    if peak.get("limited_by") in ("generator", "client"):
        return EXIT_GENERATOR_LIMIT
    thresholds_ok = all(t["passed"] for t in doc.get("thresholds", []))
    return EXIT_OK if peak["confirmed"] and doc["valid"] and thresholds_ok else EXIT_INVALID
