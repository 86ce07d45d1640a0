"""MLPerf LoadGen's verdict and log files, computed from what one run measured.

:func:`evaluate` applies MLPerf LoadGen's validity rules (minimum duration, minimum
query and sample counts, the Server latency bound, early stopping) to a
:class:`~loadgen.mlperf.figures.RunFigures` and the effective settings. The writers then
render the three files MLPerf tools read, in MLPerf LoadGen's exact layout:

- ``mlperf_log_summary.txt``: :func:`write_summary` and :func:`write_summary_trailer`;
- ``mlperf_log_detail.txt``: a :class:`DetailLog` of ``:::MLLOG {json}`` lines, with
  :func:`write_detail_results` for the result lines;
- ``mlperf_log_accuracy.json``: an :class:`AccuracyLog`.

How this differs from MLPerf LoadGen, which sorts a vector holding every latency:

- Latencies come from HDR histograms, so an order statistic is known to the precision of
  its bucket. The value reported for a rank is the highest value of the bucket holding
  it, capped at the exact largest latency (so the top rank is exact). The rank itself is
  MLPerf's: MLPerf reads ``sorted[int(count * p)]``, which is one rank above what HDR's
  ``value_at_percentile`` reads whenever ``count * p`` is a whole number or its fraction
  is below one half; this module looks the rank up directly instead.
- "Over the latency bound" (the Server overlatency count, the percentile checks against
  ``target_latency``, TTFT and TPOT) is decided with the same reported values: a latency
  counts as over when the top of its bucket is over. A bucket that straddles the bound
  therefore counts as over, never as under (at 3 significant figures it spans at most
  0.1% of the bound).
- Means are exact when the runtime supplies the sum of the latencies (it does for the
  sample and query latencies); the token latency means fall back to the histogram mean
  when no exact sum is available.
- Detail-log values are always valid JSON: strings are JSON-escaped, infinities and NaN
  are written ``Infinity``/``-Infinity``/``NaN``, an empty list is ``[]`` and an empty
  map ``{}``. For ordinary values the text is byte for byte MLPerf's.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import (
    IO,
    Any,
    Callable,
)

import numpy as np

from ..stats.early_stopping import min_passing_queries_fraction
from ..stats.histogram import Histogram
from .figures import RunFigures

__all__ = [
    "EARLY_STOPPING_CONFIDENCE",
    "LATENCY_PERCENTILES",
    "RAN_OUT_OF_QUERIES_MESSAGE",
    "SCENARIO_RESULT_KEYS",
    "AccuracyLog",
    "DetailLog",
    "Evaluation",
    "cpp_fixed",
    "cpp_stream_double",
    "current_date_time_iso8601",
    "evaluate",
    "log_paths",
    "min_passing_queries",
    "power_date_time",
    "write_detail_results",
    "write_summary",
    "write_summary_trailer",
]

#: The fixed percentiles (as fractions) every MLPerf summary and detail log reports.
LATENCY_PERCENTILES: tuple[float, ...] = (0.50, 0.90, 0.95, 0.97, 0.99, 0.999)

#: Confidence of MLPerf's early-stopping test (no tolerance is applied).
EARLY_STOPPING_CONFIDENCE = 0.99

#: SingleStream also estimates this percentile, from which MultiStream can be inferred.
_SINGLE_STREAM_SECOND_PERCENTILE = 0.99

#: The detail-log key the MLPerf submission checker reads as each scenario's result.
SCENARIO_RESULT_KEYS: dict[str, str] = {
    "SingleStream": "early_stopping_latency_ss",
    "MultiStream": "early_stopping_latency_ms",
    "Server": "result_completed_samples_per_sec",
    "Offline": "result_samples_per_second",
}

#: The ``error_runtime`` detail line MLPerf writes when issuing ran out of queries.
RAN_OUT_OF_QUERIES_MESSAGE = (
    "Ending early: Ran out of generated queries to issue before the minimum query count "
    "and test duration were reached. Please update the relevant expected latency or "
    "target qps in the TestSettings so they are more accurate."
)

_SINGLE_STREAM, _MULTI_STREAM, _SERVER, _OFFLINE = 0, 1, 2, 3
_SCENARIO_NAMES = {0: "SingleStream", 1: "MultiStream", 2: "Server", 3: "Offline"}
_MODE_NAMES = {0: "SubmissionRun", 1: "AccuracyOnly", 2: "PerformanceOnly", 3: "FindPeakPerformance"}
_U64 = 1 << 64
_BANNER = "================================================"
_EXITED_EARLY = "The test exited early, before enough queries were issued."


# --------------------------------------------------------------------- number text


def _nan_text(value: float) -> str:
    # glibc prints the sign of a NaN; x86's default NaN (0/0) has it set.
    return "-nan" if math.copysign(1.0, value) < 0 else "nan"


def cpp_fixed(value: float, precision: int = 2) -> str:
    """A double as C++ ``std::fixed`` with ``precision`` decimals (MLPerf's DoubleToString).

    Args:
        value: the number.
        precision: digits after the decimal point.

    Returns:
        e.g. ``"1946.97"``, ``"inf"``, ``"-nan"``.
    """
    value = float(value)
    if math.isnan(value):
        return _nan_text(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{precision}f}"


def cpp_stream_double(value: float) -> str:
    """A double as a default-configured C++ ostream prints it (``%g``, 6 significant digits).

    Args:
        value: the number.

    Returns:
        e.g. ``"2000"``, ``"0.9"``, ``"1.15499e+06"``, ``"inf"``.
    """
    value = float(value)
    if math.isnan(value):
        return _nan_text(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:g}"


def _div(numerator: float, denominator: float) -> float:
    """IEEE division, as C++ does it: x/0 is +-inf, 0/0 is NaN (with the sign bit set)."""
    if denominator == 0:
        if numerator == 0 or math.isnan(numerator):
            return -math.nan
        return math.copysign(math.inf, numerator) * math.copysign(1.0, denominator)
    return numerator / denominator


def _size_minus_one(count: int) -> int:
    # MLPerf subtracts one from an unsigned count; with no samples that wraps around.
    return (count - 1) % _U64


def _ms_setting_s(duration_ns: int) -> float:
    """A duration setting, in seconds, as MLPerf converts its millisecond settings."""
    duration_ns = int(duration_ns)
    if duration_ns % 1_000_000 == 0:
        return (duration_ns // 1_000_000) / 1000.0
    return duration_ns / 1e9


# ------------------------------------------------------------------ order statistics


class _Ordered:
    """Order statistics of a histogram's values, to the precision of its buckets."""

    __slots__ = ("_cumulative", "_highest", "count", "max", "min")

    def __init__(self, histogram: Histogram | None) -> None:
        self.count = 0 if histogram is None else int(histogram.total_count)
        self.min = self.max = 0
        if self.count:
            core = histogram._h
            self.min = int(getattr(core, "raw_min", histogram.min))
            self.max = int(getattr(core, "raw_max", histogram.max))
            _, highest, counts = histogram.recorded_buckets()
            self._highest = np.minimum(np.asarray(highest, dtype=np.int64), self.max)
            self._cumulative = np.cumsum(np.asarray(counts, dtype=np.int64))

    def at(self, index: int) -> int:
        """The value at 0-based ``index`` of the sorted values (clamped into range)."""
        if not self.count:
            return 0
        rank = min(max(int(index), 0), self.count - 1) + 1
        i = int(np.searchsorted(self._cumulative, rank, side="left"))
        return max(int(self._highest[i]), self.min)

    def count_over(self, bound_ns: int) -> int:
        """How many values are over ``bound_ns`` (the top of their bucket is above it)."""
        if not self.count:
            return 0
        first_over = int(np.searchsorted(self._highest, int(bound_ns), side="right"))
        under = int(self._cumulative[first_over - 1]) if first_over > 0 else 0
        return self.count - under


# -------------------------------------------------------------------- early stopping


@lru_cache(maxsize=65536)
def min_passing_queries(overlatency_count: int, percentile: float) -> int:
    """MLPerf's h(t): the fewest under-latency queries that let ``t`` overlatency ones pass.

    The least ``h`` for which P[at most t of h + t queries are over] < 1 - 0.99, each
    query being over with probability ``1 - percentile``.

    Args:
        overlatency_count: t, queries over the latency (>= 0).
        percentile: the target percentile as a fraction, e.g. 0.9.

    Returns:
        h (>= 1).

    Raises:
        ValueError: ``t`` is negative or ``percentile`` is not strictly between 0 and 1.
    """
    t = int(overlatency_count)
    if t < 0 or not 0.0 < percentile < 1.0:
        raise ValueError(
            f"need overlatency_count >= 0 and 0 < percentile < 1, got {t} and {percentile}"
        )
    return min_passing_queries_fraction(t, percentile, EARLY_STOPPING_CONFIDENCE)


def _largest_passing_overlatency(queries: int, percentile: float) -> int:
    """The largest t with queries >= h(t) + t, given that t = 1 qualifies."""
    lo, hi = 1, max(1, queries - 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if queries >= min_passing_queries(mid, percentile) + mid:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class _EarlyStoppingOutcome:
    met: bool
    text: str
    estimate_ss_ns: int | None = None
    estimate_ms_ns: int | None = None


def _percentile_early_stopping(
    queries: int, percentile: float, latencies: _Ordered
) -> tuple[int | None, int, int]:
    """(estimate or None when too few queries, h_min + 1, t) for a percentile estimate."""
    needed = min_passing_queries(1, percentile) + 1
    if queries < needed:
        return None, needed, 0
    t = _largest_passing_overlatency(queries, percentile)
    return latencies.at(queries - t), needed, t


def _early_stopping(
    scenario: int,
    percentile: float,
    queries: int,
    latencies: _Ordered,
    query_latencies: _Ordered,
    bound_ns: int,
) -> _EarlyStoppingOutcome:
    label = cpp_fixed(percentile * 100, 1)
    if scenario in (_SINGLE_STREAM, _MULTI_STREAM):
        source = latencies if scenario == _SINGLE_STREAM else query_latencies
        estimate, needed, t = _percentile_early_stopping(queries, percentile, source)
        if estimate is None:
            return _EarlyStoppingOutcome(
                False,
                f" * Only processed {queries} queries.\n"
                f" * Need to process at least {needed} queries for early stopping.",
            )
        text = (
            f" * Processed at least {needed} queries ({queries}).\n"
            f" * Would discard {t - 1} highest latency queries.\n"
            f" * Early stopping {label}th percentile estimate: {estimate}"
        )
        if scenario == _MULTI_STREAM:
            return _EarlyStoppingOutcome(True, text, estimate_ms_ns=estimate)
        second = _SINGLE_STREAM_SECOND_PERCENTILE
        second_label = cpp_fixed(second * 100, 1)
        estimate2, needed2, _ = _percentile_early_stopping(queries, second, latencies)
        if estimate2 is None:
            text += (
                f"\n * Not enough queries processed for {second_label}th percentile\n"
                f" early stopping estimate (would need to process at\n"
                f" least {needed2} total queries)."
            )
        else:
            text += f"\n * Early stopping {second_label}th percentile estimate: {estimate2}"
        return _EarlyStoppingOutcome(True, text, estimate, estimate2)
    if scenario == _SERVER:
        t = latencies.count_over(bound_ns)
        h = min_passing_queries(t, percentile)
        if queries >= h + t:
            return _EarlyStoppingOutcome(True, " * Run successful.")
        return _EarlyStoppingOutcome(
            False,
            f" * Run unsuccessful.\n * Processed {queries} queries.\n"
            f" * Would need to run at least {h + t - queries} more queries,\n"
            " with the run being successful if every additional\n"
            " query were under latency.",
        )
    return _EarlyStoppingOutcome(True, "")


# ------------------------------------------------------------------------ evaluation


def _zero_percentiles() -> dict[float, int]:
    return {p: 0 for p in LATENCY_PERCENTILES}


@dataclass
class Evaluation:
    """MLPerf's reading of one performance run: figures, checks and the verdict.

    Latencies are integer ns, rates per second, percentiles fractions (0.9 = 90th).

    Attributes:
        scenario_name / mode_name: MLPerf's names, e.g. ``"Server"``, ``"PerformanceOnly"``.
        valid: all four checks passed ("Result is : VALID").
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


def _scenario_of(eff: Any) -> int:
    return int(eff.scenario)


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


def _percentile_table(view: _Ordered, count: int) -> dict[float, int]:
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
    scenario = _scenario_of(eff)
    ev = Evaluation(_name(_SCENARIO_NAMES, eff.scenario), _name(_MODE_NAMES, eff.mode))
    use_tokens = bool(getattr(eff, "use_token_latencies", False))
    percentile = float(getattr(eff, "target_latency_percentile", 0.99))
    target_latency_ns = int(getattr(eff, "target_latency_ns", 0))
    ev.target_percentile = percentile
    ev.has_perf_constraints = scenario == _SERVER
    queries_issued = int(fig.queries_issued)
    ev.queries_issued = queries_issued

    samples = _Ordered(fig.sample_latency)
    queries = _Ordered(fig.query_latency)
    first_tokens = _Ordered(fig.first_token_latency)
    tpots = _Ordered(fig.time_per_output_token)

    # ProcessLatencies: nothing is computed when no sample completed.
    n = int(fig.sample_count or samples.count)
    if n:
        ev.sample_count = n
        ev.sample_latency_mean_ns = _exact_mean(fig.sample_latency_sum_ns, n, fig.sample_latency)
        ev.sample_latency_target_ns = samples.at(int(n * percentile))
        ev.sample_latency_min_ns = samples.min
        ev.sample_latency_max_ns = samples.max
        ev.sample_latency_percentiles_ns = _percentile_table(samples, n)
        ev.query_count = queries_issued
        if scenario == _SERVER:
            ev.overlatency_query_count = samples.count_over(target_latency_ns)
        if use_tokens:
            ev.token_count = int(fig.tokens_per_sample_sum)
            if first_tokens.count:
                ev.first_token_mean_ns = _exact_mean(
                    _figure_sum(fig, "first_token_latency_sum_ns"), n, fig.first_token_latency
                )
                ev.tpot_mean_ns = _exact_mean(
                    _figure_sum(fig, "time_per_output_token_sum_ns"), n, fig.time_per_output_token
                )
                ev.first_token_target_ns = first_tokens.at(int(n * percentile))
                ev.first_token_min_ns = first_tokens.min
                ev.first_token_max_ns = first_tokens.max
                ev.first_token_percentiles_ns = _percentile_table(first_tokens, n)
                ev.tpot_target_ns = tpots.at(int(n * percentile))
                ev.tpot_min_ns = tpots.min
                ev.tpot_max_ns = tpots.max
                ev.tpot_percentiles_ns = _percentile_table(tpots, n)
                if scenario == _SERVER:
                    ev.overlatency_first_token_count = first_tokens.count_over(target_latency_ns)
        if scenario == _MULTI_STREAM:
            ev.query_latency_mean_ns = _exact_mean(
                fig.query_latency_sum_ns, queries_issued, fig.query_latency
            )
            ev.query_latency_min_ns = queries.min
            ev.query_latency_max_ns = queries.max
            ev.query_latency_target_ns = queries.at(int(queries_issued * percentile))
            ev.query_latency_percentiles_ns = _percentile_table(queries, queries_issued)

    # MinDurationMet.
    min_duration_s = _ms_setting_s(eff.min_duration_ns)
    if scenario == _OFFLINE:
        ev.min_duration_met = fig.max_latency_s >= min_duration_s
    elif scenario == _SERVER:
        ev.min_duration_met = fig.final_query_scheduled_s >= min_duration_s
    else:
        ev.min_duration_met = fig.final_query_issued_s >= min_duration_s
    if not ev.min_duration_met:
        ev.min_duration_recommendation = {
            _SINGLE_STREAM: "Decrease the expected latency so the loadgen pre-generates more queries.",
            _MULTI_STREAM: "Decrease the expected latency so the loadgen pre-generates more queries.",
            _SERVER: "Increase the target QPS so the loadgen pre-generates more queries.",
            _OFFLINE: "Increase expected QPS so the loadgen pre-generates a larger (coalesced) query.",
        }.get(scenario, "")

    # MinQueriesMet and MinSamplesMet.
    ev.min_queries_met = queries_issued >= int(eff.min_query_count) and ev.sample_count >= int(
        eff.min_sample_count
    )

    # EarlyStopping (TPOT first, then TTFT only when TPOT passed, as MLPerf chains them).
    if not use_tokens:
        outcome = _early_stopping(scenario, percentile, queries_issued, samples, queries, target_latency_ns)
        ev.early_stopping_met = outcome.met
        ev.early_stopping_text = outcome.text
        outcomes = [outcome]
    else:
        tpot_outcome = _early_stopping(
            scenario, percentile, queries_issued, tpots, queries, int(eff.server_tpot_latency)
        )
        ev.early_stopping_tpot_text = tpot_outcome.text
        outcomes = [tpot_outcome]
        ev.early_stopping_met = tpot_outcome.met
        if tpot_outcome.met:
            ttft_outcome = _early_stopping(
                scenario, percentile, queries_issued, first_tokens, queries, int(eff.server_ttft_latency)
            )
            ev.early_stopping_ttft_text = ttft_outcome.text
            ev.early_stopping_met = ttft_outcome.met
            outcomes.append(ttft_outcome)
    for outcome in outcomes:
        if outcome.estimate_ss_ns is not None:
            ev.early_stopping_latency_ss_ns = outcome.estimate_ss_ns
        if outcome.estimate_ms_ns is not None:
            ev.early_stopping_latency_ms_ns = outcome.estimate_ms_ns

    # PerfConstraintsMet.
    if scenario == _SERVER:
        if not use_tokens:
            if ev.sample_latency_target_ns > target_latency_ns:
                ev.perf_constraints_met = False
                ev.perf_constraints_recommendation = "Reduce target QPS to improve latency."
        else:
            advice = []
            if ev.first_token_target_ns > int(eff.server_ttft_latency):
                advice.append("TTFT constrain not met: Reduce target QPS to improve latency.")
            if ev.tpot_target_ns > int(eff.server_tpot_latency):
                advice.append("TPOT constrain not met: Reduce target QPS to improve latency.")
            if advice:
                ev.perf_constraints_met = False
                ev.perf_constraints_recommendation = "\n * ".join(advice)

    ev.valid = (
        ev.min_duration_met and ev.min_queries_met and ev.perf_constraints_met and ev.early_stopping_met
    )
    if not ev.perf_constraints_met:
        ev.recommendations.append(ev.perf_constraints_recommendation)
    if not ev.min_duration_met:
        ev.recommendations.append(ev.min_duration_recommendation)
    if not ev.min_queries_met:
        ev.recommendations.append(_EXITED_EARLY)

    _compute_rates(ev, eff, fig, scenario, use_tokens)
    return ev


def _compute_rates(ev: Evaluation, eff: Any, fig: RunFigures, scenario: int, use_tokens: bool) -> None:
    n = ev.sample_count
    n_minus_one = _size_minus_one(n)
    mean_s = ev.sample_latency_mean_ns / 1e9
    if scenario == _SINGLE_STREAM:
        ev.qps_with_loadgen_overhead = _div(n_minus_one, fig.final_query_issued_s)
        ev.qps_without_loadgen_overhead = _div(1.0, mean_s)
    elif scenario == _SERVER:
        ev.scheduled_samples_per_s = _div(n_minus_one, fig.final_query_scheduled_s)
        ev.completed_samples_per_s = _div(n_minus_one, fig.final_query_all_samples_done_s)
    elif scenario == _OFFLINE:
        ev.samples_per_s = _div(n, fig.max_latency_s)
    if use_tokens:
        tokens = ev.token_count
        ev.tokens_per_s_with_loadgen_overhead = _div(tokens, fig.final_query_issued_s)
        ev.tokens_per_s_without_loadgen_overhead = _div(tokens, mean_s * n)
        # MLPerf's detail-log "result_token_throughput" divides by a mean in ns.
        ev.tokens_per_s_detail_throughput = _div(tokens, float(ev.sample_latency_mean_ns) * n)
        ev.completed_tokens_per_s = _div(tokens, fig.final_query_all_samples_done_s)
        ev.tokens_per_s = _div(tokens, fig.max_latency_s)
    if getattr(eff, "infer_token_latencies", False):
        factor = int(eff.token_latency_scaling_factor)
        if scenario == _SERVER:
            ev.inferred_tokens_per_s = _div((factor * n_minus_one) % _U64, fig.final_query_all_samples_done_s)
        elif scenario == _OFFLINE:
            ev.inferred_tokens_per_s = _div((factor * n) % _U64, fig.max_latency_s)

    label = cpp_fixed(ev.target_percentile * 100, 1)
    if scenario == _SINGLE_STREAM:
        ev.metric_name = f"{label}th percentile latency (ns)"
        ev.metric_value = ev.sample_latency_target_ns
        ev.result_value = ev.early_stopping_latency_ss_ns
    elif scenario == _MULTI_STREAM:
        ev.metric_name = f"{label}th percentile latency (ns)"
        ev.metric_value = ev.query_latency_target_ns
        ev.result_value = ev.early_stopping_latency_ms_ns
    elif scenario == _SERVER:
        ev.metric_name = "Completed samples per second"
        ev.metric_value = ev.completed_samples_per_s
        ev.result_value = ev.completed_samples_per_s
    else:
        ev.metric_name = "Samples per second"
        ev.metric_value = ev.samples_per_s
        ev.result_value = ev.samples_per_s
    ev.result_key = SCENARIO_RESULT_KEYS.get(ev.scenario_name, "")


# --------------------------------------------------------------------------- summary


def _summary_value(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "1" if value else "0"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return cpp_stream_double(value)
    return str(value)


def _settings_summary_lines(eff: Any) -> list[str]:
    lines = [
        f"samples_per_query : {_summary_value(eff.samples_per_query)}",
        f"target_qps : {_summary_value(float(eff.target_qps))}",
    ]
    if not getattr(eff, "use_token_latencies", False):
        lines.append(f"target_latency (ns): {int(eff.target_latency_ns)}")
    else:
        lines.append(f"ttft_latency (ns): {int(eff.server_ttft_latency)}")
        lines.append(f"tpot_latency (ns): {int(eff.server_tpot_latency)}")
    lines += [
        f"max_async_queries : {int(eff.max_async_queries)}",
        f"min_duration (ms): {int(eff.min_duration_ns) // 1_000_000}",
        f"max_duration (ms): {int(eff.max_duration_ns) // 1_000_000}",
        f"min_query_count : {int(eff.min_query_count)}",
        f"max_query_count : {int(eff.max_query_count)}",
        f"qsl_rng_seed : {int(eff.qsl_rng_seed)}",
        f"sample_index_rng_seed : {int(eff.sample_index_rng_seed)}",
        f"schedule_rng_seed : {int(eff.schedule_rng_seed)}",
        f"accuracy_log_rng_seed : {int(eff.accuracy_log_rng_seed)}",
        f"accuracy_log_probability : {_summary_value(float(eff.accuracy_log_probability))}",
        f"accuracy_log_sampling_target : {int(eff.accuracy_log_sampling_target)}",
        f"print_timestamps : {_summary_value(bool(eff.print_timestamps))}",
        f"performance_issue_unique : {_summary_value(bool(eff.performance_issue_unique))}",
        f"performance_issue_same : {_summary_value(bool(eff.performance_issue_same))}",
        f"performance_issue_same_index : {int(eff.performance_issue_same_index)}",
        f"performance_sample_count : {int(eff.performance_sample_count)}",
        f"accuracy_sample_count : {int(eff.accuracy_sample_count)}",
    ]
    if getattr(eff, "sample_concatenate_permutation", False):
        lines.append(
            "WARNING: sample_concatenate_permutation was set to true. \n"
            "Generated samples per query might be different as the one in the setting.\n"
            "Check the generated_samples_per_query line in the detailed log for the real\n"
            "samples_per_query value"
        )
    return lines


def _summary_lines(eff: Any, fig: RunFigures, ev: Evaluation, sut_name: str) -> list[str]:
    scenario = _scenario_of(eff)
    use_tokens = bool(getattr(eff, "use_token_latencies", False))
    out: list[str] = [_BANNER, "MLPerf Results Summary", _BANNER]
    out.append(f"SUT name : {sut_name}")
    out.append(f"Scenario : {ev.scenario_name}")
    out.append(f"Mode     : {ev.mode_name}")
    label = cpp_fixed(ev.target_percentile * 100, 1)
    if scenario == _SINGLE_STREAM:
        out.append(f"{label}th percentile latency (ns) : {ev.sample_latency_target_ns}")
    elif scenario == _MULTI_STREAM:
        out.append(f"{label}th percentile latency (ns) : {ev.query_latency_target_ns}")
    elif scenario == _SERVER:
        out.append(f"Completed samples per second    : {cpp_fixed(ev.completed_samples_per_s)}")
    elif scenario == _OFFLINE:
        out.append(f"Samples per second: {cpp_stream_double(ev.samples_per_s)}")
    if use_tokens:
        if scenario in (_SINGLE_STREAM, _MULTI_STREAM):
            out.append(f"{label}th first token percentile latency (ns) : {ev.first_token_target_ns}")
        elif scenario == _OFFLINE:
            out.append(f"Tokens per second: {cpp_stream_double(ev.tokens_per_s)}")
        elif scenario == _SERVER:
            out.append(f"Completed tokens per second: {cpp_fixed(ev.completed_tokens_per_s)}")
    if getattr(eff, "infer_token_latencies", False):
        if scenario == _OFFLINE:
            out.append(f"Tokens per second (inferred): {cpp_stream_double(ev.inferred_tokens_per_s)}")
        elif scenario == _SERVER:
            out.append(f"Completed tokens per second (inferred): {cpp_fixed(ev.inferred_tokens_per_s)}")

    def yes_no(flag: bool) -> str:
        return "Yes" if flag else "NO"

    out.append(f"Result is : {ev.result_validity}")
    if ev.has_perf_constraints:
        out.append(f"  Performance constraints satisfied : {yes_no(ev.perf_constraints_met)}")
    out.append(f"  Min duration satisfied : {yes_no(ev.min_duration_met)}")
    out.append(f"  Min queries satisfied : {yes_no(ev.min_queries_met)}")
    out.append(f"  Early stopping satisfied: {yes_no(ev.early_stopping_met)}")
    if not ev.valid:
        out.append("Recommendations:")
        if not ev.perf_constraints_met:
            out.append(" * " + ev.perf_constraints_recommendation)
        if not ev.min_duration_met:
            out.append(" * " + ev.min_duration_recommendation)
        if not ev.min_queries_met:
            out.append(f" * {_EXITED_EARLY}\n   See the detailed log for why this may have occurred.")
    if scenario in (_SINGLE_STREAM, _SERVER, _MULTI_STREAM):
        if not use_tokens:
            out += ["Early Stopping Result:", ev.early_stopping_text]
        else:
            out += ["TTFT Early Stopping Result:", ev.early_stopping_ttft_text]
            out += ["TPOT Early Stopping Result:", ev.early_stopping_tpot_text]

    out.append(f"\n{_BANNER}\nAdditional Stats\n{_BANNER}")
    pad = "                : "
    if scenario == _SINGLE_STREAM:
        out.append("QPS w/ loadgen overhead         : " + cpp_fixed(ev.qps_with_loadgen_overhead))
        out.append("QPS w/o loadgen overhead        : " + cpp_fixed(ev.qps_without_loadgen_overhead))
        out.append("")
    elif scenario == _SERVER:
        out.append("Scheduled samples per second : " + cpp_fixed(ev.scheduled_samples_per_s))
    elif scenario == _MULTI_STREAM:
        out.append("Per-query latency:  ")
        out.append(f"Min latency (ns){pad}{ev.query_latency_min_ns}")
        out.append(f"Max latency (ns){pad}{ev.query_latency_max_ns}")
        out.append(f"Mean latency (ns)               : {ev.query_latency_mean_ns}")
        for p in LATENCY_PERCENTILES:
            out.append(f"{cpp_fixed(p * 100)} percentile latency (ns)   : {ev.query_latency_percentiles_ns[p]}")
    if scenario != _MULTI_STREAM:
        out.append(f"Min latency (ns){pad}{ev.sample_latency_min_ns}")
        out.append(f"Max latency (ns){pad}{ev.sample_latency_max_ns}")
        out.append(f"Mean latency (ns)               : {ev.sample_latency_mean_ns}")
        for p in LATENCY_PERCENTILES:
            out.append(f"{cpp_fixed(p * 100)} percentile latency (ns)   : {ev.sample_latency_percentiles_ns[p]}")
    if use_tokens:
        out.append("")
        if scenario == _SINGLE_STREAM:
            out.append("TPS w/ loadgen overhead         : " + cpp_fixed(ev.tokens_per_s_with_loadgen_overhead))
            out.append("TPS w/o loadgen overhead        : " + cpp_fixed(ev.tokens_per_s_without_loadgen_overhead))
        elif scenario == _SERVER:
            out.append("Completed tokens per second                 : " + cpp_fixed(ev.completed_tokens_per_s))
        if scenario != _OFFLINE:
            wide = "                : "
            out.append(f"Min First Token latency (ns){wide}{ev.first_token_min_ns}")
            out.append(f"Max First Token latency (ns){wide}{ev.first_token_max_ns}")
            out.append(f"Mean First Token latency (ns)               : {ev.first_token_mean_ns}")
            for p in LATENCY_PERCENTILES:
                out.append(
                    f"{cpp_fixed(p * 100)} percentile first token latency (ns)   : "
                    f"{ev.first_token_percentiles_ns[p]}"
                )
            out.append("")
            out.append(f"Min Time per Output Token (ns){wide}{ev.tpot_min_ns}")
            out.append(f"Max Time per Output Token (ns){wide}{ev.tpot_max_ns}")
            out.append(f"Mean Time per Output Token (ns)               : {ev.tpot_mean_ns}")
            for p in LATENCY_PERCENTILES:
                out.append(
                    f"{cpp_fixed(p * 100)} percentile time to output token (ns)   : "
                    f"{ev.tpot_percentiles_ns[p]}"
                )

    out.append(f"\n{_BANNER}\nTest Parameters Used\n{_BANNER}")
    out += _settings_summary_lines(eff)

    # Our addition, after every MLPerf section: how late queries went out.
    delay = fig.issue_delay
    if delay is not None and delay.total_count:
        view = _Ordered(delay)
        count = view.count
        out.append(f"\n{_BANNER}\nIssue delay (scheduled to issued)\n{_BANNER}")
        out.append(f"Queries measured                : {count}")
        out.append(f"Min issue delay (ns)            : {view.min}")
        out.append(f"Max issue delay (ns)            : {view.max}")
        out.append(f"Mean issue delay (ns)           : {round(delay.mean)}")
        for p in LATENCY_PERCENTILES:
            out.append(f"{cpp_fixed(p * 100)} percentile issue delay (ns)   : {view.at(int(count * p))}")
    return out


def write_summary(fh: IO[str], eff: Any, fig: RunFigures, ev: Evaluation, sut_name: str) -> None:
    """Writes a performance run's part of ``mlperf_log_summary.txt``, as MLPerf lays it out.

    The file's closing warning and error counts come separately, from
    :func:`write_summary_trailer`, when the log is closed.

    Args:
        fh: text stream to write to.
        eff: the effective settings.
        fig: what the run measured.
        ev: ``evaluate(eff, fig)``.
        sut_name: the SUT's name, as its ``Name()`` reported it.
    """
    fh.write("".join(line + "\n" for line in _summary_lines(eff, fig, ev, sut_name)))


def write_summary_trailer(fh: IO[str], warning_count: int, error_count: int) -> None:
    """Writes the warning and error counts MLPerf appends to the summary when logging stops.

    Args:
        fh: the summary's text stream.
        warning_count: warnings written to the detail log.
        error_count: errors written to the detail log.
    """
    if warning_count == 0:
        warnings = "\nNo warnings encountered during test.\n"
    elif warning_count == 1:
        warnings = "\n1 warning encountered. See detailed log.\n"
    else:
        warnings = f"\n{warning_count} warnings encountered. See detailed log.\n"
    if error_count == 0:
        errors = "\nNo errors encountered during test.\n"
    elif error_count == 1:
        errors = "\n1 ERROR encountered. See detailed log.\n"
    else:
        errors = f"\n{error_count} ERRORS encountered. See detailed log.\n"
    fh.write(warnings + errors)


# ------------------------------------------------------------------------ detail log


def _json_string(text: str) -> str:
    return json.dumps(str(text), ensure_ascii=False)


def _detail_value(value: Any) -> str:
    """A value as MLPerf's detail log encodes it (always valid JSON here)."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return f"{value:g}"
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, Mapping):
        items = sorted((str(k), str(v)) for k, v in value.items())
        return "{" + ",".join(f"{_json_string(k)}:{_json_string(v)}" for k, v in items) + "}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return '"' + bytes(value).hex().upper() + '"'
    if isinstance(value, (list, tuple, np.ndarray)):
        return "[" + ",".join(str(int(v)) for v in value) + "]"
    if value is None:
        return "null"
    return _json_string(str(value))


def power_date_time(epoch_ns: int) -> str:
    """A wall-clock time as MLPerf's power lines write it: UTC ``MM-DD-YYYY HH:MM:SS.mmm``.

    Args:
        epoch_ns: ns since the Unix epoch (``time.time_ns()``).
    """
    seconds, remainder_ns = divmod(int(epoch_ns), 1_000_000_000)
    stamp = time.strftime("%m-%d-%Y %H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{remainder_ns // 1_000_000:03d}"


def current_date_time_iso8601(epoch_s: float | None = None) -> str:
    """The test's date and time as MLPerf names files and logs it.

    MLPerf formats the *local* time and appends a literal ``Z``; this does the same.

    Args:
        epoch_s: seconds since the epoch; now when None.

    Returns:
        e.g. ``"2024-05-01T12:34:56Z"``.
    """
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.localtime(epoch_s))


def _default_clock() -> Callable[[], int]:
    try:
        from .. import _core

        return _core.now_ns
    except (ImportError, AttributeError):  # pragma: no cover
        return time.monotonic_ns


@lru_cache(maxsize=1)
def _package_identity() -> dict[str, Any]:
    """Version, build dates and file digests of this loadgen, for the version lines."""
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        from importlib.metadata import version as _dist_version

        version = _dist_version("loadgen")
    except ImportError:  # not installed as a distribution (PackageNotFoundError)
        version = ""
    if not version:
        from .._version import __version__ as version
    digests: dict[str, str] = {}
    build_time: float | None = None
    for sub in ("", "mlperf"):
        folder = os.path.join(package_dir, sub)
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                continue
            try:
                with open(path, "rb") as f:
                    digests[f"/{sub + '/' if sub else ''}{name}"] = hashlib.sha1(f.read()).hexdigest()
            except OSError:
                continue
            if name.startswith("_core"):
                build_time = os.path.getmtime(path)
    if build_time is None:
        build_time = time.time()
    local = datetime.datetime.fromtimestamp(build_time).isoformat()
    utc = datetime.datetime.fromtimestamp(build_time, datetime.timezone.utc).replace(tzinfo=None).isoformat()
    return {"version": str(version), "build_local": local, "build_utc": utc, "sha1": digests}


class DetailLog:
    """Writes ``mlperf_log_detail.txt``: one ``:::MLLOG {json}`` line per entry.

    Each line carries, in MLPerf's order: key, value, time_ms (since the log's origin,
    with 6 decimals), namespace, event_type and metadata (is_error, is_warning, the
    Python file and line that logged it, pid, tid). Thread-safe.

    Args:
        fh: text stream to write to (the caller owns it).
        origin_ns: the clock reading that time_ms counts from; now when None.
        clock: a monotonic ns clock; loadgen's native clock by default.
        copy_to_stdout: also print every line (MLPerf's copy_detail_to_stdout).
    """

    def __init__(
        self,
        fh: IO[str],
        *,
        origin_ns: int | None = None,
        clock: Callable[[], int] | None = None,
        copy_to_stdout: bool = False,
    ) -> None:
        self._fh = fh
        self._clock = clock or _default_clock()
        self.origin_ns = int(self._clock() if origin_ns is None else origin_ns)
        self.copy_to_stdout = copy_to_stdout
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.error_count = 0
        self.warning_count = 0

    # ------------------------------------------------------------- the entries

    def _write(self, key: str, value: Any, is_error: bool, is_warning: bool,
               time_ns: int | None, depth: int) -> None:
        frame = sys._getframe(depth)
        file_name = os.path.basename(frame.f_code.co_filename)
        line_no = frame.f_lineno
        elapsed = int((self._clock() if time_ns is None else time_ns) - self.origin_ns)
        whole_ms, fraction_ns = divmod(max(elapsed, 0), 1_000_000)
        line = (
            f':::MLLOG {{"key": {_json_string(key)}, "value": {_detail_value(value)}, '
            f'"time_ms": {whole_ms}.{fraction_ns:06d}, "namespace": "mlperf::logging", '
            f'"event_type": "POINT_IN_TIME", "metadata": {{"is_error": {"true" if is_error else "false"}, '
            f'"is_warning": {"true" if is_warning else "false"}, "file": {_json_string(file_name)}, '
            f'"line_no": {line_no}, "pid": {self._pid}, "tid": {threading.get_native_id()}}}}}\n'
        )
        with self._lock:
            if is_error:
                self.error_count += 1
            if is_warning:
                self.warning_count += 1
            self._fh.write(line)
            if is_error:
                self._fh.flush()
            if self.copy_to_stdout:
                sys.stdout.write(line)

    def log(self, key: str, value: Any, *, time_ns: int | None = None) -> None:
        """Writes one entry.

        Args:
            key: MLPerf's key, e.g. ``"result_validity"``.
            value: bool, int, float, str, a sequence of ints, a str-to-str mapping or bytes
                (written as upper-case hex).
            time_ns: the clock reading to stamp it with; now when None.
        """
        self._write(key, value, False, False, time_ns, 2)

    def error(self, key: str, message: Any, *, time_ns: int | None = None) -> None:
        """Writes an error entry (``is_error`` true; counted in ``num_errors``).

        Args:
            key: e.g. ``"error_runtime"``, ``"error_invalid_test_settings"``.
            message: what went wrong.
            time_ns: as for :meth:`log`.
        """
        self._write(key, message, True, False, time_ns, 2)

    def warning(self, key: str, message: Any, *, time_ns: int | None = None) -> None:
        """Writes a warning entry (``is_warning`` true), e.g. ``"warning_generic_message"``."""
        self._write(key, message, False, True, time_ns, 2)

    def interval_start(self, key: str, value: Any, *, time_ns: int | None = None) -> None:
        """Writes the opening entry of an interval (MLPerf: ``power_begin``)."""
        self._write(key, value, False, False, time_ns, 2)

    def interval_end(self, key: str, value: Any, *, time_ns: int | None = None) -> None:
        """Writes the closing entry of an interval (MLPerf: ``power_end``)."""
        self._write(key, value, False, False, time_ns, 2)

    def flush(self) -> None:
        """Flushes the stream."""
        with self._lock:
            self._fh.flush()

    # ------------------------------------------------- MLPerf's standard entries

    def log_version_info(self, *, git_revision: str = "NA") -> None:
        """Writes the ``loadgen_*`` version lines that open every MLPerf detail log.

        The values describe this package: its version, the build time of its native
        extension and the SHA-1 of its files. Git details are ``"NA"`` (as MLPerf writes
        them for a build outside a git checkout), which MLPerf does not flag as an error.

        Args:
            git_revision: appended to the version after " @ ".
        """
        ident = _package_identity()
        self._write("loadgen_version", f"{ident['version']} @ {git_revision}", False, False, None, 1)
        self._write("loadgen_build_date_local", ident["build_local"], False, False, None, 1)
        self._write("loadgen_build_date_utc", ident["build_utc"], False, False, None, 1)
        self._write("loadgen_git_commit_date", "NA", False, False, None, 1)
        self._write("loadgen_git_log_message", "NA", False, False, None, 1)
        self._write("loadgen_git_status_message", "NA", False, False, None, 1)
        self._write("loadgen_file_sha1", ident["sha1"], False, False, None, 1)

    def log_test_start(
        self,
        *,
        test_date_time: str,
        sut_name: str,
        get_sut_name_duration_ns: int,
        qsl_name: str,
        qsl_total_count: int,
        qsl_performance_count: int,
    ) -> None:
        """Writes the test identity lines (test_datetime, sut_name, qsl_* ...)."""
        for key, value in (
            ("test_datetime", test_date_time),
            ("sut_name", sut_name),
            ("get_sut_name_duration_ns", int(get_sut_name_duration_ns)),
            ("qsl_name", qsl_name),
            ("qsl_reported_total_count", int(qsl_total_count)),
            ("qsl_reported_performance_count", int(qsl_performance_count)),
        ):
            self._write(key, value, False, False, None, 1)

    def log_items(self, items: Iterable[tuple[str, Any]]) -> None:
        """Writes ``(key, value)`` pairs, e.g. the requested_* or effective_* settings."""
        for key, value in items:
            self._write(key, value, False, False, None, 1)

    def log_settings(self, eff: Any) -> None:
        """Writes the requested_* then the effective_* settings lines of ``eff``."""
        from .settings import effective_log_items, requested_log_items

        for key, value in requested_log_items(eff.requested) + effective_log_items(eff):
            self._write(key, value, False, False, None, 1)

    def log_generated_queries(self, query_count: int, samples_per_query: int, duration_ns: int) -> None:
        """Writes generated_query_count, generated_samples_per_query, generated_query_duration."""
        self._write("generated_query_count", int(query_count), False, False, None, 1)
        self._write("generated_samples_per_query", int(samples_per_query), False, False, None, 1)
        self._write("generated_query_duration", int(duration_ns), False, False, None, 1)

    def log_loaded_qsl_set(self, indices: Sequence[int]) -> None:
        """Writes ``loaded_qsl_set``: the sample indices loaded into memory."""
        self._write("loaded_qsl_set", list(indices), False, False, None, 1)

    def log_power(self, start_epoch_ns: int, active_duration_ns: int) -> None:
        """Writes power_begin and power_end (UTC wall clock, ms precision).

        Args:
            start_epoch_ns: wall-clock time (``time.time_ns()``) when issuing started.
            active_duration_ns: from the start of issuing to the last completion.
        """
        self._write("power_begin", power_date_time(start_epoch_ns), False, False, None, 1)
        self._write("power_end", power_date_time(int(start_epoch_ns) + int(active_duration_ns)),
                    False, False, None, 1)


def write_detail_results(detail: DetailLog, eff: Any, fig: RunFigures, ev: Evaluation) -> None:
    """Writes a performance run's result lines to the detail log, in MLPerf's order.

    MLPerf's lines (result_validity ... result_*_percentile_latency_ns, token and inferred
    token lines) come first, then our additions (``loadgen_*``: issue delay, encoded HDR
    histograms), and ``num_errors`` last.

    Args:
        detail: the detail log.
        eff: the effective settings.
        fig: what the run measured.
        ev: ``evaluate(eff, fig)``.
    """
    scenario = _scenario_of(eff)
    use_tokens = bool(getattr(eff, "use_token_latencies", False))
    lines: list[tuple[str, Any]] = [("result_validity", ev.result_validity)]
    if ev.has_perf_constraints:
        lines.append(("result_perf_constraints_met", ev.perf_constraints_met))
    lines.append(("result_min_duration_met", ev.min_duration_met))
    lines.append(("result_min_queries_met", ev.min_queries_met))
    lines.append(("early_stopping_met", ev.early_stopping_met))
    if not ev.valid:
        reason = ""
        if not ev.perf_constraints_met:
            reason += ev.perf_constraints_recommendation + " "
        if not ev.min_duration_met:
            reason += ev.min_duration_recommendation + " "
        if not ev.min_queries_met:
            reason += _EXITED_EARLY
        lines.append(("result_invalid_reason", reason.replace("\n", " ")))
    if not use_tokens:
        lines.append(("early_stopping_result", ev.early_stopping_text.replace("\n", " ")))
    else:
        lines.append(("early_stopping_ttft_result", ev.early_stopping_ttft_text.replace("\n", " ")))
        lines.append(("early_stopping_tpot_result", ev.early_stopping_tpot_text.replace("\n", " ")))
    lines.append(("result_query_count", ev.query_count))
    if scenario == _SERVER:
        lines.append(("result_overlatency_query_count", ev.overlatency_query_count))

    if scenario == _SINGLE_STREAM:
        lines += [
            ("result_qps_with_loadgen_overhead", ev.qps_with_loadgen_overhead),
            ("result_qps_without_loadgen_overhead", ev.qps_without_loadgen_overhead),
            ("early_stopping_latency_ss", ev.early_stopping_latency_ss_ns),
            ("early_stopping_latency_ms", ev.early_stopping_latency_ms_ns),
        ]
    elif scenario == _MULTI_STREAM:
        lines += [
            ("result_min_query_latency_ns", ev.query_latency_min_ns),
            ("result_max_query_latency_ns", ev.query_latency_max_ns),
            ("result_mean_query_latency_ns", ev.query_latency_mean_ns),
        ]
        lines += [
            (f"result_{cpp_fixed(p * 100)}_percentile_per_query_latency_ns", ev.query_latency_percentiles_ns[p])
            for p in LATENCY_PERCENTILES
        ]
        lines.append(("early_stopping_latency_ms", ev.early_stopping_latency_ms_ns))
    elif scenario == _SERVER:
        lines += [
            ("result_scheduled_samples_per_sec", ev.scheduled_samples_per_s),
            ("result_completed_samples_per_sec", ev.completed_samples_per_s),
        ]
    elif scenario == _OFFLINE:
        lines.append(("result_samples_per_second", ev.samples_per_s))

    lines += [
        ("result_min_latency_ns", ev.sample_latency_min_ns),
        ("result_max_latency_ns", ev.sample_latency_max_ns),
        ("result_mean_latency_ns", ev.sample_latency_mean_ns),
    ]
    lines += [
        (f"result_{cpp_fixed(p * 100)}_percentile_latency_ns", ev.sample_latency_percentiles_ns[p])
        for p in LATENCY_PERCENTILES
    ]
    if use_tokens:
        if scenario != _OFFLINE:
            lines += [
                ("result_first_token_min_latency_ns", ev.first_token_min_ns),
                ("result_first_token_max_latency_ns", ev.first_token_max_ns),
                ("result_first_token_mean_latency_ns", ev.first_token_mean_ns),
            ]
            lines += [
                (f"result_first_token_{cpp_fixed(p * 100)}_percentile_latency_ns", ev.first_token_percentiles_ns[p])
                for p in LATENCY_PERCENTILES
            ]
            lines += [
                ("result_token_throughput_with_loadgen_overhead", ev.tokens_per_s_with_loadgen_overhead),
                ("result_token_throughput", ev.tokens_per_s_detail_throughput),
            ]
            lines += [
                (f"result_time_per_output_token_{cpp_fixed(p * 100)}_percentile_ns", ev.tpot_percentiles_ns[p])
                for p in LATENCY_PERCENTILES
            ]
            lines += [
                ("result_time_to_output_token_min", ev.tpot_min_ns),
                ("result_time_to_output_token_max", ev.tpot_max_ns),
                ("result_time_to_output_token_mean", ev.tpot_mean_ns),
                ("result_completed_tokens_per_second", ev.completed_tokens_per_s),
            ]
        else:
            lines.append(("result_tokens_per_second", ev.tokens_per_s))
    if getattr(eff, "infer_token_latencies", False):
        if scenario == _SERVER:
            lines.append(("result_inferred_completed_tokens_per_second", ev.inferred_tokens_per_s))
        elif scenario == _OFFLINE:
            lines.append(("result_inferred_tokens_per_second", ev.inferred_tokens_per_s))

    lines += _detail_extras(fig)
    stamp = detail._clock()
    for key, value in lines:
        detail._write(key, value, False, False, stamp, 1)
    detail._write("num_errors", detail.error_count, False, False, stamp, 1)


def _detail_extras(fig: RunFigures) -> list[tuple[str, Any]]:
    """Our additions to the detail log, all keyed ``loadgen_*``."""
    extras: list[tuple[str, Any]] = []
    delay = fig.issue_delay
    if delay is not None and delay.total_count:
        view = _Ordered(delay)
        extras += [
            ("loadgen_issue_delay_count", view.count),
            ("loadgen_issue_delay_min_ns", view.min),
            ("loadgen_issue_delay_max_ns", view.max),
            ("loadgen_issue_delay_mean_ns", round(delay.mean)),
        ]
        extras += [
            (f"loadgen_issue_delay_p{p * 100:g}_ns", view.at(int(view.count * p))) for p in LATENCY_PERCENTILES
        ]
    for key, histogram in (
        ("loadgen_sample_latency_hdr", fig.sample_latency),
        ("loadgen_query_latency_hdr", fig.query_latency),
        ("loadgen_issue_delay_hdr", fig.issue_delay),
        ("loadgen_first_token_latency_hdr", fig.first_token_latency),
        ("loadgen_time_per_output_token_hdr", fig.time_per_output_token),
    ):
        if histogram is not None and histogram.total_count:
            extras.append((key, histogram.encode()))
    extras += [
        ("loadgen_samples_issued", int(fig.samples_issued)),
        ("loadgen_unknown_completions", int(fig.unknown_completions)),
        ("loadgen_ran_out_of_generated_queries", bool(fig.ran_out_of_generated_queries)),
    ]
    return extras


# ---------------------------------------------------------------------- accuracy log


class AccuracyLog:
    """Writes ``mlperf_log_accuracy.json``: a JSON list with one entry per logged response.

    Entries read ``{ "seq_id" : 0, "qsl_idx" : 5, "data" : "05AB" }``, one per line, the
    data in upper-case hex; token runs add ``"token_count"`` and, outside Offline,
    ``"token_data"`` (the first-token response) before it. With no entry the file is
    ``[`` and ``]`` on two lines. Thread-safe.

    Args:
        fh: text stream to write to; "[" is written at once.
        use_tokens: the run reports output token counts (``use_token_latencies``).
        needs_first_token: token runs other than Offline also log the first token.
    """

    def __init__(self, fh: IO[str], *, use_tokens: bool = False, needs_first_token: bool = False) -> None:
        self._fh = fh
        self.use_tokens = use_tokens
        self.needs_first_token = needs_first_token
        self._lock = threading.Lock()
        self._needs_comma = False
        self._closed = False
        self.count = 0
        fh.write("[")

    def add(
        self,
        seq_id: int,
        qsl_idx: int,
        data: bytes,
        *,
        token_count: int = 0,
        token_data: bytes | None = None,
    ) -> None:
        """Appends one response.

        Args:
            seq_id: the sample's sequence id.
            qsl_idx: the sample's index in the QSL.
            data: the response bytes.
            token_count: output tokens (token runs only).
            token_data: the first-token response (token runs outside Offline).
        """
        fields = f'"seq_id" : {int(seq_id)}, "qsl_idx" : {int(qsl_idx)}, "data" : "{bytes(data).hex().upper()}"'
        if self.use_tokens:
            if self.needs_first_token:
                hex_first = bytes(token_data).hex().upper() if token_data is not None else ""
                fields += f', "token_data" : "{hex_first}"'
            fields += f', "token_count" : {int(token_count)}'
        with self._lock:
            if self._closed:
                raise ValueError("the accuracy log is closed")
            self._fh.write((",\n{ " if self._needs_comma else "\n{ ") + fields + " }")
            self._needs_comma = True
            self.count += 1

    def close(self) -> None:
        """Ends the JSON list (idempotent); the caller closes the stream."""
        with self._lock:
            if not self._closed:
                self._fh.write("\n]\n")
                self._closed = True
                self._fh.flush()


# ------------------------------------------------------------------------- log paths


def log_paths(log_output_settings: Any, test_date_time: str) -> dict[str, str]:
    """The four log file paths, named as MLPerf's LogOutputSettings name them.

    ``outdir + "/" + prefix [+ test_date_time + "_"] + kind + suffix + extension``.

    Args:
        log_output_settings: has ``outdir``, ``prefix``, ``suffix`` and
            ``prefix_with_datetime`` (like ``lg.LogOutputSettings``).
        test_date_time: :func:`current_date_time_iso8601` at the start of the test.

    Returns:
        ``{"summary": ..., "detail": ..., "accuracy": ..., "trace": ...}``.
    """
    head = f"{log_output_settings.outdir}/{log_output_settings.prefix}"
    if log_output_settings.prefix_with_datetime:
        head += f"{test_date_time}_"
    suffix = log_output_settings.suffix
    return {
        "summary": f"{head}summary{suffix}.txt",
        "detail": f"{head}detail{suffix}.txt",
        "accuracy": f"{head}accuracy{suffix}.json",
        "trace": f"{head}trace{suffix}.json",
    }
