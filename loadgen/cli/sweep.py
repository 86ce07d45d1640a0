"""``loadgen sweep``: many runs over a grid or a list of points, one folder each, into
one table; resumable, with per-point hooks."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

from loadgen.cli.common import (
    EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK, Interrupts, ProgressPrinter, UsageError, add_run_options,
    check_applies, check_output, exit_code_for, linger_live, run_flags, save, save_html, serve_live, warn,
    write_stdout,
)
from loadgen.options import (
    OPTION_SPECS, SWEEP_TABLE, OptionError, RunOptions, read_config_table, resolve, unknown_environment,
)
from loadgen.results import ThresholdError
from loadgen.results.cost import PICK_BY, pick_cheapest, render_pick
from loadgen.units import ns_to_ms
from loadgen.sweep.files import SWEEP_CSV, SWEEP_JSONL, column_name, csv_table, is_sweep_folder, read_records
from loadgen.sweep.grid import Dimension, SweepError, combine, parse_vary, read_points_file
from loadgen.sweep.plan import PlannedRun, plan_runs
from loadgen.sweep.run import SweepContext, SweepOutcome, run_sweep
from loadgen.sweep.settings import HOOK_TIMEOUT_S, MAX_REPEAT, ORDERS, POINT_GAP_S, SweepSettings, split_table, sweep_settings
from loadgen.sweep.state import open_sweep

if TYPE_CHECKING:
    from loadgen.storage import RemoteOutput

__all__ = ["register"]

_SETTING_FLAGS = ("before_point", "after_point", "hook_timeout_s", "stop_on_error", "order", "order_seed", "repeat",
                  "restart", "force_mix", "point_gap_s")
_SWEEP_FLAGS = ["--vary", "--points", "--pick", "--pick-by", *("--" + n.replace("_", "-") for n in _SETTING_FLAGS)]
#: ``--pick``: no point meets the rules.
EXIT_NO_PICK = 3


def register(sub: Any) -> Dict[str, Any]:
    """Adds ``sweep`` to the subcommands; returns {name: (handler, known flags)}."""
    p = sub.add_parser(
        "sweep", help="run a grid or a list of points, resumably",
        description="Runs one benchmark per point of a grid (--vary, repeatable) or a list of points "
        "(--points FILE, or the [sweep] table of --config), each with every 'loadgen run' option, into "
        "--output DIR: a folder per point under DIR/points, DIR/sweep.jsonl and DIR/sweep.csv. Rerunning "
        "the same command resumes: finished points are skipped. Exit 0 when every point ran and is valid, "
        "1 when one is invalid or failed, 2 bad usage, 130 interrupted. --pick RULE names the cheapest point "
        "that meets RULE, at the end of the sweep or (without --vary/--points) among the points in --output "
        "DIR: then exit 0 when one does, 3 when none does.",
        argument_default=argparse.SUPPRESS,
    )
    add_run_options(p)
    g = p.add_argument_group("sweep")
    g.add_argument("--vary", action="append", metavar="NAME=VALUES",
                   help="sweep a run option over values: a comma list, A:B:STEP an inclusive range "
                   "(concurrency=1,2,4 or target-qps=100:1000:100); label.KEY=a,b sweeps a label; "
                   "repeatable: the points are the grid of all")
    g.add_argument("--points", metavar="FILE", help="a list of points: TOML (points = [{concurrency = 1}, ...]), "
                   "a JSON list of objects, or .jsonl; with --vary, each point is combined with the grid")
    g.add_argument("--repeat", metavar="N", help=f"run each point N times, in rounds, each repeat with its own "
                   f"seed derived from --seed (default 1, at most {MAX_REPEAT})")
    g.add_argument("--order", metavar="ORDER", help=f"the points' order: {' or '.join(ORDERS)} (default given)")
    g.add_argument("--order-seed", metavar="N", help="seed of the shuffled order (default: --seed)")
    g.add_argument("--before-point", metavar="CMD", help="shell command run before each point, with "
                   "LOADGEN_POINT_<NAME> for its values, LOADGEN_POINT_INDEX and LOADGEN_POINT_DIR set; "
                   "failing (non-zero, or too long) fails the point")
    g.add_argument("--after-point", metavar="CMD", help="shell command run after each point, like --before-point")
    g.add_argument("--hook-timeout-s", metavar="S", help=f"the longest a hook may run (default {HOOK_TIMEOUT_S:g})")
    g.add_argument("--stop-on-error", action="store_const", const=True,
                   help="stop at the first failed point (default: record it and go on)")
    g.add_argument("--restart", action="store_const", const=True, help="start over: move the earlier "
                   "sweep's files in --output aside (into restarted-<time>/)")
    g.add_argument("--point-gap-s", metavar="S", help="with --start-at: point k starts at --start-at plus the planned "
                   "lengths of the points before it and this gap after each (default "
                   f"{POINT_GAP_S:g}), so that the workers of a scaled-out sweep run each point together")
    g.add_argument("--force-mix", action="store_const", const=True, help="resume although the base options "
                   "changed, keeping the earlier points beside these")
    g.add_argument("--pick", action="append", metavar="RULE", help="name the cheapest point (by its cost, from "
                   "--price-per-hour) whose runs are valid and meet RULE, a --require expression like 'p99<50ms' "
                   "(repeatable, or comma separated: all must hold), and why each other point was not picked; "
                   "without --vary or --points, among the points of the sweep already in --output "
                   "(a --price-per-hour given then prices every point anew); exit 3 when no point meets it")
    g.add_argument("--pick-by", metavar="COST", choices=list(PICK_BY), help="--pick: the cost compared: "
                   "queries (per 1,000; default), output-tokens or tokens (input and output; per million)")
    return {"sweep": (cmd_sweep, [spec.flag for spec in OPTION_SPECS] + _SWEEP_FLAGS)}


def _merge(table_dims: List[Dimension], flag_dims: List[Dimension]) -> List[Dimension]:
    """The table's dimensions, each replaced by a --vary of the same name, then the other
    --vary dimensions."""
    by_name = {d.name: d for d in flag_dims}
    dims = [by_name.pop(d.name, d) for d in table_dims]
    return dims + [d for d in flag_dims if d.name in by_name]


def _definition(args: argparse.Namespace, flags: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], SweepSettings]:
    """The points and the settings, from the flags and the config file's [sweep] table."""
    config = flags.get("config") or os.environ.get("LOADGEN_CONFIG")
    table = read_config_table(str(config), SWEEP_TABLE) if config else None
    where = f"--config {config}: [{SWEEP_TABLE}]"
    table_dims, points, raw = split_table(table or {}, where)
    dims = _merge(table_dims, [parse_vary(v) for v in getattr(args, "vary", [])])
    if hasattr(args, "points"):
        points = read_points_file(args.points)
    if not dims and points is None:
        raise UsageError("nothing to sweep: give --vary NAME=VALUES (like --vary concurrency=1,2,4), --points FILE, "
                         f"or a [{SWEEP_TABLE}] table in the --config file")
    settings = sweep_settings({n: getattr(args, n) for n in _SETTING_FLAGS if hasattr(args, n)}, raw, where)
    if settings.restart and settings.force_mix:
        raise UsageError("--restart and --force-mix exclude each other: start over, or keep the earlier points")
    return combine(dims, points), settings


def _swept(points: Sequence[Dict[str, Any]]) -> List[str]:
    names: List[str] = []
    for p in points:
        names.extend(n for n in p if n not in names)
    return names


def _plan(args: argparse.Namespace, flags: Dict[str, Any]) -> Tuple[RunOptions, List[PlannedRun], SweepSettings,
                                                                    List[str]]:
    """Every point resolved and checked (exit 2 before anything runs when one is bad)."""
    try:
        points, settings = _definition(args, flags)
        base, runs, flag_sets = plan_runs(flags, points, settings)
    except (OptionError, SweepError, ThresholdError) as e:
        raise UsageError(str(e)) from None
    if not base.output:
        raise UsageError("loadgen sweep needs --output DIR (the folder for every point's files, sweep.jsonl "
                         "and sweep.csv)")
    warned: Set[str] = set()
    checked: Set[int] = set()
    for run, run_flags_ in zip(runs, flag_sets):
        if run.index not in checked:
            checked.add(run.index)
            check_applies(run.options, run_flags_, run.given, warned)
    check_output(base.output)
    return base, runs, settings, _swept(points)


def _duration(s: Optional[float]) -> str:
    if s is None:
        return "?"
    s = max(0, round(s))
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s" if s < 3600 else f"{s // 3600} h {s % 3600 // 60:02d} min"


class _Reporter:
    """Progress on stdout: a line as each point starts (k of n, its values, the ETA) and
    one as it ends (its verdict and headline figures); with --json, each point's record
    as a JSON line instead."""

    def __init__(self, as_json: bool, printer: Optional[ProgressPrinter]) -> None:
        self.as_json = as_json
        self.printer = printer
        self.broken: Optional[BrokenPipeError] = None  # stdout closed: the sweep goes on, unseen
        self.failed: Optional[str] = None  # why a --json line could not be written (stdout closed, full)

    def start(self, position: int, total: int, run: PlannedRun, eta_s: Optional[float]) -> None:
        if self.printer is not None:
            self.printer.write(f"[{position}/{total}] point {run.index}: {run.describe()}  (ETA {_duration(eta_s)})\n")

    def end(self, position: int, total: int, run: PlannedRun, record: Dict[str, Any]) -> None:
        if self.as_json and self.broken is None and self.failed is None:
            try:
                self.failed = write_stdout(json.dumps(record, separators=(",", ":")) + "\n")
            except BrokenPipeError as e:
                self.broken = e
        if self.printer is None:
            return
        self.printer.end()
        sweep = record["sweep"]
        if sweep["status"] == "done":
            p99 = ns_to_ms(record.get("latency_ns", {}).get("p99", 0))
            verdict = "VALID" if record["valid"] else "INVALID"
            text = f"{verdict}  {record['throughput']['completed_qps']:,.1f} q/s  p99 {p99:.3f} ms"
        else:
            text = f"{sweep['status'].upper()}  {sweep.get('error', '')}"
        self.printer.write(f"[{position}/{total}] {text}  ({sweep['wall_s']:.1f} s)\n")


def _table(records: List[Dict[str, Any]], swept: List[str]) -> str:
    """A short table of the points: their values, status and headline figures."""
    if not records:
        return ""
    columns, rows = csv_table(records)
    wanted = ["point", "repeat", *map(column_name, swept),
              "status", "valid", "completed_qps", "latency_p99_ms", "cost.per_1k_queries"]
    shown = [c for c in wanted if c in columns]
    cells = [list(shown)] + [[f"{row[c]:.4g}" if c.startswith("cost.") and isinstance(row[c], float) else _cell(row[c])
                              for c in shown] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(shown))]
    return "".join("  ".join(v.rjust(w) for v, w in zip(r, widths)) + "\n" for r in cells)


def _cell(v: Any) -> str:
    return f"{v:,.3f}" if isinstance(v, float) else str(v)


def _exit_code(outcome: SweepOutcome) -> int:
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    for record in outcome.records:
        if record is None or record["sweep"]["status"] != "done" or not record.get("valid"):
            return EXIT_INVALID
        if not all(t["passed"] for t in record.get("thresholds", [])):
            return EXIT_INVALID
    return EXIT_OK


def _end_lines(outcome: SweepOutcome, directory: str, swept: List[str]) -> str:
    done = [r for r in outcome.records if r is not None and r["sweep"]["status"] == "done"]
    valid = sum(1 for r in done if r.get("valid"))
    failed = sum(1 for r in outcome.records if r is not None and r["sweep"]["status"] == "failed")
    text = _table([r for r in outcome.records if r is not None], swept)
    text += (f"sweep: {len(done)} of {len(outcome.records)} runs done ({valid} valid, {len(done) - valid} invalid), "
             f"{failed} failed; {outcome.ran} ran now, {outcome.skipped} done earlier\n")
    text += f"wrote {os.path.join(directory, SWEEP_JSONL)}, {os.path.join(directory, SWEEP_CSV)}\n"
    return text


def _save_sweep_html(directory: str) -> None:
    """Writes the sweep's report.html over every point in its sweep.jsonl."""
    from loadgen.results.html import render_sweep_html

    save_html(lambda: render_sweep_html([(directory, read_records(directory))]), directory)


def cmd_sweep(args: argparse.Namespace) -> int:
    """Plans and checks every point, opens (or resumes) the sweep folder, runs the points
    not finished, and returns the exit code."""
    with contextlib.ExitStack() as stack:  # the live metrics server of the whole sweep
        return _cmd_sweep(args, stack)


def _check_live(base: RunOptions, runs: Sequence[PlannedRun]) -> None:
    """One live metrics server serves the whole sweep: its options cannot vary by point."""
    for run in runs:
        for name in ("metrics_port", "metrics_addr", "metrics_linger_s"):
            if getattr(run.options, name) != getattr(base, name):
                raise UsageError(f"--{name.replace('_', '-')} cannot vary by point: one live metrics server "
                                 "serves the whole sweep (each point's run labelled with its key as 'point')")


def _pick_rules(args: argparse.Namespace) -> List[str]:
    """The --pick rules, each checked (exit 2 when one cannot be read)."""
    rules = [part.strip() for expr in getattr(args, "pick", []) for part in expr.split(",") if part.strip()]
    try:
        pick_cheapest([], rules)
    except ThresholdError as e:
        raise UsageError(f"--pick: {e}") from None
    return rules


def _pick(args: argparse.Namespace, records: List[Dict[str, Any]], options: RunOptions, price: Optional[str]) -> int:
    """Names the cheapest point that meets the --pick rules; 0 when one does, 3 when none."""
    report = pick_cheapest(records, _pick_rules(args), getattr(args, "pick_by", "queries"), price)
    if price is None and records and not any(isinstance(r.get("cost"), dict) for r in records):
        raise UsageError("--pick: no point has a cost: the sweep ran without --price-per-hour (give one with "
                         "--pick to price every point)")
    if options.json:
        write_stdout(json.dumps(report, separators=(",", ":")) + "\n")
    elif not options.quiet:
        write_stdout(render_pick(report))
    return EXIT_OK if report["pick"] is not None else EXIT_NO_PICK


def _pick_only(args: argparse.Namespace, flags: Dict[str, Any]) -> Optional[int]:
    """``--pick`` without --vary, --points or a [sweep] table: the pick among the points
    of the sweep in --output (None: there is a sweep to run first)."""
    try:
        options, _ = resolve(flags, config_tables=(SWEEP_TABLE,))
        if options.config and read_config_table(options.config, SWEEP_TABLE) is not None:
            return None
    except OptionError as e:
        raise UsageError(str(e)) from None
    if not options.output:
        raise UsageError("--pick without --vary or --points picks among the points of a sweep: give its folder "
                         "as --output DIR")
    if not is_sweep_folder(options.output):
        raise UsageError(f"--output {options.output}: no sweep there (no sweep.json or sweep.jsonl)")
    try:
        records = read_records(options.output)
    except (OSError, ValueError) as e:
        raise UsageError(f"--output {options.output}: {e}") from None
    return _pick(args, records, options, options.price_per_hour if "price_per_hour" in flags else None)


def _cmd_sweep(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    flags = run_flags(args)
    for warning in unknown_environment():
        warn(warning)
    if hasattr(args, "pick"):
        _pick_rules(args)
        if not hasattr(args, "vary") and not hasattr(args, "points"):
            code = _pick_only(args, flags)
            if code is not None:
                return code
    with Interrupts() as interrupts:  # before the points run, a signal ends the command at once
        base, runs, settings, swept = _plan(args, flags)
        if hasattr(args, "pick"):
            if not any(run.options.price_per_hour for run in runs):
                raise UsageError("--pick needs a price: give --price-per-hour (or vary it by point)")
        remote = _stage(base, stack)
        directory = str(base.output)
        try:
            state = open_sweep(directory, base, swept, runs, settings)
        except SweepError as e:
            raise UsageError(str(e)) from None
        except OSError as e:
            raise UsageError(f"--output: cannot write to {directory}: {e.strerror or e}") from None
        _check_live(base, runs)
        live = serve_live(base, stack)
        quiet = base.quiet or base.json
        printer = None if quiet or sys.stdout is None else ProgressPrinter(sys.stdout)  # None: started with >&-
        todo = sum(1 for r in runs if not state.finished(r))
        if printer is not None:
            points = len({r.index for r in runs})
            printer.write(f"sweep: {points} points x {settings.repeat} repeat(s) = {len(runs)} runs; "
                          f"{len(runs) - todo} done earlier, {todo} to run; in {directory}\n")
        ctx = SweepContext(directory, settings, interrupts, functools.partial(save, html=not base.no_html),
                           on_progress=printer, progress_interval_s=0.5 if printer is not None and printer.tty else 5.0, live=live)
        interrupts.running = True
        reporter = _Reporter(base.json, printer)
        try:
            outcome = run_sweep(state, ctx, reporter)
        except OSError as e:  # the points finished before are in the folder's files
            raise UsageError(f"--output: cannot write to {directory}: {e.strerror or e}") from None
        finally:
            state.close()
        # Within the signal handling: a signal now is taken as during the sweep's last point.
        from loadgen.storage import publish

        code = publish(remote, lambda: _after_sweep(outcome, directory, base, swept, runs, printer, reporter, live,
                                                    interrupts), quiet, base.json)
        if hasattr(args, "pick") and code != EXIT_INTERRUPTED and interrupts.signal is None:
            return _pick(args, [r for r in outcome.records if r is not None], base, None)
        return code


def _stage(base: RunOptions, stack: contextlib.ExitStack) -> Optional[RemoteOutput]:
    """A --output URL staged in a local folder, with the earlier complete sweep there to resume."""
    from loadgen.storage import stage_output

    try:
        return stage_output(base, base.storage_option, stack, seed=None)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _after_sweep(outcome: SweepOutcome, directory: str, base: RunOptions, swept: List[str],
                 runs: Sequence[PlannedRun], printer: Optional[ProgressPrinter], reporter: _Reporter,
                 live: Any, interrupts: Interrupts) -> int:
    """The sweep's report.html, end lines and warnings; returns the exit code."""
    if not base.no_html:
        _save_sweep_html(directory)
    if printer is not None:
        printer.write(_end_lines(outcome, directory, swept))
    broken = reporter.broken or (printer.broken if printer is not None else None)
    if broken is not None:
        raise broken  # after every point ran and was saved: main ends quietly
    if reporter.failed is not None:
        print(f"error: --json: cannot write the points' records on stdout ({reporter.failed}); they are saved in "
              f"{os.path.join(directory, SWEEP_JSONL)}", file=sys.stderr)
        return EXIT_INVALID
    if not outcome.interrupted and interrupts.signal is None:
        linger_live(live, base)
    if outcome.interrupted:
        warn(f"interrupted: {sum(1 for r in outcome.records if r and r['sweep']['status'] == 'done')} of "
             f"{len(runs)} runs are done; run the same command again to run the rest")
    elif outcome.stopped:
        warn("stopped at a failed point (--stop-on-error); run the same command again to retry it and go on")
    code = _exit_code(outcome)
    return exit_code_for(interrupts.signal) if code == EXIT_INTERRUPTED or interrupts.signal is not None else code
