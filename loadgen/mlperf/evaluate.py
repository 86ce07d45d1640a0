"""MLPerf LoadGen's verdict on one performance run, computed from what it measured.

:func:`evaluate` applies MLPerf LoadGen's validity rules (minimum duration, minimum
query and sample counts, the Server latency bound, early stopping) to a
:class:`~loadgen.mlperf.figures.RunFigures` and the effective settings; the log writers
(:mod:`.summary`, :mod:`.detail_log`) render the resulting :class:`Evaluation`.

How this differs from MLPerf LoadGen, which sorts a vector holding every latency:

- Latencies come from HDR histograms, read through
  :class:`~loadgen.stats.early_stopping.OrderStatistics`: the value reported for a rank
  is the highest value of the bucket holding it, capped at the exact largest latency
  (so the top rank is exact). The rank itself is MLPerf's: MLPerf reads
  ``sorted[int(count * p)]``, which is one rank above what HDR's ``value_at_percentile``
  reads whenever ``count * p`` is a whole number or its fraction is below one half; this
  module looks the rank up directly instead.
- "Over the latency bound" (the Server overlatency count, the percentile checks against
  ``target_latency``, TTFT and TPOT) is decided with the same reported values
  (:func:`~loadgen.stats.early_stopping.count_over`): a latency counts as over when the
  top of its bucket is over. A bucket that straddles the bound therefore counts as over,
  never as under (at 3 significant figures it spans at most 0.1% of the bound).
- Early stopping is :mod:`loadgen.stats.early_stopping`, the module ``loadgen run``
  uses; this module only words its verdicts as MLPerf does.
- Means are exact when the runtime supplies the sum of the latencies (it does for the
  sample and query latencies); the token latency means fall back to the histogram mean
  when no exact sum is available.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..units import ns_to_s

from ..stats.early_stopping import (
    CONFIDENCE,
    OrderStatistics,
    count_over,
    estimate_early_stopping,
    rank_over_bound,
    server_early_stopping,
)
from ..stats.histogram import Histogram
from .figures import RunFigures
from .number_text import cpp_divide, cpp_fixed, ms_setting_s, size_minus_one
from .settings import TestScenario

__all__ = [
    "EARLY_STOPPING_CONFIDENCE",
    "EXITED_EARLY_MESSAGE",
    "LATENCY_PERCENTILES",
    "SCENARIO_RESULT_KEYS",
    "Evaluation",
    "evaluate",
]

#: The fixed percentiles (as fractions) every MLPerf summary and detail log reports.
LATENCY_PERCENTILES: tuple[float, ...] = (0.50, 0.90, 0.95, 0.97, 0.99, 0.999)

#: Confidence of MLPerf's early-stopping test (no tolerance is applied).
EARLY_STOPPING_CONFIDENCE = CONFIDENCE

#: SingleStream also estimates this percentile, from which MultiStream can be inferred.
_SINGLE_STREAM_SECOND_PERCENTILE = 0.99

#: The detail-log key the MLPerf submission checker reads as each scenario's result.
SCENARIO_RESULT_KEYS: dict[str, str] = {
    "SingleStream": "early_stopping_latency_ss",
    "MultiStream": "early_stopping_latency_ms",
    "Server": "result_completed_samples_per_sec",
    "Offline": "result_samples_per_second",
}

#: MLPerf's recommendation when the minimum query or sample count was not met.
EXITED_EARLY_MESSAGE = "The test exited early, before enough queries were issued."

_SCENARIO_NAMES = {0: "SingleStream", 1: "MultiStream", 2: "Server", 3: "Offline"}
_MODE_NAMES = {0: "SubmissionRun", 1: "AccuracyOnly", 2: "PerformanceOnly", 3: "FindPeakPerformance"}
_STREAMS = (TestScenario.SingleStream, TestScenario.MultiStream)
_U64 = 1 << 64


# -------------------------------------------------------------------- early stopping


@dataclass
class _EarlyStoppingOutcome:
    met: bool
    text: str
    estimate_ss_ns: int | None = None
    estimate_ms_ns: int | None = None


def _stream_early_stopping(
    scenario: int, p: float, queries: int, latencies: OrderStatistics, query_latencies: OrderStatistics
) -> _EarlyStoppingOutcome:
    """SingleStream/MultiStream: the estimate (and SingleStream's p99 one), in MLPerf's words."""
    source = latencies if scenario == TestScenario.SingleStream else query_latencies
    es = estimate_early_stopping(source, queries, p, EARLY_STOPPING_CONFIDENCE)
    if not es.passed:
        return _EarlyStoppingOutcome(
            False,
            f" * Only processed {queries} queries.\n"
            f" * Need to process at least {es.min_queries} queries for early stopping.",
        )
    text = (
        f" * Processed at least {es.min_queries} queries ({queries}).\n"
        f" * Would discard {es.overlatency - 1} highest latency queries.\n"
        f" * Early stopping {cpp_fixed(p * 100, 1)}th percentile estimate: {es.estimate_ns}"
    )
    if scenario == TestScenario.MultiStream:
        return _EarlyStoppingOutcome(True, text, estimate_ms_ns=es.estimate_ns)
    second = _SINGLE_STREAM_SECOND_PERCENTILE
    second_label = cpp_fixed(second * 100, 1)
    es2 = estimate_early_stopping(latencies, queries, second, EARLY_STOPPING_CONFIDENCE)
    if not es2.passed:
        text += (
            f"\n * Not enough queries processed for {second_label}th percentile\n"
            f" early stopping estimate (would need to process at\n"
            f" least {es2.min_queries} total queries)."
        )
    else:
        text += f"\n * Early stopping {second_label}th percentile estimate: {es2.estimate_ns}"
    return _EarlyStoppingOutcome(True, text, es.estimate_ns, es2.estimate_ns)


def _server_early_stopping(p: float, queries: int, overlatency_count: int) -> _EarlyStoppingOutcome:
    """Server: the verdict on ``overlatency_count`` queries over the bound, in MLPerf's words."""
    es = server_early_stopping(
        queries=queries, overlatency_count=overlatency_count, p=p, confidence=EARLY_STOPPING_CONFIDENCE
    )
    if es.passed:
        return _EarlyStoppingOutcome(True, " * Run successful.")
    return _EarlyStoppingOutcome(
        False,
        f" * Run unsuccessful.\n * Processed {queries} queries.\n"
        f" * Would need to run at least {es.more_queries_needed} more queries,\n"
        " with the run being successful if every additional\n"
        " query were under latency.",
    )


# ------------------------------------------------------------------------ evaluation


def _zero_percentiles() -> dict[float, int]:
    return {p: 0 for p in LATENCY_PERCENTILES}


@dataclass
class Evaluation:
    """MLPerf's reading of one performance run: figures, checks and the verdict.

    Latencies are integer ns, rates per second, percentiles fractions (0.9 = 90th).

    Attributes:
        scenario_name / mode_name: MLPerf's names, e.g. ``"Server"``, ``"PerformanceOnly"``.
        valid: all four checks passed ("Result is : VALID") and every reported time was
            recorded (``unrecorded_text`` says what was not).
        min_duration_met / min_queries_met / perf_constraints_met / early_stopping_met:
            the four checks; ``min_queries_met`` covers both the query and sample minimums.
        has_perf_constraints: the scenario has a latency bound (Server).
        min_duration_recommendation / perf_constraints_recommendation: MLPerf's advice
            when that check failed, else "".
        recommendations: the advice for every failed check, in MLPerf's order.
        early_stopping_text: the "Early Stopping Result" block (lines joined by "\\n").
        early_stopping_ttft_text / early_stopping_tpot_text: the same for token runs.
        early_stopping_latency_ss_ns / early_stopping_latency_ms_ns: the early-stopping
            estimates (0 when not computed, as MLPerf logs them).
        result_key / result_value: the detail-log key the submission checker reads for
            the scenario and its value.
        metric_name / metric_value: the scenario's headline line of the summary.
        sample_count / query_count: completed samples; queries issued (0 when no sample
            completed, as MLPerf's ProcessLatencies leaves it).
        queries_issued: queries issued (used by the minimum-query and early-stopping checks).
        overlatency_query_count: Server: samples over ``target_latency``.
        target_percentile: the scenario's latency percentile (fraction).
        sample_latency_*: min, max, mean, the target percentile and the fixed percentiles.
        query_latency_*: the same per query (MultiStream only).
        token_count, first_token_*, tpot_*: token runs (``use_token_latencies``).
        qps_with_loadgen_overhead / qps_without_loadgen_overhead: SingleStream.
        scheduled_samples_per_s / completed_samples_per_s: Server.
        samples_per_s: Offline.
        tokens_per_s_*: token throughputs as the summary and detail log print them.
    """

    scenario_name: str
    mode_name: str
    valid: bool = False
    min_duration_met: bool = False
    min_queries_met: bool = False
    perf_constraints_met: bool = True
    early_stopping_met: bool = True
    unrecorded_text: str = ""
    has_perf_constraints: bool = False
    min_duration_recommendation: str = ""
    perf_constraints_recommendation: str = ""
    recommendations: list[str] = field(default_factory=list)
    early_stopping_text: str = ""
    early_stopping_ttft_text: str = ""
    early_stopping_tpot_text: str = ""
    early_stopping_latency_ss_ns: int = 0
    early_stopping_latency_ms_ns: int = 0
    result_key: str = ""
    result_value: float = 0.0
    metric_name: str = ""
    metric_value: float = 0.0
    sample_count: int = 0
    query_count: int = 0
    queries_issued: int = 0
    overlatency_query_count: int = 0
    target_percentile: float = 0.0
    sample_latency_min_ns: int = 0
    sample_latency_max_ns: int = 0
    sample_latency_mean_ns: int = 0
    sample_latency_target_ns: int = 0
    sample_latency_percentiles_ns: dict[float, int] = field(default_factory=_zero_percentiles)
    query_latency_min_ns: int = 0
    query_latency_max_ns: int = 0
    query_latency_mean_ns: int = 0
    query_latency_target_ns: int = 0
    query_latency_percentiles_ns: dict[float, int] = field(default_factory=_zero_percentiles)
    token_count: int = 0
    overlatency_first_token_count: int = 0
    first_token_min_ns: int = 0
    first_token_max_ns: int = 0
    first_token_mean_ns: int = 0
    first_token_target_ns: int = 0
    first_token_percentiles_ns: dict[float, int] = field(default_factory=_zero_percentiles)
    tpot_min_ns: int = 0
    tpot_max_ns: int = 0
    tpot_mean_ns: int = 0
    tpot_target_ns: int = 0
    tpot_percentiles_ns: dict[float, int] = field(default_factory=_zero_percentiles)
    qps_with_loadgen_overhead: float = 0.0
    qps_without_loadgen_overhead: float = 0.0
    scheduled_samples_per_s: float = 0.0
    completed_samples_per_s: float = 0.0
    samples_per_s: float = 0.0
    tokens_per_s_with_loadgen_overhead: float = 0.0
    tokens_per_s_without_loadgen_overhead: float = 0.0
    tokens_per_s_detail_throughput: float = 0.0
    completed_tokens_per_s: float = 0.0
    tokens_per_s: float = 0.0
    inferred_tokens_per_s: float = 0.0

    @property
    def result_validity(self) -> str:
        """``"VALID"`` or ``"INVALID"``."""
        return "VALID" if self.valid else "INVALID"


def _unrecorded_text(fig: RunFigures) -> str:
    """Why the run is invalid when the SUT reported times the histograms cannot hold
    ("" when it did not): those latencies are missing from every figure."""
    parts = []
    if fig.out_of_range:
        parts.append(
            f"{fig.out_of_range} sample completions reported a time before their query was "
            "scheduled or issued, or beyond the latency histograms' range"
        )
    if fig.first_token_out_of_range:
        parts.append(f"{fig.first_token_out_of_range} first tokens were reported at impossible times")
    if not parts:
        return ""
    return "; ".join(parts) + ": their latencies are not in the figures. Check the times the SUT reports."


def _name(names: Mapping[int, str], value: Any) -> str:
    try:
        return names[int(value)]
    except (KeyError, TypeError, ValueError):
        return str(getattr(value, "name", value))


def _exact_mean(total_ns: int | None, divisor: int, histogram: Histogram | None) -> int:
    """Integer mean like C++ (sum / count); estimated from the histogram without a sum."""
    if divisor <= 0:
        return 0
    if total_ns is None or (total_ns == 0 and histogram is not None and histogram.max > 0):
        if histogram is None or histogram.total_count == 0:
            return 0
        total_ns = round(histogram.mean * histogram.total_count)
    return int(total_ns) // divisor


def _figure_sum(fig: RunFigures, name: str) -> int | None:
    value = getattr(fig, name, None)
    if value is None:
        value = fig.extra.get(name) if isinstance(fig.extra, dict) else None
    return None if value is None else int(value)


def _percentile_table(view: OrderStatistics, count: int) -> dict[float, int]:
    return {p: view.at(int(count * p)) for p in LATENCY_PERCENTILES}


def evaluate(eff: Any, fig: RunFigures) -> Evaluation:
    """Applies MLPerf LoadGen's result rules (PerformanceSummary) to one run.

    Args:
        eff: the effective settings (``EffectiveSettings``: MLPerf's TestSettingsInternal
            fields, durations in ns).
        fig: what the run measured.

    Returns:
        The figures, the four checks, the verdict and MLPerf's texts about them.
    """
    scenario = int(eff.scenario)
    ev = Evaluation(_name(_SCENARIO_NAMES, eff.scenario), _name(_MODE_NAMES, eff.mode))
    ev.target_percentile = float(getattr(eff, "target_latency_percentile", 0.99))
    ev.has_perf_constraints = scenario == TestScenario.Server
    ev.queries_issued = int(fig.queries_issued)
    views = _Views(fig)
    _process_latencies(ev, eff, fig, views)
    _check_min_duration(ev, eff, fig, scenario)
    # MinQueriesMet and MinSamplesMet.
    ev.min_queries_met = ev.queries_issued >= int(eff.min_query_count) and ev.sample_count >= int(
        eff.min_sample_count
    )
    _check_early_stopping(ev, eff, views, scenario)
    _check_perf_constraints(ev, eff, views, scenario)
    ev.unrecorded_text = _unrecorded_text(fig)
    ev.valid = (
        ev.min_duration_met and ev.min_queries_met and ev.perf_constraints_met and ev.early_stopping_met
        and not ev.unrecorded_text
    )
    if ev.unrecorded_text:
        ev.recommendations.append(ev.unrecorded_text)
    if not ev.perf_constraints_met:
        ev.recommendations.append(ev.perf_constraints_recommendation)
    if not ev.min_duration_met:
        ev.recommendations.append(ev.min_duration_recommendation)
    if not ev.min_queries_met:
        ev.recommendations.append(EXITED_EARLY_MESSAGE)
    _compute_rates(ev, eff, fig, scenario, bool(getattr(eff, "use_token_latencies", False)))
    return ev


class _Views:
    """The run's histograms as order statistics."""

    def __init__(self, fig: RunFigures) -> None:
        self.samples = OrderStatistics(fig.sample_latency)
        self.queries = OrderStatistics(fig.query_latency)
        self.first_tokens = OrderStatistics(fig.first_token_latency)
        self.tpots = OrderStatistics(fig.time_per_output_token)
        self._exact = {"samples": fig.latency_over, "first_tokens": fig.ttft_over, "tpots": fig.tpot_over}

    def count_over(self, name: str, bound_ns: int) -> int:
        """How many values of view ``name`` are over ``bound_ns``: the native run's exact
        count where it counted this bound, else to bucket precision."""
        exact = self._exact[name].get(bound_ns)
        return exact if exact is not None else count_over(getattr(self, name), bound_ns)

    def over_at(self, name: str, index: int, bound_ns: int) -> bool:
        """Whether the value at 0-based ``index`` (clamped) of view ``name``'s sorted values
        is over ``bound_ns``: exactly when at least ``count - index`` values are."""
        return rank_over_bound(getattr(self, name).count, self.count_over(name, bound_ns), index + 1)


def _process_latencies(ev: Evaluation, eff: Any, fig: RunFigures, views: _Views) -> None:
    """MLPerf's ProcessLatencies: nothing is computed when no sample completed."""
    samples, p = views.samples, ev.target_percentile
    n = int(fig.sample_count or samples.count)
    if not n:
        return
    ev.sample_count = n
    ev.sample_latency_mean_ns = _exact_mean(fig.sample_latency_sum_ns, n, fig.sample_latency)
    ev.sample_latency_target_ns = samples.at(int(n * p))
    ev.sample_latency_min_ns = samples.min
    ev.sample_latency_max_ns = samples.max
    ev.sample_latency_percentiles_ns = _percentile_table(samples, n)
    ev.query_count = ev.queries_issued
    scenario = int(eff.scenario)
    if scenario == TestScenario.Server:
        # The native run's exact count; figures built from a histogram alone fall back
        # to bucket precision.
        ev.overlatency_query_count = views.count_over("samples", int(getattr(eff, "target_latency_ns", 0)))
    if getattr(eff, "use_token_latencies", False):
        _process_token_latencies(ev, eff, fig, views, n)
    if scenario == TestScenario.MultiStream:
        queries, issued = views.queries, ev.queries_issued
        ev.query_latency_mean_ns = _exact_mean(fig.query_latency_sum_ns, issued, fig.query_latency)
        ev.query_latency_min_ns = queries.min
        ev.query_latency_max_ns = queries.max
        ev.query_latency_target_ns = queries.at(int(issued * p))
        ev.query_latency_percentiles_ns = _percentile_table(queries, issued)


def _process_token_latencies(ev: Evaluation, eff: Any, fig: RunFigures, views: _Views, n: int) -> None:
    ev.token_count = int(fig.tokens_per_sample_sum)
    first_tokens, tpots, p = views.first_tokens, views.tpots, ev.target_percentile
    if not first_tokens.count:
        return
    ev.first_token_mean_ns = _exact_mean(
        _figure_sum(fig, "first_token_latency_sum_ns"), n, fig.first_token_latency
    )
    ev.tpot_mean_ns = _exact_mean(
        _figure_sum(fig, "time_per_output_token_sum_ns"), n, fig.time_per_output_token
    )
    ev.first_token_target_ns = first_tokens.at(int(n * p))
    ev.first_token_min_ns = first_tokens.min
    ev.first_token_max_ns = first_tokens.max
    ev.first_token_percentiles_ns = _percentile_table(first_tokens, n)
    ev.tpot_target_ns = tpots.at(int(n * p))
    ev.tpot_min_ns = tpots.min
    ev.tpot_max_ns = tpots.max
    ev.tpot_percentiles_ns = _percentile_table(tpots, n)
    if int(eff.scenario) == TestScenario.Server:
        ev.overlatency_first_token_count = views.count_over(
            "first_tokens", int(getattr(eff, "target_latency_ns", 0)))


_MIN_DURATION_ADVICE: dict[int, str] = {
    TestScenario.SingleStream: "Decrease the expected latency so the loadgen pre-generates more queries.",
    TestScenario.MultiStream: "Decrease the expected latency so the loadgen pre-generates more queries.",
    TestScenario.Server: "Increase the target QPS so the loadgen pre-generates more queries.",
    TestScenario.Offline: "Increase expected QPS so the loadgen pre-generates a larger (coalesced) query.",
}


def _check_min_duration(ev: Evaluation, eff: Any, fig: RunFigures, scenario: int) -> None:
    min_duration_s = ms_setting_s(eff.min_duration_ns)
    if scenario == TestScenario.Offline:
        ev.min_duration_met = fig.max_latency_s >= min_duration_s
    elif scenario == TestScenario.Server:
        ev.min_duration_met = fig.final_query_scheduled_s >= min_duration_s
    else:
        ev.min_duration_met = fig.final_query_issued_s >= min_duration_s
    if not ev.min_duration_met:
        ev.min_duration_recommendation = _MIN_DURATION_ADVICE.get(scenario, "")


def _early_stopping(
    ev: Evaluation, scenario: int, latencies: OrderStatistics, queries: OrderStatistics,
    overlatency_count: int,
) -> _EarlyStoppingOutcome:
    p, issued = ev.target_percentile, ev.queries_issued
    if scenario in _STREAMS:
        return _stream_early_stopping(scenario, p, issued, latencies, queries)
    if scenario == TestScenario.Server:
        return _server_early_stopping(p, issued, overlatency_count)
    return _EarlyStoppingOutcome(True, "")


def _check_early_stopping(ev: Evaluation, eff: Any, views: _Views, scenario: int) -> None:
    """EarlyStopping: TPOT first, then TTFT only when TPOT passed, as MLPerf chains them."""
    if not getattr(eff, "use_token_latencies", False):
        outcome = _early_stopping(ev, scenario, views.samples, views.queries, ev.overlatency_query_count)
        ev.early_stopping_met = outcome.met
        ev.early_stopping_text = outcome.text
        outcomes = [outcome]
    else:
        tpot_bound, ttft_bound = int(eff.server_tpot_latency), int(eff.server_ttft_latency)
        tpot_over = views.count_over("tpots", tpot_bound) if scenario == TestScenario.Server else 0
        tpot_outcome = _early_stopping(ev, scenario, views.tpots, views.queries, tpot_over)
        ev.early_stopping_tpot_text = tpot_outcome.text
        outcomes = [tpot_outcome]
        ev.early_stopping_met = tpot_outcome.met
        if tpot_outcome.met:
            ttft_over = views.count_over("first_tokens", ttft_bound) if scenario == TestScenario.Server else 0
            ttft_outcome = _early_stopping(ev, scenario, views.first_tokens, views.queries, ttft_over)
            ev.early_stopping_ttft_text = ttft_outcome.text
            ev.early_stopping_met = ttft_outcome.met
            outcomes.append(ttft_outcome)
    for outcome in outcomes:
        if outcome.estimate_ss_ns is not None:
            ev.early_stopping_latency_ss_ns = outcome.estimate_ss_ns
        if outcome.estimate_ms_ns is not None:
            ev.early_stopping_latency_ms_ns = outcome.estimate_ms_ns


def _check_perf_constraints(ev: Evaluation, eff: Any, views: _Views, scenario: int) -> None:
    """Server: the latency at MLPerf's percentile index (int(n * p), 0-based) must be
    within each bound, judged on exact over-bound counts."""
    if scenario != TestScenario.Server:
        return
    index = int(ev.sample_count * ev.target_percentile)
    if not getattr(eff, "use_token_latencies", False):
        if views.over_at("samples", index, int(getattr(eff, "target_latency_ns", 0))):
            ev.perf_constraints_met = False
            ev.perf_constraints_recommendation = "Reduce target QPS to improve latency."
        return
    advice = []
    if views.over_at("first_tokens", index, int(eff.server_ttft_latency)):
        advice.append("TTFT constrain not met: Reduce target QPS to improve latency.")
    if views.over_at("tpots", index, int(eff.server_tpot_latency)):
        advice.append("TPOT constrain not met: Reduce target QPS to improve latency.")
    if advice:
        ev.perf_constraints_met = False
        ev.perf_constraints_recommendation = "\n * ".join(advice)


def _compute_rates(ev: Evaluation, eff: Any, fig: RunFigures, scenario: int, use_tokens: bool) -> None:
    n = ev.sample_count
    n_minus_one = size_minus_one(n)
    mean_s = ns_to_s(ev.sample_latency_mean_ns)
    if scenario == TestScenario.SingleStream:
        ev.qps_with_loadgen_overhead = cpp_divide(n_minus_one, fig.final_query_issued_s)
        ev.qps_without_loadgen_overhead = cpp_divide(1.0, mean_s)
    elif scenario == TestScenario.Server:
        ev.scheduled_samples_per_s = cpp_divide(n_minus_one, fig.final_query_scheduled_s)
        ev.completed_samples_per_s = cpp_divide(n_minus_one, fig.final_query_all_samples_done_s)
    elif scenario == TestScenario.Offline:
        ev.samples_per_s = cpp_divide(n, fig.max_latency_s)
    if use_tokens:
        tokens = ev.token_count
        ev.tokens_per_s_with_loadgen_overhead = cpp_divide(tokens, fig.final_query_issued_s)
        ev.tokens_per_s_without_loadgen_overhead = cpp_divide(tokens, mean_s * n)
        # MLPerf's detail-log "result_token_throughput" divides by a mean in ns.
        ev.tokens_per_s_detail_throughput = cpp_divide(tokens, float(ev.sample_latency_mean_ns) * n)
        ev.completed_tokens_per_s = cpp_divide(tokens, fig.final_query_all_samples_done_s)
        ev.tokens_per_s = cpp_divide(tokens, fig.max_latency_s)
    if getattr(eff, "infer_token_latencies", False):
        factor = int(eff.token_latency_scaling_factor)
        if scenario == TestScenario.Server:
            ev.inferred_tokens_per_s = cpp_divide((factor * n_minus_one) % _U64, fig.final_query_all_samples_done_s)
        elif scenario == TestScenario.Offline:
            ev.inferred_tokens_per_s = cpp_divide((factor * n) % _U64, fig.max_latency_s)

    label = cpp_fixed(ev.target_percentile * 100, 1)
    if scenario == TestScenario.SingleStream:
        ev.metric_name = f"{label}th percentile latency (ns)"
        ev.metric_value = ev.sample_latency_target_ns
        ev.result_value = ev.early_stopping_latency_ss_ns
    elif scenario == TestScenario.MultiStream:
        ev.metric_name = f"{label}th percentile latency (ns)"
        ev.metric_value = ev.query_latency_target_ns
        ev.result_value = ev.early_stopping_latency_ms_ns
    elif scenario == TestScenario.Server:
        ev.metric_name = "Completed samples per second"
        ev.metric_value = ev.completed_samples_per_s
        ev.result_value = ev.completed_samples_per_s
    else:
        ev.metric_name = "Samples per second"
        ev.metric_value = ev.samples_per_s
        ev.result_value = ev.samples_per_s
    ev.result_key = SCENARIO_RESULT_KEYS.get(ev.scenario_name, "")

