"""The state the GPU sampler keeps per physical GPU and per selected device, and how it
reads in the result document's ``gpu`` section: a device's entry (statistics, energy per
phase, where power and energy came from) and the per-interval figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from loadgen.telemetry.gpu_backend import Handle, reason_name
from loadgen.telemetry.streams import BinnedSeries, CounterSeries, StreamStats, bin_mean

__all__ = ["DeviceState", "GpuState", "device_entry", "device_intervals", "ratio"]

_MIG_UTILIZATION = {"supported": False, "why": "MIG device"}
# Tops of the percentile histograms (min, max and mean are exact beyond them).
_SMALL_TOP = 1 << 12  # percent, degrees C
_MHZ_TOP = 1 << 17  # clocks
_MW_TOP = 1 << 24  # power in mW: 16.7 kW


@dataclass
class GpuState:
    """One physical GPU: what it is and what was read from it (the sampler's thread writes
    it under the sampler's lock)."""

    index: int
    uuid: str
    name: str
    handle: Handle
    mig: bool = False
    power_limit_w: Optional[float] = None
    lost: Optional[Tuple[int, str]] = None
    unsupported: Dict[str, str] = field(default_factory=dict)
    ticks: int = 0
    sm_clock: StreamStats = field(default_factory=lambda: StreamStats(highest=_MHZ_TOP))
    mem_clock: StreamStats = field(default_factory=lambda: StreamStats(highest=_MHZ_TOP))
    temperature: StreamStats = field(default_factory=lambda: StreamStats(highest=_SMALL_TOP))
    power_read: StreamStats = field(default_factory=lambda: StreamStats(1000.0, _MW_TOP))
    power_drained: StreamStats = field(default_factory=lambda: StreamStats(1000.0, _MW_TOP))
    utilization: StreamStats = field(default_factory=lambda: StreamStats(highest=_SMALL_TOP))
    power_read_series: BinnedSeries = field(default_factory=BinnedSeries)
    power_drained_series: BinnedSeries = field(default_factory=BinnedSeries)
    utilization_series: BinnedSeries = field(default_factory=BinnedSeries)
    energy: CounterSeries = field(default_factory=CounterSeries)
    energy_read_ns: Optional[int] = None  # when the energy counter was last read
    energy_read_cost_ns: int = 0  # the CPU time its last read took
    integrated_mj: float = 0.0
    last_power: Optional[Tuple[int, float]] = None
    throttle_ticks: Dict[int, int] = field(default_factory=dict)
    cursors: Dict[str, int] = field(default_factory=lambda: {"utilization": 0, "power": 0})
    marks: Dict[str, Tuple[int, float]] = field(default_factory=dict)
    units: List[DeviceState] = field(default_factory=list)
    latest: Dict[str, float] = field(default_factory=dict)  # the newest reading of each figure


@dataclass
class DeviceState:
    """One selected device: a whole GPU, or one MIG device of a GPU in MIG mode."""

    gpu: GpuState
    uuid: str
    name: str
    handle: Handle
    slot: Optional[int] = None
    memory_total: Optional[int] = None
    lost: Optional[Tuple[int, str]] = None
    unsupported: Optional[str] = None
    ticks: int = 0
    memory: StreamStats = field(default_factory=StreamStats)
    memory_series: BinnedSeries = field(default_factory=BinnedSeries)
    latest_memory: Optional[int] = None


def device_entry(unit: DeviceState, driver_version: str) -> Dict[str, Any]:
    """A device's entry in the ``gpu`` section's ``devices`` (a MIG device's power,
    clocks, temperature and energy are its GPU's)."""
    gpu = unit.gpu
    entry: Dict[str, Any] = {
        "index": gpu.index,
        "uuid": unit.uuid,
        "name": unit.name,
        "driver_version": driver_version,
        "mig": unit.slot is not None,
    }
    if unit.slot is not None:
        entry.update(parent_uuid=gpu.uuid, mig_index=unit.slot)
    power_stats, power_source, _ = _power_of(gpu)
    entry.update({
        "utilization_pct": (dict(_MIG_UTILIZATION) if unit.slot is not None
                            else gpu.utilization.section(gpu.unsupported.get("utilization"))),
        "memory_used_bytes": unit.memory.section(unit.unsupported),
        "memory_total_bytes": unit.memory_total,
        "power_w": power_stats.section(None if power_source else "not supported"),
        "power_source": power_source,
        "power_limit_w": gpu.power_limit_w,
        "sm_clock_mhz": gpu.sm_clock.section(gpu.unsupported.get("clocks")),
        "mem_clock_mhz": gpu.mem_clock.section(gpu.unsupported.get("clocks")),
        "temperature_c": gpu.temperature.section(gpu.unsupported.get("temperature")),
        "energy_j": _phase_energy(gpu),
        "energy_source": _energy_source(gpu),
        "throttle_reasons": [reason_name(bit) for bit in sorted(gpu.throttle_ticks)],
        "throttle_samples": {reason_name(bit): n for bit, n in sorted(gpu.throttle_ticks.items())},
        "samples": unit.ticks,
    })
    if unit.lost:
        entry["lost"] = {"at_ns": unit.lost[0], "reason": unit.lost[1]}
    return entry


def device_intervals(gpus: Sequence[GpuState], measure_start_ns: int, interval_ns: int, n_intervals: int
                     ) -> List[Dict[str, Dict[str, Optional[float]]]]:
    """The figures of :meth:`GpuSampler.intervals <loadgen.telemetry.gpu.GpuSampler.intervals>`
    from the GPUs' series: for each interval, a dict by device UUID."""
    out: List[Dict[str, Dict[str, Optional[float]]]] = [{} for _ in range(n_intervals)]
    for gpu in gpus:
        _, _, power_series = _power_of(gpu)
        util = gpu.utilization_series.bins(measure_start_ns, interval_ns, n_intervals)
        power = power_series.bins(measure_start_ns, interval_ns, n_intervals)
        energy = [_joules(gpu.energy.delta(measure_start_ns + i * interval_ns,
                                           measure_start_ns + (i + 1) * interval_ns))
                  for i in range(n_intervals)]
        for unit in gpu.units:
            memory = unit.memory_series.bins(measure_start_ns, interval_ns, n_intervals)
            for i in range(n_intervals):
                out[i][unit.uuid] = {
                    "utilization_pct": None if unit.slot is not None else bin_mean(util[i]),
                    "power_w": bin_mean(power[i]),
                    "memory_used_bytes": int(memory[i][2]) if memory[i][0] else None,
                    "energy_j": energy[i],
                }
    return out


def _power_of(gpu: GpuState) -> Tuple[StreamStats, Optional[str], BinnedSeries]:
    """The power figures to report: the driver's samples when it gave any, else the
    readings taken every tick; and what they are."""
    if gpu.power_drained.n:
        return gpu.power_drained, "driver samples", gpu.power_drained_series
    if gpu.power_read.n:
        source = "average" if "power_instant" in gpu.unsupported else "instant"
        return gpu.power_read, source, gpu.power_read_series
    return gpu.power_read, None, gpu.power_read_series


def _phase_energy(gpu: GpuState) -> Dict[str, Optional[float]]:
    def between(a: str, b: str) -> Optional[float]:
        if a in gpu.marks and b in gpu.marks:
            return (gpu.marks[b][1] - gpu.marks[a][1]) / 1000.0
        return None

    out = {
        "start_to_issue_end": between("start", "issue_end"),
        "issue_end_to_end": between("issue_end", "end"),
        "total": between("start", "end"),
    }
    last = gpu.energy.last()
    if gpu.lost and "start" in gpu.marks and last is not None:
        out["until_lost"] = (last[1] - gpu.marks["start"][1]) / 1000.0
    return out


def _energy_source(gpu: GpuState) -> Optional[str]:
    if "energy" not in gpu.unsupported:
        return "counter"
    return "power integral" if gpu.last_power is not None else None


def _joules(mj: Optional[float]) -> Optional[float]:
    return None if mj is None else mj / 1000.0


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """a / b; None when either is missing or b is 0."""
    if a is None or not b:
        return None
    return a / b
