"""Telemetry sampled beside a run, on the engine's clock: GPU utilization, memory, power,
clocks and energy (:mod:`loadgen.telemetry.gpu`, over NVML or a scripted fake backend),
and the generator host's own health (:mod:`loadgen.telemetry.host`); :mod:`loadgen.telemetry.run`
runs them around one benchmark."""

from loadgen.telemetry.gpu import DEFAULT_SAMPLE_MS, MARKS, GpuSampler
from loadgen.telemetry.gpu_backend import (
    GpuBackend,
    GpuError,
    GpuLost,
    GpuNotSupported,
    GpuUnavailable,
    NvmlBackend,
)
from loadgen.telemetry.gpu_fake import FakeBackend, FakeClock, FakeDevice, FakeMigDevice
from loadgen.telemetry.gpu_select import DeviceInfo, GpuSelection, parse_gpus, select

__all__ = [
    "DEFAULT_SAMPLE_MS",
    "DeviceInfo",
    "FakeBackend",
    "FakeClock",
    "FakeDevice",
    "FakeMigDevice",
    "GpuBackend",
    "GpuError",
    "GpuLost",
    "GpuNotSupported",
    "GpuSampler",
    "GpuSelection",
    "GpuUnavailable",
    "MARKS",
    "NvmlBackend",
    "parse_gpus",
    "select",
]
