"""The search for the highest setting that holds: widening a bracket, bisecting it, and
confirming the answer. Pure logic over callables, with no run of its own: ``loadgen
find-peak`` (:mod:`loadgen.peak.driver`) and ``loadgen.mlperf``'s FindPeakPerformance
(:mod:`loadgen.mlperf.modes`) both drive their probes through it.

A probe is ``probe(x) -> Verdict``: does setting ``x`` (a rate, a concurrency) hold? The
search assumes what holds is a prefix: everything below the peak holds, nothing above it
does. Measured verdicts near the edge are noisy; the bracket is then the last word of the
probes, and :meth:`Search.confirm` is what makes the answer trustworthy.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence

__all__ = ["Bracket", "Confirmation", "Knee", "KneeAnswer", "ProbeRecord", "Search", "Verdict", "integer_midpoint",
           "midpoint", "relative_finish", "stable"]


@dataclass(frozen=True)
class Verdict:
    """What one probe or confirmation run found.

    Attributes:
        holds: the setting held (the bound was met, the run was valid, ...).
        why: when it did not hold, why not, as a sentence; empty otherwise.
        figure: the probe's headline figure (a latency, a throughput), for display.
        data: whatever the caller wants kept with the verdict (a result document).
    """

    holds: bool
    why: str = ""
    figure: Optional[float] = None
    data: Any = None


@dataclass(frozen=True)
class ProbeRecord:
    """One call of a probe or confirmation function, in the order made.

    Attributes:
        index: 1-based, over every call of the search (probes and confirmation runs).
        x: the setting probed.
        phase: ``start``, ``widen``, ``bisect`` or ``confirm``.
        verdict: what the call returned.
        wall_s: how long the call took.
    """

    index: int
    x: float
    phase: str
    verdict: Verdict
    wall_s: float


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
        attempts: settings tried (1 + the step-downs made).
        last: the verdict of the last run (None when no run was made).
    """

    answer: float
    held: bool
    attempts: int = 0
    last: Optional[Verdict] = None


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
        max_probes: at most this many search probes (confirmation runs do not count).
        before: called before each call, probes and confirmation runs alike, with the
            call's 1-based index, its setting, its phase and the bracket so far
            (``lo`` None before anything held, ``hi`` None before anything failed).
        after: called with each :class:`ProbeRecord` once its call returned.

    The bracket of the phase under way is :attr:`lo` and :attr:`hi` (None: not known
    yet); :attr:`records` holds every call.
    """

    probe_fn: Callable[[float], Verdict]
    max_probes: int
    before: Optional[Callable[[int, float, str, Optional[float], Optional[float]], None]] = None
    after: Optional[Callable[[ProbeRecord], None]] = None
    records: List[ProbeRecord] = field(default_factory=list)
    probes: int = 0
    lo: Optional[float] = None
    hi: Optional[float] = None

    def budget_left(self) -> bool:
        """Whether another search probe may be made."""
        return self.probes < self.max_probes

    def probe(self, x: float, phase: str = "start") -> Verdict:
        """One search probe at ``x`` (counted against the budget); the bracket follows it."""
        self.probes += 1
        return self._call(self.probe_fn, x, phase)

    def _call(self, fn: Callable[[float], Verdict], x: float, phase: str) -> Verdict:
        index = len(self.records) + 1
        if self.before is not None:
            self.before(index, x, phase, self.lo, self.hi)
        started = time.monotonic()
        verdict = fn(x)
        record = ProbeRecord(index, x, phase, verdict, time.monotonic() - started)
        self.records.append(record)
        if self.after is not None:
            self.after(record)
        return verdict

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
               middle: Callable[[float, float], float] = midpoint) -> Bracket:
        """Halves ``bracket`` until ``finished(lo, hi)`` or the budget is spent. A bracket
        without an upper end is returned as it is."""
        lo, hi, failed = bracket.lo, bracket.hi, bracket.hi_failed
        if hi is None:
            return bracket
        while self.budget_left() and not finished(lo, hi):
            mid = middle(lo, hi)
            if not lo < mid < hi:
                break
            self.lo, self.hi = lo, hi
            if self.probe(mid, "bisect").holds:
                lo = mid
            else:
                hi, failed = mid, True
        self.lo, self.hi = lo, hi
        return Bracket(lo, hi, failed)

    def confirm(self, x: float, run: Callable[[float], Verdict], *, runs: int, attempts: int,
                down: Callable[[float], Optional[float]]) -> Confirmation:
        """Confirms ``x``: ``runs`` calls of ``run`` that must all hold (the first that does
        not ends the attempt); after a failed attempt, tries ``down(x)`` (None: nothing
        lower to try), ``attempts`` settings at most."""
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
        if c not in self.measured:
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
                           f"{self.min_gain:.0%} (--min-gain)", m.figure, m.data)
        return m

    def _holds(self, c: float, m: Verdict) -> Verdict:
        return m

    def _below(self, c: float) -> bool:
        return self._qps(c) * (1 + self.min_gain) < self.best

    def _under_knee(self, c: float, m: Verdict) -> Verdict:
        if not m.holds or self._below(c):
            return m
        return Verdict(False, f"within {self.min_gain:.0%} of the best throughput", m.figure, m.data)

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
