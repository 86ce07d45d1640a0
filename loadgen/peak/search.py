"""The search for the highest setting that holds: widening a bracket, bisecting it, and
confirming the answer. Pure logic over callables, with no run of its own: ``loadgen
find-peak`` (:mod:`loadgen.peak.driver`) and ``loadgen.mlperf``'s FindPeakPerformance
(:mod:`loadgen.mlperf.modes`) both drive their probes through it.

A probe is ``probe(x) -> Verdict``: does setting ``x`` (a rate, a concurrency) hold? The
search assumes what holds is a prefix: everything below the peak holds, nothing above it
does. Measured verdicts near the edge are noisy; the bracket is then the last word of the
probes, and confirmation (:meth:`Search.settle`, or MLPerf's step-down
:meth:`Search.confirm`) is what makes the answer trustworthy.

Three rules keep one noisy verdict from deciding the answer:

- a verdict that says nothing of the SUT (``inconclusive``: the generator or the client
  could not offer the load) is retried, ``retries`` times at most, and never taken as a
  failure of the SUT; when every try is inconclusive the search ends (:class:`Undecided`);
- a failure within ``recheck_within`` (relative) of the highest setting that held is run
  once more before it moves the bracket's upper end (the second verdict decides);
- a setting is the answer only once ``runs`` confirmation runs at it all held; a failed
  confirmation makes it the bracket's upper end, and the search bisects below it.

``max_time_s`` (and the probe budget) bound the whole: :class:`BudgetSpent` says which ran
out.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Set

__all__ = ["Bracket", "BudgetSpent", "Confirmation", "Knee", "KneeAnswer", "ProbeRecord", "Search", "Undecided",
           "Verdict", "integer_midpoint", "midpoint", "relative_finish", "stable"]


@dataclass(frozen=True)
class Verdict:
    """What one probe or confirmation run found.

    Attributes:
        holds: the setting held (the bound was met, the run was valid, ...).
        why: when it did not hold, why not, as a sentence; empty otherwise.
        figure: the probe's headline figure (a latency, a throughput), for display.
        data: whatever the caller wants kept with the verdict (a result document).
        inconclusive: the run says nothing of the SUT (the generator or the client could
            not offer the load); ``holds`` is False and ``why`` says what failed. The
            search retries it and never takes it as the SUT's limit.
        plateau: the run itself held, but the search's rule puts it at or past its limit
            (the concurrency knee: throughput no longer grows); ``holds`` is False.
    """

    holds: bool
    why: str = ""
    figure: Optional[float] = None
    data: Any = None
    inconclusive: bool = False
    plateau: bool = False

    @property
    def ran(self) -> bool:
        """The run itself held (a held verdict, or one on the plateau)."""
        return self.holds or self.plateau

    @property
    def fails(self) -> bool:
        """The SUT failed this setting: neither held, on the plateau, nor inconclusive."""
        return not (self.holds or self.plateau or self.inconclusive)


@dataclass(frozen=True)
class ProbeRecord:
    """One call of a probe or confirmation function, in the order made.

    Attributes:
        index: 1-based, over every call of the search (probes and confirmation runs).
        x: the setting probed.
        phase: ``start``, ``widen``, ``bisect`` or ``confirm``.
        verdict: what the call returned.
        wall_s: how long the call took.
        attempt: 1 for the first call at this step; 2, 3, ... for a retry of an
            inconclusive verdict or the recheck of a failure near the bracket's low end.
        full: made by :meth:`Search.settle` (a confirmation run, or a bisection step
            below a failed one): a full-length run.
    """

    index: int
    x: float
    phase: str
    verdict: Verdict
    wall_s: float
    attempt: int = 1
    full: bool = False


class Undecided(Exception):
    """Every try at a setting was inconclusive: the generator or the client could not
    offer that load, so the search cannot say whether the SUT holds it.

    Attributes:
        record: the last try's record.
        tries: how many tries were made.
    """

    def __init__(self, record: ProbeRecord, tries: int) -> None:
        super().__init__(record.verdict.why)
        self.record, self.tries = record, tries


class BudgetSpent(Exception):
    """The search's time budget (``max_time_s``) ran out before the next call; the
    message says how far it got."""


@dataclass(frozen=True)
class Bracket:
    """Where the peak lies: ``lo`` held, ``hi`` is above it.

    Attributes:
        lo: the highest setting known to hold.
        hi: the lowest setting above ``lo`` that failed, or, when the probe budget ran out
            first, the next one the search would have probed (``hi_failed`` False).
            None when there is no next setting (the ``up`` function gave none).
        hi_failed: ``hi`` was probed and did not hold.
    """

    lo: float
    hi: Optional[float]
    hi_failed: bool


@dataclass
class Confirmation:
    """The outcome of :meth:`Search.confirm`.

    Attributes:
        answer: the last setting tried: the confirmed answer when ``held``.
        held: every run at ``answer`` held.
        attempts: settings tried (1 + the step-downs made, or 1 + the failed
            confirmations for :meth:`Search.settle`).
        last: the verdict of the last run (None when no run was made).
        why: when not ``held``, why the search stopped, as a sentence (:meth:`Search.settle`).
    """

    answer: float
    held: bool
    attempts: int = 0
    last: Optional[Verdict] = None
    why: str = ""


def midpoint(lo: float, hi: float) -> float:
    """The arithmetic midpoint of ``[lo, hi)``."""
    return lo + (hi - lo) / 2


def integer_midpoint(lo: float, hi: float) -> float:
    """The integer midpoint of ``[lo, hi)`` (for concurrencies)."""
    return float((int(lo) + int(hi)) // 2)


def relative_finish(precision: float, step: float = 0.0) -> Callable[[float, float], bool]:
    """The usual stopping rule: the bracket ``[lo, hi)`` is at most ``precision`` of ``lo``
    wide, or at most ``step`` wide (1 for integers, whose bracket cannot shrink below 1)."""

    def finished(lo: float, hi: float) -> bool:
        return hi - lo <= precision * lo or hi - lo <= step

    return finished


def stable(series: Sequence[float], last: int, tolerance: float) -> bool:
    """perf_analyzer's stability rule: the ``last`` values of ``series`` each lie within
    ``tolerance`` (relative) of their mean. Fewer values than ``last`` are not stable."""
    if last < 1 or len(series) < last:
        return False
    tail = [float(v) for v in series[-last:]]
    if not all(math.isfinite(v) for v in tail):
        return False
    mean = sum(tail) / last
    return all(abs(v - mean) <= tolerance * abs(mean) for v in tail)


@dataclass
class Search:
    """Widening, bisection and confirmation over one probe function.

    Args:
        probe: ``probe(x) -> Verdict`` for the search's probes.
        max_probes: at most this many search probes (confirmation runs, retries and
            rechecks do not count).
        before: called before each call, probes and confirmation runs alike, with the
            call's 1-based index, its setting, its phase and the bracket so far
            (``lo`` None before anything held, ``hi`` None before anything failed).
        after: called with each :class:`ProbeRecord` once its call returned.
        retries: an inconclusive verdict is tried again this many times at most; still
            inconclusive, the call raises :class:`Undecided`.
        recheck_within: a failure of a probe whose setting is within this (relative) of
            the highest setting that held is run once more, and the second verdict
            decides (0: never).
        max_time_s: no call starts this long after the search was made
            (:class:`BudgetSpent`); None: no limit.
        clock: the clock of ``max_time_s`` and of each record's ``wall_s``.

    The bracket of the phase under way is :attr:`lo` and :attr:`hi` (None: not known
    yet); :attr:`records` holds every call.
    """

    probe_fn: Callable[[float], Verdict]
    max_probes: int
    before: Optional[Callable[[int, float, str, Optional[float], Optional[float]], None]] = None
    after: Optional[Callable[[ProbeRecord], None]] = None
    retries: int = 0
    recheck_within: float = 0.0
    max_time_s: Optional[float] = None
    clock: Callable[[], float] = time.monotonic
    records: List[ProbeRecord] = field(default_factory=list)
    probes: int = 0
    lo: Optional[float] = None
    hi: Optional[float] = None
    #: Indices in :attr:`records` of failures a recheck overruled.
    overruled: Set[int] = field(default_factory=set)
    #: The call under way (or the last one) is this step's attempt (1, 2, ...).
    attempt: int = 0
    #: :meth:`settle` is under way: its bisection steps are full-length runs.
    settling: bool = False

    def __post_init__(self) -> None:
        self.started = self.clock()

    def budget_left(self) -> bool:
        """Whether another search probe may be made."""
        return self.probes < self.max_probes

    def probe(self, x: float, phase: str = "start") -> Verdict:
        """One search probe at ``x`` (counted against the budget); the bracket follows it.
        An inconclusive verdict is retried; a failure near the bracket's low end is
        rechecked once (see the class)."""
        self.probes += 1
        return self._checked(self.probe_fn, x, phase)

    def _checked(self, fn: Callable[[float], Verdict], x: float, phase: str) -> Verdict:
        """A call whose failure near the bracket's low end is run once more: the second
        verdict decides, and a first failure it overrules no longer counts as one."""
        verdict = self._call(fn, x, phase)
        if verdict.fails and self._near_lo(x):
            first = len(self.records) - 1
            verdict = self._call(fn, x, phase, again=True)
            if not verdict.fails:
                self.overruled.add(first)
        return verdict

    def _near_lo(self, x: float) -> bool:
        return self.recheck_within > 0 and self.lo is not None and x <= self.lo * (1 + self.recheck_within)

    def _call(self, fn: Callable[[float], Verdict], x: float, phase: str, again: bool = False) -> Verdict:
        """One call of ``fn`` at ``x``, retried while inconclusive (``retries`` times);
        ``again``: the same step as the last call (its attempts go on counting)."""
        if not again:
            self.attempt = 0
        for _ in range(self.retries + 1):
            record = self._one(fn, x, phase)
            if not record.verdict.inconclusive:
                return record.verdict
        raise Undecided(record, self.retries + 1)

    def _one(self, fn: Callable[[float], Verdict], x: float, phase: str) -> ProbeRecord:
        if self.max_time_s is not None and self.clock() - self.started >= self.max_time_s:
            raise BudgetSpent(f"the time budget of {self.max_time_s:g} s ran out after {_plural(len(self.records), 'run')}")
        index = len(self.records) + 1
        self.attempt += 1
        if self.before is not None:
            self.before(index, x, phase, self.lo, self.hi)
        started = self.clock()
        verdict = fn(x)
        record = ProbeRecord(index, x, phase, verdict, self.clock() - started, self.attempt,
                             self.settling or phase == "confirm")
        self.records.append(record)
        if self.after is not None:
            self.after(record)
        return record

    def failures(self) -> List[ProbeRecord]:
        """The calls whose setting the SUT failed, but those a recheck overruled."""
        return [r for i, r in enumerate(self.records) if r.verdict.fails and i not in self.overruled]

    def widen(self, lo: float, up: Callable[[float], Optional[float]]) -> Bracket:
        """From ``lo``, which holds, probes ``up(lo)``, ``up(up(lo))``, ... while they hold
        and the budget lasts. ``up`` returns None where there is nothing higher to try."""
        hi = up(lo)
        while hi is not None and self.budget_left():
            self.lo, self.hi = lo, None
            if not self.probe(hi, "widen").holds:
                self.hi = hi
                return Bracket(lo, hi, True)
            lo, hi = hi, up(hi)
        self.lo = lo
        return Bracket(lo, hi, False)

    def bisect(self, bracket: Bracket, finished: Callable[[float, float], bool],
               middle: Callable[[float, float], float] = midpoint,
               run: Optional[Callable[[float], Verdict]] = None) -> Bracket:
        """Halves ``bracket`` until ``finished(lo, hi)`` or the budget is spent. A bracket
        without an upper end is returned as it is. ``run`` (default: the probe function)
        is what each step calls."""
        lo, hi, failed = bracket.lo, bracket.hi, bracket.hi_failed
        if hi is None:
            return bracket
        while self.budget_left() and not finished(lo, hi):
            mid = middle(lo, hi)
            if not lo < mid < hi:
                break
            self.lo, self.hi = lo, hi
            if self._step(mid, "bisect", run).holds:
                lo = mid
            else:
                hi, failed = mid, True
        self.lo, self.hi = lo, hi
        return Bracket(lo, hi, failed)

    def _step(self, x: float, phase: str, run: Optional[Callable[[float], Verdict]]) -> Verdict:
        if run is None:
            return self.probe(x, phase)
        self.probes += 1
        return self._checked(run, x, phase)

    def confirm(self, x: float, run: Callable[[float], Verdict], *, runs: int, attempts: int,
                down: Callable[[float], Optional[float]]) -> Confirmation:
        """Confirms ``x``: ``runs`` calls of ``run`` that must all hold (the first that does
        not ends the attempt); after a failed attempt, tries ``down(x)`` (None: nothing
        lower to try), ``attempts`` settings at most. (MLPerf's FindPeakPerformance;
        ``loadgen find-peak`` uses :meth:`settle`.)"""
        outcome = Confirmation(x, False)
        for attempt in range(attempts):
            outcome.attempts = attempt + 1
            outcome.answer = x
            held = True
            for _ in range(max(1, runs)):
                outcome.last = self._call(run, x, "confirm")
                if not outcome.last.holds:
                    held = False
                    break
            if held:
                outcome.held = True
                return outcome
            lower = down(x)
            if attempt + 1 == attempts or lower is None:
                return outcome
            x = lower
        return outcome

    def held_below(self, x: float, full: bool = False) -> Optional[float]:
        """The highest setting whose run held (a probe, a bisection step, a confirmation
        run; on the plateau counts: the run held) below ``x`` and below every failure at
        or under ``x``; None when there is none. ``full``: full-length runs only."""
        limit = min([r.x for r in self.failures() if r.x <= x] + [x])
        held = [r.x for r in self.records if r.verdict.ran and r.x < limit and (r.full or not full)]
        return max(held) if held else None

    def settle(self, x: float, run: Callable[[float], Verdict], *, runs: int, finished: Callable[[float, float], bool],
               down: Callable[[float], Optional[float]], max_failures: int,
               middle: Callable[[float, float], float] = midpoint) -> Confirmation:
        """Confirms ``x`` with ``runs`` calls of ``run`` that must all hold. When one does
        not, ``x`` is the bracket's upper end and its lower end the highest setting that
        held below it in a full-length run (:meth:`held_below`; short probes are
        optimistic near the limit, so their holds do not count here; without one,
        ``down(x)``, ``down(down(x))``, ... are run until one holds, and the upper end is
        the lowest of them that failed). That bracket is bisected with ``run``
        (full-length runs) until ``finished``, and its low end is confirmed in turn. Ends unconfirmed after ``max_failures`` failed confirmations,
        when the probe budget is spent, or when nothing lower is left to try.

        Raises:
            Undecided: every try of a run was inconclusive.
            BudgetSpent: the time budget ran out.
        """
        self.settling = True
        try:
            return self._settle(x, run, runs, finished, down, max_failures, middle)
        finally:
            self.settling = False

    def _settle(self, x: float, run: Callable[[float], Verdict], runs: int, finished: Callable[[float, float], bool],
                down: Callable[[float], Optional[float]], max_failures: int,
                middle: Callable[[float, float], float]) -> Confirmation:
        outcome = Confirmation(x, False)
        while True:
            outcome.attempts += 1
            outcome.answer = x
            for _ in range(max(1, runs)):
                outcome.last = self._call(run, x, "confirm")
                if not outcome.last.holds:
                    break
            else:
                outcome.held = True
                return outcome
            if outcome.attempts > max_failures:
                outcome.why = (f"{_plural(outcome.attempts, 'confirmation')} failed, the last at {_setting(x)} "
                               f"({outcome.last.why}); raise --max-step-downs to search lower")
                return outcome
            # Short probes are optimistic near the limit: once a full-length run failed,
            # only a full-length run that held is a lower end.
            lo = self.held_below(x, full=True)
            probe_down = x
            while lo is None:
                lower = down(probe_down)
                if lower is None or not self.budget_left():
                    outcome.why = (f"the confirmation at {_setting(x)} failed ({outcome.last.why}) and "
                                   + ("nothing lower is left to try" if lower is None else
                                      "the probe budget is spent; raise --max-probes"))
                    return outcome
                self.lo, self.hi = None, probe_down
                if self._step(lower, "bisect", run).holds:
                    lo = lower
                probe_down = lower
            # The upper end is the lowest failure above the low end: stepping down may have
            # failed settings below x.
            hi = min(r.x for r in self.failures() if lo < r.x <= x)
            x = self.bisect(Bracket(lo, hi, True), finished, middle, run).lo

    def deciding_failure(self, answer: float) -> Optional[ProbeRecord]:
        """The failure that decided ``answer``: the lowest setting above it that the SUT
        failed (the latest run there when there are several); None when none did."""
        above = [r for r in self.failures() if r.x > answer]
        if not above:
            return None
        lowest = min(r.x for r in above)
        return [r for r in above if r.x == lowest][-1]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _setting(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.3f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class KneeAnswer:
    """What :meth:`Knee.find` found.

    Attributes:
        answer: the concurrency.
        reason: why it is the answer, as a sentence.
        bracket: the final bracket; the answer is its upper end when throughput flattened,
            its lower end when the next concurrency did not hold.
    """

    answer: float
    reason: str
    bracket: Bracket


class Knee:
    """The concurrency where throughput stops growing, or the last that holds.

    ``measure(c) -> Verdict`` runs concurrency ``c``: ``holds`` says whether the run held
    (valid, within the bound), ``figure`` is its throughput. Give :meth:`probe` to the
    :class:`Search` as its probe function, then call :meth:`find`.

    Widening goes on while each step raises throughput by ``min_gain`` (relative) over
    the last concurrency that held. When a step does not, the answer is the lowest
    concurrency whose throughput is within ``min_gain`` of the best seen while widening
    (bisected between the highest below it and the lowest within it). When a run does
    not hold instead, the answer is the highest concurrency that holds (bisected).
    """

    def __init__(self, measure: Callable[[float], Verdict], min_gain: float) -> None:
        self.measure = measure
        self.min_gain = min_gain
        self.measured: dict[float, Verdict] = {}
        self.best = 0.0
        self._judge: Callable[[float, Verdict], Verdict] = self._gains
        self._search: Optional[Search] = None

    def probe(self, c: float) -> Verdict:
        """The search's probe: measures ``c`` (once) and judges it by the phase's rule."""
        if c not in self.measured or self.measured[c].inconclusive:  # an inconclusive run is tried again
            self.measured[c] = self.measure(c)
        return self._judge(c, self.measured[c])

    def _qps(self, c: float) -> float:
        return float(self.measured[c].figure or 0.0)

    def _gains(self, c: float, m: Verdict) -> Verdict:
        lo = self._search.lo if self._search is not None else None
        if not m.holds or lo is None or lo == c:
            return m
        gain = self._qps(c) / self._qps(lo) - 1 if self._qps(lo) > 0 else math.inf
        if gain < self.min_gain:
            return Verdict(False, f"throughput grew {gain:.1%} over concurrency {lo:g}, less than "
                           f"{self.min_gain:.0%} (--min-gain)", m.figure, m.data, plateau=True)
        return m

    def _holds(self, c: float, m: Verdict) -> Verdict:
        return m

    def _below(self, c: float) -> bool:
        return self._qps(c) * (1 + self.min_gain) < self.best

    def _under_knee(self, c: float, m: Verdict) -> Verdict:
        if not m.holds or self._below(c):
            return m
        return Verdict(False, f"throughput within {self.min_gain:.0%} of the best seen", m.figure, m.data,
                       plateau=True)

    def find(self, search: Search, start: float, up: Callable[[float], Optional[float]],
             finished: Callable[[float, float], bool]) -> Optional[KneeAnswer]:
        """Probes ``start`` (None when it does not hold), widens with ``up``, bisects with
        ``finished`` (integer midpoints)."""
        self._search, self._judge = search, self._gains
        if not search.probe(start, "start").holds:
            return None
        bracket = search.widen(start, up)
        hi = bracket.hi
        if hi is None or not bracket.hi_failed:
            return KneeAnswer(bracket.lo, "the probe budget ran out while throughput still grew; "
                              "raise --max-probes", bracket)
        if not self.measured[hi].holds:
            self._judge = self._holds
            final = search.bisect(bracket, finished, integer_midpoint)
            return KneeAnswer(final.lo, self._broke(final), final)
        held = [c for c, m in self.measured.items() if m.holds]
        self.best = max(self._qps(c) for c in held)
        plateau = min(c for c in held if not self._below(c))
        below = [c for c in held if c < plateau]
        if not below:
            return KneeAnswer(plateau, f"gain flattened: concurrency {plateau:g} already reaches "
                              f"{self._qps(plateau):,.1f} queries/s, within {self.min_gain:.0%} of the "
                              "best seen", bracket)
        self._judge = self._under_knee
        final = search.bisect(Bracket(max(below), plateau, True), finished, integer_midpoint)
        if final.hi is None or not self.measured[final.hi].holds:
            return KneeAnswer(final.lo, self._broke(final), final)
        return KneeAnswer(final.hi, (
            f"gain flattened: concurrency {final.hi:g} reaches {self._qps(final.hi):,.1f} queries/s, "
            f"within {self.min_gain:.0%} of the best seen ({self.best:,.1f}); {final.lo:g} gives "
            f"{self._qps(final.lo):,.1f}"), final)

    def _broke(self, bracket: Bracket) -> str:
        hi = bracket.hi
        if hi is None or hi not in self.measured:
            return f"nothing above concurrency {bracket.lo:g} was tried"
        return f"concurrency {hi:g} does not hold: {self.measured[hi].why}"
