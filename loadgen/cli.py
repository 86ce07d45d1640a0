"""The ``loadgen`` command line. Only :func:`main` turns errors into exit codes.

Exit codes: 0 the run was valid (or the command succeeded), 1 it ran but was invalid or a
--fail-if/--require threshold failed, 2 bad usage, options or input, 130 interrupted
(Ctrl-C, or SIGTERM as when a pod is stopped), 141 stdout was a pipe that closed before
all the output was written (as in ``loadgen report R | head -1``; 128 + SIGPIPE, what a
shell reports for a process a broken pipe ended). A closed pipe ends the command quietly,
with no traceback; ``run`` still finishes the run and writes its ``--output`` files
first, so no measured result is lost.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import signal
import sys
import tempfile
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, Dict, List, NoReturn, Optional, Sequence, TextIO, Tuple

from loadgen._version import __version__
from loadgen.stats.hdrlog import HistogramLogError, read_log
from loadgen.stats.histogram import DEFAULT_PERCENTILES, Histogram
from loadgen.options import OPTION_SPECS, OptionError, RunOptions, resolve, unknown_environment
from loadgen.results import (
    ThresholdError, load_result, parse_threshold, render_summary, result_files, write_outputs,
)
from loadgen.results.files import CSV_FILE, HLOG_FILE, RESULT_FILE, SUMMARY_FILE
from loadgen.scenarios import options_not_applying
from loadgen.units import NS_PER, TIME_UNITS

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from loadgen.runner import Progress

__all__ = ["main"]

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE (a constant: Windows has no signal.SIGPIPE)


class _UsageError(Exception):
    """Bad input from the user: exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would exit; main decides
        raise _UsageError(f"{self.prog}: {message}")

    def _print_message(self, message: str, file: Optional[SupportsWrite[str]] = None) -> None:
        # What prints --help, --version and usage. argparse drops every write error; a
        # closed pipe is let through, so that main ends with EXIT_BROKEN_PIPE.
        if message:
            try:
                (file or sys.stderr).write(message)
            except BrokenPipeError:
                raise
            except (AttributeError, OSError):
                pass


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="loadgen",
        description="A load generator for machine-learning inference.",
        epilog="Run 'loadgen run --help' for the benchmark options.",
    )
    parser.add_argument("--version", action="version", version=f"loadgen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser(
        "run", help="run one benchmark",
        description="Runs one benchmark and prints a summary (VALID/INVALID first). Options "
        "come from, in rising precedence: defaults, --config FILE (TOML, keys are the long "
        "flag names), LOADGEN_<FLAG_NAME> environment variables, and these flags.",
        argument_default=argparse.SUPPRESS,
    )
    for spec in OPTION_SPECS:
        kwargs: Dict[str, Any] = {"dest": spec.name, "help": spec.help + f" [env {spec.env}]"}
        if spec.convert.__name__ == "_bool":
            kwargs["action"] = "store_const"
            kwargs["const"] = True
        else:
            kwargs["metavar"] = spec.metavar or spec.name.upper()
            if spec.repeatable:
                kwargs["action"] = "append"
        run.add_argument(spec.flag, **kwargs)

    report = sub.add_parser("report", help="re-render the summary of a saved result.json",
                            description="Prints the summary of saved results (a result.json "
                            "or a folder holding one).")
    report.add_argument("paths", nargs="+", metavar="RESULT", help="result.json files or folders")
    report.add_argument("--json", action="store_true", help="print the result JSON instead")

    hlog = sub.add_parser(
        "hlog", help="summarize HdrHistogram interval logs (.hlog)",
        description="Merges the intervals of one or more HdrHistogram interval logs, per tag, "
        "and prints count, min, mean, percentiles and max.",
    )
    hlog.add_argument("paths", nargs="+", metavar="FILE", help="interval log files")
    hlog.add_argument("--tag", help="only intervals with this tag ('' for untagged)")
    hlog.add_argument("--unit", choices=sorted(TIME_UNITS), default="us",
                      help="unit to print values in; recorded values are taken as ns (default: us)")
    hlog.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def _check_unknown(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Turns an unknown --flag into an error with a 'did you mean' suggestion."""
    if not argv or argv[0] != "run":
        return
    known = {spec.flag for spec in OPTION_SPECS} | {"--help", "-h"}
    for arg in argv[1:]:
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            if flag not in known:
                close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]}?" if close else "; see 'loadgen run --help'"
                raise _UsageError(f"unknown option {flag}{hint}")


# ---------------------------------------------------------------------------------- run

class _Interrupts:
    """SIGINT/SIGTERM handling from the options to the end of a run. Before the run (while
    the SUT is loaded or a server's readiness awaited) either signal ends the command as
    interrupted (exit 130); during it, the first asks the run to stop (the result is
    still written). Handlers are restored afterwards."""

    def __init__(self) -> None:
        self.signal: Optional[int] = None
        self.running = False  # before the run (options, the server's readiness): stop at once
        self._old: Dict[int, Any] = {}

    def __enter__(self) -> "_Interrupts":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if not self.running:
            raise KeyboardInterrupt  # nothing measured yet: main says "interrupted", exit 130
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: give up at once
        self.signal = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


class _ProgressPrinter:
    """Prints progress lines on ``out``: one line rewritten in place on a terminal, a
    line each time otherwise. A closed pipe stops the printing, not the run: the error
    is kept in :attr:`broken` for after the results are saved."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.broken: Optional[BrokenPipeError] = None

    def __call__(self, p: Progress) -> None:
        line = (f"{p.elapsed_s:7.1f} s  issued {p.issued:>10,}  completed {p.completed:>10,}  "
                f"{p.qps:>10,.0f} q/s  p99 {p.p99_ns / NS_PER['ms']:8.3f} ms")
        self._write("\r" + line if self.tty else line + "\n")

    def end(self) -> None:
        """Ends the line rewritten in place on a terminal."""
        if self.tty:
            self._write("\n")

    def _write(self, text: str) -> None:
        if self.broken is not None:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError as e:
            self.broken = e


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _check_thresholds(options: RunOptions) -> None:
    """Every --fail-if/--require expression reads; the error names the option."""
    for flag, exprs in (("--fail-if", options.fail_if), ("--require", options.require)):
        for expr in exprs:
            try:
                parse_threshold(expr)
            except ThresholdError as e:
                raise _UsageError(f"{flag}: {e}") from None


def _check_applies(options: RunOptions, flags: Dict[str, Any], given: Dict[str, Any]) -> None:
    """An option that the scenario does not read is an error when given as a flag, and a
    warning when it comes from the config file or the environment (which may set options
    for several scenarios)."""
    problems = options_not_applying(options.scenario, [name for name in given if name in flags])
    if problems:
        raise _UsageError(problems[0] + "; drop it, or choose the scenario it is for with --scenario")
    for message in options_not_applying(options.scenario, [name for name in given if name not in flags]):
        _warn(message + " (set in the config file or the environment: ignored)")


def _check_output(directory: Optional[str]) -> None:
    """Fails before the run when ``--output`` cannot be written: a file in the way, a
    folder that cannot be created or written. Warns when it holds an earlier run's
    result (replaced; results.csv gets a row per run)."""
    if not directory:
        return
    path = os.path.abspath(directory)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise _UsageError(f"--output: cannot write to {directory}: it exists and is not a folder")
    probe = path
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise _UsageError(f"--output: cannot write to {directory}: {probe} is a file, not a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".loadgen-probe-", dir=probe)
    except OSError as e:
        where = "" if probe == path else f" (nor create it in {probe})"
        raise _UsageError(f"--output: cannot write to {directory}{where}: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(tmp)
    for name in (RESULT_FILE, SUMMARY_FILE, HLOG_FILE, CSV_FILE):
        if os.path.isdir(os.path.join(path, name)):
            raise _UsageError(f"--output: {os.path.join(directory, name)} is a folder; the run writes a file there")
    if os.path.isfile(os.path.join(path, RESULT_FILE)):
        _warn(f"--output {directory} holds an earlier run's {RESULT_FILE}: this run replaces it, "
              f"{SUMMARY_FILE} and {HLOG_FILE}, and adds a row to {CSV_FILE}")


def _save(doc: Dict[str, Any], directory: str, partial: bool) -> Tuple[List[str], Optional[str]]:
    """Writes the run's files to ``directory``; returns their paths and, when rendering
    them failed, what failed. result.json is written whatever fails after it; a partial
    document (see :class:`loadgen.runner.ResultError`) is written as result.json alone."""
    failure: Optional[str] = None
    if not partial:
        try:
            return write_outputs(doc, directory), None
        except OSError:
            raise
        except Exception as e:  # a renderer failed: the result itself is kept
            failure = f"writing the result files failed: {type(e).__name__}: {e}"
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, RESULT_FILE)
    text = json.dumps(doc, indent=2, default=str) + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return [path], failure


def _cmd_run(args: argparse.Namespace) -> int:
    from loadgen.runner import ResultError, prepare, run_benchmark

    flags = {spec.name: getattr(args, spec.name) for spec in OPTION_SPECS if hasattr(args, spec.name)}
    for warning in unknown_environment():
        _warn(warning)
    with _Interrupts() as interrupts:  # SIGTERM before the run (the server's readiness): as Ctrl-C
        try:
            options, given = resolve(flags)
            _check_thresholds(options)
            _check_applies(options, flags, given)
            _check_output(options.output)
            prepared = prepare(options)  # every option and the SUT checked before anything runs
        except (OptionError, ThresholdError, ValueError) as e:
            raise _UsageError(str(e)) from None
        quiet = options.quiet or options.json
        show = None if quiet else _ProgressPrinter(sys.stdout)
        tty = show is not None and show.tty
        interrupts.running = True
        failure: Optional[str] = None
        try:
            doc = run_benchmark(
                options, given=given, on_progress=show,
                progress_interval_s=0.5 if tty else 5.0,
                stop_requested=lambda: interrupts.signal is not None, prepared=prepared,
            )
        except ResultError as e:  # measured, but the document could not be built
            doc, failure = e.doc, str(e)
    if show is not None:
        show.end()
    # The result files before the summary: whatever happens to stdout (a closed pipe, a
    # renderer that fails), the measured result is saved.
    paths: List[str] = []
    if options.output:
        try:
            paths, render_failure = _save(doc, options.output, partial=failure is not None)
        except OSError as e:
            print(json.dumps(doc, default=str), file=sys.stderr)
            raise _UsageError(f"--output: cannot write to {options.output}: {e.strerror or e} "
                              "(the result JSON was printed on stderr instead)") from None
        failure = failure or render_failure
    if show is not None and show.broken is not None:
        raise show.broken  # stdout closed during the run: main ends quietly
    if failure is None:
        try:
            if options.json:
                print(json.dumps(doc, indent=2))
            elif not options.quiet:
                sys.stdout.write(render_summary(doc))
                if options.output:
                    print(f"wrote {', '.join(paths)}")
        except (BrokenPipeError, KeyboardInterrupt):
            raise
        except Exception as e:
            failure = f"showing the result failed: {type(e).__name__}: {e}"
    if failure is not None:
        return _after_run_failure(doc, failure, paths, options.json)
    if interrupts.signal is not None:
        return EXIT_INTERRUPTED
    thresholds_ok = all(t["passed"] for t in doc["thresholds"])
    return EXIT_OK if doc["valid"] and thresholds_ok else EXIT_INVALID


def _after_run_failure(doc: Dict[str, Any], failure: str, paths: List[str], as_json: bool) -> int:
    """An error after the run: the measured result is saved (``paths``), or printed as
    JSON (on stdout with --json, else on stderr), then the error; exit 1."""
    if not paths:
        text = json.dumps(doc, indent=2, default=str)
        print(text, file=sys.stdout if as_json else sys.stderr)
    where = f"saved in {paths[0]}" if paths else ("printed on stdout" if as_json else "printed above")
    print(f"error: {failure} (the measured result is {where})", file=sys.stderr)
    return EXIT_INVALID


def _read(read: Any, path: str) -> Any:
    """``read(path)``; a file that cannot be read, or is not what it should be, is bad input."""
    try:
        return read(path)
    except OSError as e:
        raise _UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except HistogramLogError as e:
        raise _UsageError(f"{path}: {e}") from None
    except ValueError as e:  # load_result's message names the file
        raise _UsageError(str(e)) from None


def _cmd_report(args: argparse.Namespace) -> int:
    files = result_files(args.paths)
    if not files:
        raise _UsageError(f"no result.json found in {', '.join(args.paths)}")
    status = EXIT_OK
    for path in files:
        doc = _read(load_result, path)
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            if len(files) > 1:
                print(f"== {path}")
            # load_result checked the schema; these are the last line of defence.
            try:
                sys.stdout.write(render_summary(doc))
            except KeyError as e:
                if doc.get("partial"):
                    raise _UsageError(f"{path} is a partial result (its document could not be built after "
                                      f"the run) without {e} for a summary; 'loadgen report --json' shows "
                                      "what it holds") from None
                raise _UsageError(f"{path}: the result is missing {e}; is it complete?") from None
            except (TypeError, ValueError, AttributeError, OverflowError) as e:
                raise _UsageError(f"{path}: the result cannot be summarized: {e}") from None
        if not doc.get("valid", False):
            status = EXIT_INVALID
    return status


# --------------------------------------------------------------------------------- hlog

def _merge_logs(paths: Sequence[str], tag: Optional[str]) -> Dict[str, Dict[str, Any]]:
    merged: Dict[str, Dict[str, Any]] = {}
    for path in paths:
        for entry in _read(read_log, path):
            key = entry.tag or ""
            if tag is not None and key != tag:
                continue
            slot = merged.setdefault(key, {"intervals": 0, "histogram": None})
            slot["intervals"] += 1
            if slot["histogram"] is None:
                slot["histogram"] = entry.histogram.copy()
                continue
            try:
                slot["histogram"].add(entry.histogram)
            except ValueError as e:
                raise _UsageError(f"{path} line {entry.line_number}: {e}") from None
    return merged


def _summarize(h: Histogram, scale: float) -> Dict[str, float]:
    out: Dict[str, float] = {"count": h.total_count, "min": h.min / scale, "mean": h.mean / scale}
    for p, v in h.percentiles(DEFAULT_PERCENTILES).items():
        out[f"p{p:g}"] = v / scale
    out["max"] = h.max / scale
    return out


def _cmd_hlog(args: argparse.Namespace) -> int:
    merged = _merge_logs(args.paths, args.tag)
    if not merged:
        print("no intervals found" + (f" with tag {args.tag!r}" if args.tag is not None else ""),
              file=sys.stderr)
        return EXIT_INVALID
    scale = NS_PER[args.unit]
    rows = {tag or "(untagged)": {"intervals": slot["intervals"], **_summarize(slot["histogram"], scale)}
            for tag, slot in sorted(merged.items())}
    if args.json:
        print(json.dumps({"unit": args.unit, "tags": rows}, indent=2))
        return EXIT_OK
    columns = list(next(iter(rows.values())).keys())
    print(f"{'tag':<16}" + "".join(f"{c:>14}" for c in columns) + f"   ({args.unit})")
    for tag, row in rows.items():
        cells = [f"{row[c]:>14d}" if isinstance(row[c], int) else f"{row[c]:>14.3f}" for c in columns]
        print(f"{tag:<16}" + "".join(cells))
    return EXIT_OK


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the command line and returns the process exit code.

    Output to a closed pipe ends the command quietly with :data:`EXIT_BROKEN_PIPE`.
    ``--help`` and ``--version`` exit through argparse's SystemExit, as before.
    """
    try:
        try:
            status = _main(argv)
        except SystemExit:  # --help, --version: printed; their output is flushed here
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        _silence_closed_pipes()
        return EXIT_BROKEN_PIPE


def _silence_closed_pipes() -> None:
    """Points stdout, and stderr when it is a closed pipe too, at os.devnull, so that the
    interpreter's flush of what is still buffered at exit does not raise again."""
    streams: List[TextIO] = [sys.stdout]
    try:
        sys.stderr.flush()
    except BrokenPipeError:  # as in `loadgen ... 2>&1 | head -1`
        streams.append(sys.stderr)
    except (OSError, ValueError):
        pass
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in streams:
            try:
                os.dup2(devnull, stream.fileno())
            except (OSError, ValueError):  # no file descriptor (replaced stream): nothing to redirect
                pass
    finally:
        os.close(devnull)


def _main(argv: Optional[List[str]]) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    try:
        _check_unknown(parser, argv)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        handler = {"run": _cmd_run, "report": _cmd_report, "hlog": _cmd_hlog}[args.command]
        return handler(args)
    except _UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
