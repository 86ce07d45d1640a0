"""What the GPU sampler asks of a GPU library: the :class:`GpuBackend` protocol, the
errors it raises, and :class:`NvmlBackend`, the implementation over NVIDIA's NVML
(``pynvml``, from the ``nvidia-ml-py`` package: ``pip install 'loadgen[gpu]'``).

Every method may raise :class:`GpuNotSupported` (this device does not have that reading:
the sampler stops asking for it) or another :class:`GpuError` (the device failed: the
sampler stops sampling it and records why). :meth:`GpuBackend.init` raises
:class:`GpuUnavailable` when there is no library, driver or GPU.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from typing import Any, Callable, List, Protocol, Tuple

from loadgen.units import NS_PER

__all__ = [
    "GpuBackend",
    "GpuError",
    "GpuLost",
    "GpuNotSupported",
    "GpuUnavailable",
    "NvmlBackend",
    "SAMPLE_KINDS",
    "one_line",
]

#: The kinds of the driver's own sample buffer that :meth:`GpuBackend.samples` drains.
SAMPLE_KINDS = ("utilization", "power")

Handle = Any


def one_line(text: str) -> str:
    """A backend's message as the result shows it: one line, at most 300 characters."""
    return " ".join(text.split())[:300]


class GpuError(Exception):
    """A GPU call failed; the message says which call and why, on one line."""


class GpuUnavailable(GpuError):
    """No GPU can be sampled here: no library, no driver, or no device."""


class GpuLost(GpuError):
    """The GPU has fallen off the bus or needs a reset."""


class GpuNotSupported(GpuError):
    """This device does not support the reading asked for."""


class GpuBackend(Protocol):
    """The calls the GPU sampler makes. Handles are opaque; times are
    ``time.monotonic_ns()``; power is in watts, memory in bytes, clocks in MHz,
    temperature in degrees C, energy in millijoules."""

    def init(self) -> None:
        """Opens the library (raises :class:`GpuUnavailable` when it cannot)."""

    def shutdown(self) -> None:
        """Closes the library; raises nothing."""

    def driver_version(self) -> str:
        """The driver's version string."""

    def device_count(self) -> int:
        """How many physical GPUs the library sees."""

    def handle_by_index(self, index: int) -> Handle:
        """The handle of the physical GPU at ``index`` (the library's order)."""

    def uuid(self, handle: Handle) -> str:
        """The device's UUID (``GPU-...``, or ``MIG-...`` for a MIG device)."""

    def name(self, handle: Handle) -> str:
        """The device's product name."""

    def memory(self, handle: Handle) -> Tuple[int, int]:
        """(used, total) bytes of device memory."""

    def clocks(self, handle: Handle) -> Tuple[int, int]:
        """(SM clock, memory clock) in MHz."""

    def temperature(self, handle: Handle) -> float:
        """The GPU core temperature."""

    def power_instant(self, handle: Handle) -> float:
        """The instantaneous board power (:class:`GpuNotSupported` where there is none)."""

    def power_avg(self, handle: Handle) -> float:
        """The board power as the driver reports it (averaged over about a second on
        recent GPUs)."""

    def power_limit(self, handle: Handle) -> float:
        """The enforced board power limit."""

    def clocks_event_reasons(self, handle: Handle) -> int:
        """The bitmask of reasons the clocks are held down now (NVML's
        ``nvmlClocksEventReason*`` bits)."""

    def samples(self, handle: Handle, kind: str, since: int) -> Tuple[List[Tuple[int, float]], int]:
        """Drains the driver's buffer of ``kind`` (one of :data:`SAMPLE_KINDS`): the
        (monotonic ns, value) readings newer than the cursor ``since`` (0 at first), and
        the new cursor. Utilization is in percent, power in watts."""

    def total_energy_mj(self, handle: Handle) -> int:
        """The board's energy counter (mJ since the driver loaded)."""

    def is_mig(self, handle: Handle) -> bool:
        """Whether MIG mode is on for this physical GPU."""

    def mig_devices(self, handle: Handle) -> List[Handle]:
        """The MIG devices of a physical GPU in MIG mode, in slot order."""


# ----------------------------------------------------------------------- NVML

_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# Where a loaded NVIDIA driver shows on Linux: its /proc entry, its control device (in a
# container too), WSL's GPU device.
_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


def _driver_present() -> bool:
    """Whether an NVIDIA driver may be loaded; False only on Linux with none of its paths."""
    return not sys.platform.startswith("linux") or any(os.path.exists(p) for p in _DRIVER_PATHS)


class NvmlBackend:
    """:class:`GpuBackend` over ``pynvml``. The module is imported by :meth:`init`, so
    that constructing one never fails; a missing module, library or driver is a
    :class:`GpuUnavailable` there."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._memory_v2 = True
        self._event_reasons_fn = "nvmlDeviceGetCurrentClocksEventReasons"

    def init(self) -> None:
        if importlib.util.find_spec("pynvml") is None:
            raise GpuUnavailable("nvidia-ml-py (pynvml) is not installed: pip install 'loadgen[gpu]'")
        if not _driver_present():  # importing pynvml to learn that costs some 6 ms of CPU
            raise GpuUnavailable("NVML could not start: Driver Not Loaded (no NVIDIA driver: none of "
                                 f"{', '.join(_DRIVER_PATHS)} exists)")
        try:
            import pynvml  # the 'gpu' extra: optional
        except ImportError as e:
            raise GpuUnavailable(f"nvidia-ml-py (pynvml) is not installed: pip install 'loadgen[gpu]' ({e})") from e
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise GpuUnavailable(f"NVML could not start: {_nvml_message(e)}") from e
        self._nvml = pynvml
        if not hasattr(pynvml, self._event_reasons_fn):
            self._event_reasons_fn = "nvmlDeviceGetCurrentClocksThrottleReasons"

    def shutdown(self) -> None:
        if self._nvml is None:
            return
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass
        self._nvml = None

    def _call(self, fn: str, *args: Any) -> Any:
        nvml = self._nvml
        if nvml is None:
            raise GpuError(f"{fn}: NVML is not initialised")
        try:
            return getattr(nvml, fn)(*args)
        except nvml.NVMLError as e:
            raise _translate(nvml, fn, e) from e

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def handle_by_index(self, index: int) -> Handle:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def uuid(self, handle: Handle) -> str:
        return _text(self._call("nvmlDeviceGetUUID", handle))

    def name(self, handle: Handle) -> str:
        return _text(self._call("nvmlDeviceGetName", handle))

    def memory(self, handle: Handle) -> Tuple[int, int]:
        if self._memory_v2:
            # v2 counts memory the driver reserves as not used; v1 counts it as used.
            try:
                m = self._call("nvmlDeviceGetMemoryInfo", handle, self._nvml.nvmlMemory_v2)
                return int(m.used), int(m.total)
            except GpuLost:
                raise
            except GpuError:
                self._memory_v2 = False
        m = self._call("nvmlDeviceGetMemoryInfo", handle)
        return int(m.used), int(m.total)

    def clocks(self, handle: Handle) -> Tuple[int, int]:
        nvml = self._nvml
        return (int(self._call("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM)),
                int(self._call("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_MEM)))

    def temperature(self, handle: Handle) -> float:
        return float(self._call("nvmlDeviceGetTemperature", handle, self._nvml.NVML_TEMPERATURE_GPU))

    def power_instant(self, handle: Handle) -> float:
        nvml = self._nvml
        values = self._call("nvmlDeviceGetFieldValues", handle, [nvml.NVML_FI_DEV_POWER_INSTANT])
        v = values[0]
        if v.nvmlReturn != nvml.NVML_SUCCESS:
            raise GpuNotSupported("instantaneous power (NVML_FI_DEV_POWER_INSTANT) is not supported")
        return _field_value(v.valueType, v.value) / 1000.0

    def power_avg(self, handle: Handle) -> float:
        return float(self._call("nvmlDeviceGetPowerUsage", handle)) / 1000.0

    def power_limit(self, handle: Handle) -> float:
        try:
            return float(self._call("nvmlDeviceGetEnforcedPowerLimit", handle)) / 1000.0
        except GpuNotSupported:
            return float(self._call("nvmlDeviceGetPowerManagementLimit", handle)) / 1000.0

    def clocks_event_reasons(self, handle: Handle) -> int:
        return int(self._call(self._event_reasons_fn, handle))

    def samples(self, handle: Handle, kind: str, since: int) -> Tuple[List[Tuple[int, float]], int]:
        nvml = self._nvml
        sampling = nvml.NVML_GPU_UTILIZATION_SAMPLES if kind == "utilization" else nvml.NVML_TOTAL_POWER_SAMPLES
        scale = 1.0 if kind == "utilization" else 1e-3  # power samples are in mW
        try:
            vtype, raw = self._call("nvmlDeviceGetSamples", handle, sampling, since)
        except GpuError as e:
            if isinstance(e.__cause__, nvml.NVMLError_NotFound):
                return [], since  # nothing new since the cursor
            raise
        # The driver stamps samples in microseconds of the wall clock.
        offset_ns = time.time_ns() - time.monotonic_ns()
        out: List[Tuple[int, float]] = []
        cursor = since
        for s in raw:
            ts = int(s.timeStamp)
            if ts <= since:
                continue
            out.append((ts * NS_PER["us"] - offset_ns, _field_value(vtype, s.sampleValue) * scale))
            cursor = max(cursor, ts)
        return out, cursor

    def total_energy_mj(self, handle: Handle) -> int:
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption", handle))

    def is_mig(self, handle: Handle) -> bool:
        try:
            current, _pending = self._call("nvmlDeviceGetMigMode", handle)
        except GpuNotSupported:
            return False
        return bool(current == self._nvml.NVML_DEVICE_MIG_ENABLE)

    def mig_devices(self, handle: Handle) -> List[Handle]:
        out = []
        for i in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle))):
            try:
                out.append(self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, i))
            except GpuError as e:
                if isinstance(e.__cause__, self._nvml.NVMLError_NotFound):
                    continue  # an empty slot
                raise
        return out


def _field_value(value_type: int, value: Any) -> float:
    return float(getattr(value, _VALUE_FIELDS.get(int(value_type), "ullVal")))


def _nvml_message(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _translate(nvml: Any, fn: str, e: Exception) -> GpuError:
    kind: Callable[[str], GpuError] = GpuError
    if isinstance(e, nvml.NVMLError_NotSupported):
        kind = GpuNotSupported
    elif isinstance(e, (nvml.NVMLError_GpuIsLost, getattr(nvml, "NVMLError_ResetRequired", ()))):
        kind = GpuLost
    elif isinstance(e, (nvml.NVMLError_LibraryNotFound, nvml.NVMLError_DriverNotLoaded)):
        kind = GpuUnavailable
    return kind(f"{fn}: {_nvml_message(e)}")


#: NVML's clock-event (throttle) reason bits, by the names the result uses.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def reason_bits(mask: int) -> List[int]:
    """The bits set in a clock-event reasons mask."""
    return [1 << i for i in range(mask.bit_length()) if mask >> i & 1]


def reason_name(bit: int) -> str:
    """The name of one clock-event reason bit (hex for one NVML does not name)."""
    return THROTTLE_REASONS.get(bit, f"0x{bit:x}")
