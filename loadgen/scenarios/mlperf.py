"""MLPerf Inference's scenarios, with MLPerf's meaning: latency from the scheduled time,
minimum duration and query count, and early stopping."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from loadgen.stats.early_stopping import percentile_estimate, server_early_stopping
from loadgen import defaults
from loadgen.engine import EngineSettings, RunResult
from loadgen.options import RunOptions
from loadgen.scenarios.base import Scenario, require
from loadgen.units import NS_PER

__all__ = ["MultiStream", "Offline", "Server", "SingleStream"]


class _Mlperf(Scenario):
    mlperf = True
    uses: Tuple[str, ...] = ("min_duration_s", "min_query_count")

    def effective(self, opts: RunOptions) -> RunOptions:
        if opts.duration_s is not None:
            # "--duration-s 5" on an MLPerf scenario is its minimum duration, MLPerf's
            # min_duration: a floor, after which the run goes on until --min-query-count
            # queries too. Never a cap: one below --min-duration-s would end every run too
            # short (INVALID), one above it would be cut to the minimum. Given both, the
            # run lasts at least the longer.
            floor = opts.duration_s if opts.min_duration_s is None else max(opts.duration_s, opts.min_duration_s)
            opts = _replace(opts, min_duration_s=floor, duration_s=None)
        return super().effective(opts)


def _replace(o: RunOptions, **kw: Any) -> RunOptions:
    import dataclasses

    return dataclasses.replace(o, **kw)


class _Stream(_Mlperf):
    """One query in flight; the next when it completes."""

    unshared = "it keeps one query in flight, the next when it completes: one stream, one worker"

    def engine_settings(self, o: RunOptions) -> EngineSettings:
        return self.base_settings(
            o, mode="closed", concurrency=1,
            min_duration_s=require(o.min_duration_s, "--min-duration-s"),
            min_query_count=require(o.min_query_count, "--min-query-count"),
            duration_s=o.duration_s, query_count=o.query_count,
        )

    def metric(self, result: RunResult, o: RunOptions) -> Dict[str, Any]:
        percentile = require(o.latency_percentile, "--latency-percentile")
        return {
            "name": f"p{percentile:g}_latency",
            "value": result.latency.value_at_percentile(percentile) / NS_PER["ms"],
            "unit": "ms",
        }

    def early_stopping(self, result: RunResult, o: RunOptions) -> Optional[Dict[str, Any]]:
        percentile = require(o.latency_percentile, "--latency-percentile")
        if not 0 < percentile < 100:
            return None
        return percentile_estimate(result.latency, percentile).as_dict()

    def invalid_reasons(self, result: RunResult, o: RunOptions) -> List[str]:
        es = self.early_stopping(result, o)
        if es is not None and not es["passed"]:
            return [f"early stopping: {es['message']}"]
        return []


class SingleStream(_Stream):
    name = "single-stream"
    summary = ("one query of one sample in flight, the next when it completes; metric: the "
               "90th-percentile latency (--latency-percentile)")
    default_percentile = defaults.SINGLESTREAM_PERCENTILE


class MultiStream(_Stream):
    name = "multi-stream"
    summary = ("one query of N samples (--samples-per-query, default 8) in flight, the next when "
               "it completes; metric: the 99th-percentile latency")
    default_percentile = 99.0

    def effective(self, opts: RunOptions) -> RunOptions:
        if opts.samples_per_query is None:
            opts = _replace(opts, samples_per_query=defaults.MULTISTREAM_SAMPLES_PER_QUERY)
        return super().effective(opts)


class Server(_Mlperf):
    name = "server"
    summary = ("Poisson arrivals at --target-qps; valid only if the latency at "
               "--latency-percentile (99) is within --latency-bound-ms (10); metric: the QPS")
    uses = _Mlperf.uses + ("target_qps", "max_in_flight")

    def effective(self, opts: RunOptions) -> RunOptions:
        o = super().effective(opts)
        if o.target_qps is None:
            o.target_qps = defaults.TARGET_QPS
        if o.latency_bound_ms is None:
            o.latency_bound_ms = defaults.LATENCY_BOUND_MS
        return o

    def worker_share(self, o: RunOptions, index: int, count: int) -> RunOptions:
        # N independent Poisson streams at rate / N add up to one at the rate: the
        # merged run has MLPerf's Server arrivals.
        return _replace(o, target_qps=require(o.target_qps, "--target-qps") / count)

    def engine_settings(self, o: RunOptions) -> EngineSettings:
        return self.base_settings(
            o, mode="poisson", target_qps=o.target_qps,
            min_duration_s=require(o.min_duration_s, "--min-duration-s"),
            min_query_count=require(o.min_query_count, "--min-query-count"),
            duration_s=o.duration_s, query_count=o.query_count,
            max_in_flight=o.max_in_flight,
        )

    def metric(self, result: RunResult, o: RunOptions) -> Dict[str, Any]:
        scheduled = result.counts["issued"] / result.issue_duration_s if result.issue_duration_s > 0 else 0.0
        return {"name": "scheduled_qps", "value": scheduled, "unit": "queries/s"}

    def early_stopping(self, result: RunResult, o: RunOptions) -> Optional[Dict[str, Any]]:
        percentile = require(o.latency_percentile, "--latency-percentile")
        if not 0 < percentile < 100:
            return None
        return server_early_stopping(
            queries=result.counts["issued"],
            # The engine's exact count over --latency-bound-ms (latency_bounds_ns[0]).
            overlatency_count=result.over_bound[0],
            p=percentile / 100.0,
        ).as_dict()

    def invalid_reasons(self, result: RunResult, o: RunOptions) -> List[str]:
        es = self.early_stopping(result, o)
        if es is not None and not es["passed"]:
            return [f"early stopping: {es['message']}"]
        return []


class Offline(_Mlperf):
    name = "offline"
    summary = ("all queries at once (--query-count x --samples-per-query samples; by default "
               "1.1 x --min-duration-s x the expected --target-qps samples, and at least "
               "--min-query-count queries); metric: samples/s")
    checks_overload = False  # every query is due at t = 0: issue delay is the backlog by design
    unshared = "it issues every query at once, at t = 0, from one generator"
    uses = _Mlperf.uses + ("target_qps",)
    default_expected_qps = defaults.OFFLINE_EXPECTED_QPS

    def effective(self, opts: RunOptions) -> RunOptions:
        o = super().effective(opts)
        if o.target_qps is None:
            o.target_qps = self.default_expected_qps
        if o.query_count is None:
            # Rounded first, so that 1.1 * 1 s * 100/s is 110 samples, not 111.
            min_duration_s = require(o.min_duration_s, "--min-duration-s")
            samples = math.ceil(round(1.1 * min_duration_s * o.target_qps, 6))
            queries = math.ceil(samples / require(o.samples_per_query, "--samples-per-query"))
            o.query_count = max(1, require(o.min_query_count, "--min-query-count"), queries)
            if o.query_count > defaults.MAX_QUERY_COUNT:
                raise ValueError(
                    f"--target-qps {o.target_qps:g} x --min-duration-s {min_duration_s:g} makes "
                    f"{o.query_count} offline queries, more than {defaults.MAX_QUERY_COUNT}; lower them "
                    "or give --query-count")
        return o

    def engine_settings(self, o: RunOptions) -> EngineSettings:
        query_count = require(o.query_count, "--query-count")
        s = self.base_settings(o, mode="offline", query_count=query_count)
        # Everything is issued at t = 0, so the grace period is the whole run: allow the
        # expected duration three times over on top of --grace-s.
        samples = query_count * require(o.samples_per_query, "--samples-per-query")
        expected_s = samples / require(o.target_qps, "--target-qps")
        s.grace_s = o.grace_s + 3 * expected_s
        return s

    def metric(self, result: RunResult, o: RunOptions) -> Dict[str, Any]:
        return {"name": "samples_per_s", "value": result.samples_per_s, "unit": "samples/s"}

    def measured_duration_s(self, result: RunResult) -> float:
        return result.duration_s

    def invalid_reasons(self, result: RunResult, o: RunOptions) -> List[str]:
        return []
