"""Writes ``mlperf_log_summary.txt`` as MLPerf LoadGen lays it out, from an Evaluation.

The file's closing warning and error counts come from :func:`write_summary_trailer`,
when the log is closed. After MLPerf's sections comes one of ours: the issue delay.
"""

from __future__ import annotations

from typing import IO, Any

import numpy as np

from ..units import NS_PER

from ..stats.early_stopping import OrderStatistics
from .evaluate import EXITED_EARLY_MESSAGE, LATENCY_PERCENTILES, Evaluation
from .figures import RunFigures
from .number_text import cpp_fixed, cpp_stream_double
from .settings import TestScenario

__all__ = ["write_summary", "write_summary_trailer"]

_BANNER = "================================================"

def _summary_value(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "1" if value else "0"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return cpp_stream_double(float(value))
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
        f"min_duration (ms): {int(eff.min_duration_ns) // NS_PER['ms']}",
        f"max_duration (ms): {int(eff.max_duration_ns) // NS_PER['ms']}",
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
    scenario = int(eff.scenario)
    use_tokens = bool(getattr(eff, "use_token_latencies", False))
    out: list[str] = [_BANNER, "MLPerf Results Summary", _BANNER]
    out.append(f"SUT name : {sut_name}")
    out.append(f"Scenario : {ev.scenario_name}")
    out.append(f"Mode     : {ev.mode_name}")
    label = cpp_fixed(ev.target_percentile * 100, 1)
    if scenario == TestScenario.SingleStream:
        out.append(f"{label}th percentile latency (ns) : {ev.sample_latency_target_ns}")
    elif scenario == TestScenario.MultiStream:
        out.append(f"{label}th percentile latency (ns) : {ev.query_latency_target_ns}")
    elif scenario == TestScenario.Server:
        out.append(f"Completed samples per second    : {cpp_fixed(ev.completed_samples_per_s)}")
    elif scenario == TestScenario.Offline:
        out.append(f"Samples per second: {cpp_stream_double(ev.samples_per_s)}")
    if use_tokens:
        if scenario in (TestScenario.SingleStream, TestScenario.MultiStream):
            out.append(f"{label}th first token percentile latency (ns) : {ev.first_token_target_ns}")
        elif scenario == TestScenario.Offline:
            out.append(f"Tokens per second: {cpp_stream_double(ev.tokens_per_s)}")
        elif scenario == TestScenario.Server:
            out.append(f"Completed tokens per second: {cpp_fixed(ev.completed_tokens_per_s)}")
    if getattr(eff, "infer_token_latencies", False):
        if scenario == TestScenario.Offline:
            out.append(f"Tokens per second (inferred): {cpp_stream_double(ev.inferred_tokens_per_s)}")
        elif scenario == TestScenario.Server:
            out.append(f"Completed tokens per second (inferred): {cpp_fixed(ev.inferred_tokens_per_s)}")
    out += _validity_lines(ev, scenario, use_tokens)
    out += _additional_stats_lines(ev, scenario)
    if use_tokens:
        out += _token_stats_lines(ev, scenario)
    out.append(f"\n{_BANNER}\nTest Parameters Used\n{_BANNER}")
    out += _settings_summary_lines(eff)
    out += _issue_delay_lines(fig)
    return out


def _validity_lines(ev: Evaluation, scenario: int, use_tokens: bool) -> list[str]:
    out: list[str] = []

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
            out.append(f" * {EXITED_EARLY_MESSAGE}\n   See the detailed log for why this may have occurred.")
        if ev.unrecorded_text:
            out.append(" * " + ev.unrecorded_text)
    if scenario in (TestScenario.SingleStream, TestScenario.Server, TestScenario.MultiStream):
        if not use_tokens:
            out += ["Early Stopping Result:", ev.early_stopping_text]
        else:
            out += ["TTFT Early Stopping Result:", ev.early_stopping_ttft_text]
            out += ["TPOT Early Stopping Result:", ev.early_stopping_tpot_text]
    return out


def _additional_stats_lines(ev: Evaluation, scenario: int) -> list[str]:
    out: list[str] = []
    out.append(f"\n{_BANNER}\nAdditional Stats\n{_BANNER}")
    pad = "                : "
    if scenario == TestScenario.SingleStream:
        out.append("QPS w/ loadgen overhead         : " + cpp_fixed(ev.qps_with_loadgen_overhead))
        out.append("QPS w/o loadgen overhead        : " + cpp_fixed(ev.qps_without_loadgen_overhead))
        out.append("")
    elif scenario == TestScenario.Server:
        out.append("Scheduled samples per second : " + cpp_fixed(ev.scheduled_samples_per_s))
    elif scenario == TestScenario.MultiStream:
        out.append("Per-query latency:  ")
        out.append(f"Min latency (ns){pad}{ev.query_latency_min_ns}")
        out.append(f"Max latency (ns){pad}{ev.query_latency_max_ns}")
        out.append(f"Mean latency (ns)               : {ev.query_latency_mean_ns}")
        for p in LATENCY_PERCENTILES:
            out.append(f"{cpp_fixed(p * 100)} percentile latency (ns)   : {ev.query_latency_percentiles_ns[p]}")
    if scenario != TestScenario.MultiStream:
        out.append(f"Min latency (ns){pad}{ev.sample_latency_min_ns}")
        out.append(f"Max latency (ns){pad}{ev.sample_latency_max_ns}")
        out.append(f"Mean latency (ns)               : {ev.sample_latency_mean_ns}")
        for p in LATENCY_PERCENTILES:
            out.append(f"{cpp_fixed(p * 100)} percentile latency (ns)   : {ev.sample_latency_percentiles_ns[p]}")
    return out


def _token_stats_lines(ev: Evaluation, scenario: int) -> list[str]:
    out: list[str] = []
    out.append("")
    if scenario == TestScenario.SingleStream:
        out.append("TPS w/ loadgen overhead         : " + cpp_fixed(ev.tokens_per_s_with_loadgen_overhead))
        out.append("TPS w/o loadgen overhead        : " + cpp_fixed(ev.tokens_per_s_without_loadgen_overhead))
    elif scenario == TestScenario.Server:
        out.append("Completed tokens per second                 : " + cpp_fixed(ev.completed_tokens_per_s))
    if scenario != TestScenario.Offline:
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
    return out


def _issue_delay_lines(fig: RunFigures) -> list[str]:
    """Our addition, after every MLPerf section: how late queries went out."""
    out: list[str] = []
    delay = fig.issue_delay
    if delay is not None and delay.total_count:
        view = OrderStatistics(delay)
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
    warnings = _tally(warning_count, "warning", "warnings")
    errors = _tally(error_count, "ERROR", "ERRORS")
    fh.write(warnings + errors)



def _tally(count: int, singular: str, plural: str) -> str:
    if count == 0:
        return f"\nNo {plural.lower()} encountered during test.\n"
    return f"\n{count} {singular if count == 1 else plural} encountered. See detailed log.\n"
