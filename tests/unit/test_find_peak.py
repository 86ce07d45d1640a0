"""``loadgen find-peak`` and the search it shares with loadgen.mlperf's FindPeakPerformance.

First the search itself (``loadgen.peak.search``) on synthetic probe functions: a known
threshold, noisy verdicts near it, the step-down of a failed confirmation, the probe
budget, and the stability rule of concurrency probes on synthetic window series. Then
real searches: the demo SUT (whose capacity is known: workers / service time) over a rate
and over a concurrency, a real MLServer over KServe v2 REST, and the scripted streaming
server (OpenAI, known TTFT and inter-token gaps); the answer run again as a plain
``loadgen run``; usage errors, a search without an answer, and Ctrl-C.

The tests that start processes or servers are in tests/integration/test_find_peak.py.
"""

from __future__ import annotations

import math
import random
from typing import Any, Dict, List, Tuple

import pytest

from loadgen.peak.criteria import judge_run
from loadgen.peak.driver import PeakSearch, PeakSettings, default_start, windows_done
from loadgen.peak.report import render_peak
from loadgen.peak.search import (
    Bracket,
    BudgetSpent,
    Knee,
    Search,
    Undecided,
    Verdict,
    integer_midpoint,
    relative_finish,
    stable,
)

# ============================================================ the search, synthetic


def threshold_probe(threshold: float, calls: List[float]):
    def probe(x: float) -> Verdict:
        calls.append(x)
        return Verdict(x <= threshold, "" if x <= threshold else "over the threshold")
    return probe


def search_to_answer(probe, start: float, growth: float, precision: float, max_probes: int = 30):
    search = Search(probe, max_probes=max_probes)
    assert search.probe(start).holds
    bracket = search.widen(start, lambda x: x * growth)
    return search, search.bisect(bracket, relative_finish(precision))


@pytest.mark.parametrize("threshold", [1.0, 37.5, 1234.0, 9.9e6])
def test_a_known_threshold_is_found_within_the_precision(threshold):
    calls: List[float] = []
    search, bracket = search_to_answer(threshold_probe(threshold, calls), start=1.0, growth=2.0, precision=0.05)
    assert bracket.hi_failed and bracket.hi is not None
    assert bracket.lo <= threshold < bracket.hi
    assert bracket.hi - bracket.lo <= 0.05 * bracket.lo
    assert threshold / 1.05 <= bracket.lo <= threshold
    assert search.probes == len(calls) == len(search.records)
    phases = [r.phase for r in search.records]
    assert phases[0] == "start" and set(phases[1:]) <= {"widen", "bisect"}
    # Widening doubles until the first failure; bisection never probes outside the bracket.
    widen = [r.x for r in search.records if r.phase == "widen"]
    assert widen == [2.0 ** (k + 1) for k in range(len(widen))]


def test_noisy_verdicts_near_the_edge_still_land_near_it():
    """Within 5% of the true edge a probe is a coin toss; outside it is certain. The answer
    stays within the noisy band (less the precision)."""
    edge = 1000.0

    def noisy(rng: random.Random):
        def probe(x: float) -> Verdict:
            if x < 0.95 * edge:
                return Verdict(True)
            if x > 1.05 * edge:
                return Verdict(False, "over")
            return Verdict(rng.random() < 0.5, "noise")
        return probe

    answers = set()
    for seed in range(20):
        _, bracket = search_to_answer(noisy(random.Random(seed)), start=10.0, growth=2.0, precision=0.02)
        assert 0.95 * edge / 1.02 <= bracket.lo <= 1.05 * edge, (seed, bracket)
        answers.add(bracket.lo)
    assert len(answers) > 1  # the noise did reach the search


def test_a_failed_confirmation_steps_the_answer_down_until_runs_hold():
    calls: List[Tuple[str, float]] = []

    def confirm(x: float) -> Verdict:
        calls.append(("confirm", x))
        return Verdict(x <= 900.0, "too high")

    search = Search(lambda x: Verdict(True), max_probes=5)
    outcome = search.confirm(1000.0, confirm, runs=2, attempts=5, down=lambda x: x * 0.95)
    # 1000 and 950 fail at their first run (which ends the attempt); 902.5 fails; 857.4 holds twice.
    assert outcome.held
    assert outcome.answer == pytest.approx(1000 * 0.95**3)
    assert outcome.attempts == 4
    assert [x for _, x in calls] == pytest.approx([1000.0, 950.0, 902.5, 857.375, 857.375])
    assert all(r.phase == "confirm" for r in search.records) and search.probes == 0


def test_confirmation_gives_up_after_its_attempts_or_when_nothing_is_lower():
    search = Search(lambda x: Verdict(True), max_probes=5)
    never = search.confirm(100.0, lambda x: Verdict(False, "no"), runs=3, attempts=3, down=lambda x: x - 10)
    assert not never.held and never.attempts == 3 and never.answer == 80.0
    assert len(search.records) == 3  # the first failing run of each attempt ends it
    floor = search.confirm(2.0, lambda x: Verdict(False, "no"), runs=1, attempts=10,
                           down=lambda x: x - 1 if x > 1 else None)
    assert not floor.held and floor.answer == 1.0 and floor.attempts == 2


def test_the_probe_budget_bounds_the_search():
    calls: List[float] = []
    search = Search(threshold_probe(1e9, calls), max_probes=4)
    search.probe(1.0)
    bracket = search.widen(1.0, lambda x: x * 2)
    assert calls == [1.0, 2.0, 4.0, 8.0] and search.probes == 4
    # The budget ran out before anything failed: hi is the next setting, never probed.
    assert bracket == Bracket(8.0, 16.0, False)
    assert search.bisect(bracket, relative_finish(0.05)) == bracket and len(calls) == 4
    # And it bounds bisection too.
    calls2: List[float] = []
    s2 = Search(threshold_probe(100.0, calls2), max_probes=6)
    s2.probe(1.0)
    b2 = s2.bisect(s2.widen(1.0, lambda x: x * 1000), relative_finish(1e-9))
    assert len(calls2) == 6 and b2.lo <= 100.0 < b2.hi  # type: ignore[operator]


def test_an_extra_finish_rule_ends_bisection_early():
    """MLPerf's decimals-of-precision rule is passed in beside the relative precision."""
    calls: List[float] = []
    search = Search(threshold_probe(12.34, calls), max_probes=50)
    search.probe(1.0)
    bracket = search.widen(1.0, lambda x: x * 2)
    relative = relative_finish(1e-9)
    done = search.bisect(bracket, lambda lo, hi: int(lo) + 1 >= int(hi) or relative(lo, hi))
    assert int(done.lo) + 1 >= int(done.hi)  # type: ignore[arg-type]
    assert len(calls) < 12


def test_integer_bisection_of_concurrencies():
    calls: List[float] = []
    search = Search(threshold_probe(23, calls), max_probes=30)
    search.probe(1.0)
    bracket = search.widen(1.0, lambda c: c * 2)
    done = search.bisect(bracket, relative_finish(0.0, step=1.0), integer_midpoint)
    assert (done.lo, done.hi) == (23.0, 24.0)
    assert all(float(x).is_integer() for x in calls)


def knee_search(throughput, holds=lambda c: True, max_probes: int = 30, start: float = 1.0):
    """Knee.find over a synthetic throughput curve; (answer, the Search, measured settings)."""
    measured: List[float] = []

    def measure(c: float) -> Verdict:
        measured.append(c)
        ok = holds(c)
        return Verdict(ok, "" if ok else "latency bound missed", throughput(c))

    knee = Knee(measure, min_gain=0.05)
    search = Search(knee.probe, max_probes=max_probes)
    found = knee.find(search, start, lambda c: float(max(c + 1, math.ceil(c * 2))), relative_finish(0.05, 1.0))
    return found, search, measured


def test_the_knee_is_where_throughput_stops_growing():
    found, search, measured = knee_search(lambda c: 500.0 * min(c, 6))
    assert found is not None and found.answer == 6 and found.reason.startswith("gain flattened"), found
    assert measured[:5] == [1, 2, 4, 8, 16] and len(measured) == len(set(measured)) == search.probes
    assert (found.bracket.lo, found.bracket.hi) == (5, 6)


def test_a_plateau_measured_lower_at_its_end_still_gives_the_knee():
    """Noise on the plateau: 16 measured below 8, so it is 'below' the best of the plateau,
    but past it; the knee is still searched below the first concurrency on the plateau."""
    noisy = {8: 2968.0, 16: 2808.0}
    found, _, _ = knee_search(lambda c: noisy.get(c, 500.0 * min(c, 6)))
    assert found is not None and found.answer == 6, found


def test_the_knee_is_the_last_concurrency_that_holds_when_the_bound_breaks_first():
    found, _, measured = knee_search(lambda c: 100.0 * c, holds=lambda c: c <= 11)
    assert found is not None and found.answer == 11
    assert found.reason == "concurrency 12 does not hold: latency bound missed"
    assert measured[:5] == [1, 2, 4, 8, 16]


def test_the_knee_at_the_start_and_without_budget():
    found, _, _ = knee_search(lambda c: 1000.0, start=4)
    assert found is not None and found.answer == 4 and "already reaches 1,000.0" in found.reason
    found, search, _ = knee_search(lambda c: 100.0 * c, max_probes=3)
    assert found is not None and found.answer == 4 and "budget ran out" in found.reason and search.probes == 3
    none, _, measured = knee_search(lambda c: 100.0, holds=lambda c: False)
    assert none is None and measured == [1]


def windows(qps: List[float], p99_ms: List[float], length_s: float = 0.2) -> List[Dict[str, Any]]:
    return [{"length_s": length_s, "qps": q, "p99_ns": p * 1e6} for q, p in zip(qps, p99_ms)]


def test_the_stability_rule_on_window_series():
    assert stable([100, 50, 98, 101, 99], 3, 0.10)
    assert not stable([100, 120, 90], 3, 0.10)
    assert not stable([100, 100], 3, 0.10)
    assert stable([0.0, 0.0, 0.0], 3, 0.1)
    settings = PeakSettings(over="concurrency", probe_s=0.6, stability=0.1)  # windows of 0.2 s
    # Long enough and steady: done.
    assert windows_done(windows([500, 1000, 1010, 990], [3, 2, 2.1, 2.05]), settings)
    # Throughput steady but the p99 swings: not done (the probe is extended).
    assert not windows_done(windows([1000, 1010, 990], [2, 4, 2]), settings)
    # Steady, but shorter than probe_s: not done.
    assert not windows_done(windows([1000, 1000, 1000], [2, 2, 2], length_s=0.15), settings)
    # A run's last, cut-short entry is not a window: it neither counts nor breaks stability.
    assert windows_done(windows([1000, 1000, 1000], [2, 2, 2]) + windows([10], [50], 0.01), settings)
    assert not windows_done(windows([1000, 1000], [2, 2]) + windows([1000], [2], 0.01), settings)


def test_settings_are_checked_with_the_flag_named():
    for kwargs, flag in (({"precision": 0}, "--precision"), ({"growth": 1.0}, "--growth"),
                         ({"probe_s": float("nan")}, "--probe-s"), ({"over": "latency"}, "--over"),
                         ({"over": "concurrency", "start": 2.5}, "--start"), ({"max_windows": 2}, "--max-windows"),
                         ({"confirm_runs": 0}, "--confirm-runs")):
        with pytest.raises(ValueError, match=flag):
            PeakSettings(**kwargs).check()
    assert default_start(PeakSettings(), 10.0) == 50.0  # 1 / (2 x 10 ms)
    assert default_start(PeakSettings(probe_s=1.0), 1000.0) == 100.0  # at least 100 queries a probe
    assert default_start(PeakSettings(over="concurrency"), None) == 1.0


# ============================================================ a search that holds on a busy machine
#
# The search only sees probe(x) -> Verdict: these drive it with scripted verdicts, and the
# find-peak driver with scripted result documents (run_benchmark replaced), so nothing here
# depends on the machine's speed or on a thread waking on time.


def busy_generator_probe(capacity: float, flaky: Dict[float, int], calls: List[float]):
    """Holds up to ``capacity``; at each setting of ``flaky`` the first N calls fail for
    the generator (inconclusive), as on a busy machine."""
    def probe(x: float) -> Verdict:
        calls.append(x)
        if flaky.get(x, 0) > 0:
            flaky[x] -= 1
            return Verdict(False, "generator overload: p99 issue delay is 40.000 ms", inconclusive=True)
        return Verdict(x <= capacity, "" if x <= capacity else "latency bound missed")
    return probe


def test_a_probe_failed_by_the_generator_is_retried_and_never_taken_for_the_limit():
    calls: List[float] = []
    search = Search(busy_generator_probe(1000.0, {40.0: 2}, calls), max_probes=30, retries=2)
    assert search.probe(10.0).holds
    bracket = search.bisect(search.widen(10.0, lambda x: x * 2), relative_finish(0.05))
    # 40 failed twice for the generator and held on its third try: the search went on past it.
    assert calls.count(40.0) == 3 and [r.attempt for r in search.records if r.x == 40.0] == [1, 2, 3]
    assert 1000 / 1.05 <= bracket.lo <= 1000 < bracket.hi  # type: ignore[operator]
    assert search.deciding_failure(bracket.lo).verdict.why == "latency bound missed"  # type: ignore[union-attr]
    assert all(not r.verdict.fails for r in search.records if r.x <= 1000)


def test_a_setting_the_generator_never_offers_ends_the_search_undecided():
    calls: List[float] = []
    search = Search(busy_generator_probe(1e9, {80.0: 99}, calls), max_probes=30, retries=2)
    search.probe(10.0)
    with pytest.raises(Undecided) as e:
        search.widen(10.0, lambda x: x * 2)
    assert e.value.tries == 3 and e.value.record.x == 80.0 and calls == [10.0, 20.0, 40.0, 80.0, 80.0, 80.0]
    assert "generator overload" in str(e.value)
    assert search.held_below(80.0) == 40.0  # the lower bound the search reports
    assert search.failures() == []  # no try at 80 counts as the SUT failing


def test_a_failure_near_the_highest_held_setting_is_rechecked_once_and_the_recheck_decides():
    """A stall fails 979.6875 once: rechecked (it is within 20% of 950, which held), it
    holds, and the first failure no longer counts. 1,900, far above, is not rechecked;
    1,068.75, near, fails twice (it is over the edge)."""
    flips = {979.6875: 1}
    calls: List[float] = []

    def probe(x: float) -> Verdict:
        calls.append(x)
        if flips.get(x, 0):
            flips[x] -= 1
            return Verdict(False, "a stall")
        return Verdict(x <= 1000, "" if x <= 1000 else "latency bound missed")

    search = Search(probe, max_probes=30, recheck_within=0.2)
    search.probe(950.0)
    bracket = search.bisect(search.widen(950.0, lambda x: x * 2), relative_finish(0.02))
    assert calls.count(1900.0) == 1 and calls.count(979.6875) == 2 and calls.count(1068.75) == 2
    assert 979.6875 <= bracket.lo <= 1000 < bracket.hi  # type: ignore[operator]
    assert [r.x for r in search.failures() if r.x == 979.6875] == [] and len(search.overruled) == 1
    assert search.deciding_failure(bracket.lo).verdict.why == "latency bound missed"  # type: ignore[union-attr]


def test_a_failed_confirmation_bisects_below_it_until_the_precision():
    """Short probes hold up to 1,000 (a queue has no time to build); full-length runs only
    up to 600. Five 5% step-downs from 1,000 would stop at 774; the bisection goes on."""
    full: List[float] = []

    def run(x: float) -> Verdict:
        full.append(x)
        return Verdict(x <= 600, "" if x <= 600 else f"p99 over the bound at {x:g}")

    search = Search(lambda x: Verdict(x <= 1000, "" if x <= 1000 else "over"), max_probes=40)
    search.probe(100.0)
    bracket = search.bisect(search.widen(100.0, lambda x: x * 2), relative_finish(0.05))
    outcome = search.settle(bracket.lo, run, runs=2, finished=relative_finish(0.05), down=lambda x: x / 2,
                            max_failures=5)
    assert outcome.held and 600 / 1.05 <= outcome.answer <= 600, outcome
    assert full[-2:] == [outcome.answer, outcome.answer]  # the answer's own two confirmation runs held
    failure = search.deciding_failure(outcome.answer)
    assert failure is not None and failure.x > outcome.answer and failure.x <= outcome.answer * 1.05 + 1e-9
    assert failure.verdict.why == f"p99 over the bound at {failure.x:g}"
    assert outcome.attempts <= 3 and len(full) < 15


def test_a_failed_confirmation_with_nothing_held_below_steps_down_until_one_holds():
    """800 (the start) fails its confirmation; 400 and 200 fail, 100 holds: the bracket is
    [100, 200), never above 200, which failed."""
    full: List[float] = []

    def run(x: float) -> Verdict:
        full.append(x)
        return Verdict(x <= 150, "over")

    search = Search(lambda x: Verdict(True), max_probes=20)
    search.probe(800.0)
    outcome = search.settle(800.0, run, runs=1, finished=relative_finish(0.1), down=lambda x: x / 2, max_failures=5)
    assert outcome.held and 150 / 1.1 <= outcome.answer <= 150
    assert full[:4] == [800.0, 400.0, 200.0, 100.0] and all(x < 200 for x in full[4:]), full


def test_the_time_budget_ends_the_search_with_a_clear_message():
    now = [0.0]

    def probe(x: float) -> Verdict:
        now[0] += 10.0  # each probe takes 10 s on the search's clock
        return Verdict(True)

    search = Search(probe, max_probes=100, max_time_s=35.0, clock=lambda: now[0])
    search.probe(1.0)
    with pytest.raises(BudgetSpent, match=r"the time budget of 35 s ran out after 4 runs"):
        search.widen(1.0, lambda x: x * 2)
    assert len(search.records) == 4


def document(x: float, *, duration_s: float = 1.0, reasons: Any = (), p99_ms: float = 5.0, qps: Any = None,
             thresholds: Any = (), goodput: Any = None, diagnosis: Any = None,
             timeseries: Any = None, warnings: Any = ()) -> Dict[str, Any]:
    """A result document as find-peak reads it, built by hand."""
    doc: Dict[str, Any] = {
        "schema": "loadgen.result/1", "valid": not reasons, "interrupted": False, "invalid_reasons": list(reasons),
        "settings": {"effective": {"latency_percentile": 99.0}},
        "counts": {"issued": 100, "completed": 100, "failed": 0, "timed_out": 0},
        "latency_ns": {"count": 100, "p99": int(p99_ms * 1e6)},
        "throughput": {"completed_qps": float(x if qps is None else qps), "target_qps": x},
        "duration_s": duration_s, "thresholds": list(thresholds), "timeseries": timeseries or [],
        "warnings": list(warnings),
    }
    if goodput is not None:
        doc["goodput"] = goodput
    if diagnosis is not None:
        doc["diagnosis"] = diagnosis
    return doc


LATE = "generator overload: p99 issue delay is 40.000 ms, above 1 ms (--max-issue-delay-ms)"
MISSED = "latency bound missed: p99 latency is 41.000 ms, above the bound of 20 ms (30 of 100 latencies)"


def test_a_run_is_judged_from_its_document():
    assert judge_run(document(1)).holds
    # The generator alone: inconclusive, from the diagnosis or (documents without one) the reason.
    for doc in (document(1, reasons=[LATE]),
                document(1, reasons=["the generator fell behind"],
                         diagnosis={"cause": "generator", "invalid": True, "summary": "CPU starved", "evidence": {}}),
                document(1, reasons=["connections ran out"],
                         diagnosis={"cause": "client", "invalid": True, "summary": "the client ran out", "evidence": {}})):
        j = judge_run(doc)
        assert not j.holds and j.inconclusive and j.cause in ("generator", "client"), doc
    assert judge_run(document(1, reasons=["x"], diagnosis={"cause": "client", "invalid": True,
                                                          "summary": "the client ran out"})).why == "the client ran out"
    # The SUT missed a criterion too: a failure of the SUT, whatever the generator did.
    j = judge_run(document(1, reasons=[LATE, MISSED]))
    assert not j.holds and not j.inconclusive and j.cause == "server" and j.why == MISSED
    j = judge_run(document(1, reasons=[MISSED], diagnosis={"cause": "server", "invalid": True, "summary": "s"}))
    assert j.cause == "server" and j.why == MISSED
    # A valid run that fails a --require, or the goodput target of --slo.
    failed = {"kind": "require", "expr": "goodput_fraction>=0.95", "metric": "goodput_fraction", "actual": 0.81,
              "threshold": 0.95, "passed": False}
    j = judge_run(document(1, thresholds=[failed]))
    assert not j.holds and not j.inconclusive and j.why == "goodput_fraction 0.81 below --require goodput_fraction>=0.95"
    fail_if = {"kind": "fail_if", "expr": "p99>20ms", "metric": "p99", "actual": 41e6, "threshold": 20e6,
               "passed": False}
    assert judge_run(document(1, thresholds=[fail_if])).why == "p99 41.000 ms: --fail-if p99>20ms holds"
    goodput = {"slos": ["ttft<=200000000ns"], "fraction": 0.9, "met": 90, "of": 100, "requests_per_s": 90.0}
    j = judge_run(document(1, goodput=goodput), goodput_fraction=0.95)
    assert not j.holds and "goodput 0.9 of requests met every SLO" in j.why and "--min-goodput 0.95" in j.why
    assert judge_run(document(1, goodput=goodput), goodput_fraction=0.9).holds
    # Within the bound, but the server did not keep up: its backlog grew over the run.
    grew = {"name": "server_saturated", "message": "the server saturated: outstanding queries grew from 3 to 740"}
    j = judge_run(document(1, warnings=[grew]))
    assert not j.holds and not j.inconclusive and j.cause == "server" and "grew from 3 to 740" in j.why
    # A failed threshold beside a late generator: the SUT's verdict.
    assert judge_run(document(1, reasons=[LATE], thresholds=[failed])).cause == "server"
    # A bound missed beside a late generator: the lateness explains a p99 of 41 ms when the
    # p99 issue delay is 30 ms (41 - 30 <= 20), not when it is 10 ms.
    late = document(1, reasons=[LATE, MISSED], p99_ms=41.0)
    late["issue_delay_ns"] = {"p99": 30_000_000}
    j = judge_run(late, percentile=99.0, latency_bound_ms=20.0)
    assert j.inconclusive and j.cause == "generator", j
    late["issue_delay_ns"] = {"p99": 10_000_000}
    j = judge_run(late, percentile=99.0, latency_bound_ms=20.0)
    assert not j.inconclusive and j.why == MISSED


class Scripted:
    """find-peak's runs replaced by ``script(options) -> document``; each run's setting
    and length kept in ``runs``."""

    def __init__(self, monkeypatch: Any, script: Any) -> None:
        import loadgen.runner as runner

        self.script, self.runs = script, []  # type: ignore[var-annotated]
        monkeypatch.setattr(runner, "prepare", lambda options: None)
        monkeypatch.setattr(runner, "run_benchmark", self._run)

    def _run(self, options: Any, **kwargs: Any) -> Dict[str, Any]:
        x = options.target_qps if options.concurrency is None or options.scenario != "concurrency" else options.concurrency
        self.runs.append((x, options.duration_s))
        return self.script(options)


def scripted_search(monkeypatch: Any, script: Any, flags: Dict[str, str], **settings: Any):
    """A find-peak search over scripted runs: (final document, progress lines, rendered text)."""
    from loadgen.options import resolve

    Scripted(monkeypatch, script)
    options, given = resolve(flags, {})
    lines: List[str] = []
    search = PeakSearch(options, PeakSettings(**settings), given)
    doc = search.run(say=lines.append)
    return doc, lines, render_peak(doc)


def rate_script(probe_capacity: float, full_capacity: float, late: Dict[float, int] = None):  # type: ignore[assignment]
    """Probes (0.5 s) hold up to probe_capacity, full-length runs (2 s) up to
    full_capacity; the settings in ``late`` fail for the generator their first N times."""
    late = dict(late or {})

    def script(o: Any) -> Dict[str, Any]:
        x, length = o.target_qps, o.duration_s
        if late.get(x, 0) > 0:
            late[x] -= 1
            return document(x, duration_s=length, reasons=[LATE])
        capacity = full_capacity if length >= 2 else probe_capacity
        if x <= capacity:
            return document(x, duration_s=length, p99_ms=10.0)
        return document(x, duration_s=length, p99_ms=41.0,
                        reasons=[f"latency bound missed: p99 latency is 41.000 ms, above the bound of 20 ms "
                                 f"(at {x:g})"])
    return script


RATE_FLAGS = {"scenario": "poisson", "sut": "null", "latency_bound_ms": "20", "duration_s": "2"}


def test_find_peak_retries_a_generator_failure_and_says_so(monkeypatch):
    doc, lines, text = scripted_search(monkeypatch, rate_script(1000, 1000, late={400.0: 1}), RATE_FLAGS,
                                       start=100, probe_s=0.5, precision=0.05)
    peak = doc["peak"]
    assert peak["confirmed"] and 1000 / 1.05 <= peak["answer"] <= 1000, peak["reason"]
    at_400 = [r for r in peak["runs"] if r["x"] == 400]
    assert [(r["outcome"], r["attempt"]) for r in at_400] == [("inconclusive", 1), ("holds", 2)]
    assert at_400[0]["cause"] == "generator" and peak["inconclusive_runs"] == 1
    assert any("not judged (generator failed, not the SUT)" in line and "trying again (2 of 3 tries)" in line
               for line in lines), lines
    assert "probe 3/30 (widen), try 2 at 400 queries/s" in "\n".join(lines)
    assert "not judged (generator): generator overload" in text


def test_find_peak_ends_saying_the_generator_could_not_offer_the_load(monkeypatch):
    """Everything above 300 queries/s is late on this machine: no peak is named, the SUT's
    lower bound is, and the command exits 3."""
    from loadgen.cli.find_peak import EXIT_GENERATOR_LIMIT, _report

    def script(o: Any) -> Dict[str, Any]:
        x = o.target_qps
        return document(x, duration_s=o.duration_s, reasons=[LATE] if x > 300 else [])

    doc, lines, text = scripted_search(monkeypatch, script, RATE_FLAGS, start=100, probe_s=0.5, retries=2)
    peak = doc["peak"]
    assert not peak["confirmed"] and peak["answer"] is None and not doc["valid"]
    assert peak["limited_by"] == "generator" and peak["lower_bound"] == 200
    assert peak["reason"].startswith("the generator could not offer 400 queries/s on this machine (3 tries: "
                                     "generator overload"), peak["reason"]
    assert "this is not the SUT's limit: the SUT held 200 queries/s, a lower bound" in peak["reason"]
    assert [r["x"] for r in peak["runs"]] == [100, 200, 400, 400, 400]
    assert "no peak: the generator could not offer" in text and "\npeak:" not in text
    assert "no tries left (--retries)" in lines[-1]
    assert _report(doc, True, True, "", None) == EXIT_GENERATOR_LIMIT == 3


def messages_about(x: float, over: str, lines: List[str], text: str) -> List[str]:
    """Every progress line and table row about setting ``x``."""
    shown = f"{x:,.0f}" if float(x).is_integer() else f"{x:g}"
    out, about = [], False
    for line in lines:
        if not line.startswith("  "):
            about = f" at {shown} " in line
        elif about:
            out.append(line)
    out += [row for row in text.splitlines() if row[:3].strip().isdigit() and row.split()[2] == shown]
    return out


def test_find_peak_bisects_below_a_failed_confirmation_and_names_the_failure_that_decided(monkeypatch):
    doc, lines, text = scripted_search(monkeypatch, rate_script(1000, 600), RATE_FLAGS, start=100, probe_s=0.5,
                                       precision=0.05)
    peak = doc["peak"]
    assert peak["confirmed"] and doc["valid"] and 600 / 1.05 <= peak["answer"] <= 600, peak["reason"]
    answer = peak["answer"]
    # The closing message names the failure just above the answer, not the first probe's.
    above = min(r["x"] for r in peak["runs"] if r["outcome"] == "fails" and r["x"] > answer)
    assert above <= answer * 1.05 + 1e-6
    assert peak["reason"].startswith(f"{above:,.3f}".rstrip("0").rstrip(".") + " queries/s does not hold")
    assert f"(at {above:g})" in peak["reason"] and "(at 1" not in peak["reason"]
    assert f"\n  {peak['reason']}\n" in text
    assert peak["bracket"] == [answer, above]
    # Bisection below used full-length runs, kept in their own folders' names.
    assert any(r.get("full_length") for r in peak["runs"]) and "(bisect, full length)" in "\n".join(lines)
    # Nothing said about the answer calls it failing.
    about = messages_about(answer, "rate", lines, text)
    assert about and not [m for m in about if "fails" in m or "does not hold" in m], about


def concurrency_script(o: Any) -> Dict[str, Any]:
    """Six workers: throughput grows 500 queries/s per query in flight up to 6."""
    c = o.concurrency
    qps = 500.0 * min(c, 6)
    windows = [{"length_s": o.interval_s, "qps": qps, "p99_ns": 3e6} for _ in range(3)]
    return document(qps, duration_s=o.duration_s, qps=qps, timeseries=windows)


def test_concurrency_messages_never_say_the_answer_fails(monkeypatch):
    doc, lines, text = scripted_search(monkeypatch, concurrency_script, {"sut": "null"}, over="concurrency",
                                       probe_s=0.3, confirm_runs=1)
    peak = doc["peak"]
    assert peak["confirmed"] and peak["answer"] == 6 and peak["reason"].startswith("gain flattened"), peak
    about = messages_about(6, "concurrency", lines, text)
    assert about and not [m for m in about if "fails" in m or "does not hold" in m], about
    assert "fails" not in text and "does not hold" not in "\n".join(lines)
    assert "holds, on the plateau: throughput within 5% of the best seen" in text


def test_concurrency_bisects_below_a_failed_confirmation(monkeypatch):
    """The knee is 6, but at full length 6 breaks the bound: the answer is 5, and the
    closing message says why 6 is not."""
    def script(o: Any) -> Dict[str, Any]:
        doc = concurrency_script(o)
        if o.duration_s >= 2 and o.concurrency >= 6:
            doc.update(valid=False, invalid_reasons=[f"latency bound missed at concurrency {o.concurrency}"])
        return doc

    doc, lines, text = scripted_search(monkeypatch, script, {"sut": "null", "latency_bound_ms": "20",
                                                             "duration_s": "2"}, over="concurrency", probe_s=0.3,
                                       confirm_runs=1)
    peak = doc["peak"]
    assert peak["confirmed"] and peak["answer"] == 5, peak
    assert peak["reason"].startswith("concurrency 6 does not hold (a confirmation run): latency bound missed")


def test_require_and_goodput_fail_a_probe(monkeypatch):
    """Every run is valid; --require on goodput fails above 500 queries/s: the answer is
    the highest rate that meets it, and the closing message says so."""
    def script(o: Any) -> Dict[str, Any]:
        x = o.target_qps
        fraction = 0.99 if x <= 500 else 0.81
        goodput = {"slos": ["latency<=20000000ns"], "fraction": fraction, "met": int(100 * fraction), "of": 100,
                   "requests_per_s": fraction * x}
        t = {"kind": "require", "expr": "goodput_fraction>=0.95", "metric": "goodput_fraction", "actual": fraction,
             "threshold": 0.95, "passed": fraction >= 0.95}
        return document(x, duration_s=o.duration_s, goodput=goodput, thresholds=[t])

    flags = {"scenario": "poisson", "sut": "null", "slo": ["latency<=20ms"], "require": ["goodput_fraction>=0.95"],
             "duration_s": "1"}
    doc, _, text = scripted_search(monkeypatch, script, flags, start=100, probe_s=0.5, precision=0.05)
    peak = doc["peak"]
    assert peak["confirmed"] and 500 / 1.05 <= peak["answer"] <= 500, peak["reason"]
    assert "goodput_fraction 0.81 below --require goodput_fraction>=0.95" in peak["reason"]
    # Without --require, --slo alone holds a run to --min-goodput (0.95 by default).
    flags = {k: v for k, v in flags.items() if k != "require"}
    doc, _, _ = scripted_search(monkeypatch, script, flags, start=100, probe_s=0.5, precision=0.05)
    assert doc["peak"]["confirmed"] and doc["peak"]["answer"] <= 500
    assert "below --min-goodput 0.95" in doc["peak"]["reason"]


# ============================================================ real searches


