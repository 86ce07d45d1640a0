"""``loadgen run``: one benchmark, its summary and its files."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

from loadgen.cli.common import (
    EXIT_INVALID, EXIT_OK, Interrupted, Interrupts, ProgressPrinter, UsageError, add_run_options, after_run_failure,
    check_applies, check_output, check_thresholds, linger_live, loading_sut, run_flags, save, serve_live, show_json,
    warn,
)
from loadgen.engine.records import check_record_path
from loadgen.options import OPTION_SPECS, OptionError, RunOptions, resolve, unknown_environment
from loadgen.results import ThresholdError, render_summary
from loadgen.workers import START_LATE_WARN_S

__all__ = ["register"]


def register(sub: Any) -> Dict[str, Any]:
    """Adds ``run`` to the subcommands; returns {name: (handler, known flags)}."""
    run = sub.add_parser(
        "run", help="run one benchmark",
        description="Runs one benchmark and prints a summary (VALID/INVALID first). Options "
        "come from, in rising precedence: defaults, --config FILE (TOML, keys are the long "
        "flag names), LOADGEN_<FLAG_NAME> environment variables, and these flags.",
        argument_default=argparse.SUPPRESS,
    )
    add_run_options(run)
    return {"run": (cmd_run, [spec.flag for spec in OPTION_SPECS])}


def cmd_run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:  # the live metrics server, closed at the very end
        return _cmd_run(args, stack)


def _cmd_run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    from loadgen.results.files import CSV_FILE
    from loadgen.runner import ResultError, prepare, run_benchmark
    from loadgen.storage import publish, stage_output

    flags = run_flags(args)
    for warning in unknown_environment():
        warn(warning)
    with Interrupts() as interrupts:  # SIGTERM before the run (the server's readiness): as Ctrl-C
        try:
            options, given = resolve(flags)
            check_thresholds(options)
            check_applies(options, flags, given)
            check_output(options.output)
            remote = stage_output(options, options.storage_option, stack, seed=(CSV_FILE,))  # a URL: staged here
            live = serve_live(options, stack)  # before the SUT: a port in use fails at once
            if options.record_requests:
                check_record_path(options.record_requests, None if remote else options.output)
            with loading_sut(interrupts, options.sut):
                prepared = prepare(options)  # every option and the SUT checked before anything runs
        except (OptionError, ThresholdError, ValueError) as e:
            raise UsageError(str(e)) from None
        quiet = options.quiet or options.json
        _say_start(options, quiet)
        show = None if quiet or sys.stdout is None else ProgressPrinter(sys.stdout)  # None: started with >&-
        tty = show is not None and show.tty
        interrupts.running = True
        failure: Optional[str] = None
        try:
            doc = run_benchmark(
                options, given=given, on_progress=show,
                progress_interval_s=0.5 if tty else 5.0,
                stop_requested=lambda: interrupts.signal is not None, prepared=prepared, live=live,
            )
        except ResultError as e:  # measured, but the document could not be built
            doc, failure = e.doc, str(e)
        except KeyboardInterrupt as e:  # stopped before it started (--start-at): the signal's exit code
            if interrupts.signal is not None and not isinstance(e, Interrupted):
                raise Interrupted(interrupts.signal) from None
            raise
        # Still within the signal handling: a signal while the files are written is
        # taken as during the run (the files are finished, then the exit code says it).
        return publish(remote, lambda: _after_run(doc, failure, options, interrupts, show, live), quiet,
                       options.json)


def _after_run(doc: Dict[str, Any], failure: Optional[str], options: RunOptions, interrupts: Interrupts,
               show: Optional[ProgressPrinter], live: Any) -> int:
    """Saves, shows and judges the run's result; returns the exit code."""
    if show is not None:
        show.end()
    _warn_late_start(doc)
    # The result files before the summary: whatever happens to stdout (a closed pipe, a
    # renderer that fails), the measured result is saved.
    paths: List[str] = []
    if options.output:
        try:
            # A partial document (one that could not be built) is saved as result.json alone.
            paths, render_failure = save(doc, options.output, partial=bool(doc.get("partial")),
                                         html=not options.no_html)
        except OSError as e:
            print(json.dumps(doc, default=str), file=sys.stderr)
            raise UsageError(f"--output: cannot write to {options.output}: {e.strerror or e} "
                              "(the result JSON was printed on stderr instead)") from None
        failure = failure or render_failure
    if show is not None and show.broken is not None:
        raise show.broken  # stdout closed during the run: main ends quietly
    if failure is None:
        try:
            if options.json:
                code = show_json(doc, paths)
                if code is not None:
                    return code
            elif not options.quiet:
                sys.stdout.write(render_summary(doc))
                if options.output:
                    print(f"wrote {', '.join(paths)}")
        except (BrokenPipeError, KeyboardInterrupt):
            raise
        except Exception as e:
            failure = f"showing the result failed: {type(e).__name__}: {e}"
    if interrupts.signal is None:  # the files are written: a late scraper may come now
        linger_live(live, options)
    if failure is not None:
        return after_run_failure(doc, failure, paths, options.json)
    if not _records_written(doc, options.quiet or options.json):
        return EXIT_INVALID
    if interrupts.exit_code is not None:
        return interrupts.exit_code
    thresholds_ok = all(t["passed"] for t in doc["thresholds"])
    return EXIT_OK if doc["valid"] and thresholds_ok else EXIT_INVALID




def _records_written(doc: Dict[str, Any], quiet: bool) -> bool:
    """Says where the per-request records went (unless ``quiet``); False, with the error
    on stderr, when writing them failed (the result itself is saved and shown)."""
    section = doc.get("requests")
    if section is None:
        return True
    if section.get("error"):
        # A Parquet file whose conversion failed is not there (its spool is, as the error says).
        written = (f"; {section['records']} records were written to {section['file']}, which is incomplete"
                   if os.path.isfile(section["file"]) else "")
        warn(f"--record-requests: {section['error']}{written}")
        return False
    if not quiet:
        print(f"wrote {section['records']} request records to {section['file']}")
    return True


def _say_start(options: RunOptions, quiet: bool) -> None:
    """Says, before the run, how long it waits for ``--start-at`` (unless ``quiet``), or
    warns that one already past will start late."""
    if options.start_at is None:
        return
    behind = time.time() - options.start_at
    if behind < -1.0 and not quiet:
        print(f"waiting {-behind:.1f} s for --start-at {options.start_at:.3f}", flush=True)
    if behind > options.start_tolerance_s:
        warn(f"--start-at {options.start_at:.3f} was {behind:.3f} s ago, more than --start-tolerance-s "
             f"{options.start_tolerance_s:g}: this worker starts now, late, and its result will be invalid")
    elif behind > 0:
        warn(f"--start-at {options.start_at:.3f} was {behind:.3f} s ago: this worker starts now, late")


def _warn_late_start(doc: Dict[str, Any]) -> None:
    """Says by how much a worker started after ``--start-at``, when it did."""
    late = doc.get("worker", {}).get("start_late_s")
    if late is not None and late > START_LATE_WARN_S:
        warn(f"this worker started {late:.3f} s after --start-at")
