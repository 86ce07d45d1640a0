"""The settings a run uses, derived from the requested ones as MLPerf LoadGen derives them.

:func:`effective_settings` is MLPerf's normalisation before a run (query counts, target
QPS, durations), computed with the same integer and floating-point conversions so that
generated query counts agree; :func:`apply_test05` is the compliance TEST05 adjustment.
"""

from __future__ import annotations

import math

from ..units import NS_PER, ms_to_s
from dataclasses import dataclass, field

from .number_text import cpp_divide
from .settings import TestMode, TestScenario, TestSettings, describe, unsigned64

__all__ = ["EffectiveSettings", "apply_test05", "effective_settings"]

_U64_MASK = (1 << 64) - 1
_NS_PER_MS = NS_PER["ms"]
_NS_PER_S = NS_PER["s"]

# EffectiveSettings fields that take the requested value unchanged.
_AS_REQUESTED = (
    "qsl_rng_seed",
    "sample_index_rng_seed",
    "schedule_rng_seed",
    "accuracy_log_rng_seed",
    "accuracy_log_probability",
    "accuracy_log_sampling_target",
    "print_timestamps",
    "performance_issue_unique",
    "performance_issue_same",
    "performance_issue_same_index",
    "use_token_latencies",
    "infer_token_latencies",
)


def _as_int64(value: int) -> int:
    """A 64-bit unsigned value read as two's-complement signed."""
    value &= _U64_MASK
    return value - (1 << 64) if value >> 63 else value


def _double_to_uint64(value: float) -> int:
    """Converts double to uint64_t as MLPerf's x86-64 build does.

    Values in [0, 2**64) truncate toward zero; negative values that fit int64 wrap
    modulo 2**64; NaN and other out-of-range values give 2**63, or 0 from 2**64 up.
    """

    def truncate_to_int64_bits(x: float) -> int:
        if math.isnan(x) or not (-9223372036854775808.0 <= x < 9223372036854775808.0):
            return 1 << 63
        return int(x) & _U64_MASK

    two_to_63 = 9223372036854775808.0
    if value >= two_to_63:
        return truncate_to_int64_bits(value - two_to_63) ^ (1 << 63)
    return truncate_to_int64_bits(value)


@dataclass(frozen=True)
class EffectiveSettings:
    """The settings a run uses, derived from the requested ones (MLPerf's
    ``TestSettingsInternal``).

    Field names are MLPerf's member names; its ``std::chrono`` durations are
    integer nanoseconds here, with ``_ns`` appended (they hold whole milliseconds,
    except ``target_latency_ns``).

    Attributes:
        requested: a copy of the requested settings.
        scenario: the requested scenario.
        mode: the requested mode.
        samples_per_query: samples in each query (Offline: in its single query).
        target_qps: the rate the schedule is generated for, queries/s.
        target_latency_ns: the Server latency bound, ns (0 elsewhere).
        target_latency_percentile: the reported latency percentile (fraction).
        max_async_queries: most outstanding queries, 0 for unlimited.
        target_duration_ns: the duration queries are generated for (0 for Offline).
        min_duration_ns: minimum test duration.
        max_duration_ns: maximum test duration, 0 for unlimited.
        min_query_count: minimum number of queries.
        max_query_count: maximum number of queries, 0 for unlimited.
        min_sample_count: ``min_query_count * samples_per_query`` (modulo 2**64).
        qsl_rng_seed: as requested.
        sample_index_rng_seed: as requested.
        schedule_rng_seed: as requested.
        accuracy_log_rng_seed: as requested.
        accuracy_log_probability: as requested.
        accuracy_log_sampling_target: as requested.
        print_timestamps: as requested.
        performance_issue_unique: as requested.
        performance_issue_same: as requested.
        performance_issue_same_index: as requested.
        performance_sample_count: the override, or the QSL's performance count.
        accuracy_sample_count: the override, or the QSL's total count.
        sample_concatenate_permutation: as requested.
        use_token_latencies: as requested.
        server_ttft_latency: the first-token bound, ns (signed 64-bit).
        server_tpot_latency: the per-token bound, ns (signed 64-bit).
        infer_token_latencies: as requested.
        token_latency_scaling_factor: as requested (signed 64-bit).
        setting_errors: problems MLPerf logs as
            ``error_invalid_test_settings``, in the order it logs them.
    """

    requested: TestSettings = field(hash=False)
    scenario: TestScenario
    mode: TestMode
    samples_per_query: int
    target_qps: float
    target_latency_ns: int
    target_latency_percentile: float
    max_async_queries: int
    target_duration_ns: int
    min_duration_ns: int
    max_duration_ns: int
    min_query_count: int
    max_query_count: int
    min_sample_count: int
    qsl_rng_seed: int
    sample_index_rng_seed: int
    schedule_rng_seed: int
    accuracy_log_rng_seed: int
    accuracy_log_probability: float
    accuracy_log_sampling_target: int
    print_timestamps: bool
    performance_issue_unique: bool
    performance_issue_same: bool
    performance_issue_same_index: int
    performance_sample_count: int
    accuracy_sample_count: int
    sample_concatenate_permutation: bool
    use_token_latencies: bool
    server_ttft_latency: int
    server_tpot_latency: int
    infer_token_latencies: bool
    token_latency_scaling_factor: int
    setting_errors: tuple[str, ...] = ()

    @property
    def target_duration_ms(self) -> int:
        """``target_duration_ns`` in whole milliseconds."""
        return self.target_duration_ns // _NS_PER_MS

    @property
    def min_duration_ms(self) -> int:
        """``min_duration_ns`` in whole milliseconds."""
        return self.min_duration_ns // _NS_PER_MS

    @property
    def max_duration_ms(self) -> int:
        """``max_duration_ns`` in whole milliseconds."""
        return self.max_duration_ns // _NS_PER_MS


def effective_settings(
    requested: TestSettings,
    qsl_performance_sample_count: int,
    qsl_total_sample_count: int,
) -> EffectiveSettings:
    """Derives the settings a run uses, as MLPerf LoadGen does before a test.

    Args:
        requested: the settings given to the test (after any audit.config and
            TEST05 adjustments, see :func:`apply_test05`).
        qsl_performance_sample_count: the QSL's ``PerformanceSampleCount()``.
        qsl_total_sample_count: the QSL's ``TotalSampleCount()``.

    Returns:
        The effective settings; invalid requests are reported in
        ``setting_errors`` and replaced as MLPerf replaces them.

    Raises:
        TypeError: ``requested`` is not a :class:`TestSettings` or a count is not
            an unsigned 64-bit integer.
        ValueError: SingleStream with ``sample_concatenate_permutation`` and a QSL
            performance sample count of 0 (MLPerf divides by it).
    """
    qsl_performance, qsl_total = _checked_arguments(
        requested, qsl_performance_sample_count, qsl_total_sample_count
    )
    r = requested.copy()
    errors: list[str] = []
    # MLPerf keeps these as signed 64-bit millisecond counts.
    target_duration_ms = _as_int64(r.min_duration_ms)
    min_duration_ms = _as_int64(r.min_duration_ms)
    max_duration_ms = _as_int64(r.max_duration_ms)
    min_query_count = r.min_query_count
    scenario = r.scenario
    target_qps, target_latency_ns, target_latency_percentile, max_async_queries = _scenario_targets(
        r, errors
    )
    samples_per_query = r.multi_stream_samples_per_query if scenario is TestScenario.MultiStream else 1
    performance_sample_count = r.performance_sample_count_override or qsl_performance
    accuracy_sample_count = r.accuracy_sample_count_override or qsl_total
    sample_concatenate_permutation = r.sample_concatenate_permutation
    if scenario is TestScenario.Offline:
        samples_per_query = _offline_samples_per_query(
            r, target_duration_ms, target_qps, performance_sample_count, min_query_count
        )
        min_query_count = 1
        target_duration_ms = 0
    if sample_concatenate_permutation and scenario is TestScenario.SingleStream:
        min_query_count = _equal_issue_min_query_count(
            min_query_count, target_duration_ms, target_qps, qsl_performance
        )
    min_sample_count = (min_query_count * samples_per_query) & _U64_MASK
    errors += _issue_setting_errors(r, performance_sample_count)
    return EffectiveSettings(
        requested=r,
        scenario=scenario,
        mode=r.mode,
        samples_per_query=samples_per_query,
        target_qps=target_qps,
        target_latency_ns=target_latency_ns,
        target_latency_percentile=target_latency_percentile,
        max_async_queries=max_async_queries,
        target_duration_ns=target_duration_ms * _NS_PER_MS,
        min_duration_ns=min_duration_ms * _NS_PER_MS,
        max_duration_ns=max_duration_ms * _NS_PER_MS,
        min_query_count=min_query_count,
        max_query_count=r.max_query_count,
        **{name: getattr(r, name) for name in _AS_REQUESTED},
        min_sample_count=min_sample_count,
        performance_sample_count=performance_sample_count,
        accuracy_sample_count=accuracy_sample_count,
        sample_concatenate_permutation=sample_concatenate_permutation,
        server_ttft_latency=_as_int64(r.ttft_latency),
        server_tpot_latency=_as_int64(r.tpot_latency),
        token_latency_scaling_factor=_as_int64(r.token_latency_scaling_factor),
        setting_errors=tuple(errors),
    )


def _checked_arguments(requested: object, qsl_performance: object, qsl_total: object) -> tuple[int, int]:
    if not isinstance(requested, TestSettings):
        raise TypeError(
            f"effective_settings: requested must be a TestSettings, "
            f"got {describe(requested)}"
        )
    qsl_performance = unsigned64(
        "effective_settings", "qsl_performance_sample_count", qsl_performance
    )
    qsl_total = unsigned64(
        "effective_settings", "qsl_total_sample_count", qsl_total
    )
    return qsl_performance, qsl_total


def _scenario_targets(r: TestSettings, errors: list[str]) -> tuple[float, int, float, int]:
    """(target QPS, target latency ns, target percentile, max async queries) per scenario."""
    target_qps = 1.0
    target_latency_ns = 0
    target_latency_percentile = 0.0
    max_async_queries = 0
    scenario = r.scenario
    if scenario is TestScenario.SingleStream:
        target_qps = cpp_divide(float(_NS_PER_S), r.single_stream_expected_latency_ns)
        max_async_queries = 1
        target_latency_percentile = r.single_stream_target_latency_percentile
    elif scenario is TestScenario.MultiStream:
        target_qps = cpp_divide(float(_NS_PER_S), r.multi_stream_expected_latency_ns)
        max_async_queries = 1
        target_latency_percentile = r.multi_stream_target_latency_percentile
    elif scenario is TestScenario.Server:
        if r.server_target_qps >= 0.0:
            target_qps = r.server_target_qps
        else:
            errors.append(
                f"server_target_qps must not be negative (requested "
                f"{r.server_target_qps!r}, using {target_qps!r} instead)"
            )
        target_latency_ns = _as_int64(r.server_target_latency_ns)
        target_latency_percentile = r.server_target_latency_percentile
        max_async_queries = r.server_max_async_queries
    else:  # Offline
        target_latency_percentile = 0.99
        if r.offline_expected_qps >= 0.0:
            target_qps = r.offline_expected_qps
        else:
            errors.append(
                f"offline_expected_qps must not be negative (requested "
                f"{r.offline_expected_qps!r}, using {target_qps!r} instead)"
            )
        max_async_queries = 1

    return target_qps, target_latency_ns, target_latency_percentile, max_async_queries


def _offline_samples_per_query(
    r: TestSettings, target_duration_ms: int, target_qps: float, performance_sample_count: int,
    min_query_count: int,
) -> int:
    """Offline's one query: 10 % more samples than the expected rate needs for the duration."""
    slack = 1.1
    target_seconds = ms_to_s(float(target_duration_ms))
    target_sample_count = _double_to_uint64(slack * target_seconds * target_qps)
    if r.performance_issue_unique:
        return performance_sample_count
    return max(min_query_count, target_sample_count)


def _equal_issue_min_query_count(
    min_query_count: int, target_duration_ms: int, target_qps: float, qsl_performance: int
) -> int:
    """Equal issue: twice the expected query count, rounded up past a multiple of the
    QSL's performance sample count (a whole multiple still gets one more full round)."""
    slack = 2.0
    target_seconds = ms_to_s(float(target_duration_ms))
    expected_queries = _double_to_uint64(slack * target_seconds * target_qps)
    min_query_count = max(min_query_count, expected_queries)
    if qsl_performance == 0:
        raise ValueError(
            "sample_concatenate_permutation in SingleStream needs a QSL "
            "performance sample count above 0"
        )
    return (min_query_count + qsl_performance - min_query_count % qsl_performance) & _U64_MASK


def _issue_setting_errors(r: TestSettings, performance_sample_count: int) -> list[str]:
    errors: list[str] = []
    same_index = r.performance_issue_same_index
    if r.performance_issue_same and same_index >= performance_sample_count:
        errors.append(
            f"performance_issue_same_index ({r.performance_issue_same_index}) must be "
            f"below the performance sample count ({performance_sample_count})"
        )
    if r.performance_issue_unique and r.performance_issue_same:
        errors.append(
            "performance_issue_unique and performance_issue_same cannot both be set"
        )
    return errors


def apply_test05(ts: TestSettings) -> TestSettings:
    """Returns a copy of ``ts`` adjusted for compliance TEST05 when ``ts.test05``.

    The copy runs in PerformanceOnly mode with the three ``test05_*`` seeds in place
    of the QSL, sample index and schedule seeds. Without ``test05`` it is a plain
    copy.

    Args:
        ts: the requested settings.

    Returns:
        A new :class:`TestSettings`.
    """
    adjusted = ts.copy()
    if adjusted.test05:
        adjusted.mode = TestMode.PerformanceOnly
        adjusted.qsl_rng_seed = ts.test05_qsl_rng_seed
        adjusted.sample_index_rng_seed = ts.test05_sample_index_rng_seed
        adjusted.schedule_rng_seed = ts.test05_schedule_rng_seed
    return adjusted
