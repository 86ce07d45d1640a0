"""The ``requested_*`` and ``effective_*`` entries of the detail log, in MLPerf's order."""

from __future__ import annotations

from .effective import EffectiveSettings
from .settings import TestScenario, TestSettings

__all__ = ["all_log_items", "effective_log_items", "requested_log_items"]


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
    if ts.scenario is TestScenario.SingleStream:
        items += [
            (
                "requested_single_stream_expected_latency_ns",
                ts.single_stream_expected_latency_ns,
            ),
            (
                "requested_single_stream_target_latency_percentile",
                ts.single_stream_target_latency_percentile,
            ),
        ]
    elif ts.scenario is TestScenario.MultiStream:
        items += [
            (
                "requested_multi_stream_expected_latency_ns",
                ts.multi_stream_expected_latency_ns,
            ),
            (
                "requested_multi_stream_target_latency_percentile",
                ts.multi_stream_target_latency_percentile,
            ),
            (
                "requested_multi_stream_samples_per_query",
                ts.multi_stream_samples_per_query,
            ),
        ]
    elif ts.scenario is TestScenario.Server:
        items += [
            ("requested_server_target_qps", ts.server_target_qps),
            ("requested_server_target_latency_ns", ts.server_target_latency_ns),
            (
                "requested_server_target_latency_percentile",
                ts.server_target_latency_percentile,
            ),
            ("requested_server_coalesce_queries", ts.server_coalesce_queries),
            (
                "requested_server_find_peak_qps_decimals_of_precision",
                ts.server_find_peak_qps_decimals_of_precision,
            ),
            (
                "requested_server_find_peak_qps_boundary_step_size",
                ts.server_find_peak_qps_boundary_step_size,
            ),
            ("requested_server_max_async_queries", ts.server_max_async_queries),
            (
                "requested_server_num_issue_query_threads",
                ts.server_num_issue_query_threads,
            ),
        ]
    else:
        items.append(("requested_offline_expected_qps", ts.offline_expected_qps))

    items += [
        ("requested_min_duration_ms", ts.min_duration_ms),
        ("requested_max_duration_ms", ts.max_duration_ms),
        ("requested_min_query_count", ts.min_query_count),
        ("requested_max_query_count", ts.max_query_count),
        ("requested_qsl_rng_seed", ts.qsl_rng_seed),
        ("requested_sample_index_rng_seed", ts.sample_index_rng_seed),
        ("requested_schedule_rng_seed", ts.schedule_rng_seed),
        ("requested_accuracy_log_rng_seed", ts.accuracy_log_rng_seed),
        ("requested_accuracy_log_probability", ts.accuracy_log_probability),
        ("requested_accuracy_log_sampling_target", ts.accuracy_log_sampling_target),
        ("requested_print_timestamps", ts.print_timestamps),
        ("requested_performance_issue_unique", ts.performance_issue_unique),
        ("requested_performance_issue_same", ts.performance_issue_same),
        ("requested_performance_issue_same_index", ts.performance_issue_same_index),
        (
            "requested_performance_sample_count_override",
            ts.performance_sample_count_override,
        ),
        ("requested_accuracy_sample_count_override", ts.accuracy_sample_count_override),
        ("requested_sample_concatenate_permutation", ts.sample_concatenate_permutation),
    ]
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
