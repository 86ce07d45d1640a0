"""MLPerf's test modes around the native issue loop: accuracy, performance, peak search.

Each mode loads the QSL sets it needs, runs the :class:`~loadgen.mlperf.session.Session`
over them, and unloads them again.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ..units import NS_PER

from .. import _core
from ..peak.search import Search, Verdict, relative_finish
from .effective import EffectiveSettings
from .evaluate import evaluate
from .figures import RunFigures
from .run_options import options
from .session import Session
from .settings import TestScenario

__all__ = ["run_accuracy", "run_find_peak", "run_performance"]


def _performance_set(test: Session, eff: EffectiveSettings) -> tuple[list, int]:
    sets = _loadable_sets(test, eff, int(eff.performance_sample_count))
    if not sets:
        raise ValueError("the QSL has no samples to load (total_sample_count is 0)")
    return sets[0]


def _loadable_sets(
    test: Session, eff: EffectiveSettings, total: int
) -> list[tuple[list, int]]:
    set_size = int(eff.performance_sample_count)
    if set_size < 1:
        raise ValueError(
            "performance_sample_count is 0: give the QSL a performance sample count "
            "or set TestSettings.performance_sample_count_override"
        )
    padding = (
        int(eff.samples_per_query) - 1
        if int(eff.scenario) == int(TestScenario.MultiStream)
        else 0
    )
    sets = _core.mlperf_loadable_sets(
        total_sample_count=total,
        qsl_total_count=test.qsl.total_sample_count,
        set_size=set_size,
        padding=padding,
        qsl_rng_seed=int(eff.qsl_rng_seed),
    )
    return [(s, len(s) - padding) for s in sets]


def run_performance(test: Session, eff: EffectiveSettings) -> None:
    loaded, end = _performance_set(test, eff)
    test.load(loaded)
    fig = test.run_once(eff, loaded, end, accuracy=False)
    test.report(eff, fig)
    test.unload(loaded)


def run_accuracy(test: Session, eff: EffectiveSettings) -> None:
    for loaded, end in _loadable_sets(test, eff, int(eff.accuracy_sample_count)):
        test.load(loaded)
        test.run_once(eff, loaded, end, accuracy=True)
        test.unload(loaded)


def _with_qps(eff: EffectiveSettings, qps: float, **changes: Any) -> EffectiveSettings:
    return replace(eff, target_qps=float(qps), **changes)


def _perf_constraints_met(eff: EffectiveSettings, fig: RunFigures) -> bool:
    return _judge(eff, fig)[0]


def _judge(eff: EffectiveSettings, fig: RunFigures) -> tuple[bool, int]:
    """(meets the latency bound, the target-percentile sample latency in ns)."""
    ev = evaluate(eff, fig)
    return bool(ev.perf_constraints_met) and not fig.too_many_outstanding, int(
        ev.sample_latency_target_ns
    )


def run_find_peak(test: Session, eff: EffectiveSettings) -> None:
    """Highest Server QPS that meets the latency bound, confirmed at full length.

    Short probes (``options.peak_probe_min_duration_ms``) find the bounds: the user's
    server_target_qps must hold, then the rate widens by (1 + boundary step size) until a
    probe fails, then bisects until the bounds are within MLPerf's decimals of precision
    or ``options.peak_relative_precision``. Short probes are optimistic (queues have
    little time to build), so the answer is run again at the full min duration, and
    lowered until such a run holds; only a rate that held at full length is reported.
    """
    if int(eff.scenario) != int(TestScenario.Server):
        test.detail.error(
            "error_invalid_test_settings",
            "Finding peak performance is only supported in the Server scenario.",
        )
        return
    loaded, end = _performance_set(test, eff)
    test.load(loaded)
    try:
        search = _PeakSearch(test, eff, loaded, end)
        lower = search.find_lower_bound_of_peak()
        if lower is not None:
            search.confirm(lower)
    finally:
        test.unload(loaded)


class _PeakSearch:
    """FindPeakPerformance's probes over one loaded set, searched by the shared
    :class:`~loadgen.peak.search.Search` (the one ``loadgen find-peak`` uses)."""

    def __init__(self, test: Session, eff: EffectiveSettings, loaded: list, end: int) -> None:
        self.test, self.eff, self.loaded, self.end = test, eff, loaded, end
        self.probe_ms = min(int(options.peak_probe_min_duration_ms), int(eff.min_duration_ns) // NS_PER["ms"])
        probe_ns = max(self.probe_ms, 1) * NS_PER["ms"]
        self.probe = {
            "target_duration_ns": probe_ns,
            "min_duration_ns": probe_ns,
            "min_query_count": min(int(eff.min_query_count), 64),
        }
        self.search = Search(self._probe, max_probes=int(options.peak_max_probes))
        self.probe_latency_ns: dict[float, int] = {}

    @property
    def probes(self) -> int:
        """Search probes made so far."""
        return self.search.probes

    def holds(self, qps: float) -> bool:
        """One short probe at ``qps``: does it meet the latency bound?"""
        return self.search.probe(qps).holds

    def _probe(self, qps: float) -> Verdict:
        probe_eff = _with_qps(self.eff, qps, **self.probe)
        fig = self.test.run_once(probe_eff, self.loaded, self.end, accuracy=False)
        ok, latency_ns = _judge(probe_eff, fig)
        self.probe_latency_ns.setdefault(qps, latency_ns)
        self.test.detail.log(
            "generic_message",
            f"FindPeakPerformance: probe {self.probes} at {qps:.6f} QPS "
            f"({self.probe_ms} ms): {'meets' if ok else 'misses'} the latency bound",
        )
        return Verdict(ok, figure=float(latency_ns))

    def find_lower_bound_of_peak(self) -> float | None:
        """The highest probed rate that held; None when server_target_qps itself does not."""
        test, eff, detail = self.test, self.eff, self.test.detail
        base = float(eff.target_qps)
        detail.log("generic_message", f"FindPeakPerformance: checking the lower bound {base:.6f} QPS")
        if not self.holds(base):
            # A short probe can fail by chance: the lower bound gets one full-length run,
            # and the search goes on only if that run holds.
            fig = test.run_once(eff, self.loaded, self.end, accuracy=False)
            if not _perf_constraints_met(eff, fig):
                detail.error(
                    "error_runtime",
                    "FindPeakPerformance: the initial lower bound (server_target_qps) "
                    "does not meet the performance constraints",
                )
                test.report(eff, fig)
                return None
            detail.log(
                "generic_message",
                "FindPeakPerformance: the lower bound holds at full length; searching above it",
            )
        step = float(eff.requested.server_find_peak_qps_boundary_step_size)
        if not step > 0:
            step = 1.0
        decimals = int(eff.requested.server_find_peak_qps_decimals_of_precision)
        bracket = self.search.widen(base, lambda qps: qps * (1 + step))
        upper = bracket.hi if bracket.hi is not None else bracket.lo * (1 + step)
        detail.log("generic_message", f"FindPeakPerformance: bounds [{bracket.lo:.6f}, {upper:.6f})")
        relative = relative_finish(options.peak_relative_precision)

        def finished(lo: float, hi: float) -> bool:
            # MLPerf's own rule (decimals of precision), or the relative precision.
            scale = 10.0**decimals
            return math.floor(lo * scale) + 1 >= math.floor(hi * scale) or relative(lo, hi)

        return self.search.bisect(bracket, finished).lo

    def confirm(self, candidate: float) -> None:
        """Confirms at full length, stepping down until full runs hold with room to spare."""
        test, eff, detail = self.test, self.eff, self.test.detail
        bound_ns = int(eff.target_latency_ns)
        base_latency_ns = self.probe_latency_ns.get(float(eff.target_qps), bound_ns)
        ceiling_ns = int(max(options.peak_latency_headroom * bound_ns, min(bound_ns, 2 * base_latency_ns)))
        factor = 1.0 - max(5 * options.peak_relative_precision, 0.01)
        outcome = self.search.confirm(
            candidate, lambda qps: self._full_length_run(qps, ceiling_ns),
            runs=max(1, int(options.peak_confirm_runs)), attempts=int(options.peak_max_confirmations),
            down=lambda qps: qps * factor,
        )
        if outcome.last is None:
            return
        if outcome.held:
            detail.log(
                "generic_message",
                f"FindPeakPerformance: Found peak performance field: {outcome.answer:.6f}",
            )
        else:
            detail.error(
                "error_runtime",
                "FindPeakPerformance: no full-length run held; "
                f"reporting the last one, at {outcome.answer:.6f} QPS",
            )
        confirm_eff, fig = outcome.last.data
        test.report(confirm_eff, fig)

    def _full_length_run(self, candidate: float, ceiling_ns: int) -> Verdict:
        confirm_eff = _with_qps(self.eff, candidate)
        fig = self.test.run_once(confirm_eff, self.loaded, self.end, accuracy=False)
        held, latency_ns = _judge(confirm_eff, fig)
        # Near capacity the tail swings from run to run (a queue that builds in one run
        # drains in the next), so a rate that passes once can fail the next time: the
        # answer must pass with room to spare.
        roomy = latency_ns <= ceiling_ns
        self.test.detail.log(
            "generic_message",
            f"FindPeakPerformance: full-length run at {candidate:.6f} QPS: "
            f"target-percentile latency {latency_ns} ns (ceiling {ceiling_ns}), "
            f"{'holds' if held and roomy else 'does not hold'}",
        )
        return Verdict(held and roomy, figure=float(latency_ns), data=(confirm_eff, fig))
