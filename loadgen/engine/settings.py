"""How the engine generates load: :class:`EngineSettings`, one typed structure with the
unit in every name, its validation (naming the bad field) and its native form."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from loadgen import _core, defaults
from loadgen.engine.records import engine_path, record_format
from loadgen.engine.records import sink as records_sink
from loadgen.engine.trace import load_trace
from loadgen.units import ms_to_ns, s_to_ms, s_to_ns, us_to_ns

__all__ = ["CORE_ONLY_FIELDS", "EngineSettings", "MODES", "MODE_FIELDS", "SAMPLE_ORDERS", "allowed_cpus",
           "io_thread_cpus"]

#: The arrival processes (``EngineSettings.mode``).
MODES = ("constant", "poisson", "stages", "trace", "closed", "offline")
#: How sample indices are drawn (``EngineSettings.sample_order``).
SAMPLE_ORDERS = ("random", "sequential", "shuffled")
_MODES, _ORDERS = MODES, SAMPLE_ORDERS


def allowed_cpus() -> List[int]:
    """The CPUs this process may run on (its affinity: a pod's cgroup cpuset), sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


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
        burstiness: "poisson" and Poisson stages: the gaps are Gamma(shape B, mean
            1 / rate), coefficient of variation 1 / sqrt(B); 1 (default) is exactly the
            exponential (Poisson) stream, < 1 burstier, > 1 smoother.
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
        latency_bounds_ns: latency bounds (ns, up to 8) to count exactly: the engine
            counts, as it records, every latency strictly greater than each bound
            (``RunResult.over_bound``, in this order). Early stopping and bound checks
            use these counts, never a histogram-bucket estimate.
        ramp_up_s: "closed": start the ``concurrency`` streams evenly over this long
            (stream k at ``k * ramp_up_s / concurrency``) rather than all at once. The
            ramp is counted apart like a warm-up: measuring starts ``ramp_up_s +
            warmup_s`` after the start.
        sched_slice_us: the scheduler slice the issue thread and a native network
            client's I/O threads ask the kernel for (Linux 6.12+, no privilege needed):
            on a busy core a thread with a short slice preempts a CPU-bound neighbour
            when it wakes, so arrivals are sent on time. 0: the kernel's default.
        warmup_s: warm-up: queries scheduled in the first ``warmup_s`` are issued at the
            schedule but not recorded (counted apart as ``warmup_*``). Durations, query
            counts, histograms and the time series start at its end. Not for "stages",
            "trace" (the schedule itself is the warm-up there) or "offline".
        dispatcher_cpus: CPUs to pin the Python dispatcher thread (and the event loop it
            runs) to (empty = not pinned); see :mod:`loadgen.placement`.
        sut_cpus: CPUs for an in-process SUT's threads that loadgen starts: the fixed-delay
            and demo SUTs' thread, the extra threads of a closed-loop function SUT
            (empty = not pinned).
        record_requests: write one record per resolved query to this file: JSON lines,
            or Parquet for a ``.parquet`` path (needs pyarrow); see
            :mod:`loadgen.engine.records`. None: no records.
        record_worker_index: the ``worker_index`` written in every record.
        slo_latency_ns, slo_ttft_ns, slo_tpot_ns: service level objectives (0 = none):
            the engine judges every measured completion against all that are set, as it
            resolves it, and counts those meeting each and every one (the ``slo_*``
            counts; see :mod:`loadgen.results.goodput`).
    """

    mode: str = defaults.MODE
    target_qps: Optional[float] = None
    stages: Sequence[Tuple[float, float, float]] = ()
    stages_poisson: bool = False
    burstiness: float = defaults.BURSTINESS
    trace_offsets_ns: Any = None
    concurrency: int = defaults.CONCURRENCY
    max_in_flight: int = defaults.MAX_IN_FLIGHT
    duration_s: Optional[float] = None
    query_count: Optional[int] = None
    min_duration_s: float = 0.0
    min_query_count: int = 0
    samples_per_query: int = defaults.SAMPLES_PER_QUERY
    sample_count: int = defaults.SAMPLE_COUNT
    sample_order: str = defaults.SAMPLE_ORDER
    schedule_seed: int = defaults.SEED
    sample_seed: int = defaults.SEED
    spin_us: float = defaults.SPIN_US
    pin_cpus: Sequence[int] = ()
    timeout_ms: Optional[float] = None
    grace_s: float = defaults.GRACE_S
    interval_s: float = defaults.INTERVAL_S
    significant_figures: int = defaults.SIGNIFICANT_FIGURES
    batch_max: int = defaults.BATCH_MAX
    consumer_spin_us: float = defaults.CONSUMER_SPIN_US
    inline_dispatch: bool = False
    latency_bounds_ns: Sequence[int] = ()
    warmup_s: float = defaults.WARMUP_S
    ramp_up_s: float = 0.0
    sched_slice_us: float = defaults.SCHED_SLICE_US
    dispatcher_cpus: Sequence[int] = ()
    sut_cpus: Sequence[int] = ()
    record_requests: Optional[str] = None
    record_worker_index: int = 0
    slo_latency_ns: int = 0
    slo_ttft_ns: int = 0
    slo_tpot_ns: int = 0

    def validate(self) -> None:
        """Checks every field against its range (:mod:`loadgen.defaults`' limits: nothing
        may overflow the core's 64-bit nanoseconds and counts, nor ask for a rate or
        memory the engine cannot give); raises ValueError naming the first bad one and
        what is allowed."""
        if self.mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}; got {self.mode!r}")
        if self.sample_order not in _ORDERS:
            raise ValueError(f"sample_order must be one of {', '.join(_ORDERS)}; got {self.sample_order!r}")
        if self.mode in ("constant", "poisson"):
            if self.target_qps is None or not (math.isfinite(self.target_qps) and self.target_qps > 0):
                raise ValueError(f"target_qps must be a finite rate > 0 for mode {self.mode!r}; got {self.target_qps}")
        if self.target_qps is not None and not self.target_qps <= defaults.MAX_TARGET_QPS:
            raise ValueError(f"target_qps must be <= {defaults.MAX_TARGET_QPS:g} queries/s (the engine issues "
                             f"tens of millions of queries per second at most); got {self.target_qps}")
        if self.mode == "stages":
            self._validate_stages()
        if self.mode == "trace" and self.trace_offsets_ns is None:
            raise ValueError("trace_offsets_ns is required for mode 'trace'")
        if self.mode == "closed":
            _check_int("concurrency", self.concurrency, 1, defaults.MAX_CONCURRENCY)
        if self.duration_s is not None:
            _check_time("duration_s", self.duration_s, defaults.MIN_DURATION_S, "(or None for no limit)")
        if self.query_count is not None:
            _check_int("query_count", self.query_count, 1, defaults.MAX_QUERY_COUNT, "(or None)")
        for name in ("min_duration_s", "grace_s", "interval_s", "warmup_s", "ramp_up_s"):
            _check_time(name, getattr(self, name), 0.0)
        if self.ramp_up_s > 0 and self.mode != "closed":
            raise ValueError(f"ramp_up_s (--ramp-up-s) applies to a closed loop (--concurrency), not mode "
                             f"{self.mode!r}, whose schedule sets when each query starts")
        if self.warmup_s > 0 and self.mode in ("stages", "trace", "offline"):
            raise ValueError(f"warmup_s (--warmup-s) does not apply to mode {self.mode!r}: "
                             + ("everything is issued at once" if self.mode == "offline"
                                else "the schedule itself is the warm-up (start it with a stage)"))
        if 0 < self.interval_s < defaults.MIN_INTERVAL_S:
            raise ValueError(f"interval_s must be 0 (none) or >= {defaults.MIN_INTERVAL_S:g} s; "
                             f"got {self.interval_s!r}")
        for name, hi in (("spin_us", defaults.MAX_SPIN_US), ("consumer_spin_us", defaults.MAX_SPIN_US),
                         ("sched_slice_us", defaults.MAX_SCHED_SLICE_US)):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v <= hi):
                raise ValueError(f"{name} must be a number in 0..{hi:g}; got {v!r}")
        _check_int("min_query_count", self.min_query_count, 0, defaults.MAX_QUERY_COUNT)
        _check_int("max_in_flight", self.max_in_flight, 0, defaults.MAX_IN_FLIGHT_LIMIT,
                   "(the in-flight table's size)")
        _check_int("samples_per_query", self.samples_per_query, 1, defaults.MAX_SAMPLES_PER_QUERY,
                   "(64 MiB of sample indices per query)")
        _check_int("sample_count", self.sample_count, 1, defaults.MAX_SAMPLE_COUNT)
        _check_int("batch_max", self.batch_max, 1, 1 << 24)
        if self.sample_order == "shuffled" and self.sample_count > defaults.MAX_SHUFFLED_SAMPLE_COUNT:
            raise ValueError(f"sample_count must be <= {defaults.MAX_SHUFFLED_SAMPLE_COUNT} with sample_order "
                             f"'shuffled', which keeps a permutation of them (8 bytes each); got {self.sample_count}")
        self._validate_table_memory()
        if self.timeout_ms is not None and not (
                _is_number(self.timeout_ms) and defaults.MIN_TIMEOUT_MS <= self.timeout_ms <= _MAX_MS):
            raise ValueError(f"timeout_ms must be a number in {defaults.MIN_TIMEOUT_MS:g}..{_MAX_MS:g} ms "
                             f"(or None); got {self.timeout_ms!r}")
        if not 1 <= self.significant_figures <= 5:
            raise ValueError(f"significant_figures must be in 1..5; got {self.significant_figures}")
        allowed = allowed_cpus()
        for name in ("pin_cpus", "dispatcher_cpus", "sut_cpus"):
            bad = [c for c in getattr(self, name) if c not in allowed]
            if bad:
                raise ValueError(
                    f"{name}: CPU {bad[0]} is not available to this process "
                    f"(allowed: {','.join(map(str, allowed))})"
                )
        for name in ("schedule_seed", "sample_seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or not 0 <= v < 2**64:
                raise ValueError(f"{name} must be an integer in 0..2**64-1; got {v!r}")
        for i, bound in enumerate(self.latency_bounds_ns):
            if not (isinstance(bound, int) and 1 <= bound <= _MAX_NS):
                raise ValueError(f"latency_bounds_ns[{i}] must be an integer in 1..{_MAX_NS} ns "
                                 f"({defaults.MAX_TIME_S:g} s); got {bound!r}")
        if self.record_requests:
            record_format(self.record_requests)
        self._validate_burst_and_slos()
        bounded = (
            self.duration_s is not None or self.query_count is not None
            or self.min_duration_s > 0 or self.min_query_count > 0
            or self.mode in ("stages", "trace")
        )
        if not bounded:
            raise ValueError("the run needs a bound: set duration_s or query_count (both are unset)")

    def _validate_burst_and_slos(self) -> None:
        b = self.burstiness
        if not (_is_number(b) and defaults.MIN_BURSTINESS <= b <= defaults.MAX_BURSTINESS):
            raise ValueError(f"burstiness must be a number in {defaults.MIN_BURSTINESS:g}.."
                             f"{defaults.MAX_BURSTINESS:g}; got {b!r}")
        if b != 1.0 and not (self.mode == "poisson" or (self.mode == "stages" and self.stages_poisson)):
            raise ValueError(f"burstiness applies to Poisson arrivals (mode 'poisson', or 'stages' with "
                             f"stages_poisson), not mode {self.mode!r}; got {b!r}")
        for name in ("slo_latency_ns", "slo_ttft_ns", "slo_tpot_ns"):
            v = getattr(self, name)
            if not (isinstance(v, int) and 0 <= v <= _MAX_NS):
                raise ValueError(f"{name} must be an integer in 0..{_MAX_NS} ns (0: none); got {v!r}")

    def _validate_stages(self) -> None:
        if not self.stages:
            raise ValueError("stages must list (duration_s, start_qps, end_qps) for mode 'stages'")
        total = 0.0
        for i, stage in enumerate(self.stages):
            try:
                duration_s, start_qps, end_qps = stage
            except (TypeError, ValueError):
                raise ValueError(f"stages[{i}] must be (duration_s, start_qps, end_qps); got {stage!r}") from None
            _check_time(f"stages[{i}] duration_s", duration_s, defaults.MIN_DURATION_S)
            for rate in (start_qps, end_qps):
                if not (_is_number(rate) and 0 <= rate <= defaults.MAX_TARGET_QPS):
                    raise ValueError(f"stages[{i}] rates must be in 0..{defaults.MAX_TARGET_QPS:g} queries/s; "
                                     f"got {rate!r}")
            total += duration_s
        if total > defaults.MAX_TIME_S:
            raise ValueError(f"stages last {total:g} s in all, more than {defaults.MAX_TIME_S:g} s")

    def _validate_table_memory(self) -> None:
        """The in-flight table keeps ``samples_per_query`` sample indices (8 bytes each)
        for each of its slots; refuses, before anything is allocated, a table over
        :data:`loadgen.defaults.MAX_SAMPLE_SLOTS` indices."""
        slots = _table_slots(self)
        if slots * self.samples_per_query <= defaults.MAX_SAMPLE_SLOTS:
            return
        size_gib = slots * self.samples_per_query * 8 / 2**30
        what = ("2 x concurrency" if self.mode == "closed" else "max_in_flight")
        raise ValueError(
            f"samples_per_query {self.samples_per_query} with an in-flight table of {slots} slots "
            f"({what}, rounded up to a power of 2) needs {size_gib:.1f} GiB of sample indices, more than "
            f"{defaults.MAX_SAMPLE_SLOTS * 8 / 2**30:g} GiB; lower samples_per_query, concurrency or max_in_flight"
        )

    def to_core(self, sut_form: str, sut: Any) -> _core.EngineSettings:
        """The native settings for this run (validates first).

        Every field of the native settings that the run reads is set here, from these
        settings or :mod:`loadgen.defaults`, so that no default of ``csrc/engine.h``
        decides a run; the fields left to the core, and those set only where the mode
        reads them, are :data:`CORE_ONLY_FIELDS` and :data:`MODE_FIELDS`."""
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
        stages = self.stages if self.mode == "stages" else ()
        s.stages = [_core.Stage(s_to_ns(d), float(a), float(b)) for d, a, b in stages]
        s.stages_poisson = bool(self.stages_poisson)
        s.burstiness = float(self.burstiness)
        s.trace_offsets_ns = load_trace(self.trace_offsets_ns).tolist() if self.mode == "trace" else []
        s.max_in_flight = self.max_in_flight
        # 0: the engine sizes the in-flight table from the load, as _table_slots mirrors.
        s.table_capacity = 0
        s.max_duration_ns = s_to_ns(self.duration_s)
        s.max_query_count = self.query_count or 0
        s.min_duration_ns = s_to_ns(self.min_duration_s)
        s.min_query_count = self.min_query_count
        # The ramp is the end of the engine's warm-up: its queries are counted apart too.
        s.warmup_ns = s_to_ns(self.warmup_s + self.ramp_up_s)
        s.ramp_up_ns = min(s_to_ns(self.ramp_up_s), s.warmup_ns)
        s.sched_slice_ns = us_to_ns(self.sched_slice_us)
        s.samples_per_query = self.samples_per_query
        s.sample_count = self.sample_count
        s.sample_order = getattr(_core.SampleOrder, self.sample_order)
        s.schedule_seed = self.schedule_seed
        s.sample_seed = self.sample_seed
        s.spin_ns = us_to_ns(self.spin_us)
        s.pin_cpus = [int(c) for c in self.pin_cpus]
        s.timeout_ns = ms_to_ns(self.timeout_ms)
        s.grace_ns = s_to_ns(self.grace_s)
        s.interval_ns = s_to_ns(self.interval_s)
        s.significant_figures = self.significant_figures
        s.highest_trackable_ns = defaults.HIGHEST_LATENCY_NS
        s.max_error_messages = defaults.MAX_ERROR_MESSAGES
        s.latency_bounds_ns = [int(b) for b in self.latency_bounds_ns]
        # TTFT and TPOT bounds are counted for MLPerf runs (loadgen.mlperf); a run judges
        # its --slo objectives per completion instead (slo_*).
        s.ttft_bounds_ns, s.tpot_bounds_ns = [], []
        s.slo_latency_ns, s.slo_ttft_ns, s.slo_tpot_ns = self.slo_latency_ns, self.slo_ttft_ns, self.slo_tpot_ns
        if self.inline_dispatch and sut_form not in ("function", "batched"):
            raise ValueError(
                f"inline_dispatch needs a function or batched Python SUT, not a {sut_form} SUT"
            )
        s.inline_dispatch = bool(self.inline_dispatch)
        if self.record_requests:
            s.records_sink = records_sink(self.record_requests)
            s.records_path = engine_path(str(self.record_requests))
        else:
            s.records_sink, s.records_path = _core.RecordSink.none, ""
        s.records_worker_index = int(self.record_worker_index)
        if sut_form in ("null", "fixed_delay", "demo", "native_client"):
            # A native SUT knows its own settings; a bare "null" form needs none.
            s.sut = sut.native_settings() if sut is not None else _core.NativeSutSettings(kind=_core.SutKind.null)
            s.sut.cpus = [int(c) for c in self.sut_cpus]
            # The native network client running multi-turn conversations schedules follow-ups.
            s.follow_ups = sut_form == "native_client" and bool(getattr(sut, "follow_ups", False))
            if sut_form == "native_client" and self.pin_cpus and not s.sut.net.cpus:
                # A placed run (--pin): a native client's I/O threads keep off the issue
                # thread's core, so that the thread timing the arrivals has it to itself.
                s.sut.net.cpus = io_thread_cpus(self.pin_cpus, self.dispatcher_cpus, self.sut_cpus)
        else:
            s.sut = _core.NativeSutSettings(kind=_core.SutKind.queue)
            # A SUT that schedules follow-up queries (multi-turn conversations) says so.
            s.follow_ups = bool(getattr(sut, "follow_ups", False))
        return s


#: Fields of the native settings (``_core.EngineSettings``) that :meth:`EngineSettings.to_core`
#: leaves to the core, and why.
CORE_ONLY_FIELDS: Dict[str, str] = {
    "sut_delay_ns": "an older name of sut.delay_ns, set with sut",
    "demo_workers": "an older name of sut.workers, set with sut",
    "demo_max_batch": "an older name of sut.max_batch, set with sut",
    "demo_service_ns": "an older name of sut.service_ns, set with sut",
    "demo_per_item_ns": "an older name of sut.per_item_ns, set with sut",
    "demo_sigma": "an older name of sut.sigma, set with sut",
    "sut_seed": "an older name of sut.seed, set with sut",
}

#: Fields of the native settings that :meth:`EngineSettings.to_core` sets only where the
#: load reads them, and where that is.
MODE_FIELDS: Dict[str, str] = {
    "concurrency": "the closed loop's queries in flight; an open loop does not read it",
    "arrival": "the open loop's arrival process; the closed loop does not read it",
    "target_qps": "set when given: the constant and poisson arrivals read it (and require it)",
}


def io_thread_cpus(issue_cpus: Sequence[int], dispatcher_cpus: Sequence[int], sut_cpus: Sequence[int]) -> List[int]:
    """Where a placed run's native network client runs its I/O threads: every planned CPU
    but the issue thread's (none when that leaves nothing: then they are not pinned)."""
    return sorted((set(dispatcher_cpus) | set(sut_cpus)) - set(issue_cpus))


#: The longest time, in ns: :data:`loadgen.defaults.MAX_TIME_S`.
_MAX_NS = s_to_ns(defaults.MAX_TIME_S)
_MAX_MS = s_to_ms(defaults.MAX_TIME_S)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_time(name: str, seconds: Any, lo_s: float, extra: str = "") -> None:
    """``seconds`` is a finite number in lo_s..MAX_TIME_S; ValueError naming ``name``."""
    if _is_number(seconds) and lo_s <= seconds <= defaults.MAX_TIME_S:
        return
    raise ValueError(f"{name} must be a number in {lo_s:g}..{defaults.MAX_TIME_S:g} s"
                     f"{' ' + extra if extra else ''}; got {seconds!r}")


def _check_int(name: str, v: Any, lo: int, hi: int, why: str = "") -> None:
    if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi:
        return
    raise ValueError(f"{name} must be an integer in {lo}..{hi}{' ' + why if why else ''}; got {v!r}")


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _table_slots(s: EngineSettings) -> int:
    """The in-flight table's slots for these settings, as the engine chooses them
    (csrc/engine.cc, table_capacity_for)."""
    if s.mode == "closed":
        return _pow2_at_least(2 * s.concurrency)
    if s.max_in_flight > 0:
        return _pow2_at_least(s.max_in_flight)
    capacity = _DEFAULT_TABLE_SLOTS
    while capacity > 1 and capacity * s.samples_per_query > _MAX_DEFAULT_SAMPLE_SLOTS:
        capacity >>= 1
    return capacity


# The engine's defaults for an uncapped open loop (csrc/engine.cc).
_DEFAULT_TABLE_SLOTS = 1 << 18
_MAX_DEFAULT_SAMPLE_SLOTS = 1 << 23
