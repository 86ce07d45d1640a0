"""What the commands of the command line share: exit codes, usage errors, the run
options as flags, signal handling around a run, progress lines, and saving results."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import signal
import sys
import tempfile
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, NoReturn, Optional, Sequence, Set, TextIO, Tuple

from loadgen.units import NS_PER

# What the commands need is imported where it is used, so that the command line's
# --version and --help import none of it (tests/integration/test_startup.py).
if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from loadgen.options import RunOptions

    from loadgen.runner import Progress
    from loadgen.telemetry.live import LiveMetrics

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_HANGUP = 128 + 1  # 128 + SIGHUP: the terminal or session went away
EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE (a constant: Windows has no signal.SIGPIPE)


class UsageError(Exception):
    """Bad input from the user: exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would exit; main decides
        raise UsageError(f"{self.prog}: {message}")

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



def add_run_options(parser: argparse.ArgumentParser, exclude: Iterable[str] = ()) -> None:
    """Adds every ``loadgen run`` option (but ``exclude``) to ``parser`` as a flag; a
    parser made with ``argument_default=argparse.SUPPRESS`` then holds only those given."""
    from loadgen.option_values import bool_value
    from loadgen.options import OPTION_SPECS

    skip = set(exclude)
    for spec in OPTION_SPECS:
        if spec.name in skip:
            continue
        # argparse formats help with %: a literal one in an option's text is doubled
        kwargs: Dict[str, Any] = {"dest": spec.name, "help": spec.help.replace("%", "%%") + f" [env {spec.env}]"}
        if spec.convert is bool_value:  # a flag: present means true
            kwargs["action"] = "store_const"
            kwargs["const"] = True
        else:
            kwargs["metavar"] = spec.metavar or spec.name.upper()
            if spec.repeatable:
                kwargs["action"] = "append"
        parser.add_argument(spec.flag, **kwargs)


def run_flags(args: argparse.Namespace) -> Dict[str, Any]:
    """The run options given as flags: name -> raw value."""
    from loadgen.options import OPTION_SPECS

    return {spec.name: getattr(args, spec.name) for spec in OPTION_SPECS if hasattr(args, spec.name)}


def check_unknown(argv: Sequence[str], known: Iterable[str], command: str) -> None:
    """Turns an unknown --flag of ``command`` into an error with a 'did you mean'."""
    known_set = set(known) | {"--help", "-h"} | set(COMMON_FLAGS)
    for arg in argv:
        if arg == "--":
            break
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            if flag not in known_set:
                close = difflib.get_close_matches(flag, sorted(known_set), n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]}?" if close else f"; see 'loadgen {command} --help'"
                raise UsageError(f"unknown option {flag}{hint}")


#: The flags every command has (run, sweep and find-peak as run options; the others by
#: :func:`add_common_flags`): --json, the command's output as JSON on stdout and nothing
#: else there; --quiet, nothing printed but errors (the exit code says how it went).
COMMON_FLAGS = ("--json", "--quiet")
_COMMON_HELP = {"--json": "print the output as JSON on stdout, and nothing else there",
                "--quiet": "print nothing but errors: the exit code says how it went (with --json, the JSON "
                           "is still printed)"}


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """Adds each of :data:`COMMON_FLAGS` that ``parser`` lacks. A --quiet added here is
    carried out by :func:`quiet_stdout` (the command's stdout goes nowhere); a command
    with its own --quiet does what it says itself."""
    have = set(parser._option_string_actions)  # argparse's own index of the flags
    for flag in COMMON_FLAGS:
        if flag not in have:
            parser.add_argument(flag, action="store_true", help=_COMMON_HELP[flag])
            if flag == "--quiet":
                parser.set_defaults(quiet_stdout=True)


@contextlib.contextmanager
def quiet_stdout(args: argparse.Namespace) -> Iterator[None]:
    """Around a command: with a --quiet of :func:`add_common_flags` given (and no
    --json), what the command prints on stdout goes nowhere; errors, on stderr, still show."""
    if not (getattr(args, "quiet_stdout", False) and getattr(args, "quiet", False)
            and not getattr(args, "json", False)):
        yield
        return
    with open(os.devnull, "w", encoding="utf-8") as devnull, contextlib.redirect_stdout(devnull):
        yield


#: The signals that interrupt a command: Ctrl-C, a stop (as when a pod is stopped), and
#: the terminal or session going away (SIGHUP, where the platform has it).
STOP_SIGNALS: Tuple[int, ...] = tuple(
    sig for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if sig is not None)


def exit_code_for(signum: Optional[int]) -> int:
    """The exit code of a command that ``signum`` interrupted: 129 for SIGHUP, else 130
    (SIGINT, and SIGTERM alike, as a stopped pod's run is an interrupted run)."""
    return EXIT_HANGUP if signum is not None and signum == getattr(signal, "SIGHUP", None) else EXIT_INTERRUPTED


class Interrupted(KeyboardInterrupt):
    """A stop signal that ends the command at once; :attr:`signum` is the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupts:
    """SIGINT/SIGTERM/SIGHUP handling from the options to the end of a run. Before the
    run (while the SUT is loaded or a server's readiness awaited) a signal ends the
    command as interrupted (:class:`Interrupted`: exit 130, 129 for SIGHUP); during it,
    the first asks the run to stop (the result is still written, and the command's exit
    code is :attr:`exit_code`). Handlers are restored afterwards. :func:`main` holds one
    around the whole command, so that no signal ends it by the default action."""

    def __init__(self) -> None:
        self.signal: Optional[int] = None
        self.running = False  # before the run (options, the server's readiness): stop at once
        self._old: Dict[int, Any] = {}

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code a signal received calls for (None when none came)."""
        return None if self.signal is None else exit_code_for(self.signal)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        first = self.signal is None
        if first:
            self.signal = signum  # also before the run: whoever catches Interrupted sees it
        if not self.running:
            raise Interrupted(signum)  # nothing measured yet: main says "interrupted"
        if not first and signum == signal.SIGINT:
            raise Interrupted(signum)  # a second Ctrl-C: give up at once

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def loading_sut(interrupts: Interrupts, sut: str) -> Iterator[None]:
    """Around the SUT's loading: a KeyboardInterrupt that no signal caused (``interrupts``
    saw none) is the SUT's own code raising it, bad input (exit 2), not an interruption."""
    try:
        yield
    except KeyboardInterrupt:
        if interrupts.signal is None:
            raise UsageError(f"SUT {sut!r} raised KeyboardInterrupt while loading") from None
        raise


class ProgressPrinter:
    """Prints progress lines on ``out``: one line rewritten in place on a terminal, a
    line each time otherwise. A closed pipe stops the printing, not the run: the error
    is kept in :attr:`broken` for after the results are saved."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.broken: Optional[BrokenPipeError] = None
        self._in_place = False  # a line rewritten in place is open on the terminal

    def __call__(self, p: Progress) -> None:
        line = (f"{p.elapsed_s:7.1f} s  issued {p.issued:>10,}  completed {p.completed:>10,}  "
                f"{p.qps:>10,.0f} q/s  p99 {p.p99_ns / NS_PER['ms']:8.3f} ms")
        self._write("\r" + line if self.tty else line + "\n")
        self._in_place = self.tty

    def end(self) -> None:
        """Ends the line rewritten in place on a terminal."""
        if self._in_place:
            self._write("\n")
            self._in_place = False

    def write(self, text: str) -> None:
        """Writes other text (whole lines) among the progress lines, ending an open
        in-place line first."""
        self.end()
        self._write(text)

    def _write(self, text: str) -> None:
        if self.broken is not None:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError as e:
            self.broken = e


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def check_thresholds(options: RunOptions) -> None:
    """Every --fail-if/--require expression reads; the error names the option."""
    from loadgen.results import ThresholdError, parse_threshold

    for flag, exprs in (("--fail-if", options.fail_if), ("--require", options.require)):
        for expr in exprs:
            try:
                metric = parse_threshold(expr)[0]
            except ThresholdError as e:
                raise UsageError(f"{flag}: {e}") from None
            if metric.startswith("goodput") and not options.slo:
                raise UsageError(f"{flag}: {expr!r}: {metric} needs at least one --slo (like --slo ttft<=200ms)")


def check_applies(options: RunOptions, flags: Dict[str, Any], given: Dict[str, Any],
                  warned: Optional[Set[str]] = None) -> None:
    """An option that the scenario does not read is an error when given as a flag, and a
    warning when it comes from the config file or the environment (which may set options
    for several scenarios). With ``warned``, a warning already in it is not repeated."""
    from loadgen.scenarios import options_not_applying

    problems = options_not_applying(options.scenario, [name for name in given if name in flags])
    if problems:
        raise UsageError(problems[0] + "; drop it, or choose the scenario it is for with --scenario")
    for message in options_not_applying(options.scenario, [name for name in given if name not in flags]):
        if warned is None or message not in warned:
            warn(message + " (set in the config file or the environment: ignored)")
        if warned is not None:
            warned.add(message)


def check_output(directory: Optional[str]) -> None:
    """Fails before the run when ``--output`` cannot be written: a file in the way, a
    folder that cannot be created or written. Warns when it holds an earlier run's
    result (replaced; results.csv gets a row per run). A URL is checked where it is
    staged (:func:`loadgen.storage.stage_output`)."""
    from loadgen.storage import is_remote

    if not directory or is_remote(directory):
        return
    path = os.path.abspath(directory)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"--output: cannot write to {directory}: it exists and is not a folder")
    probe = path
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UsageError(f"--output: cannot write to {directory}: {probe} is a file, not a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".loadgen-probe-", dir=probe)
    except OSError as e:
        where = "" if probe == path else f" (nor create it in {probe})"
        raise UsageError(f"--output: cannot write to {directory}{where}: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(tmp)
    from loadgen.results.files import CSV_FILE, HLOG_FILE, RESULT_FILE, SUMMARY_FILE
    from loadgen.results.html import HTML_FILE

    for name in (RESULT_FILE, SUMMARY_FILE, HLOG_FILE, CSV_FILE, HTML_FILE):
        if os.path.isdir(os.path.join(path, name)):
            raise UsageError(f"--output: {os.path.join(directory, name)} is a folder; the run writes a file there")
    if os.path.isfile(os.path.join(path, RESULT_FILE)):
        warn(f"--output {directory} holds an earlier run's {RESULT_FILE}: this run replaces it, "
              f"{SUMMARY_FILE} and {HLOG_FILE}, and adds a row to {CSV_FILE}")


def save_html(render: Callable[[], str], directory: str) -> List[str]:
    """Writes ``render()`` as ``directory``/report.html; returns [its path], or [] with a
    warning when it cannot be made or written (the results themselves are saved)."""
    from loadgen.results.html import HTML_FILE, write_html

    try:
        return [write_html(os.path.join(directory, HTML_FILE), render())]
    except Exception as e:  # the report is a view of saved results: never fatal
        warn(f"{os.path.join(directory, HTML_FILE)} not written: {type(e).__name__}: {e}")
        return []


def save(doc: Dict[str, Any], directory: str, partial: bool, html: bool = True) -> Tuple[List[str], Optional[str]]:
    """Writes the run's files to ``directory`` (with report.html unless ``html`` is
    false); returns their paths and, when rendering them failed, what failed. result.json
    is written whatever fails after it; a partial document (see
    :class:`loadgen.runner.ResultError`) is written as result.json alone."""
    failure: Optional[str] = None
    if not partial:
        from loadgen.results import write_outputs

        try:
            paths = write_outputs(doc, directory)
        except OSError:
            raise
        except Exception as e:  # a renderer failed: the result itself is kept
            failure = f"writing the result files failed: {type(e).__name__}: {e}"
        else:
            if html:
                from loadgen.results.html import render_html

                paths += save_html(lambda: render_html([(directory, doc)]), directory)
            return paths, None
    from loadgen.results.files import RESULT_FILE

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, RESULT_FILE)
    text = json.dumps(doc, indent=2, default=str) + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return [path], failure

def note(text: str, options: RunOptions) -> None:
    """A line about the command's own doings (not a result): on stdout, on stderr with
    --json (stdout holds the JSON alone), nowhere with --quiet."""
    if not options.quiet:
        print(text, file=sys.stderr if options.json else sys.stdout, flush=True)


def serve_live(options: RunOptions, stack: contextlib.ExitStack) -> Optional[LiveMetrics]:
    """The live metrics server of ``--metrics-port`` (None without it), closed with
    ``stack``; says where it serves. A port in use or a bad address is a usage error that
    names it, before anything runs."""
    if options.metrics_port is None:
        return None
    from loadgen.telemetry.live import LiveMetrics

    try:
        live = stack.enter_context(LiveMetrics.serve(options))
    except ValueError as e:
        raise UsageError(str(e)) from None
    note(f"live metrics on {live.url} (run {live.run_id})", options)
    return live


def linger_live(live: Optional[LiveMetrics], options: RunOptions) -> None:
    """Serves the final metrics ``--metrics-linger-s`` longer, saying so; Ctrl-C (or
    SIGTERM) ends it at once."""
    if live is None or options.metrics_linger_s <= 0:
        return
    with Interrupts() as interrupts:
        interrupts.running = True
        # Said once the linger's own handler is in place: a Ctrl-C after this line ends
        # the linger, not the run (whose result is already written).
        note(f"serving the final metrics on {live.url} for {options.metrics_linger_s:g} s more "
             "(--metrics-linger-s; Ctrl-C ends it)", options)
        live.linger(options.metrics_linger_s, lambda: interrupts.signal is not None)


def after_run_failure(doc: Dict[str, Any], failure: str, paths: List[str], as_json: bool) -> int:
    """An error after the run: the measured result is saved (``paths``), or printed as
    JSON (on stdout with --json, else on stderr), then the error; exit 1."""
    where = f"saved in {paths[0]}" if paths else ("printed on stdout" if as_json else "printed above")
    if not paths:
        text = json.dumps(doc, indent=2, default=str) + "\n"
        if as_json:
            problem = write_stdout(text)
            if problem is not None:
                where = f"saved in {save_fallback(doc)} ({problem})"
        else:
            sys.stderr.write(text)
    print(f"error: {failure} (the measured result is {where})", file=sys.stderr)
    return EXIT_INVALID


def write_stdout(text: str) -> Optional[str]:
    """Writes ``text`` on stdout, flushed; None when it got there, else why not (stdout
    closed, a full device, an I/O error). After a failure what is still buffered is sent
    to os.devnull, so that no later flush fails again. A closed pipe is raised
    (BrokenPipeError), for main to end the command quietly."""
    stream = sys.stdout
    try:
        if stream is None:  # started with stdout closed (>&-)
            return "stdout is closed"
        stream.write(text)
        stream.flush()
        return None
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        _discard_stdout()
        return f"stdout: {reason}"


def _discard_stdout() -> None:
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def save_fallback(doc: Any) -> str:
    """Saves ``doc`` as a new ``loadgen-result-*.json`` in the current folder (in the
    temporary folder when that cannot be written), for a result that could not be
    printed and has no --output; returns its path."""
    text = json.dumps(doc, indent=2, default=str) + "\n"
    last: Optional[OSError] = None
    for folder in (os.getcwd(), tempfile.gettempdir()):
        try:
            fd, path = tempfile.mkstemp(prefix="loadgen-result-", suffix=".json", dir=folder)
        except OSError as e:
            last = e
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return path
    raise last if last is not None else OSError("no folder to save the result in")


def show_json(doc: Any, paths: List[str], what: str = "result") -> Optional[int]:
    """Prints ``doc`` as the --json output; None when it got there. Else the error is said
    in one line naming where the result is (``paths[0]``, or a file saved for it, see
    :func:`save_fallback`), and the exit code (1) returned. A closed pipe still ends the
    command quietly (exit 141), the result saved first when it has no file."""
    try:
        problem = write_stdout(json.dumps(doc, indent=2) + "\n")
    except BrokenPipeError:
        if not paths:
            path = save_fallback(doc)
            with contextlib.suppress(OSError, ValueError):
                print(f"error: --json: stdout closed before the {what} was written; it is saved in {path}",
                      file=sys.stderr)
        raise
    if problem is None:
        return None
    where = paths[0] if paths else save_fallback(doc)
    print(f"error: --json: cannot write the {what} on stdout ({problem}); it is saved in {where}", file=sys.stderr)
    return EXIT_INVALID


def read(read: Any, path: str) -> Any:
    """``read(path)``; a file that cannot be read, or is not what it should be, is bad input."""
    from loadgen.stats.hdrlog import HistogramLogError

    try:
        return read(path)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except HistogramLogError as e:
        raise UsageError(f"{path}: {e}") from None
    except ValueError as e:  # load_result's message names the file
        raise UsageError(str(e)) from None

