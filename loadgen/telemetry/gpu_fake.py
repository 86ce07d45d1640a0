"""A scripted :class:`~loadgen.telemetry.gpu_backend.GpuBackend` for tests and demos.

Each :class:`FakeDevice` plays known series: the k-th reading of a metric on a device is
element ``k`` of its series (repeating from the start when the series is shorter). The
driver's sample buffer holds one utilization sample per ``util_period_ms`` and one power
sample per ``power_period_ms`` since :meth:`FakeBackend.init`, and the energy counter
grows at exactly ``power_w``. A device can carry MIG devices and can fail from its k-th
reading on (``fail_at``), as a GPU that falls off the bus does.

With a :class:`FakeClock` everything is deterministic: the test moves time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from loadgen.units import ms_to_ns, s_to_ns
from loadgen.telemetry.gpu_backend import GpuError, GpuLost, GpuNotSupported, GpuUnavailable, Handle

__all__ = ["FakeBackend", "FakeClock", "FakeDevice", "FakeMigDevice"]

_GIB = 1 << 30


class FakeClock:
    """A hand-moved monotonic nanosecond clock: call it for the time, :meth:`advance` to
    move it."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> int:
        """Moves the clock forward by ``seconds``; returns the new time."""
        self.now_ns += s_to_ns(seconds)
        return self.now_ns


@dataclass
class FakeMigDevice:
    """A MIG device of a :class:`FakeDevice`: only memory is readable on it, as on a
    real one (utilization, power, clocks and temperature are the parent's or absent)."""

    uuid: str
    memory_total: int = 10 * _GIB
    memory_used: Sequence[int] = (0,)


@dataclass
class FakeDevice:
    """One scripted GPU. Series are per reading: the k-th call of a metric returns
    element k (modulo the length).

    Attributes:
        fail_at: from this reading on (0-based, counted per metric), every call on the
            device and its MIG devices raises: :class:`GpuLost` when ``fail_error`` is
            "lost", a plain :class:`GpuError` otherwise.
        power_instant_supported: False makes :meth:`FakeBackend.power_instant` raise
            :class:`GpuNotSupported`, so the averaged reading is used.
        samples_supported, energy_supported: False makes the driver buffer or the energy
            counter raise :class:`GpuNotSupported`.
    """

    uuid: str
    name: str = "Fake GPU"
    memory_total: int = 80 * _GIB
    memory_used: Sequence[int] = (0,)
    sm_clock_mhz: Sequence[int] = (1980,)
    mem_clock_mhz: Sequence[int] = (2619,)
    temperature_c: Sequence[float] = (40.0,)
    power_w: float = 300.0
    power_readings_w: Optional[Sequence[float]] = None
    power_instant_supported: bool = True
    power_limit_w: float = 700.0
    clocks_event_reasons: Sequence[int] = (0,)
    utilization_pct: Sequence[float] = (0.0,)
    util_period_ms: float = 100.0
    power_period_ms: float = 100.0
    samples_supported: bool = True
    energy_supported: bool = True
    energy_start_mj: int = 1_000_000
    mig_devices: Sequence[FakeMigDevice] = ()
    fail_at: Optional[int] = None
    fail_error: str = "lost"
    _reads: Dict[Tuple[Optional[int], str], int] = field(default_factory=dict, init=False, repr=False)
    _failed: bool = field(default=False, init=False, repr=False)


@dataclass(frozen=True)
class _Handle:
    index: int
    mig: Optional[int] = None


def _pick(series: Sequence[float], k: int) -> float:
    return series[k % len(series)]


class FakeBackend:
    """A :class:`~loadgen.telemetry.gpu_backend.GpuBackend` over scripted devices.

    Args:
        devices: the GPUs, in index order.
        clock: the monotonic ns clock (``time.monotonic_ns`` by default; a
            :class:`FakeClock` in deterministic tests).
        driver: the driver version it reports.
        unavailable: a reason: :meth:`init` raises :class:`GpuUnavailable` with it (a
            machine without a driver).
    """

    def __init__(self, devices: Sequence[FakeDevice], *, clock: Callable[[], int] = time.monotonic_ns,
                 driver: str = "999.99-fake", unavailable: Optional[str] = None) -> None:
        self.devices = list(devices)
        self.clock = clock
        self.driver = driver
        self.unavailable = unavailable
        self.initialised = False
        self.calls = 0
        self._t0 = 0
        self._lock = threading.Lock()

    def init(self) -> None:
        if self.unavailable is not None:
            raise GpuUnavailable(self.unavailable)
        self._t0 = self.clock()
        self.initialised = True

    def shutdown(self) -> None:
        self.initialised = False

    # ------------------------------------------------------------- internals

    def _device(self, handle: Handle, metric: Optional[str] = None) -> Tuple[FakeDevice, int]:
        """The device behind a handle and, for a metric, its reading number; raises when
        the device has failed or fails at this reading."""
        if not self.initialised:
            raise GpuError("fake backend is not initialised")
        h: _Handle = handle
        dev = self.devices[h.index]
        with self._lock:
            self.calls += 1
            k = 0
            if metric is not None:
                key = (h.mig, metric)
                k = dev._reads.get(key, 0)
                dev._reads[key] = k + 1
                if dev.fail_at is not None and k >= dev.fail_at:
                    dev._failed = True
            if dev._failed:
                if dev.fail_error == "lost":
                    raise GpuLost(f"{metric or 'call'}: GPU is lost")
                raise GpuError(f"{metric or 'call'}: Unknown Error")
        return dev, k

    def _physical(self, handle: Handle, metric: str) -> Tuple[FakeDevice, int]:
        h: _Handle = handle
        dev, k = self._device(handle, metric)
        if h.mig is not None:
            raise GpuNotSupported(f"{metric}: not supported on a MIG device")
        return dev, k

    # ----------------------------------------------------------------- calls

    def driver_version(self) -> str:
        return self.driver

    def device_count(self) -> int:
        return len(self.devices)

    def handle_by_index(self, index: int) -> Handle:
        if not 0 <= index < len(self.devices):
            raise GpuError(f"handle_by_index: no device {index}")
        return _Handle(index)

    def uuid(self, handle: Handle) -> str:
        dev, _ = self._device(handle)
        return dev.uuid if handle.mig is None else dev.mig_devices[handle.mig].uuid

    def name(self, handle: Handle) -> str:
        dev, _ = self._device(handle)
        return dev.name if handle.mig is None else f"{dev.name} MIG {handle.mig}"

    def memory(self, handle: Handle) -> Tuple[int, int]:
        dev, k = self._device(handle, "memory")
        if handle.mig is not None:
            mig = dev.mig_devices[handle.mig]
            return int(_pick(mig.memory_used, k)), mig.memory_total
        return int(_pick(dev.memory_used, k)), dev.memory_total

    def clocks(self, handle: Handle) -> Tuple[int, int]:
        dev, k = self._physical(handle, "clocks")
        return int(_pick(dev.sm_clock_mhz, k)), int(_pick(dev.mem_clock_mhz, k))

    def temperature(self, handle: Handle) -> float:
        dev, k = self._physical(handle, "temperature")
        return float(_pick(dev.temperature_c, k))

    def power_instant(self, handle: Handle) -> float:
        dev, _ = self._device(handle)
        if not dev.power_instant_supported:
            raise GpuNotSupported("power_instant: not supported")
        dev, k = self._physical(handle, "power")
        return float(_pick(dev.power_readings_w or (dev.power_w,), k))

    def power_avg(self, handle: Handle) -> float:
        dev, k = self._physical(handle, "power")
        return float(_pick(dev.power_readings_w or (dev.power_w,), k))

    def power_limit(self, handle: Handle) -> float:
        dev, _ = self._physical(handle, "power_limit")
        return dev.power_limit_w

    def clocks_event_reasons(self, handle: Handle) -> int:
        dev, k = self._physical(handle, "clocks_event_reasons")
        return int(_pick(dev.clocks_event_reasons, k))

    def samples(self, handle: Handle, kind: str, since: int) -> Tuple[List[Tuple[int, float]], int]:
        dev, _ = self._device(handle, "samples_" + kind)
        if handle.mig is not None or (kind == "utilization" and dev.mig_devices):
            raise GpuNotSupported(f"samples({kind}): not supported on a MIG device")
        if not dev.samples_supported:
            raise GpuNotSupported(f"samples({kind}): not supported")
        if kind == "utilization":
            period, series = ms_to_ns(dev.util_period_ms), list(dev.utilization_pct)
        else:
            period, series = ms_to_ns(dev.power_period_ms), list(dev.power_readings_w or (dev.power_w,))
        now = self.clock()
        # Sample j is taken at t0 + (j + 1) * period; the buffer keeps the newest 1000.
        first = max((since - self._t0) // period if since else 0, (now - self._t0) // period - 1000, 0)
        out = []
        j = first
        while self._t0 + (j + 1) * period <= now:
            t = self._t0 + (j + 1) * period
            if t > since:
                out.append((t, float(_pick(series, j))))
            j += 1
        return out, (out[-1][0] if out else since)

    def total_energy_mj(self, handle: Handle) -> int:
        dev, _ = self._device(handle)  # not a counted reading: marks read it too
        if handle.mig is not None:
            raise GpuNotSupported("total_energy_mj: not supported on a MIG device")
        if not dev.energy_supported:
            raise GpuNotSupported("total_energy_mj: not supported")
        # watts * ns / 1e6 = millijoules
        return dev.energy_start_mj + int(dev.power_w * (self.clock() - self._t0) / 1e6)

    def is_mig(self, handle: Handle) -> bool:
        dev, _ = self._device(handle)
        return bool(dev.mig_devices) and handle.mig is None

    def mig_devices(self, handle: Handle) -> List[Handle]:
        dev, _ = self._device(handle)
        return [_Handle(handle.index, j) for j in range(len(dev.mig_devices))]
