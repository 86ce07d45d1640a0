"""``loadgen find-peak`` as a library: the search of :mod:`loadgen.peak.search` over real
runs (:func:`loadgen.runner.run_benchmark`), each probe kept.

Over a rate (open loop: poisson, constant or server) the answer is the highest rate whose
run holds: valid (the latency at ``--latency-percentile`` within ``--latency-bound-ms``,
the error rate within ``--max-error-rate``, ...), every ``--require``/``--fail-if``
threshold met, and with ``--slo`` the goodput target (:mod:`loadgen.peak.criteria`). A
run that failed only for the generator or the client is tried again and never taken for
the SUT's limit. Over a concurrency (closed loop) it is the concurrency where throughput
stops growing, or the last before the bound breaks; each of those probes runs in windows
until the last three agree (perf_analyzer's stability rule). Either answer is confirmed by
full-length runs; a failed confirmation makes it the upper end of the bracket, which is
bisected below it with full-length runs (:meth:`loadgen.peak.search.Search.settle`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from loadgen import defaults as D
from loadgen.options import RunOptions
from loadgen.peak.criteria import goodput_target
from loadgen.peak.report import UNITS, run_summary
from loadgen.peak.search import (
    Bracket, BudgetSpent, Confirmation, Knee, ProbeRecord, Search, Undecided, Verdict, integer_midpoint, midpoint,
    relative_finish, stable,
)
from loadgen.results.files import RESULT_FILE, write_outputs
from loadgen.units import ns_to_ms
from loadgen.results.render import format_setting

if TYPE_CHECKING:
    from loadgen.telemetry.live import LiveMetrics

__all__ = ["PROBES_DIR", "PROBES_FILE", "PeakSearch", "PeakSettings", "default_start", "find_peak", "full_windows",
           "search_options", "windows_done"]

#: Under ``--output DIR``: a folder per run, and one JSON line per run.
PROBES_DIR = "probes"
PROBES_FILE = "probes.jsonl"

RATE_SCENARIOS = ("poisson", "constant", "server")
#: Windows whose throughput and latency must agree for a concurrency probe to be stable.
STABLE_WINDOWS = 3
#: Below this rate the search does not step down (queries/s).
MIN_RATE = 1e-3
#: With --slo and no other goodput criterion: the fraction of requests that must meet every SLO.
DEFAULT_MIN_GOODPUT = 0.95


@dataclasses.dataclass
class PeakSettings:
    """How ``find-peak`` searches (the run options say what each run is).

    Attributes:
        over: ``rate`` (open loop) or ``concurrency`` (closed loop).
        precision: the search stops when its bracket is this close (relative).
        probe_s: each search probe runs at least this long.
        start: the first setting probed (None: see :func:`default_start`).
        growth: widening multiplies the setting by this until a probe fails.
        confirm_runs: runs at the answer, each ``--duration-s`` long, that must all hold.
        max_probes: at most this many search probes (confirmation runs, retries and
            rechecks apart).
        max_step_downs: at most this many failed confirmations, each followed by a
            bisection below the setting that failed; then the search ends unconfirmed.
        retries: a run that failed only for the generator or the client is tried this many
            more times; then the search ends (the generator could not offer the load).
        max_search_s: no run starts this long after the search began.
        min_goodput: with ``--slo``: the fraction of requests that must meet every SLO
            (None: :data:`DEFAULT_MIN_GOODPUT` unless a --require/--fail-if names goodput).
        min_gain: concurrency: throughput must grow by this much (relative) per widening
            step; the answer is the lowest concurrency within it of the best throughput.
        window_s: concurrency: the measurement window (None: ``probe_s`` / 3).
        stability: concurrency: the last 3 windows' throughput and p99 must each lie
            within this (relative) of their mean.
        max_windows: concurrency: an unstable probe is extended up to this many windows.
    """

    over: str = "rate"
    precision: float = 0.05
    probe_s: float = 5.0
    start: Optional[float] = None
    growth: float = 2.0
    confirm_runs: int = 2
    max_probes: int = 30
    max_step_downs: int = 5
    retries: int = 2
    max_search_s: float = 3600.0
    min_goodput: Optional[float] = None
    min_gain: float = 0.05
    window_s: Optional[float] = None
    stability: float = 0.10
    max_windows: int = 10

    def check(self) -> None:
        """Raises ValueError naming the flag of the first setting out of its range."""
        _check("--over", self.over in ("rate", "concurrency"), self.over, "rate or concurrency")
        _check("--precision", 0 < self.precision < 1, self.precision, "> 0 and < 1")
        _check("--probe-s", D.MIN_DURATION_S <= self.probe_s <= D.MAX_TIME_S, self.probe_s,
               f"{D.MIN_DURATION_S:g}..{D.MAX_TIME_S:g} s")
        _check("--growth", 1 < self.growth <= 1000, self.growth, "> 1 and <= 1000")
        _check("--confirm-runs", 1 <= self.confirm_runs <= 1000, self.confirm_runs, "1..1000")
        _check("--max-probes", 1 <= self.max_probes <= 10_000, self.max_probes, "1..10000")
        _check("--max-step-downs", 0 <= self.max_step_downs <= 1000, self.max_step_downs, "0..1000")
        _check("--retries", 0 <= self.retries <= 100, self.retries, "0..100")
        _check("--max-search-s", D.MIN_DURATION_S <= self.max_search_s <= D.MAX_TIME_S, self.max_search_s,
               f"{D.MIN_DURATION_S:g}..{D.MAX_TIME_S:g} s")
        if self.min_goodput is not None:
            _check("--min-goodput", 0 < self.min_goodput <= 1, self.min_goodput, "> 0 and <= 1")
        _check("--min-gain", 0 <= self.min_gain <= 100, self.min_gain, "0..100")
        _check("--stability", 0 < self.stability <= 10, self.stability, "> 0 and <= 10")
        _check("--max-windows", STABLE_WINDOWS <= self.max_windows <= 10_000, self.max_windows,
               f"{STABLE_WINDOWS}..10000")
        if self.window_s is not None:
            _check("--window-s", D.MIN_INTERVAL_S <= self.window_s <= D.MAX_TIME_S, self.window_s,
                   f"{D.MIN_INTERVAL_S:g}..{D.MAX_TIME_S:g} s")
        if self.start is not None:
            if self.over == "rate":
                _check("--start", 0 < self.start <= D.MAX_TARGET_QPS, self.start,
                       f"> 0 and <= {D.MAX_TARGET_QPS:g} queries/s")
            else:
                _check("--start", float(self.start).is_integer() and 1 <= self.start <= D.MAX_CONCURRENCY,
                       self.start, f"an integer concurrency, 1..{D.MAX_CONCURRENCY}")

    @property
    def window(self) -> float:
        """The concurrency probes' window, in seconds."""
        return self.window_s if self.window_s is not None else self.probe_s / STABLE_WINDOWS


def _check(flag: str, ok: bool, value: Any, allowed: str) -> None:
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"{flag} must be {allowed}, got {value!r}")


def default_start(settings: PeakSettings, latency_bound_ms: Optional[float]) -> float:
    """The first setting when ``--start`` is not given. Concurrency: 1. Rate: half of one
    query per bound (a server that meets a bound of B at all serves a query in less than
    B, so 1 / (2 B) loads even a one-at-a-time server to half its capacity), and at least
    100 queries per probe (20 queries/s for 5 s probes)."""
    if settings.over == "concurrency":
        return 1.0
    per_bound = 500.0 / latency_bound_ms if latency_bound_ms else 0.0
    return min(max(per_bound, 100.0 / settings.probe_s), D.MAX_TARGET_QPS)


class _Stopped(Exception):
    """The search was interrupted (Ctrl-C, SIGTERM): the run under way was stopped."""


class PeakSearch:
    """One search: checked and prepared when made, run by :meth:`run`.

    Args:
        options: the run options every probe starts from (``resolve``'s); ``output``,
            when set, is where the probes and the result go.
        settings: how to search.
        given: the options as the user gave them (recorded in each run's document).

    Raises:
        ValueError: a setting, an option or the SUT is unusable; the message names it.
    """

    def __init__(self, options: RunOptions, settings: PeakSettings, given: Optional[Dict[str, Any]] = None) -> None:
        from loadgen.runner import prepare

        settings.check()
        self.settings, self.given = settings, dict(given or {})
        self.options = search_options(options, settings, self.given)
        self.start = float(settings.start) if settings.start is not None else default_start(
            settings, self.options.latency_bound_ms)
        self.output = options.output
        if options.record_requests and not self.output:
            raise ValueError("--record-requests with find-peak needs --output DIR: each run writes its records "
                             f"in its own folder (DIR/{PROBES_DIR}/NNN-<setting>/"
                             f"{os.path.basename(options.record_requests)})")
        self.confirm_s = options.duration_s if options.duration_s is not None else max(settings.probe_s, 10.0)
        if settings.min_goodput is not None and not options.slo:
            raise ValueError("--min-goodput needs at least one --slo (like --slo ttft<=200ms): goodput is the share "
                             "of requests meeting every SLO")
        #: The goodput fraction a run must reach (None: none beyond the thresholds).
        self.min_goodput = goodput_target(options.slo, options.require, options.fail_if, settings.min_goodput,
                                          DEFAULT_MIN_GOODPUT)
        self.runs: List[Dict[str, Any]] = []
        self.write_error = ""
        self.last_doc: Optional[Dict[str, Any]] = None
        self.knee = Knee(self._run, settings.min_gain)
        self._pending: Optional[Tuple[Dict[str, Any], Dict[str, Any], str]] = None  # a run awaiting its verdict
        self._phase = "start"
        self._full = False  # the run under way is full length (a confirmation, or a bisection below one)
        self.started = 0.0
        self.say: Callable[[str], None] = lambda line: None
        self._search: Optional[Search] = None
        self.stop_requested: Callable[[], bool] = lambda: False
        #: The live metrics server of the whole search (``--metrics-port``), set by the
        #: command: each probe is served in turn, labelled ``point`` with its folder's name.
        self.live: Optional[LiveMetrics] = None
        # Everything, the SUT included, is checked before the first run.
        self._prepared: Optional[Tuple[float, Any]] = (self.start, prepare(self._probe_options(self.start)[0]))

    # ------------------------------------------------------------------- the search

    def run(self, say: Optional[Callable[[str], None]] = None,
            stop_requested: Optional[Callable[[], bool]] = None) -> Dict[str, Any]:
        """Searches, confirms, and returns the final document: the last confirmation run's
        (or, without one, the last run's) with a ``peak`` section; ``valid`` is False
        unless the answer was confirmed. With ``output`` set, each run is written as it
        ends and the final document last. Raises KeyboardInterrupt when interrupted
        before the first run ended."""
        if say is not None:
            self.say = say
        if stop_requested is not None:
            self.stop_requested = stop_requested
        self.started = time.monotonic()
        self._open_output()
        s = self.settings
        search = Search(self._probe, max_probes=s.max_probes, before=self._before, after=self._after,
                        retries=s.retries, recheck_within=s.growth - 1 if s.over == "rate" else 0.0,
                        max_time_s=s.max_search_s)
        self._search = search
        outcome: Dict[str, Any] = {"bracket": None, "confirmation": None, "reason": "", "interrupted": False,
                                   "limited_by": None, "lower_bound": None}
        try:
            if s.over == "rate":
                self._search_rate(search, outcome)
            else:
                self._search_concurrency(search, outcome)
        except _Stopped:
            outcome["interrupted"] = True
            held = [r["x"] for r in self.runs if r["holds"] and r["phase"] != "confirm"]
            so_far = f" (the highest setting that held so far: {format_setting(max(held))})" if held else ""
            outcome["reason"] = "interrupted: the search did not finish" + so_far
        except Undecided as e:
            self._undecided(search, e, outcome)
        except BudgetSpent as e:
            lower = search.held_below(math.inf)
            outcome["limited_by"], outcome["lower_bound"] = "time", lower
            so_far = (f"; the highest setting that held: {format_setting(lower)} {self._unit} (not confirmed)"
                    if lower is not None else "")
            outcome["reason"] = f"{e} (--max-search-s){so_far}"
        if self.last_doc is None:
            raise KeyboardInterrupt
        return self._finish(search, outcome)

    @property
    def _unit(self) -> str:
        return UNITS[self.settings.over]

    def _undecided(self, search: Search, e: Undecided, outcome: Dict[str, Any]) -> None:
        """Every try at a setting failed for the generator or the client: the search ends,
        and names the highest setting the SUT held as a lower bound of its peak."""
        x, data = e.record.x, e.record.verdict.data
        cause = data.get("cause", "generator") if isinstance(data, dict) else "generator"
        lower = search.held_below(x)
        outcome["limited_by"], outcome["lower_bound"] = cause, lower
        who = "the generator" if cause == "generator" else "the client"
        bound = (f"the SUT held {format_setting(lower)} {self._unit}, a lower bound of its peak (not confirmed)"
                 if lower is not None else "nothing lower was measured")
        outcome["reason"] = (f"{who} could not offer {format_setting(x)} {self._unit} on this machine "
                             f"({e.tries} tries: {e.record.verdict.why}); this is not the SUT's limit: {bound}. "
                             "Run loadgen where it has CPU to spare, or share the load among workers (--workers)")

    def _search_rate(self, search: Search, outcome: Dict[str, Any]) -> None:
        s = self.settings
        first = search.probe(self.start, "start")
        if not first.holds:
            outcome["reason"] = (f"the start, {format_setting(self.start)} queries/s, does not hold "
                                 f"({first.why}); give a lower --start (or a longer --probe-s, if the run "
                                 "was too short for its rules)")
            return
        bracket = search.widen(self.start, lambda x: min(x * s.growth, D.MAX_TARGET_QPS)
                               if x < D.MAX_TARGET_QPS else None)
        bracket = search.bisect(bracket, relative_finish(s.precision))
        outcome["bracket"] = bracket

        def down(x: float) -> Optional[float]:
            lower = x / s.growth
            return lower if lower >= MIN_RATE else None

        self._settle(search, bracket, outcome, relative_finish(s.precision), down)

    def _settle(self, search: Search, bracket: Bracket, outcome: Dict[str, Any],
                finished: Callable[[float, float], bool], down: Callable[[float], Optional[float]],
                middle: Callable[[float, float], float] = midpoint, answer: Optional[float] = None,
                reason: str = "") -> None:
        """Confirms the answer (``bracket.lo`` unless given), bisecting below a failed
        confirmation, and says what decided it."""
        s = self.settings
        candidate = bracket.lo if answer is None else answer
        confirmation = search.settle(candidate, self._run_full, runs=s.confirm_runs, finished=finished, down=down,
                                     max_failures=s.max_step_downs, middle=middle)
        outcome["confirmation"] = confirmation
        if not confirmation.held:
            outcome["reason"] = confirmation.why
            outcome["lower_bound"] = search.held_below(confirmation.answer)
            return
        if reason and confirmation.answer == candidate:
            outcome["reason"] = reason
            return
        failure = search.deciding_failure(confirmation.answer)
        if failure is not None and confirmation.answer != candidate:  # the bracket the answer came from
            outcome["bracket"] = Bracket(confirmation.answer, failure.x, True)
        if failure is not None:
            where = " (a confirmation run)" if failure.phase == "confirm" else ""
            outcome["reason"] = (f"{self._setting_text(failure.x)} does not hold{where}: "
                                 f"{failure.verdict.why}")
        else:
            outcome["reason"] = self._bracket_reason(bracket)

    def _setting_text(self, x: float) -> str:
        if self.settings.over == "rate":
            return f"{format_setting(x)} queries/s"
        return f"concurrency {format_setting(x)}"

    def _search_concurrency(self, search: Search, outcome: Dict[str, Any]) -> None:
        s = self.settings
        found = self.knee.find(search, self.start, _next_concurrency(s.growth), relative_finish(s.precision, 1.0))
        if found is None:
            why = self.runs[0]["why"] if self.runs else ""
            outcome["reason"] = f"the start, concurrency {int(self.start)}, does not hold ({why})"
            return
        outcome["bracket"] = found.bracket

        def down(c: float) -> Optional[float]:
            lower = min(c - 1, math.floor(c / s.growth))
            return float(lower) if lower >= 1 else None

        self._settle(search, found.bracket, outcome, relative_finish(s.precision, 1.0), down, integer_midpoint,
                     answer=found.answer, reason=found.reason)

    def _bracket_reason(self, bracket: Bracket) -> str:
        if bracket.hi is None:
            return f"reached the largest setting, {self._setting_text(bracket.lo)}"
        if not bracket.hi_failed:
            return (f"the probe budget ran out before a probe failed (next: {self._setting_text(bracket.hi)}); "
                    "raise --max-probes")
        return f"nothing above {self._setting_text(bracket.lo)} failed"

    # ------------------------------------------------------- probes and progress

    def _probe(self, x: float) -> Verdict:
        return self._run(x) if self.settings.over == "rate" else self.knee.probe(x)

    def _run_full(self, x: float) -> Verdict:
        """A full-length run (``--duration-s``): a confirmation, or a bisection step below
        a failed one."""
        self._full = True
        try:
            return self._run(x)
        finally:
            self._full = False

    def _before(self, index: int, x: float, phase: str, lo: Optional[float], hi: Optional[float]) -> None:
        self._phase = phase
        search = self._search
        unit = "queries/s" if self.settings.over == "rate" else "in flight"
        attempt = search.attempt if search is not None else 1
        if phase == "confirm":
            confirmations = sum(1 for r in self.runs if r["phase"] == "confirm")
            counter = f"confirmation run {confirmations + 1}"
        else:
            probes = search.probes if search is not None else len(self.runs) + 1
            counter = f"probe {probes}/{self.settings.max_probes} ({phase}"
            counter += ", full length)" if search is not None and search.settling else ")"
        if attempt > 1:
            counter += f", try {attempt}"
        self.say(f"{counter} at {format_setting(x)} {unit}, bracket [{format_setting(lo)}, "
                 f"{format_setting(hi)}), {time.monotonic() - self.started:.1f} s")

    def _windows_done(self, points: List[Dict[str, Any]]) -> bool:
        return windows_done(points, self.settings)

    # ------------------------------------------------------------------- the runs

    def _probe_options(self, x: float, confirm: bool = False) -> Tuple[RunOptions, Dict[str, Any]]:
        """The options and the "given" record of one run at setting ``x``."""
        s, o = self.settings, self.options
        length = self.confirm_s if confirm else s.probe_s
        change: Dict[str, Any] = {}
        if s.over == "rate":
            change["target_qps"] = x
            if o.scenario == "server":  # MLPerf's rules: a minimum duration, then as long as it takes
                change["min_duration_s"], change["duration_s"] = length, None
            else:
                change["duration_s"] = length
        else:
            change["concurrency"] = int(x)
            change["interval_s"] = s.window
            change["duration_s"] = length if confirm else max(s.probe_s, s.max_windows * s.window)
        return dataclasses.replace(o, **change), {**self.given, **change}

    def _run(self, x: float) -> Verdict:
        """One run at ``x``: held when valid (and not interrupted), its summary (see
        :func:`loadgen.peak.report.run_summary`) as the verdict's data. It is written
        under ``output`` once the search has judged it (:meth:`_after`); an interrupted
        run at once, before the search stops."""
        from loadgen.runner import ResultError, prepare, run_benchmark

        if self.stop_requested():
            raise _Stopped
        confirm = self._phase == "confirm" or self._full
        options, given = self._probe_options(x, confirm)
        prepared = self._prepared[1] if self._prepared is not None and self._prepared[0] == x else None
        self._prepared = None
        finish = None if confirm or self.settings.over == "rate" else self._windows_done
        index = len(self.runs) + 1
        folder = f"{index:03d}-{format_setting(x).replace(',', '')}" + (
            "-confirm" if self._phase == "confirm" else "-full" if self._full else "")
        options, prepared = self._records_in(folder, options, prepared or prepare(options))
        if self.live is not None:
            self.live.point = folder
        try:
            doc = run_benchmark(options, given=given, stop_requested=self.stop_requested,
                                prepared=prepared, finish_when=finish, live=self.live)
        except ResultError as e:  # measured, but the document could not be built: kept as it is
            doc = e.doc
        summary = run_summary(doc, index, self._phase, x, options, self.settings,
                              folder if self.output else None, min_goodput=self.min_goodput)
        if self._full and self._phase != "confirm":
            summary["full_length"] = True
        self._pending = (doc, summary, folder)
        if doc.get("interrupted"):
            self._record(Verdict(False, summary["why"]), 1)
            raise _Stopped
        figure = summary["qps"] if self.settings.over == "concurrency" else summary["latency_ns"]
        return Verdict(summary["holds"], summary["why"], figure, summary,
                       inconclusive=summary["outcome"] == "inconclusive")

    def _records_in(self, folder: str, options: RunOptions, prepared: Any) -> Tuple[RunOptions, Any]:
        """With --record-requests: the run's options and prepared run writing the records
        to the file's name in the run's folder under ``output`` (created now)."""
        if not options.record_requests or not self.output:
            return options, prepared
        path = os.path.join(self.output, PROBES_DIR, folder, os.path.basename(options.record_requests))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        scenario, effective, settings, sut = prepared
        settings = dataclasses.replace(settings, record_requests=path)
        effective = dataclasses.replace(effective, record_requests=path)
        return dataclasses.replace(options, record_requests=path), (scenario, effective, settings, sut)

    def _after(self, record: ProbeRecord) -> None:
        self._record(record.verdict, record.attempt)

    def _record(self, verdict: Verdict, attempt: int) -> None:
        """Keeps the pending run with the search's verdict on it: in :attr:`runs`, and
        under ``output`` (its folder and a line of probes.jsonl)."""
        if self._pending is None:
            return
        doc, summary, folder = self._pending
        self._pending = None
        interrupted = bool(doc.get("interrupted"))
        if verdict.plateau and not interrupted:  # the run held; the knee puts it on the plateau
            summary.update(holds=True, why="", outcome="plateau", note=verdict.why)
        elif not verdict.inconclusive:
            summary.update(holds=verdict.holds and not interrupted, why=verdict.why or summary["why"])
            summary["outcome"] = "holds" if summary["holds"] else "fails"
        summary["attempt"] = attempt
        summary["elapsed_s"] = round(time.monotonic() - self.started, 3)
        self.runs.append(summary)
        self.last_doc = doc
        self._write_run(doc, summary, folder)
        line = _verdict_line(summary)
        if summary["outcome"] == "inconclusive":
            line += (f"; trying again ({attempt + 1} of {self.settings.retries + 1} tries)"
                     if attempt <= self.settings.retries else "; no tries left (--retries)")
        self.say("  " + line)

    # ----------------------------------------------------------------- the output

    def _open_output(self) -> None:
        if not self.output:
            return
        try:
            os.makedirs(os.path.join(self.output, PROBES_DIR), exist_ok=True)
            with open(os.path.join(self.output, PROBES_FILE), "w", encoding="utf-8"):
                pass  # a new search's lines replace an earlier one's
        except OSError as e:
            self._write_failed(e)

    def _write_run(self, doc: Dict[str, Any], summary: Dict[str, Any], folder: str) -> None:
        if not self.output or self.write_error:
            return
        try:
            _write_doc(doc, os.path.join(self.output, PROBES_DIR, folder))
            with open(os.path.join(self.output, PROBES_FILE), "a", encoding="utf-8") as f:
                f.write(json.dumps(summary) + "\n")
        except OSError as e:
            self._write_failed(e)

    def _write_failed(self, e: OSError) -> None:
        """Writing under ``output`` failed: the search goes on, and the final document
        (which holds every run's summary) is handed back for the caller to keep."""
        self.write_error = f"--output: cannot write to {self.output}: {e.strerror or e}"
        self.say(f"error: {self.write_error}; the search goes on without writing")

    def _finish(self, search: Search, outcome: Dict[str, Any]) -> Dict[str, Any]:
        from loadgen.peak.report import peak_section

        doc = dict(self.last_doc or {})
        confirmation: Optional[Confirmation] = outcome["confirmation"]
        confirmed = bool(confirmation and confirmation.held and not outcome["interrupted"])
        doc["peak"] = peak_section(self, search, outcome, confirmed, time.monotonic() - self.started)
        if not confirmed:
            doc["valid"] = False
            doc["invalid_reasons"] = [f"find-peak: no confirmed answer: {doc['peak']['reason']}",
                                      *doc.get("invalid_reasons", [])]
        if self.output and not self.write_error:
            try:
                _write_doc(doc, self.output)
            except OSError as e:
                self._write_failed(e)
        return doc


def _write_doc(doc: Dict[str, Any], directory: str) -> None:
    """A run's files (write_outputs); a partial document (its renderers may fail) as
    result.json alone."""
    if not doc.get("partial"):
        write_outputs(doc, directory)
        return
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, RESULT_FILE), "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=2, default=str) + "\n")


def search_options(options: RunOptions, settings: PeakSettings, given: Dict[str, Any]) -> RunOptions:
    """The options every run of a search starts from: the scenario checked, or defaulted
    (poisson over a rate, concurrency over a concurrency), the bound required for a rate
    search, and no --query-count (runs are timed). ValueError names what is wrong."""
    scenario = options.scenario if "scenario" in given else (
        "poisson" if settings.over == "rate" else "concurrency")
    if settings.over == "rate" and scenario not in RATE_SCENARIOS:
        raise ValueError(f"--scenario {scenario}: find-peak --over rate searches an open loop: "
                         f"{', '.join(RATE_SCENARIOS)} (poisson by default)")
    if settings.over == "concurrency" and scenario != "concurrency":
        raise ValueError(f"--scenario {scenario}: find-peak --over concurrency runs the concurrency scenario")
    if settings.over == "rate" and options.latency_bound_ms is None and not (
            options.slo or options.require or options.fail_if):
        raise ValueError("--latency-bound-ms is required (or an --slo, --require or --fail-if): find-peak --over "
                         "rate looks for the highest rate whose runs meet it")
    return dataclasses.replace(options, scenario=scenario, output=None, json=False, quiet=True, query_count=None)


def full_windows(points: List[Dict[str, Any]], settings: PeakSettings) -> List[Dict[str, Any]]:
    """The whole windows of a time series (``timeseries`` entries); a run's last entry,
    cut short by its end, is not one."""
    return [p for p in points if p["length_s"] >= 0.9 * settings.window]


def windows_done(points: List[Dict[str, Any]], settings: PeakSettings) -> bool:
    """Whether a concurrency probe whose time series so far is ``points`` has run long
    enough: at least ``probe_s`` in whole windows, the last 3 of which agree within
    ``stability`` in throughput and in p99 latency (perf_analyzer's rule)."""
    full = full_windows(points, settings)
    if sum(p["length_s"] for p in full) < settings.probe_s * 0.999:
        return False
    return (stable([p["qps"] for p in full], STABLE_WINDOWS, settings.stability)
            and stable([p["p99_ns"] for p in full], STABLE_WINDOWS, settings.stability))


def _next_concurrency(growth: float) -> Callable[[float], Optional[float]]:
    def up(c: float) -> Optional[float]:
        if c >= D.MAX_CONCURRENCY:
            return None
        return float(min(max(c + 1, math.ceil(c * growth)), D.MAX_CONCURRENCY))
    return up


def _verdict_line(summary: Dict[str, Any]) -> str:
    latency = summary["latency_ns"]
    shown = f"p{summary['percentile']:g} {ns_to_ms(latency):.3f} ms" if latency is not None else "no latency"
    outcome = summary.get("outcome", "holds" if summary["holds"] else "fails")
    head = {"holds": "holds", "fails": "does not hold", "plateau": "holds",
            "inconclusive": f"not judged ({summary.get('cause') or 'generator'} failed, not the SUT)"}[outcome]
    tail = f": {summary['why']}" if summary["why"] else ""
    if outcome == "plateau":
        tail = f"; on the plateau: {summary['note']}"
    elapsed = f" [{summary['elapsed_s']:.1f} s]" if "elapsed_s" in summary else ""
    return f"{head}: {shown}, {summary['qps']:,.1f} queries/s{tail}{elapsed}"


def find_peak(options: RunOptions, settings: Optional[PeakSettings] = None, *,
              given: Optional[Dict[str, Any]] = None, say: Optional[Callable[[str], None]] = None,
              stop_requested: Optional[Callable[[], bool]] = None) -> Dict[str, Any]:
    """Runs a peak search and returns its final document (see :meth:`PeakSearch.run`).

    Args:
        options: the run options each probe starts from; ``output`` keeps every run.
        settings: how to search (default :class:`PeakSettings` ()).
        given: the options as the user gave them.
        say: called with a line of progress before and after each run.
        stop_requested: polled during runs; True stops the run under way and the search.

    Raises:
        ValueError: a setting, option or the SUT is unusable.
    """
    search = PeakSearch(options, settings or PeakSettings(), given)
    return search.run(say=say, stop_requested=stop_requested)
