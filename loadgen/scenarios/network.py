"""The load patterns network users expect: open loop at a constant or Poisson rate (with an
optional in-flight cap), closed loop at a fixed concurrency, ramps, and trace replay."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, Tuple

from loadgen import defaults
from loadgen.engine import EngineSettings, load_trace
from loadgen.options import RunOptions, parse_stages
from loadgen.scenarios.base import Scenario, require
from loadgen.workers import concurrency_share, stages_text

if TYPE_CHECKING:  # numpy is imported where it is used
    import numpy as np

__all__ = ["Concurrency", "Constant", "Poisson", "Ramp", "Trace"]


class _Timed(Scenario):
    """Runs for --duration-s (default 10 s) unless --query-count bounds it."""

    def effective(self, opts: RunOptions) -> RunOptions:
        o = super().effective(opts)
        if o.duration_s is None and o.query_count is None:
            o.duration_s = defaults.DURATION_S
        return o

    def _bounds(self, o: RunOptions) -> Dict[str, Any]:
        return {"duration_s": o.duration_s, "query_count": o.query_count}


class Constant(_Timed):
    name = "constant"
    summary = ("open loop at a constant --target-qps (vegeta/wrk2 style), optional "
               "--max-in-flight; metric: completed QPS, with latency percentiles")
    mode = "constant"
    uses: Tuple[str, ...] = ("target_qps", "max_in_flight")

    def effective(self, opts: RunOptions) -> RunOptions:
        o = super().effective(opts)
        if o.target_qps is None:
            o.target_qps = defaults.TARGET_QPS
        return o

    def worker_share(self, o: RunOptions, index: int, count: int) -> RunOptions:
        # Poisson: N independent streams at rate / N make one Poisson stream at the rate.
        # Constant: N evenly spaced streams, each at rate / N, their phases set by when
        # each worker starts.
        return dataclasses.replace(o, target_qps=require(o.target_qps, "--target-qps") / count)

    def engine_settings(self, o: RunOptions) -> EngineSettings:
        return self.base_settings(o, mode=self.mode, target_qps=o.target_qps,
                                   max_in_flight=o.max_in_flight, **self._bounds(o))


class Poisson(Constant):
    name = "poisson"
    summary = ("Poisson arrivals at --target-qps, as server but without MLPerf's validity "
               "rules; optional --max-in-flight; metric: completed QPS")
    mode = "poisson"
    uses = Constant.uses + ("burstiness",)

    def engine_settings(self, o: RunOptions) -> EngineSettings:
        s = super().engine_settings(o)
        s.burstiness = o.burstiness
        return s


class Concurrency(_Timed):
    name = "concurrency"
    summary = ("closed loop with --concurrency N queries in flight (perf_analyzer style); "
               "metric: completed QPS")
    uses = ("concurrency", "ramp_up_s")

    def default_ramp_up_s(self, o: RunOptions) -> float:
        """Many streams start spread (not in phase, and not one burst of sends whose
        issuing alone would set the tail): 1 ms a stream, at most 1 s, from 64 streams."""
        if o.concurrency < defaults.RAMP_UP_MIN_STREAMS:
            return 0.0
        return min(defaults.RAMP_UP_MAX_S, o.concurrency * defaults.RAMP_UP_S_PER_STREAM)

    def worker_share(self, o: RunOptions, index: int, count: int) -> RunOptions:
        return dataclasses.replace(o, concurrency=concurrency_share(o.concurrency, index, count))

    def engine_settings(self, o: RunOptions) -> EngineSettings:
        return self.base_settings(o, mode="closed", concurrency=o.concurrency, **self._bounds(o))


class Ramp(Scenario):
    name = "ramp"
    summary = ("stages of rate over time (--stages 10s:100,30s:1000), stepped or linear "
               "(--ramp); metric: completed QPS, with the time series per interval")
    uses = ("stages", "ramp", "poisson_arrivals", "burstiness", "max_in_flight")

    def effective(self, opts: RunOptions) -> RunOptions:
        o = super().effective(opts)
        if not o.stages:
            raise ValueError("--stages is required for the ramp scenario (like 10s:100,30s:1000)")
        try:
            parse_stages(o.stages, o.ramp)
        except ValueError as e:
            raise ValueError(f"--stages: {e}") from None
        if o.burstiness != 1.0 and not o.poisson_arrivals:
            raise ValueError("--burstiness shapes Poisson arrivals: add --poisson-arrivals to use it in the "
                             "ramp scenario")
        return o

    def worker_share(self, o: RunOptions, index: int, count: int) -> RunOptions:
        stages = [(d, a / count, b / count) for d, a, b in parse_stages(o.stages, o.ramp)]
        return dataclasses.replace(o, stages=stages_text(stages))

    def engine_settings(self, o: RunOptions) -> EngineSettings:
        return self.base_settings(
            o, mode="stages", stages=parse_stages(o.stages, o.ramp), stages_poisson=o.poisson_arrivals,
            burstiness=o.burstiness,
            max_in_flight=o.max_in_flight, duration_s=o.duration_s, query_count=o.query_count,
        )


class Trace(Scenario):
    name = "trace"
    summary = ("replays arrival offsets from --trace (one per line, in --trace-unit, or a .npy "
               "of ns); metric: completed QPS")
    uses = ("trace", "trace_unit", "max_in_flight")

    def effective(self, opts: RunOptions) -> RunOptions:
        o = super().effective(opts)
        if not o.trace:
            raise ValueError("--trace is required for the trace scenario (a file of arrival offsets)")
        return o

    def worker_share(self, o: RunOptions, index: int, count: int) -> RunOptions:
        return o  # the arrivals are shared in offsets_ns: every count-th line

    def offsets_ns(self, o: RunOptions) -> np.ndarray:
        """The trace's arrival offsets (ns); worker I of N > 1 replays lines I, I + N,
        I + 2N, ... at their own offsets, so that the workers together replay the trace."""
        import numpy as np

        try:
            offsets = load_trace(str(o.trace), unit=o.trace_unit)
        except ValueError as e:
            raise ValueError(f"--trace: {e}") from None
        if o.workers <= 1:
            return offsets
        index = o.worker_index or 0
        if len(offsets) <= index:
            raise ValueError(f"--trace: {o.trace} holds {len(offsets)} arrivals, too few for --workers "
                             f"{o.workers}: worker {index} would replay none")
        return np.ascontiguousarray(offsets[index::o.workers])

    def engine_settings(self, o: RunOptions) -> EngineSettings:
        return self.base_settings(
            o, mode="trace", trace_offsets_ns=self.offsets_ns(o), max_in_flight=o.max_in_flight,
            duration_s=o.duration_s, query_count=o.query_count,
        )
