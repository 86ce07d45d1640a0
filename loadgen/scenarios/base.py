"""What every scenario shares: option defaults, engine settings, and the validity rules
that apply to any run."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple, TypeVar

from loadgen import defaults
from loadgen.engine import EngineSettings, RunResult
from loadgen.options import RunOptions
from loadgen.scenarios.diagnosis import judge_lateness, lateness_reason
from loadgen.stats.early_stopping import rank_over_bound
from loadgen.sut.spec import is_network_sut
from loadgen.units import NS_PER, ms_to_ns
from loadgen.workers import SAMPLE_STREAM, SCHEDULE_STREAM, count_share, worker_seed

__all__ = ["SCENARIO_OPTIONS", "Scenario", "common_invalid_reasons", "require"]

_T = TypeVar("_T")


def require(value: Optional[_T], flag: str) -> _T:
    """``value``, an option that :meth:`Scenario.effective` fills in; ValueError naming
    ``flag`` (like ``--latency-percentile``) when it is unset, as it is in options that
    did not go through ``effective``."""
    if value is None:
        raise ValueError(f"{flag} is unset: pass the options through Scenario.effective() first")
    return value


class Scenario:
    """A scenario. Subclasses set the class attributes and override what differs.

    Attributes:
        name: the ``--scenario`` value.
        summary: one line on what it does and what its metric means.
        mlperf: True for MLPerf's four (min duration/count and early stopping apply).
        default_percentile: the metric's percentile when ``--latency-percentile`` is unset.
        checks_overload: whether the generator-lateness rule applies (not for offline,
            where every query is due at t = 0 by design; see :mod:`loadgen.scenarios.diagnosis`).
        uses: the options of :data:`SCENARIO_OPTIONS` (those only some scenarios read)
            that this one reads; the others, given, do not apply to it.
    """

    name = ""
    summary = ""
    mlperf = False
    default_percentile = defaults.LATENCY_PERCENTILE
    checks_overload = True
    uses: Tuple[str, ...] = ()

    def effective(self, opts: RunOptions) -> RunOptions:
        """The options with this scenario's defaults filled in; raises ValueError naming
        an option this scenario needs or cannot use."""
        o = dataclasses.replace(opts)
        if o.latency_percentile is None:
            o.latency_percentile = self.default_percentile
        if o.samples_per_query is None:
            o.samples_per_query = defaults.SAMPLES_PER_QUERY
        if o.schedule_seed is None:
            o.schedule_seed = o.seed
        if o.spin_us is None:
            o.spin_us = defaults.NETWORK_SPIN_US if is_network_sut(o.sut) else defaults.SPIN_US
        if o.sample_seed is None:
            o.sample_seed = defaults.sample_seed_of(o.seed)
        if o.ramp_up_s is None:
            o.ramp_up_s = self.default_ramp_up_s(o)
        if self.mlperf:
            if o.min_duration_s is None:
                o.min_duration_s = defaults.MLPERF_MIN_DURATION_S
            if o.min_query_count is None:
                o.min_query_count = defaults.MLPERF_MIN_QUERY_COUNT
        else:
            o.min_duration_s = o.min_duration_s or 0.0
            o.min_query_count = o.min_query_count or 0
        return o

    def default_ramp_up_s(self, o: RunOptions) -> float:
        """``--ramp-up-s auto``: 0, except for a closed loop of many streams."""
        return 0.0

    def for_worker(self, opts: RunOptions) -> RunOptions:
        """The effective options of worker I of N (``--worker-index``, ``--workers``).

        Worker 0 of 1 gets :meth:`effective`, unchanged. With N > 1 the worker draws its
        own random streams: ``--schedule-seed`` and ``--sample-seed``, unless given, are
        :func:`loadgen.workers.worker_seed` of ``--seed`` and I; and it runs its share of
        the load: :meth:`worker_share` (1/N of the rate, its part of the concurrency),
        and ``--query-count`` and ``--min-query-count`` rounded up to a whole share
        (:func:`loadgen.workers.count_share`). Raises ValueError when the scenario
        cannot be shared."""
        if opts.workers <= 1:
            return self.effective(opts)
        index, count = opts.worker_index or 0, opts.workers
        seeded = dataclasses.replace(
            opts,
            schedule_seed=(worker_seed(opts.seed, index, SCHEDULE_STREAM)
                           if opts.schedule_seed is None else opts.schedule_seed),
            sample_seed=(worker_seed(opts.seed, index, SAMPLE_STREAM)
                         if opts.sample_seed is None else opts.sample_seed),
        )
        o = self.worker_share(self.effective(seeded), index, count)
        o.query_count = count_share(o.query_count, count)
        o.min_query_count = count_share(o.min_query_count, count)
        return o

    #: Why this scenario cannot be shared by several workers ("" when it can).
    unshared = "it has no rule for sharing its load"

    def worker_share(self, o: RunOptions, index: int, count: int) -> RunOptions:
        """Worker ``index`` of ``count``'s share of the effective options ``o`` (the
        rate or concurrency; :meth:`for_worker` does seeds and query counts). Raises
        ValueError, saying why, for a scenario that cannot be shared."""
        raise ValueError(f"the {self.name} scenario cannot be shared by --workers {count}: {self.unshared}; "
                         "run it with one worker")

    def engine_settings(self, o: RunOptions) -> EngineSettings:
        """Engine settings for the effective options ``o``."""
        raise NotImplementedError

    def base_settings(self, o: RunOptions, **kw: Any) -> EngineSettings:
        """The engine settings every scenario shares, from the options; ``kw`` adds or
        overrides (the scenario's own)."""
        kw.update(slo_settings(o))
        return EngineSettings(
            samples_per_query=require(o.samples_per_query, "--samples-per-query"),
            sample_count=o.sample_count,
            sample_order=o.sample_order,
            schedule_seed=require(o.schedule_seed, "--schedule-seed"),
            sample_seed=require(o.sample_seed, "--sample-seed"),
            spin_us=require(o.spin_us, "--spin-us"),
            pin_cpus=tuple(o.pin_cpus),
            timeout_ms=o.timeout_ms,
            grace_s=o.grace_s,
            warmup_s=o.warmup_s,
            ramp_up_s=o.ramp_up_s or 0.0,
            sched_slice_us=o.sched_slice_us,
            interval_s=o.interval_s,
            significant_figures=o.significant_figures,
            inline_dispatch=o.inline_dispatch,
            latency_bounds_ns=latency_bounds_ns(o),
            **kw,
        )

    def metric(self, result: RunResult, o: RunOptions) -> Dict[str, Any]:
        """The headline figure: {"name", "value", "unit"}."""
        return {"name": "completed_qps", "value": result.completed_qps, "unit": "queries/s"}

    def invalid_reasons(self, result: RunResult, o: RunOptions) -> List[str]:
        """Reasons specific to this scenario (the common ones are added by the caller)."""
        return []

    def early_stopping(self, result: RunResult, o: RunOptions) -> Optional[Dict[str, Any]]:
        return None

    def measured_duration_s(self, result: RunResult) -> float:
        """The duration the minimum-duration rule checks: how long queries were issued."""
        return result.issue_duration_s


#: The options only some scenarios read (:attr:`Scenario.uses`); every other option
#: applies to every scenario.
SCENARIO_OPTIONS = ("target_qps", "concurrency", "ramp_up_s", "max_in_flight", "stages", "ramp", "poisson_arrivals", "burstiness",
                    "trace", "trace_unit", "min_duration_s", "min_query_count")


def latency_bounds_ns(o: RunOptions) -> Tuple[int, ...]:
    """The latency bounds the engine counts exactly for these options: ``--latency-bound-ms``
    when set (``RunResult.over_bound[0]``), else none."""
    return (ms_to_ns(o.latency_bound_ms),) if o.latency_bound_ms is not None else ()


def slo_settings(o: RunOptions) -> Dict[str, Any]:
    """The engine's SLO fields (slo_latency_ns, slo_ttft_ns, slo_tpot_ns) for ``--slo``."""
    from loadgen.results.goodput import parse_slos

    return {f"slo_{name}_ns": ns for name, ns in parse_slos(o.slo).items()}


def percentile_over_bound(count: int, over: int, percentile: float) -> bool:
    """Whether the ``percentile`` latency of ``count`` latencies is above a bound that
    ``over`` of them exceed: exact, from the engine's over-bound count. The percentile is
    the latency of rank ``max(1, round(count * percentile / 100))``, the rank the
    histogram's percentiles use, so it is over the bound when more latencies exceed the
    bound than lie above that rank."""
    return rank_over_bound(count, over, int(count * percentile / 100.0 + 0.5))


def _ms(ns: float) -> str:
    return f"{ns / NS_PER['ms']:.3f} ms"


def common_invalid_reasons(scenario: Scenario, result: RunResult, o: RunOptions,
                           interrupted: bool) -> List[str]:
    """The rules every run is held to, as sentences."""
    reasons: List[str] = []
    c = result.counts
    if interrupted:
        reasons.append("the run was interrupted before it finished; its figures are partial")
    resolved = c["completed"] + c["failed"] + c["timed_out"] + c["cancelled"]
    if resolved != c["issued"] or c.get("outstanding", 0):
        reasons.append(
            f"queries were lost: {c['issued']} issued but {resolved} accounted for "
            f"(completed + failed + timed out + cancelled)"
        )
    if c["cancelled"] and not interrupted:
        reasons.append(
            f"{c['cancelled']} queries were still outstanding {o.grace_s:g} s after the last was "
            f"issued and were cancelled; the SUT did not keep up (raise --grace-s to wait longer)"
        )
    if c["issued"]:
        errors = c["failed"] + c["timed_out"]
        rate = errors / c["issued"]
        if errors and rate > o.max_error_rate:
            reasons.append(
                f"{c['failed']} queries failed and {c['timed_out']} timed out ({rate:.2%} of "
                f"{c['issued']}), above the allowed {o.max_error_rate:.2%} (--max-error-rate)"
            )
    else:
        reasons.append("no query was issued")
    if scenario.mlperf:
        measured = scenario.measured_duration_s(result)
        min_duration_s = require(o.min_duration_s, "--min-duration-s")
        min_query_count = require(o.min_query_count, "--min-query-count")
        if measured < min_duration_s and not interrupted:
            reasons.append(
                f"too short: the run measured {measured:.2f} s, less than the minimum "
                f"{min_duration_s:g} s (--min-duration-s)"
                + ("; raise --target-qps (the expected rate) so more samples are issued"
                   if scenario.name == "offline" else "")
            )
        if c["issued"] < min_query_count:
            reasons.append(
                f"too few queries: {c['issued']} issued, fewer than the minimum "
                f"{min_query_count} (--min-query-count)"
            )
    reasons += _bound_reasons(result, o)
    reasons += _out_of_range_reasons(c)
    reasons += _stray_completion_reasons(c)
    if scenario.checks_overload and result.issue_delay.total_count:
        reasons += _lateness_reasons(result, o)
    return reasons


def _lateness_reasons(result: RunResult, o: RunOptions) -> List[str]:
    """The generator's lateness, judged by :func:`loadgen.scenarios.diagnosis.judge_lateness`:
    invalid only where it fell short of the schedule or is a material part of latency."""
    lateness = judge_lateness(
        issue_delay_p99_ns=result.issue_delay.value_at_percentile(99),
        latency_p99_ns=result.latency.value_at_percentile(99) if result.latency.total_count else 0,
        issue_duration_s=result.issue_duration_s, points=result.timeseries,
        open_loop=result.settings.mode not in ("closed", "offline"), max_issue_delay_ms=o.max_issue_delay_ms,
        max_lateness_share=o.max_lateness_share)
    if not lateness.invalid:
        return []
    return [lateness_reason(lateness, o.max_issue_delay_ms, o.max_lateness_share, result.counts.get("cap_waits", 0))]


def _bound_reasons(result: RunResult, o: RunOptions) -> List[str]:
    """The latency bound, judged on the engine's exact count of latencies over it."""
    count = result.latency.total_count
    if o.latency_bound_ms is None or not count or not result.over_bound:
        return []
    over = result.over_bound[0]
    percentile = require(o.latency_percentile, "--latency-percentile")
    if not percentile_over_bound(count, over, percentile):
        return []
    return [
        f"latency bound missed: p{percentile:g} latency is "
        f"{_ms(result.latency.value_at_percentile(percentile))}, above the bound of "
        f"{o.latency_bound_ms:g} ms ({over} of {count} latencies, {over / count:.2%}, were over it)"
    ]


def _stray_completion_reasons(c: Dict[str, int]) -> List[str]:
    """Completions (or failures) the SUT reported for queries it had already resolved, or
    for ids it was never given: its accounting of queries is wrong, and so may be its
    counts. (One for a query that had timed out or been cancelled is late, not wrong.)"""
    duplicate, unknown = c.get("duplicate_completions", 0), c.get("unknown_completions", 0)
    what = []
    if duplicate:
        what.append(f"{duplicate:,} duplicate completions (of queries it had already completed or failed)")
    if unknown:
        what.append(f"{unknown:,} unknown completions (of ids it was never given)")
    if not what:
        return []
    return [f"the SUT reported {' and '.join(what)}: each query must end exactly once, by the id it "
            "was issued with"]


def _out_of_range_reasons(c: Dict[str, int]) -> List[str]:
    """Completions (or first tokens) whose times could not be recorded: the SUT reported
    a time before the query was scheduled or issued, or one beyond the histograms' range."""
    reasons: List[str] = []
    n = c.get("out_of_range", 0)
    if n:
        low, high = c.get("out_of_range_min_ns", 0), c.get("out_of_range_max_ns", 0)
        what = []
        if low < 0:
            what.append(f"as early as {_ms(-low)} before the scheduled time")
        if high > 0:
            what.append(f"as late as {high / NS_PER['s']:.6g} s after it")
        reasons.append(
            f"{n} completions reported times the latency histograms cannot hold "
            f"({' and '.join(what) or 'before the query was issued'}); their latencies are "
            "not in the figures: check the completion times the SUT reports"
        )
    n = c.get("first_token_out_of_range", 0)
    if n:
        reasons.append(
            f"{n} first tokens were reported before their query was scheduled, after it "
            "completed, or beyond the histograms' range; their TTFT and TPOT are not in the figures"
        )
    return reasons
