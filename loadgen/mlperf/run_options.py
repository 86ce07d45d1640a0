"""Knobs of loadgen.mlperf that MLPerf's TestSettings have no field for."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Options", "options"]


@dataclass
class Options:
    """Knobs of loadgen.mlperf that MLPerf's TestSettings have no field for.

    Attributes:
        spin_us: Server: the issuing thread spins this long before each scheduled time
            instead of sleeping all the way (smaller issue delay; costs a busy core).
        table_capacity: queries tracked at once (a power of 2); a Server run with more
            outstanding waits for room (the wait shows up as latency).
        peak_probe_min_duration_ms: FindPeakPerformance: length of each search probe
            (capped at min_duration_ms). The answer is then confirmed at full length.
        peak_relative_precision: FindPeakPerformance stops refining when the bounds are
            this close (relative), or at MLPerf's decimals of precision, whichever first.
        peak_max_probes: FindPeakPerformance: bound on search probes.
        peak_confirm_runs: FindPeakPerformance: a rate is the answer when this many
            full-length runs in a row hold at it (near capacity one run can pass by luck).
        peak_latency_headroom: FindPeakPerformance: in the confirmation runs the
            target-percentile latency may use this fraction of the bound, or twice its
            value at the lower bound (server_target_qps), whichever is more (never more
            than the bound). Near capacity the tail swings from run to run, so a rate
            that only just passes fails on a rerun.
        peak_max_confirmations: FindPeakPerformance: rates tried at full length, stepping down
            by ``peak_relative_precision`` * 5 after each that does not hold.
        completion_timeout_s: how long the end of a run waits for outstanding samples
            (< 0: forever, as MLPerf does). When it passes, the run is reported with the
            samples that did complete, and an error line names the missing count.
    """

    spin_us: float = 0.0
    table_capacity: int = 1 << 17
    peak_probe_min_duration_ms: int = 1000
    peak_relative_precision: float = 0.01
    peak_max_probes: int = 24
    peak_confirm_runs: int = 3
    peak_latency_headroom: float = 0.5
    peak_max_confirmations: int = 6
    completion_timeout_s: float = -1.0


options = Options()
