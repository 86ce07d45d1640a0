"""The ``requested_*`` and ``effective_*`` entries of the detail log, in MLPerf's order."""

from __future__ import annotations

from .effective import EffectiveSettings
from .settings import TestScenario, TestSettings

__all__ = ["all_log_items", "effective_log_items", "requested_log_items"]

# The TestSettings fields MLPerf logs as requested_<field>, in its order: the
# scenario's own, then those of every scenario.
_REQUESTED_BY_SCENARIO: dict[TestScenario, tuple[str, ...]] = {
    TestScenario.SingleStream: (
        "single_stream_expected_latency_ns",
        "single_stream_target_latency_percentile",
    ),
    TestScenario.MultiStream: (
        "multi_stream_expected_latency_ns",
        "multi_stream_target_latency_percentile",
        "multi_stream_samples_per_query",
    ),
    TestScenario.Server: (
        "server_target_qps",
        "server_target_latency_ns",
        "server_target_latency_percentile",
        "server_coalesce_queries",
        "server_find_peak_qps_decimals_of_precision",
        "server_find_peak_qps_boundary_step_size",
        "server_max_async_queries",
        "server_num_issue_query_threads",
    ),
    TestScenario.Offline: ("offline_expected_qps",),
}
_REQUESTED_COMMON: tuple[str, ...] = (
    "min_duration_ms",
    "max_duration_ms",
    "min_query_count",
    "max_query_count",
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
    "performance_sample_count_override",
    "accuracy_sample_count_override",
    "sample_concatenate_permutation",
)


def requested_log_items(ts: TestSettings) -> list[tuple[str, object]]:
    """The ``requested_*`` detail log entries for ``ts``, in MLPerf's order.

    Args:
        ts: the settings the test runs with.

    Returns:
        ``(key, value)`` pairs; enums as their names, numbers and flags as Python
        ints, floats and bools.
    """
    items: list[tuple[str, object]] = [
        ("requested_scenario", ts.scenario.name),
        ("requested_test_mode", ts.mode.name),
    ]
    names = _REQUESTED_BY_SCENARIO[ts.scenario] + _REQUESTED_COMMON
    items += [(f"requested_{name}", getattr(ts, name)) for name in names]
    if ts.use_token_latencies:
        items.append(("requested_use_token_latencies", ts.use_token_latencies))
        if ts.scenario is not TestScenario.Offline:
            items += [
                ("requested_server_ttft_latency", ts.ttft_latency),
                ("requested_server_tpot_latency", ts.tpot_latency),
            ]
    return items


def effective_log_items(eff: EffectiveSettings) -> list[tuple[str, object]]:
    """The ``effective_*`` detail log entries for ``eff``, in MLPerf's order.

    Args:
        eff: the effective settings of the test.

    Returns:
        ``(key, value)`` pairs; durations in the units their keys name.
    """
    return [
        ("effective_scenario", eff.scenario.name),
        ("effective_test_mode", eff.mode.name),
        ("effective_samples_per_query", eff.samples_per_query),
        ("effective_target_qps", eff.target_qps),
        ("effective_target_latency_ns", eff.target_latency_ns),
        ("effective_target_latency_percentile", eff.target_latency_percentile),
        ("effective_max_async_queries", eff.max_async_queries),
        ("effective_target_duration_ms", eff.target_duration_ms),
        ("effective_min_duration_ms", eff.min_duration_ms),
        ("effective_max_duration_ms", eff.max_duration_ms),
        ("effective_min_query_count", eff.min_query_count),
        ("effective_max_query_count", eff.max_query_count),
        ("effective_min_sample_count", eff.min_sample_count),
        ("effective_qsl_rng_seed", eff.qsl_rng_seed),
        ("effective_sample_index_rng_seed", eff.sample_index_rng_seed),
        ("effective_schedule_rng_seed", eff.schedule_rng_seed),
        ("effective_accuracy_log_rng_seed", eff.accuracy_log_rng_seed),
        ("effective_accuracy_log_probability", eff.accuracy_log_probability),
        ("effective_accuracy_log_sampling_target", eff.accuracy_log_sampling_target),
        ("effective_print_timestamps", eff.print_timestamps),
        ("effective_performance_issue_unique", eff.performance_issue_unique),
        ("effective_performance_issue_same", eff.performance_issue_same),
        ("effective_performance_issue_same_index", eff.performance_issue_same_index),
        ("effective_performance_sample_count", eff.performance_sample_count),
        ("effective_accuracy_sample_count", eff.accuracy_sample_count),
        (
            "effective_sample_concatenate_permutation",
            eff.sample_concatenate_permutation,
        ),
    ]


def all_log_items(eff: EffectiveSettings) -> list[tuple[str, object]]:
    """The requested entries of ``eff.requested`` followed by the effective ones.

    Args:
        eff: the effective settings of the test.

    Returns:
        ``requested_log_items(eff.requested) + effective_log_items(eff)``.
    """
    return requested_log_items(eff.requested) + effective_log_items(eff)
