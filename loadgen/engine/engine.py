"""The issue engine from Python: settings, running a SUT, and what a run measured.

The engine itself is native (``loadgen._core.Engine``): a dedicated thread follows the
schedule and never calls into Python per query. Python SUTs receive queries through a
bounded queue that this module drains in batches (one query at a time when the rate is
low, hundreds when it is high); completions go back in arrays.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from loadgen import _core
from loadgen.stats.histogram import Histogram
from loadgen.sut.forms import Batch, classify_sut

__all__ = ["EngineSettings", "RunResult", "Engine", "run", "load_trace"]

_monotonic_ns = time.monotonic_ns

_MODES = ("constant", "poisson", "stages", "trace", "closed", "offline")
_ORDERS = ("random", "sequential", "shuffled")


@dataclass
class EngineSettings:
    """How the engine generates load. Every quantity carries its unit in its name.

    Attributes:
        mode: arrival process: "constant" (evenly spaced at target_qps), "poisson"
            (exponential gaps at target_qps), "stages" (piecewise rates, see stages),
            "trace" (replay trace_offsets_ns), "closed" (keep ``concurrency`` queries
            in flight: the next when one completes) or "offline" (all at t = 0).
        target_qps: queries per second for constant and poisson.
        stages: for "stages": a list of (duration_s, start_qps, end_qps); equal rates
            make a step, different rates a linear ramp.
        stages_poisson: Poisson arrivals within stages instead of even spacing.
        trace_offsets_ns: for "trace": arrival offsets in ns from the start
            (non-decreasing), or a path (see :func:`load_trace`).
        concurrency: for "closed": queries in flight (1 = SingleStream).
        max_in_flight: open loop: cap on outstanding queries (0 = none). A query that
            meets the cap waits; its latency still counts from its scheduled time.
        duration_s: stop issuing at this time (None = no limit).
        query_count: stop after this many queries (None = no limit).
        min_duration_s, min_query_count: MLPerf-style minimums: keep issuing until
            both are met (a duration_s/query_count limit still stops the run).
        samples_per_query: sample indices per query.
        sample_count: size of the sample set the indices are drawn from.
        sample_order: "random" (uniform, with replacement), "sequential" or
            "shuffled" (a fresh permutation per pass).
        schedule_seed, sample_seed: seeds of the arrival and sample streams.
        spin_us: the issue thread sleeps until this long before each scheduled time and
            spins the rest (0 = sleep only).
        pin_cpus: CPUs to pin the issue thread to (empty = not pinned).
        timeout_ms: per-query timeout, measured like latency from the scheduled time
            (None = none); a query not done by then counts as timed out.
        grace_s: how long to wait for outstanding queries after the last is issued;
            then they are cancelled.
        interval_s: time-series interval (0 = none).
        significant_figures: precision of the histograms (1..5).
        batch_max: most queries handed to a Python SUT in one batch.
        consumer_spin_us: how long the Python dispatcher spins before sleeping when
            no query is queued (lower latency at low rates; costs a core).
        inline_dispatch: open loop with a function or batched Python SUT: the dispatcher
            thread itself waits for each scheduled time and issues what is due, instead
            of a separate issue thread handing queries over. One busy thread instead of
            two and no cross-thread wake-up: steadier tail latency on small or shared
            machines; the schedule is not watched while the SUT runs (lateness shows as
            issue delay). Closed loop with a Python SUT always works this way.
    """

    mode: str = "poisson"
    target_qps: Optional[float] = None
    stages: Sequence[Tuple[float, float, float]] = ()
    stages_poisson: bool = False
    trace_offsets_ns: Any = None
    concurrency: int = 1
    max_in_flight: int = 0
    duration_s: Optional[float] = None
    query_count: Optional[int] = None
    min_duration_s: float = 0.0
    min_query_count: int = 0
    samples_per_query: int = 1
    sample_count: int = 1024
    sample_order: str = "random"
    schedule_seed: int = 0
    sample_seed: int = 0
    spin_us: float = 100.0
    pin_cpus: Sequence[int] = ()
    timeout_ms: Optional[float] = None
    grace_s: float = 10.0
    interval_s: float = 1.0
    significant_figures: int = 3
    batch_max: int = 4096
    consumer_spin_us: float = 50.0
    inline_dispatch: bool = False

    def validate(self) -> None:
        """Checks every field; raises ValueError naming the first bad one."""
        if self.mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}; got {self.mode!r}")
        if self.sample_order not in _ORDERS:
            raise ValueError(f"sample_order must be one of {', '.join(_ORDERS)}; got {self.sample_order!r}")
        if self.mode in ("constant", "poisson"):
            if self.target_qps is None or not (math.isfinite(self.target_qps) and self.target_qps > 0):
                raise ValueError(f"target_qps must be a finite rate > 0 for mode {self.mode!r}; got {self.target_qps}")
        if self.mode == "stages" and not self.stages:
            raise ValueError("stages must list (duration_s, start_qps, end_qps) for mode 'stages'")
        if self.mode == "trace" and self.trace_offsets_ns is None:
            raise ValueError("trace_offsets_ns is required for mode 'trace'")
        if self.mode == "closed" and (not isinstance(self.concurrency, int) or self.concurrency < 1):
            raise ValueError(f"concurrency must be an integer >= 1; got {self.concurrency!r}")
        for name in ("duration_s",):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be > 0 (or None for no limit); got {v}")
        if self.query_count is not None and (not isinstance(self.query_count, int) or self.query_count < 1):
            raise ValueError(f"query_count must be an integer >= 1 (or None); got {self.query_count!r}")
        for name in ("min_duration_s", "spin_us", "grace_s", "interval_s", "consumer_spin_us"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a number >= 0; got {v!r}")
        for name in ("min_query_count", "max_in_flight"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0; got {v!r}")
        for name in ("samples_per_query", "sample_count", "batch_max"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {v!r}")
        if self.timeout_ms is not None and not (math.isfinite(self.timeout_ms) and self.timeout_ms > 0):
            raise ValueError(f"timeout_ms must be > 0 (or None); got {self.timeout_ms}")
        if not 1 <= self.significant_figures <= 5:
            raise ValueError(f"significant_figures must be in 1..5; got {self.significant_figures}")
        if self.pin_cpus:
            try:
                allowed = sorted(os.sched_getaffinity(0))
            except AttributeError:  # pragma: no cover - not Linux
                allowed = list(range(os.cpu_count() or 1))
            bad = [c for c in self.pin_cpus if c not in allowed]
            if bad:
                raise ValueError(
                    f"pin_cpus: CPU {bad[0]} is not available to this process "
                    f"(allowed: {','.join(map(str, allowed))})"
                )
        for name in ("schedule_seed", "sample_seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or not 0 <= v < 2**64:
                raise ValueError(f"{name} must be an integer in 0..2**64-1; got {v!r}")
        bounded = (
            self.duration_s is not None or self.query_count is not None
            or self.min_duration_s > 0 or self.min_query_count > 0
            or self.mode in ("stages", "trace")
        )
        if not bounded:
            raise ValueError("the run needs a bound: set duration_s or query_count (both are unset)")

    def to_core(self, sut_form: str, sut: Any) -> _core.EngineSettings:
        """The native settings for this run (validates first)."""
        self.validate()
        s = _core.EngineSettings()
        if self.mode == "closed":
            s.load_mode = _core.LoadMode.closed_loop
            s.concurrency = self.concurrency
        else:
            s.load_mode = _core.LoadMode.open_loop
            s.arrival = getattr(_core.ArrivalKind, self.mode)
        if self.target_qps is not None:
            s.target_qps = float(self.target_qps)
        if self.mode == "stages":
            stages = []
            for i, stage in enumerate(self.stages):
                try:
                    duration_s, start_qps, end_qps = stage
                except (TypeError, ValueError):
                    raise ValueError(f"stages[{i}] must be (duration_s, start_qps, end_qps); got {stage!r}") from None
                if not duration_s > 0:
                    raise ValueError(f"stages[{i}] duration_s must be > 0; got {duration_s}")
                stages.append(_core.Stage(int(round(duration_s * 1e9)), float(start_qps), float(end_qps)))
            s.stages = stages
            s.stages_poisson = bool(self.stages_poisson)
        if self.mode == "trace":
            s.trace_offsets_ns = load_trace(self.trace_offsets_ns).tolist()
        s.max_in_flight = self.max_in_flight
        s.max_duration_ns = _ns(self.duration_s)
        s.max_query_count = self.query_count or 0
        s.min_duration_ns = _ns(self.min_duration_s)
        s.min_query_count = self.min_query_count
        s.samples_per_query = self.samples_per_query
        s.sample_count = self.sample_count
        s.sample_order = getattr(_core.SampleOrder, self.sample_order)
        s.schedule_seed = self.schedule_seed
        s.sample_seed = self.sample_seed
        s.spin_ns = _ns(self.spin_us * 1e-6)
        s.pin_cpus = [int(c) for c in self.pin_cpus]
        s.timeout_ns = _ns(self.timeout_ms * 1e-3 if self.timeout_ms else 0)
        s.grace_ns = _ns(self.grace_s)
        s.interval_ns = _ns(self.interval_s)
        s.significant_figures = self.significant_figures
        if self.inline_dispatch and sut_form not in ("function", "batched"):
            raise ValueError(
                f"inline_dispatch needs a function or batched Python SUT, not a {sut_form} SUT"
            )
        s.inline_dispatch = bool(self.inline_dispatch)
        if sut_form in ("null", "fixed_delay", "demo"):
            # The SUT object knows its native settings; a bare "null" form needs none.
            s.sut = sut.native_settings() if sut is not None else _core.NativeSutSettings(kind=_core.SutKind.null)
        else:
            s.sut = _core.NativeSutSettings(kind=_core.SutKind.queue)
        return s


def _ns(seconds: Optional[float]) -> int:
    return 0 if not seconds else int(round(seconds * 1e9))


def load_trace(source: Any) -> np.ndarray:
    """Arrival offsets in ns from an array, a ``.npy`` file, or a text file.

    A text file holds one offset per line; a ``# unit: ms`` (or ``us``, ``s``, ``ns``)
    line sets the unit, else a file named ``*.ms.txt`` is in ms, otherwise ns. Blank
    lines and other ``#`` lines are skipped.

    Raises:
        ValueError: the offsets are not numbers, negative, or decreasing (with the line).
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if path.endswith(".npy"):
            arr = np.load(path)
        else:
            scale = 1e6 if path.endswith(".ms.txt") else 1.0
            values: List[float] = []
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, start=1):
                    text = line.strip()
                    if text.startswith("# unit:"):
                        unit = text.split(":", 1)[1].strip()
                        factors = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
                        if unit not in factors:
                            raise ValueError(f"{path} line {number}: unknown unit {unit!r} (ns, us, ms, s)")
                        scale = factors[unit]
                        continue
                    if not text or text.startswith("#"):
                        continue
                    try:
                        values.append(float(text) * scale)
                    except ValueError:
                        raise ValueError(f"{path} line {number}: not a number: {text[:40]!r}") from None
            arr = np.asarray(values)
    else:
        arr = np.asarray(source)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("trace_offsets_ns must be a non-empty 1-D sequence of offsets")
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise ValueError("trace_offsets_ns must be finite")
        arr = np.rint(arr)
    arr = arr.astype(np.int64)
    if (arr < 0).any():
        raise ValueError(f"trace_offsets_ns must be >= 0 (offset {int(np.argmax(arr < 0))} is not)")
    bad = np.flatnonzero(np.diff(arr) < 0)
    if bad.size:
        raise ValueError(f"trace_offsets_ns must be non-decreasing (offset {int(bad[0]) + 1} goes back)")
    return arr


@dataclass
class RunResult:
    """What one run measured. Histograms hold nanoseconds.

    Attributes:
        counts: issued, completed, failed, timed_out, cancelled, outstanding,
            unknown_completions, cap_waits, tokens. issued equals completed + failed +
            timed_out + cancelled once the run has ended.
        latency: completed - scheduled, per completed query.
        service_time: completed - issued.
        issue_delay: issued - scheduled (the generator's own health).
        ttft, tpot: time to first token (from scheduled) and time per output token.
        timeseries: one dict per interval (start_offset_ns, length_ns, issued,
            completed, latency_p50_ns, latency_p99_ns, latency_max_ns, latency_hdr).
        errors: failure counts by kind; error_messages: the first few messages.
        duration_s: from the first scheduled time to the end of the run.
        issue_duration_s: from the first scheduled time to the last issue.
        interrupted: the run was stopped early (stop(), Ctrl-C, an error).
        settings: the settings the run used.
    """

    counts: Dict[str, int]
    latency: Histogram
    service_time: Histogram
    issue_delay: Histogram
    ttft: Histogram
    tpot: Histogram
    timeseries: List[dict]
    errors: Dict[str, int]
    error_messages: List[str]
    duration_s: float
    issue_duration_s: float
    interrupted: bool
    settings: EngineSettings
    samples_per_query: int = 1

    @property
    def completed_qps(self) -> float:
        """Completed queries per second over the run."""
        return self.counts["completed"] / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.completed_qps * self.samples_per_query


class Engine:
    """One run of the native engine against a SUT.

    Args:
        settings: an :class:`EngineSettings`.
        sut: a SUT in any form :func:`loadgen.sut.classify_sut` accepts.

    Use :meth:`run` (blocking), or :meth:`start` then :meth:`wait`; :meth:`stop` from
    any thread ends the run early. Usable as a context manager (aborts on exit).
    """

    def __init__(self, settings: EngineSettings, sut: Any) -> None:
        self.settings = settings
        self.sut = sut
        self.sut_form = classify_sut(sut)
        self._core = _core.Engine(settings.to_core(self.sut_form, sut))
        self._driver: Optional[threading.Thread] = None
        self._driver_error: Optional[BaseException] = None
        self._stopped = False

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        """Starts the run; Python SUTs are driven from a background thread. A loop SUT is
        opened on its loop first (connections made), so that the first scheduled time
        comes after it is ready, not during its setup."""
        if self.sut_form == "loop":
            # The driver opens the SUT, then starts the run itself: no hand-off between
            # threads (and their wait for the GIL) sits between the first scheduled time
            # and the first issue.
            self._loop_opened = threading.Event()
        else:
            self._core.start()
        if self.sut_form in ("function", "async", "batched", "loop"):
            self._driver = threading.Thread(target=self._drive_guarded, name="loadgen-dispatch", daemon=True)
            self._driver.start()
        if self.sut_form == "loop":
            self._loop_opened.wait()
            if self._driver_error is not None:
                self._driver.join(5.0)
                raise self._driver_error

    def stop(self) -> None:
        """Stops issuing; outstanding queries get the grace period. Any thread."""
        self._stopped = True
        self._core.stop()

    def abort(self) -> None:
        """Ends the run now, cancelling what is outstanding."""
        self._stopped = True
        self._core.abort()

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Waits for the run to end. Returns False on timeout.

        Raises:
            BaseException: whatever fatal error ended the SUT driver (re-raised here).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        # Wait in short slices so that Ctrl-C reaches Python promptly.
        while True:
            remaining = 0.2 if deadline is None else min(0.2, max(0.0, deadline - time.monotonic()))
            if self._core.wait(remaining):
                break
            if deadline is not None and time.monotonic() >= deadline:
                return False
        if self._driver is not None:
            # The run is over. A Python SUT call may still be running on the driver
            # thread; it gets a second to return, since Python code cannot be
            # interrupted from outside (the thread is a daemon).
            # Every query is resolved by now, so the driver is only finishing a call
            # whose query already timed out or was cancelled.
            self._driver.join(1.0)
        if self._driver_error is not None:
            raise self._driver_error
        error = self._core.run_error
        if error:
            raise ValueError(error)
        return True

    def run(self) -> RunResult:
        """Starts, waits, and returns the result. Ctrl-C aborts the run and re-raises."""
        self.start()
        try:
            self.wait()
        except KeyboardInterrupt:
            self.abort()
            self._core.wait(None)
            raise
        return self.result()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.abort()
        self._core.wait(None)
        if self._driver is not None:
            self._driver.join(1.0)  # see wait(): a stuck SUT call cannot be interrupted

    # ----------------------------------------------------------------- results

    def counts(self) -> Dict[str, int]:
        """The counts so far (see :class:`RunResult`)."""
        return self._core.counts()

    def result(self) -> RunResult:
        """What the run measured (complete once :meth:`wait` returned True)."""
        c = self._core
        start, end, issue_end = c.start_ns, c.end_ns, c.issue_end_ns
        if not end:
            end = _core.now_ns()
        return RunResult(
            counts=c.counts(),
            latency=Histogram._wrap(c.latency()),
            service_time=Histogram._wrap(c.service_time()),
            issue_delay=Histogram._wrap(c.issue_delay()),
            ttft=Histogram._wrap(c.ttft()),
            tpot=Histogram._wrap(c.tpot()),
            timeseries=c.timeseries(),
            errors=c.error_counts(),
            error_messages=c.error_messages(),
            duration_s=max(end - start, 0) / 1e9 if start else 0.0,
            issue_duration_s=max(issue_end - start, 0) / 1e9 if start and issue_end else 0.0,
            interrupted=self._stopped,
            settings=self.settings,
            samples_per_query=self.settings.samples_per_query,
        )

    # ------------------------------------------------------------- SUT drivers

    def _drive_guarded(self) -> None:
        try:
            if self.sut_form == "function":
                self._drive_function()
            elif self.sut_form == "batched":
                self._drive_batched()
            else:
                self._drive_async()
        except BaseException as e:  # re-raised on the waiting thread
            self._driver_error = e
            self._core.abort()
            if self.sut_form == "loop":
                self._loop_opened.set()

    def _batches(self):
        core, s = self._core, self.settings
        spin_ns = int(s.consumer_spin_us * 1e3)
        while True:
            got = core.take_batch(s.batch_max, 0.1, spin_ns)
            if got is None:
                return
            if len(got[0]):
                yield got

    def _drive_serial(self) -> None:
        # One query at a time, completion and the next query in one native call: the
        # whole per-query overhead is one Python call into the engine.
        core, f = self._core, self.sut
        spin_ns = int(self.settings.consumer_spin_us * 1e3)
        take_one, complete_take_one = core.take_one, core.complete_take_one
        nxt = take_one(0.1, spin_ns)
        while nxt is not None:
            if not nxt:  # timed out waiting; look again
                nxt = take_one(0.1, spin_ns)
                continue
            qid, sample = nxt
            try:
                f(sample)
            except Exception as e:  # a SUT error fails this query only
                core.fail(qid, type(e).__name__, str(e))
                nxt = take_one(0.1, spin_ns)
                continue
            nxt = complete_take_one(qid, 0, 0.1, spin_ns)

    def _drive_function(self) -> None:
        core, f = self._core, self.sut
        if core.inline_issue and self.settings.samples_per_query == 1:
            self._drive_serial()
            return
        monotonic_ns = time.monotonic_ns
        single = self.settings.samples_per_query == 1
        for ids, samples, _ in self._batches():
            done: List[int] = []
            stamps: List[int] = []
            sample_list = samples[:, 0].tolist() if single else list(samples)
            for qid, sample in zip(ids.tolist(), sample_list):
                try:
                    f(sample)
                except Exception as e:  # a SUT error fails this query only
                    core.fail(qid, type(e).__name__, str(e))
                    continue
                stamps.append(monotonic_ns())
                done.append(qid)
            if done:
                core.complete_many(np.array(done, dtype=np.int64), np.array(stamps, dtype=np.int64))

    def _drive_batched(self) -> None:
        core, sut = self._core, self.sut
        single = self.settings.samples_per_query == 1
        for ids, samples, scheduled in self._batches():
            batch = Batch(core, ids, samples[:, 0] if single else samples, scheduled)
            try:
                sut.issue(batch)
            except Exception as e:
                batch.fail(kind=type(e).__name__, message=str(e))

    def _drive_async(self) -> None:
        try:
            import uvloop  # noqa: F401

            loop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        driver = _LoopDriver(self, loop) if self.sut_form == "loop" else _AsyncDriver(self, loop)
        try:
            loop.run_until_complete(driver.run())
        finally:
            loop.close()


class _AsyncDriver:
    """Feeds queued queries to an async SUT, woken by the engine's eventfd."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.core = engine._core
        self.f = engine.sut
        self.settings = engine.settings
        self.loop = loop
        self.tasks: set = set()
        self.done_ids: List[int] = []
        self.done_ts: List[int] = []
        self.flush_scheduled = False
        self.exhausted = asyncio.Event()

    async def run(self) -> None:
        fd = self.core.eventfd()
        if fd < 0:
            raise OSError("the engine could not create an eventfd for the asyncio SUT")
        self.loop.add_reader(fd, self._on_ready)
        self._on_ready()
        try:
            await self.exhausted.wait()
            # Everything is handed out; let the rest finish until the engine ends
            # (completion, or cancellation after the grace period).
            while not self.core.wait(0.0):
                if not self.tasks:
                    await asyncio.sleep(0.001)
                else:
                    await asyncio.wait(self.tasks, timeout=0.01)
        finally:
            self.loop.remove_reader(fd)
            for t in list(self.tasks):
                t.cancel()
            self._flush()

    def _on_ready(self) -> None:
        single = self.settings.samples_per_query == 1
        while True:
            got = self.core.take_batch(self.settings.batch_max, 0.0, 0)
            if got is None:
                self.exhausted.set()
                return
            ids, samples, _ = got
            if not len(ids):
                break
            sample_list = samples[:, 0].tolist() if single else list(samples)
            for qid, sample in zip(ids.tolist(), sample_list):
                task = self.loop.create_task(self._one(qid, sample))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        self.core.arm_eventfd()

    async def _one(self, qid: int, sample) -> None:
        try:
            await self.f(sample)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.core.fail(qid, type(e).__name__, str(e))
            return
        self.done_ts.append(time.monotonic_ns())
        self.done_ids.append(qid)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.done_ids:
            ids = np.array(self.done_ids, dtype=np.int64)
            ts = np.array(self.done_ts, dtype=np.int64)
            self.done_ids.clear()
            self.done_ts.clear()
            self.core.complete_many(ids, ts)
        if self.core.inline_issue and not self.exhausted.is_set():
            self._on_ready()  # closed loop: the completions (or failures) made room for more


class _LoopDriver(_AsyncDriver):
    """Feeds queued queries to a loop SUT (see :class:`loadgen.sut.LoopSUT`): no task per
    query; the SUT completes queries through this driver's callbacks, which batch them
    into one native call per loop iteration."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(engine, loop)
        self.engine = engine
        self.sut = engine.sut
        self.closed_loop = bool(self.core.inline_issue)
        self._issue = self.sut.issue_query

    async def run(self) -> None:
        # A failure here reaches Engine.start through _drive_guarded, which records it
        # before waking the starter.
        await self.sut.open_on_loop(self.loop, self)
        self.core.start()
        # The issue thread sets the start time as it begins (microseconds); asking for
        # queries before that would find none and sleep until the next wake-up.
        while not self.core.start_ns and not self.core.wait(0.0):
            time.sleep(0)
        self.engine._loop_opened.set()
        try:
            fd = self.core.eventfd()
            if fd < 0:
                raise OSError("the engine could not create an eventfd for the SUT's event loop")
            self.loop.add_reader(fd, self._on_ready)
            self._on_ready()
            try:
                await self.exhausted.wait()
                while not self.core.wait(0.0):
                    await asyncio.sleep(0.002)
            finally:
                self.loop.remove_reader(fd)
                self._flush()
        finally:
            await self.sut.close_on_loop()

    def _on_ready(self) -> None:
        single = self.settings.samples_per_query == 1
        issue = self._issue
        batch_max = min(self.settings.batch_max, 256)  # woken per arrival: batches are small
        while True:
            got = self.core.take_batch(batch_max, 0.0, 0)
            if got is None:
                self.exhausted.set()
                return
            ids, samples, scheduled = got
            if not len(ids):
                break
            sample_list = samples[:, 0].tolist() if single else list(samples)
            for qid, sample, t in zip(ids.tolist(), sample_list, scheduled.tolist()):
                try:
                    issue(qid, sample, t)
                except Exception as e:  # a SUT error fails this query only
                    self.core.fail(qid, type(e).__name__, str(e))
        self.core.arm_eventfd()

    # The sink the SUT calls, on the loop's thread. Open loop, completions are gathered
    # into one native call per loop iteration. Closed loop, each completion issues the
    # next query at once: deferring it to the end of the iteration would make it wait
    # behind every other callback due, and that wait is issue delay.
    def _issue_next(self) -> None:
        # Closed loop: one completion freed one slot; take_one is the cheap native path
        # (take_batch sizes its buffers for a whole batch).
        take_one, issue, fail = self.core.take_one, self._issue, self.core.fail
        while True:
            got = take_one(0.0, 0)
            if got is None:
                self.exhausted.set()
                return
            if not got:
                return
            qid, sample = got
            try:
                issue(qid, sample, _monotonic_ns())
                return
            except Exception as e:  # a SUT error fails this query only; its slot is free again
                fail(qid, type(e).__name__, str(e))

    def complete(self, qid: int, t_ns: int) -> None:
        """Query ``qid`` completed at ``t_ns``."""
        if self.closed_loop:
            self.core.complete(qid, t_ns)
            if not self.exhausted.is_set():
                self._issue_next()
            return
        self.done_ts.append(t_ns)
        self.done_ids.append(qid)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def complete_tokens(self, qid: int, t_ns: int, n_tokens: int) -> None:
        """Query ``qid`` completed at ``t_ns`` with ``n_tokens`` output tokens."""
        self.core.complete(qid, t_ns, n_tokens)
        if self.closed_loop and not self.exhausted.is_set():
            self._issue_next()

    def first_token(self, qid: int, t_ns: int) -> None:
        """Query ``qid`` produced its first token at ``t_ns``."""
        self.core.first_token(qid, t_ns)

    def fail(self, qid: int, kind: str, message: str) -> None:
        """Query ``qid`` failed; ``kind`` is its error class."""
        self.core.fail(qid, kind, message)
        if self.closed_loop and not self.exhausted.is_set():
            self._issue_next()


def run(settings: Optional[EngineSettings] = None, sut: Any = None, **overrides: Any) -> RunResult:
    """Runs the engine once and returns what it measured.

    Args:
        settings: the settings (default :class:`EngineSettings` ()).
        sut: the system under test (default :class:`loadgen.NullSUT`).
        **overrides: EngineSettings fields to change, e.g. ``target_qps=1000``.

    Raises:
        ValueError: a setting or the SUT is invalid; the message names it.
    """
    from loadgen.sut.forms import NullSUT

    settings = settings or EngineSettings()
    if overrides:
        known = {f.name for f in fields(EngineSettings)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}")
        settings = EngineSettings(**{**settings.__dict__, **overrides})
    return Engine(settings, NullSUT() if sut is None else sut).run()
