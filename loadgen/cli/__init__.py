"""The ``loadgen`` command line. Only :func:`main` turns errors into exit codes.

Exit codes: 0 the run was valid (or the command succeeded), 1 it ran but was invalid or a
--fail-if/--require threshold failed, 2 bad usage, options or input, 130 interrupted
(Ctrl-C, or SIGTERM as when a pod is stopped), 129 hung up (SIGHUP: the terminal or
session went away; a run in progress stops and writes its result as for SIGTERM), 141 stdout was a pipe that closed before
all the output was written (as in ``loadgen report R | head -1``; 128 + SIGPIPE, what a
shell reports for a process a broken pipe ended). A closed pipe ends the command quietly,
with no traceback; ``run`` still finishes the run and writes its ``--output`` files
first, so no measured result is lost.

Each command lives in a module of this package with a ``register(subparsers)`` that adds
its parser and returns ``{name: (handler, known flags)}``; known flags (None: argparse
judges) turn a misspelled flag into a "did you mean" error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from typing import Callable, Dict, List, Optional, Sequence, TextIO, Tuple

from loadgen._version import __version__
from loadgen.cli.common import (
    EXIT_BROKEN_PIPE, EXIT_USAGE, Interrupts, Parser, UsageError, add_common_flags, check_unknown, exit_code_for,
    quiet_stdout,
)

__all__ = ["main"]

Handler = Callable[[argparse.Namespace], int]
Commands = Dict[str, Tuple[Handler, Optional[Sequence[str]]]]

#: command -> (the module of this package that registers it, its line in ``loadgen --help``).
#: Only the module of the command given is imported: ``--version``, ``--help`` and a
#: mistyped command import none (a test checks these lines against the modules' own).
COMMANDS: Dict[str, Tuple[str, str]] = {
    "run": ("run", "run one benchmark"),
    "sweep": ("sweep", "run a grid or a list of points, resumably"),
    "find-peak": ("find_peak", "find the highest rate (or the concurrency) a SUT sustains within a bound"),
    "report": ("report", "re-render the summary of a saved result.json, or an HTML report"),
    "hlog": ("report", "summarize HdrHistogram interval logs (.hlog)"),
    "merge": ("merge", "merge the results of a scaled-out run's workers into one"),
    "compare": ("compare", "compare two results (or sweeps) and call regressions beyond the noise"),
    "env": ("env", "show the CPUs, NUMA nodes, GPUs and the --pin auto plan"),
}


def _build_parser(command: Optional[str] = None) -> Tuple[argparse.ArgumentParser, Commands]:
    """The parser, with the full parser of ``command`` (its module imported) and, for
    ``None``, every command as a name and a help line only (nothing imported)."""
    parser = Parser(
        prog="loadgen",
        description="A load generator for machine-learning inference.",
        epilog="Run 'loadgen run --help' for the benchmark options.",
    )
    parser.add_argument("--version", action="version", version=f"loadgen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands: Commands = {}
    if command is not None:
        module = importlib.import_module(f"loadgen.cli.{COMMANDS[command][0]}")
        commands.update(module.register(sub))
        for name in commands:  # --json and --quiet on every command
            add_common_flags(sub.choices[name])
    else:
        for name, (_, help_line) in COMMANDS.items():
            sub.add_parser(name, help=help_line, add_help=False)
    return parser, commands


#: The variables that set the threads of numpy's BLAS (OpenBLAS), in its order.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def _one_blas_thread() -> None:
    """OpenBLAS starts a thread per core when numpy is imported, and each spins for a
    while before it sleeps: about 100 ms of CPU per process on 2 cores, more on larger
    machines, for linear algebra that the command line does not do. One thread, unless
    the user chose (one of :data:`BLAS_THREAD_VARIABLES` is set) or numpy is loaded."""
    if "numpy" not in sys.modules and not any(name in os.environ for name in BLAS_THREAD_VARIABLES):
        os.environ["OPENBLAS_NUM_THREADS"] = "1"


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the command line and returns the process exit code.

    Output to a closed pipe ends the command quietly with :data:`EXIT_BROKEN_PIPE`.
    ``--help`` and ``--version`` exit through argparse's SystemExit, as before.
    """
    _one_blas_thread()
    try:
        try:
            with Interrupts():  # a signal before (or after) a command's own handling: interrupted
                status = _main(argv)
        except SystemExit:  # --help, --version: printed; their output is flushed here
            _flush_stdout()
            raise
        _flush_stdout()  # a closed pipe shows here, not in the interpreter's exit
        return status
    except KeyboardInterrupt as e:  # outside the command's own handling (building the parser)
        return _interrupted(e)
    except BrokenPipeError:
        _silence_closed_pipes()
        return EXIT_BROKEN_PIPE


def _flush_stdout() -> None:
    if sys.stdout is not None:  # None: started with stdout closed (>&-)
        sys.stdout.flush()


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
    parser, commands = _build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    try:
        if argv and argv[0] in commands:
            known = commands[argv[0]][1]
            if known is not None:
                check_unknown(argv[1:], known, argv[0])
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        if args.command not in commands:  # named after `--`: parse again with its module
            return _main(argv[argv.index(args.command):])
        with quiet_stdout(args):
            if args.command in ("report", "hlog", "merge", "compare"):  # their URL arguments
                from loadgen.storage import with_remote_io

                return with_remote_io(args, commands[args.command][0])
            return commands[args.command][0](args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:
        return _interrupted(e)


def _interrupted(e: KeyboardInterrupt) -> int:
    """Says that a signal (or Ctrl-C) ended the command; returns its exit code."""
    signum = getattr(e, "signum", None)
    by = "" if signum in (None, signal.SIGINT) else f" by {signal.Signals(signum).name}"
    print(f"interrupted{by}", file=sys.stderr)
    return exit_code_for(signum)
