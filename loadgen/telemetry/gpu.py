"""GPU telemetry of a run: :class:`GpuSampler`, one background thread that samples every
selected GPU through a :class:`~loadgen.telemetry.gpu_backend.GpuBackend` (NVML by
default) and reports the result document's ``gpu`` section.

Every ``sample_ms`` (100 by default) the thread reads, per physical GPU: SM and memory
clocks, temperature, board power (instantaneous where the driver has it, else its
averaged reading), the clock-event (throttle) reasons and the energy counter; and per
selected device (a GPU, or a MIG device of a GPU in MIG mode) the memory used. About
once a second it drains the driver's own high-rate buffers of utilization and power
samples, from the last timestamp it saw. :meth:`GpuSampler.mark` reads the energy
counters at the run's phase boundaries (``start``, ``issue_end``, ``end``), so that the
energy of each phase is an exact difference of counter readings.

Everything is stamped with ``time.monotonic_ns()``, the engine's clock, and keyed by
UUID. Memory is bounded: statistics stream (exact min, max and mean; p50 and p99 from an
HDR histogram) and the time series for per-interval figures halve their resolution when
full (:mod:`loadgen.telemetry.streams`).

Nothing here raises for a missing GPU, library or driver: the section then says
``"status": "unavailable"`` with a one-line reason. A GPU that fails mid-run is no
longer sampled, its ``lost`` entry says when and why, and the others go on
(``"status": "partial"``).

loadgen.telemetry.run drives it around every run; docs/gpu.md shows it embedded.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

from loadgen.placement import keep_off
from loadgen.units import ms_to_ns, ns_to_s, s_to_ns
from loadgen.telemetry.gpu_backend import (
    THROTTLE_REASONS, GpuBackend, GpuError, GpuNotSupported, Handle, NvmlBackend, one_line, reason_bits,
)
from loadgen.telemetry.gpu_figures import DeviceState, GpuState, device_entry, device_intervals, ratio
from loadgen.telemetry.gpu_select import DeviceInfo, GpuSelection, parse_gpus, select
from loadgen.telemetry.streams import DEFAULT_MAX_POINTS, BinnedSeries, CounterSeries

__all__ = ["DEFAULT_SAMPLE_MS", "GpuSampler", "MARKS", "MIN_SAMPLE_MS", "MAX_SAMPLE_MS", "THROTTLE_REASONS"]

#: ``--gpu-sample-ms``: the default period and its range.
DEFAULT_SAMPLE_MS = 100.0
MIN_SAMPLE_MS = 10.0
MAX_SAMPLE_MS = 60_000.0
#: How often the driver's sample buffers are drained.
DRAIN_S = 1.0
#: How often a costly energy counter is read between marks. One read of it costs about
#: 4 ms of CPU in the driver on an H200 (the other readings a few us each), so at every
#: 100 ms tick it alone was 4% of a core; once a second it is 0.4%. A counter that costs
#: less than CHEAP_ENERGY_READ_NS of CPU to read is read at every tick. The phases' energy
#: comes from the marks, read when they happen, so only the per-interval series is coarser.
ENERGY_READ_S = 1.0
CHEAP_ENERGY_READ_NS = 100_000
#: The phase boundaries :meth:`GpuSampler.mark` knows.
MARKS = ("start", "issue_end", "end")
_T = TypeVar("_T")


class GpuSampler:
    """Samples the selected GPUs on a background thread (``loadgen-gpu``) and reports.

    Args:
        gpus: a :class:`GpuSelection` (from :func:`parse_gpus`) or a ``--gpus`` string
            (parsed without the environment).
        sample_ms: sampling period, ``MIN_SAMPLE_MS`` to ``MAX_SAMPLE_MS``.
        backend: the GPU library (an :class:`NvmlBackend` when None).
        clock: the monotonic ns clock stamping readings (``time.monotonic_ns``: the
            engine's clock; a fake one in tests that call :meth:`tick` themselves).
        drain_s: how often the driver's sample buffers are drained.
        max_points: points per time series before it halves its resolution.
        avoid_cpus: CPUs the thread keeps off (the issue thread's ``pin_cpus``), so that
            it never preempts a pinned, spinning issue thread; ignored when no other
            CPU is allowed.

    Raises:
        ValueError: a bad ``gpus`` string or ``sample_ms``; the message names it.
    """

    def __init__(self, gpus: Union[GpuSelection, str, None] = "all", sample_ms: float = DEFAULT_SAMPLE_MS, *,
                 backend: Optional[GpuBackend] = None, clock: Callable[[], int] = time.monotonic_ns,
                 drain_s: float = DRAIN_S, max_points: int = DEFAULT_MAX_POINTS,
                 avoid_cpus: Sequence[int] = ()) -> None:
        if not (isinstance(sample_ms, (int, float)) and MIN_SAMPLE_MS <= sample_ms <= MAX_SAMPLE_MS):
            raise ValueError(f"--gpu-sample-ms must be {MIN_SAMPLE_MS:g} to {MAX_SAMPLE_MS:g} ms; got {sample_ms!r}")
        self.selection = gpus if isinstance(gpus, GpuSelection) else parse_gpus(gpus)
        self.sample_ms = float(sample_ms)
        self.backend: GpuBackend = backend if backend is not None else NvmlBackend()
        self._clock = clock
        self._drain_ns = s_to_ns(drain_s)
        self._energy_read_ns = s_to_ns(ENERGY_READ_S)
        self._max_points = max_points
        self._avoid_cpus = frozenset(avoid_cpus)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._gpus: List[GpuState] = []
        self._driver = ""
        self._unavailable: Optional[str] = None
        self._failures: List[str] = []  # what went wrong outside a GPU, one line each
        self._opened_ns = 0
        self._last_drain_ns = 0
        self._state = "new"  # new -> open -> closed
        self._thread_cpu_s: Optional[float] = None
        self._thread_wall_s: Optional[float] = None
        # How long stop() waits for the thread, and the caller's thread for the lock the
        # thread holds during a pass: a GPU call that hangs must not hang the run.
        self.join_s = 2.0
        self.lock_s = 1.0

    # ------------------------------------------------------------- lifecycle

    def open(self) -> None:
        """Opens the library and finds the selected devices, without starting the
        thread (:meth:`start` does both). A missing library, driver or device makes the
        sampler unavailable; nothing raises then.

        Raises:
            ValueError: a ``--gpus`` item names no device (the library is closed again).
        """
        if self._state != "new":
            return
        self._state = "open"
        if self.selection.mode == "none":
            self._unavailable = f"no GPU selected ({self.selection.describe()})"
            return
        try:
            self.backend.init()
        except Exception as e:  # GpuUnavailable, or a broken library: never the run's end
            self._unavailable = one_line(str(e) if isinstance(e, GpuError) else f"{type(e).__name__}: {e}")
            self._state = "closed"
            return
        try:
            self._opened_ns = self._last_drain_ns = self._clock()
            self._discover()
        except ValueError:
            self._close_backend()
            raise
        except Exception as e:  # a GpuError, or a broken library
            self._unavailable = one_line(f"GPU discovery failed: {type(e).__name__}: {e}")
        if not self._unavailable and not self._gpus:
            self._unavailable = f"no GPU matches {self.selection.describe()}"
        if self._unavailable:
            self._close_backend()

    def start(self) -> None:
        """Opens (see :meth:`open`) and starts the sampling thread (none when no GPU can
        be sampled). Takes the first readings before it returns."""
        self.open()
        if self._state != "open" or self._thread is not None or self._unavailable:
            return
        if not self._safe_tick():
            return
        self._thread = threading.Thread(target=self._run, name="loadgen-gpu", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread promptly, drains the driver buffers a last time, marks
        ``end`` when ``start`` was marked and ``end`` was not, and closes the library.
        Idempotent; raises nothing."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.join_s)
        with self._guard() as held:
            if self._state != "open":
                return
            if not held:  # the thread is stuck in a GPU call: leave the library alone
                self._fail("the GPU sampler thread is stuck in a GPU call; its last readings are left out")
                self._state = "closed"
                return
            try:
                if not self._unavailable and not self._failures:
                    now = self._clock()
                    self._drain(now)
                    for gpu in self._gpus:
                        if "start" in gpu.marks and "end" not in gpu.marks and not gpu.lost:
                            self._mark_gpu(gpu, "end", now)
            except Exception as e:  # a broken backend: keep what was measured
                self._fail(f"the GPU sampler's last readings failed: {type(e).__name__}: {e}")
            self._close_backend()

    def _fail(self, message: str) -> None:
        line = one_line(message)
        if line not in self._failures:
            self._failures.append(line)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[bool]:
        """The sampler's lock, waited for ``lock_s`` at most; yields whether it is held."""
        held = self._lock.acquire(timeout=self.lock_s)
        try:
            yield held
        finally:
            if held:
                self._lock.release()

    def _close_backend(self) -> None:
        self._state = "closed"
        try:
            self.backend.shutdown()
        except Exception:  # shutting down must not lose the report
            pass

    @property
    def status(self) -> str:
        """"ok", "partial" (a GPU was lost or the thread failed) or "unavailable"."""
        if self._unavailable or self._state == "new":
            return "unavailable"
        if self._failures or any(u.lost for g in self._gpus for u in g.units):
            return "partial"
        return "ok"

    # ------------------------------------------------------------- discovery

    def _discover(self) -> None:
        self._driver = self.backend.driver_version()
        infos: List[DeviceInfo] = []
        found: List[Tuple[GpuState, List[Tuple[str, str, Handle]]]] = []
        for i in range(self.backend.device_count()):
            gpu, migs = self._describe(i)
            found.append((gpu, migs))
            infos.append(DeviceInfo(i, gpu.uuid, tuple(m[0] for m in migs), gpu.mig))
        for pos, slot in select(self.selection, infos):
            gpu, migs = found[pos]
            if slot is None:
                unit = DeviceState(gpu, gpu.uuid, gpu.name, gpu.handle, lost=gpu.lost)
            else:
                uuid, name, handle = migs[slot]
                unit = DeviceState(gpu, uuid, name, handle, slot=slot, lost=gpu.lost)
            unit.memory_series = BinnedSeries(self._max_points)
            gpu.units.append(unit)
        self._gpus = [gpu for gpu, _ in found if gpu.units]

    def _describe(self, index: int) -> Tuple[GpuState, List[Tuple[str, str, Handle]]]:
        """A physical GPU and its MIG devices (uuid, name, handle); a GPU that fails
        here is recorded as lost from the start."""
        b = self.backend
        try:
            handle = b.handle_by_index(index)
            gpu = GpuState(index, b.uuid(handle), b.name(handle), handle, mig=b.is_mig(handle))
        except GpuError as e:
            gpu = GpuState(index, f"index-{index}", "unknown", None, lost=(self._clock(), one_line(str(e))))
            return gpu, []
        for series in ("power_read_series", "power_drained_series", "utilization_series"):
            setattr(gpu, series, BinnedSeries(self._max_points))
        gpu.energy = CounterSeries(self._max_points)
        migs: List[Tuple[str, str, Handle]] = []
        try:
            gpu.power_limit_w = b.power_limit(handle)
        except GpuNotSupported:
            pass
        except GpuError as e:
            gpu.lost = (self._clock(), one_line(str(e)))
        try:
            if gpu.mig:
                migs = [(b.uuid(h), b.name(h), h) for h in b.mig_devices(handle)]
        except GpuError as e:
            gpu.lost = (self._clock(), one_line(str(e)))
        return gpu, migs

    # -------------------------------------------------------------- sampling

    def _run(self) -> None:
        keep_off(self._avoid_cpus)
        cpu0, wall0 = time.thread_time(), time.monotonic()
        period_ns = ms_to_ns(self.sample_ms)
        next_ns = time.monotonic_ns() + period_ns
        try:
            while not self._stop.wait(ns_to_s(max(0, next_ns - time.monotonic_ns()))):
                if not self._safe_tick() or all(g.lost for g in self._gpus):
                    break
                next_ns += period_ns
                now = time.monotonic_ns()
                if next_ns < now:  # fell behind (a stalled machine): skip, do not burst
                    next_ns = now + period_ns
        finally:
            self._thread_cpu_s = time.thread_time() - cpu0
            self._thread_wall_s = time.monotonic() - wall0

    def _safe_tick(self) -> bool:
        """:meth:`tick`, turning an unexpected exception (a broken backend) into the
        ``partial`` status instead of ending the run; False when sampling must stop."""
        try:
            self.tick()
        except Exception as e:  # a sampler bug must not end the run
            self._fail(f"the GPU sampler stopped: {type(e).__name__}: {e}")
            return False
        return True

    def tick(self) -> None:
        """One sampling pass over every GPU (and a drain when one is due): what the
        thread does every ``sample_ms``. Public for callers that drive sampling
        themselves (tests with a fake clock); ignored unless the sampler is open."""
        with self._lock:
            if self._state != "open" or self._unavailable:
                return
            now = self._clock()
            for gpu in self._gpus:
                if gpu.lost:
                    continue
                try:
                    self._read_gpu(gpu, now)
                except GpuError as e:
                    self._lose(gpu, now, e)
                    continue
                for unit in gpu.units:
                    self._read_unit(unit, now)
            if now - self._last_drain_ns >= self._drain_ns:
                self._drain(now)

    def _read(self, gpu: GpuState, metric: str, fn: Callable[[Handle], _T]) -> Optional[_T]:
        """A reading, or None when the GPU does not support it (asked once only)."""
        if metric in gpu.unsupported:
            return None
        try:
            return fn(gpu.handle)
        except GpuNotSupported as e:
            gpu.unsupported[metric] = one_line(str(e)) or "not supported"
            return None

    def _read_gpu(self, gpu: GpuState, now: int) -> None:
        b = self.backend
        clocks = self._read(gpu, "clocks", b.clocks)
        if clocks is not None:
            gpu.sm_clock.add(clocks[0])
            gpu.mem_clock.add(clocks[1])
            gpu.latest["sm_clock_mhz"] = clocks[0]
        temperature = self._read(gpu, "temperature", b.temperature)
        if temperature is not None:
            gpu.temperature.add(temperature)
            gpu.latest["temperature_c"] = temperature
        power = self._read_power(gpu)
        if power is not None:
            gpu.latest["power_w"] = power
            gpu.power_read.add(power)
            gpu.power_read_series.add(now, power)
            if gpu.last_power is not None:  # for GPUs without an energy counter
                t, p = gpu.last_power
                gpu.integrated_mj += (p + power) / 2 * (now - t) / 1e6
            gpu.last_power = (now, power)
        reasons = self._read(gpu, "clocks_event_reasons", b.clocks_event_reasons)
        if reasons:
            for bit in reason_bits(reasons):
                gpu.throttle_ticks[bit] = gpu.throttle_ticks.get(bit, 0) + 1
        # A costly counter is read once every ENERGY_READ_S; a cheap one, and the integral
        # of the power readings for GPUs without one, at every tick.
        if ("energy" in gpu.unsupported or gpu.energy_read_ns is None
                or gpu.energy_read_cost_ns < CHEAP_ENERGY_READ_NS
                or now - gpu.energy_read_ns >= self._energy_read_ns):
            cpu0 = time.thread_time_ns()
            energy = self._energy_mj(gpu, now)
            gpu.energy_read_cost_ns = time.thread_time_ns() - cpu0
            if energy is not None:
                gpu.energy.add(now, energy)
                gpu.energy_read_ns = now
        gpu.ticks += 1

    def _read_power(self, gpu: GpuState) -> Optional[float]:
        """Board power: the instantaneous reading where the driver has one, else its
        averaged one; None when neither is supported."""
        power = self._read(gpu, "power_instant", self.backend.power_instant)
        if power is None:
            power = self._read(gpu, "power", self.backend.power_avg)
        return power

    def _energy_mj(self, gpu: GpuState, now: int) -> Optional[float]:
        """The energy counter (mJ), or the integral of the power readings where the GPU
        has no counter (it starts at the first reading); None when neither exists."""
        counter = self._read(gpu, "energy", self.backend.total_energy_mj)
        if counter is not None:
            return float(counter)
        if gpu.last_power is None:
            power = self._read_power(gpu)
            if power is None:
                return None
            gpu.last_power = (now, power)
        t, p = gpu.last_power
        return gpu.integrated_mj + p * (now - t) / 1e6

    def _read_unit(self, unit: DeviceState, now: int) -> None:
        if unit.lost or unit.unsupported:
            return
        try:
            used, total = self.backend.memory(unit.handle)
        except GpuNotSupported as e:
            unit.unsupported = one_line(str(e)) or "not supported"
            return
        except GpuError as e:
            if unit.slot is None:
                self._lose(unit.gpu, now, e)
            else:
                unit.lost = (now, one_line(str(e)))
            return
        unit.memory.add(used)
        unit.memory_series.add(now, used)
        unit.latest_memory = used
        unit.memory_total = total
        unit.ticks += 1

    def _drain(self, now: int) -> None:
        """Drains the driver's utilization and power sample buffers of every GPU."""
        self._last_drain_ns = now
        for gpu in self._gpus:
            for kind in ("utilization", "power"):
                if gpu.lost or (kind == "utilization" and gpu.mig) or kind in gpu.unsupported:
                    continue
                try:
                    points, gpu.cursors[kind] = self.backend.samples(gpu.handle, kind, gpu.cursors[kind])
                except GpuNotSupported as e:
                    gpu.unsupported[kind] = one_line(str(e)) or "not supported"
                    continue
                except GpuError as e:
                    self._lose(gpu, now, e)
                    continue
                stats, series = ((gpu.utilization, gpu.utilization_series) if kind == "utilization"
                                 else (gpu.power_drained, gpu.power_drained_series))
                for t, value in points:
                    if t >= self._opened_ns:  # the buffer also holds samples from before
                        stats.add(value)
                        series.add(t, value)
                        if kind == "utilization":
                            gpu.latest["utilization_pct"] = value

    def _lose(self, gpu: GpuState, now: int, error: Exception) -> None:
        gpu.lost = (now, one_line(str(error)) or type(error).__name__)
        for unit in gpu.units:
            unit.lost = unit.lost or gpu.lost

    # ----------------------------------------------------------------- marks

    def mark(self, name: str) -> None:
        """Reads every GPU's energy counter now, as the boundary ``name`` (one of
        :data:`MARKS`). Call it at the start of the measured run, when issuing ends and
        at the end; a GPU that fails here is lost like one that fails sampling.

        Raises:
            ValueError: ``name`` is not one of :data:`MARKS`.
        """
        if name not in MARKS:
            raise ValueError(f"mark: {name!r} is not one of {', '.join(MARKS)}")
        with self._guard() as held:
            if self._state != "open" or self._unavailable:
                return
            if not held:
                self._fail(f"the {name} mark was skipped: the GPU sampler thread is stuck in a GPU call")
                return
            now = self._clock()
            for gpu in self._gpus:
                if not gpu.lost:
                    self._mark_gpu(gpu, name, now)

    def _mark_gpu(self, gpu: GpuState, name: str, now: int) -> None:
        try:
            energy = self._energy_mj(gpu, now)
        except GpuError as e:
            self._lose(gpu, now, e)
            return
        except Exception as e:  # a broken backend must not end the run
            self._fail(f"the GPU sampler's {name} mark failed: {type(e).__name__}: {e}")
            return
        if energy is not None:
            gpu.marks[name] = (now, energy)
            if "energy" not in gpu.unsupported:
                gpu.energy.add(now, energy)
                gpu.energy_read_ns = now

    def latest(self) -> List[Dict[str, Any]]:
        """The newest reading of each sampled device, for live displays (any thread):
        ``index``, ``uuid``, ``name``, ``memory_used_bytes`` and, of its GPU,
        ``utilization_pct``, ``power_w``, ``temperature_c``, ``sm_clock_mhz`` (each absent
        until read). Lost devices are left out; empty when the lock is not had in time."""
        with self._guard() as held:
            if not held:
                return []
            return [{"index": g.index, "uuid": u.uuid, "name": u.name, **g.latest,
                     **({} if u.latest_memory is None else {"memory_used_bytes": u.latest_memory})}
                    for g in self._gpus for u in g.units if not u.lost]

    # ---------------------------------------------------------------- report

    def report(self, *, completed_queries: int = 0, completed_samples: int = 0,
               measure_start_ns: Optional[int] = None, interval_ns: Optional[int] = None,
               n_intervals: Optional[int] = None) -> Dict[str, Any]:
        """The result document's ``gpu`` section (stops the sampler first).

        Args:
            completed_queries, completed_samples: the run's counts, for the energy per
                query and per sample.
            measure_start_ns, interval_ns, n_intervals: the run's time series; when all
                are given the section also has ``intervals`` (see :meth:`intervals`).

        Returns:
            ``status`` ("ok", "partial", "unavailable"), ``reason`` (one line; empty when
            ok), ``sample_ms``, ``selection``, ``devices`` (one entry per device, see the
            module docs), ``energy_j_total``, ``energy_per_query_j``,
            ``energy_per_sample_j``, ``queries_per_joule`` and ``sampler`` (the thread's
            own CPU time).
        """
        self.stop()
        with self._guard():  # read as it is even when a stuck thread holds the lock
            devices = [device_entry(u, self._driver) for g in self._gpus for u in g.units]
            totals = [g.marks["end"][1] - g.marks["start"][1] for g in self._gpus
                      if "start" in g.marks and "end" in g.marks]
            energy_j = sum(totals) / 1000.0 if totals else None
            section: Dict[str, Any] = {
                "status": self.status,
                "reason": self._reason(len(totals)),
                "sample_ms": self.sample_ms,
                "selection": self.selection.describe(),
                "devices": devices,
                "energy_j_total": energy_j,
                "energy_per_query_j": ratio(energy_j, completed_queries),
                "energy_per_sample_j": ratio(energy_j, completed_samples),
                "queries_per_joule": ratio(float(completed_queries), energy_j) if completed_queries else None,
                "sampler": self._overhead(),
            }
        if measure_start_ns is not None and interval_ns is not None and n_intervals is not None:
            section["intervals"] = self.intervals(measure_start_ns=measure_start_ns, interval_ns=interval_ns,
                                                  n_intervals=n_intervals)
        return section

    def _reason(self, gpus_with_energy: int) -> str:
        if self._unavailable:
            return self._unavailable
        if self._state == "new":
            return "the GPU sampler was not started"
        parts = []
        for g in self._gpus:
            for u in g.units:
                if u.lost and (u.slot is not None or u is g.units[0]):
                    parts.append(f"{u.uuid} lost at +{ns_to_s(max(u.lost[0] - self._opened_ns, 0)):.1f} s: {u.lost[1]}")
        parts.extend(self._failures)
        if parts and gpus_with_energy < len(self._gpus):
            parts.append(f"energy totals cover {gpus_with_energy} of {len(self._gpus)} GPUs")
        return "; ".join(parts)

    def _overhead(self) -> Dict[str, Optional[float]]:
        cpu, wall = self._thread_cpu_s, self._thread_wall_s
        return {
            "thread_cpu_s": cpu,
            "wall_s": wall,
            "cpu_pct_of_core": 100.0 * cpu / wall if cpu is not None and wall else None,
        }

    # ------------------------------------------------------------- intervals

    def intervals(self, *, measure_start_ns: int, interval_ns: int, n_intervals: int
                  ) -> List[Dict[str, Dict[str, Optional[float]]]]:
        """Per-interval figures aligned with the run's time series (stops the sampler
        first): for interval ``i``,
        [measure_start + i * interval, measure_start + (i + 1) * interval), a dict by
        device UUID of ``utilization_pct`` (mean), ``power_w`` (mean), ``memory_used_bytes``
        (max) and ``energy_j``; None where nothing was read in it. A MIG device's power
        and energy are its GPU's (shared by the GPU's MIG devices); its utilization is
        None (not supported).

        Raises:
            ValueError: ``interval_ns`` <= 0 or ``n_intervals`` < 0.
        """
        if interval_ns <= 0 or n_intervals < 0:
            raise ValueError(f"intervals: interval_ns must be > 0 and n_intervals >= 0; "
                             f"got {interval_ns}, {n_intervals}")
        self.stop()
        with self._guard():
            return device_intervals(self._gpus, measure_start_ns, interval_ns, n_intervals)
