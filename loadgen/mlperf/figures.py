"""What one timed MLPerf-style run measured: the input of validity and log rendering.

The runtime fills a :class:`RunFigures` per performance run (MLPerf's own
``PerformanceResult``); :mod:`loadgen.mlperf.evaluate` and the log writers turn it, with the effective
settings, into the summary, the detail log and the validity decision. Latencies are
integer nanoseconds measured from each query's scheduled time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..stats.histogram import Histogram

__all__ = ["RunFigures"]


@dataclass
class RunFigures:
    """The measurements of one run of the issue loop (one performance run or probe).

    Attributes:
        sample_latency: one value per completed sample, ns from its query's scheduled
            time to the QuerySamplesComplete call that completed it.
        sample_latency_sum_ns: exact sum of the recorded sample latencies (for the mean).
        query_latency: MultiStream only (else None): one value per query, ns from its
            scheduled time until its last sample completed.
        query_latency_sum_ns: exact sum of the query latencies.
        sample_count: samples completed (= sample_latency.total_count).
        queries_issued: queries handed to the SUT (a coalesced call counts each query).
        samples_issued: samples handed to the SUT.
        max_latency_s: the largest sample latency, seconds (Offline's duration).
        final_query_scheduled_s: scheduled offset of the last issued query, s from start.
        final_query_issued_s: when the last issued query was issued, s from start.
        final_query_all_samples_done_s: when the last issued query finished, s from start.
        issue_delay: ns from scheduled time to issue, one value per query (our extra).
        first_token_latency: token runs only: ns from scheduled time to first token.
        time_per_output_token: token runs only: (latency - first token) / (tokens - 1).
        tokens_per_sample_sum: token runs only: total output tokens reported.
        ran_out_of_generated_queries: issuing stopped because the generated queries were
            used up before min duration and min query count were met.
        too_many_outstanding: Server with server_max_async_queries: issuing stopped early.
        max_query_count_reached / max_duration_reached: issuing stopped by those limits.
        generated_query_count / generated_samples_per_query / generated_query_duration_ns:
            what the query generator produced (MLPerf logs these three).
        start_ns: now_ns() at the start of issuing; end_ns: after the last completion.
        unknown_completions: completions of ids not in flight (late, duplicate, bogus).
        latency_over / ttft_over / tpot_over: the native run's exact counts of sample
            latencies, times to first token and times per output token over each bound it
            was given (bound ns -> count). A bound missing here (figures built from
            histograms alone) is counted to bucket precision instead.
        out_of_range: samples whose completion time the histograms cannot hold (before
            the query was scheduled or issued, or beyond their range): counted, not recorded.
        first_token_out_of_range: first tokens likewise.
    """

    sample_latency: Histogram
    sample_latency_sum_ns: int = 0
    query_latency: Histogram | None = None
    query_latency_sum_ns: int = 0
    sample_count: int = 0
    queries_issued: int = 0
    samples_issued: int = 0
    max_latency_s: float = 0.0
    final_query_scheduled_s: float = 0.0
    final_query_issued_s: float = 0.0
    final_query_all_samples_done_s: float = 0.0
    issue_delay: Histogram | None = None
    first_token_latency: Histogram | None = None
    time_per_output_token: Histogram | None = None
    tokens_per_sample_sum: int = 0
    ran_out_of_generated_queries: bool = False
    too_many_outstanding: bool = False
    max_query_count_reached: bool = False
    max_duration_reached: bool = False
    generated_query_count: int = 0
    generated_samples_per_query: int = 0
    generated_query_duration_ns: int = 0
    start_ns: int = 0
    end_ns: int = 0
    unknown_completions: int = 0
    latency_over: dict[int, int] = field(default_factory=dict)
    ttft_over: dict[int, int] = field(default_factory=dict)
    tpot_over: dict[int, int] = field(default_factory=dict)
    out_of_range: int = 0
    first_token_out_of_range: int = 0
    extra: dict = field(default_factory=dict)
