"""Telemetry around one run, for the runner: where loadgen's threads are placed
(``--pin``), the host sampler, and what they add to the result document.

The runner calls :func:`place` when it builds the engine settings, then
:meth:`RunTelemetry.start` right before the engine starts, :meth:`RunTelemetry.stop`
once it has ended, and :meth:`RunTelemetry.add_to` on the finished document.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Optional

from loadgen import placement
from loadgen.engine import Engine, EngineSettings, io_thread_cpus
from loadgen.options import RunOptions
from loadgen.scenarios.diagnosis import add_diagnosis
from loadgen.telemetry.gpu import GpuSampler
from loadgen.telemetry.gpu_select import GpuSelection, parse_gpus
from loadgen.telemetry.host import SATURATED_FRACTION, HostSampler
from loadgen.units import s_to_ns

__all__ = ["RunTelemetry", "check_gpus", "place"]

#: SUT forms whose dispatcher thread runs an event loop (network clients, async SUTs):
#: its busy time is the client's own work, so a busy loop means a saturated generator.
_EVENT_LOOP_FORMS = ("loop", "async")


def place(o: RunOptions, settings: EngineSettings) -> Optional[Dict[str, Any]]:
    """Applies ``--pin`` to ``settings`` (the issue thread's and the dispatcher's CPUs)
    and returns the ``placement`` section: what was asked, the plan and what was applied.
    None without ``--pin``. ValueError for a bad value or ``--pin`` with ``--pin-cpus``."""
    if o.pin is None:
        return None
    if o.pin_cpus:
        raise ValueError("--pin and --pin-cpus both place the issue thread; give one of them")
    within = None
    if o.pin != "auto":
        try:
            within = placement.parse_cpulist(o.pin)
        except ValueError as e:
            raise ValueError(f"--pin: {e} (give auto or CPUs like 2-5)") from None
        if not within:
            raise ValueError("--pin: no CPU given (give auto or CPUs like 2-5)")
    selection = parse_gpus(o.gpus, os.environ)
    # The GPUs' locality matters only when GPUs are sampled (asking NVML costs a moment).
    topo = placement.read_topology(gpus=[] if selection.mode == "none" else None)
    plan = placement.make_plan(topo, within=within, gpu_indexes=_selected_indexes(selection, topo))
    if within is not None and not plan.ok and "not usable" in plan.why:
        raise ValueError(f"--pin {o.pin}: {plan.why}")
    applied: Dict[str, Any] = {"issue_thread": [], "dispatcher": [], "sut": []}
    if plan.ok:
        settings.pin_cpus = tuple(plan.issue_cpus)
        settings.dispatcher_cpus = tuple(plan.dispatcher_cpus)
        settings.sut_cpus = tuple(plan.sut_cpus)
        applied = {"issue_thread": list(plan.issue_cpus), "dispatcher": list(plan.dispatcher_cpus),
                   "sut": list(plan.sut_cpus),
                   # a native network client's I/O threads, when one runs: off the issue core
                   # (left out below for any other SUT)
                   "io_threads": io_thread_cpus(plan.issue_cpus, plan.dispatcher_cpus, plan.sut_cpus)}
    return {"pin": o.pin, "plan": plan.as_dict(), "applied": applied, "usable_cpus": topo.usable}


def check_gpus(o: RunOptions) -> None:
    """Checks ``--gpus`` against the devices NVML sees (ValueError naming an index or
    UUID that no device has). Without NVML or a GPU nothing is checked: the run goes on
    and its ``gpu`` section says why there are no GPU figures."""
    sampler = GpuSampler(parse_gpus(o.gpus, os.environ), o.gpu_sample_ms)
    try:
        sampler.open()
    finally:
        sampler.stop()


def _selected_indexes(selection: GpuSelection, topo: placement.Topology) -> Optional[List[int]]:
    """The indexes of the GPUs ``selection`` samples among ``topo.gpus`` (None: all)."""
    if selection.mode == "all":
        return None
    if selection.mode == "none":
        return []
    out = []
    for item in selection.items:
        for g in topo.gpus:
            if item == str(g.index) or (not item.isdigit() and g.uuid.lower().startswith(item.lower())):
                out.append(g.index)
    return out


class RunTelemetry:
    """The samplers of one run.

    Args:
        o: the effective options (the time-series interval sets the sampling interval).
    """

    def __init__(self, o: RunOptions, settings: EngineSettings) -> None:
        self.interval_s = o.interval_s if o.interval_s > 0 else 1.0
        self.warmup_s = o.unmeasured_s
        self.host: Optional[HostSampler] = None
        self.engine: Optional[Engine] = None
        self.gpu = GpuSampler(parse_gpus(o.gpus, os.environ), o.gpu_sample_ms, avoid_cpus=settings.pin_cpus)
        self._timer: Optional[threading.Timer] = None
        self._issue_end_marked = False

    def start(self, engine: Engine) -> None:
        """Starts sampling; call right before ``engine.start()``. The GPUs' energy is
        read now (the start of measuring) or, after a warm-up, when it ends."""
        self.engine = engine
        self.host = HostSampler(self.interval_s, dispatcher_tid=engine.dispatcher_thread_id)
        self.host.start()
        self.gpu.start()
        if self.warmup_s > 0:
            self._timer = threading.Timer(self.warmup_s, self.gpu.mark, args=("start",))
            self._timer.daemon = True
            self._timer.start()
        else:
            self.gpu.mark("start")

    def poll(self) -> None:
        """Called while the run goes on: reads the GPUs' energy once issuing has ended."""
        if not self._issue_end_marked and self.engine is not None and self.engine.issue_end_ns:
            self._issue_end_marked = True
            self.gpu.mark("issue_end")

    def stop(self) -> None:
        """Stops sampling (after the run ended, or failed); the GPUs' energy is read a
        last time."""
        if self._timer is not None:
            self._timer.cancel()
        self.poll()
        self.gpu.stop()
        if self.host is not None:
            self.host.stop()

    def add_to(self, doc: Dict[str, Any], placement_section: Optional[Dict[str, Any]]) -> None:
        """Adds the ``host`` (and ``placement``) sections; a saturated event loop makes
        the run invalid, saying when and how busy. The diagnosis is made again with the
        host's figures."""
        if self.host is None or self.engine is None:
            return
        self._add_gpu(doc)
        if placement_section is not None:
            if self.engine.dispatcher_thread_id() is None and placement_section["applied"]["dispatcher"]:
                placement_section["applied"]["dispatcher"] = []
                placement_section["note"] = "a native SUT has no dispatcher thread: only the issue thread was pinned"
            if self.engine.sut_form != "native_client":
                placement_section["applied"].pop("io_threads", None)
            doc["placement"] = placement_section
        event_loop = self.engine.sut_form in _EVENT_LOOP_FORMS
        origin = self.engine.measure_start_ns or None
        host = self.host.report(event_loop=event_loop, origin_ns=origin)
        doc["host"] = host
        saturated = host["saturated"]
        if saturated:
            worst = max(saturated, key=lambda s: s["busy"])
            reason = (f"generator saturated: the event loop (dispatcher thread) was busier than "
                      f"{SATURATED_FRACTION:.0%} of {len(saturated)} interval(s), {worst['busy']:.0%} at "
                      f"{worst['t_s']:.1f} s; the latencies then describe the client, not the SUT "
                      "(more workers or --pin help)")
            doc["invalid_reasons"].append(reason)
            doc["valid"] = False
        add_diagnosis(doc)  # again, with the host's figures (CPU, run-queue waits, steal)

    def _add_gpu(self, doc: Dict[str, Any]) -> None:
        """The ``gpu`` section, and each time-series interval's GPU figures (``gpu``: by
        device UUID, mean utilization and power, peak memory, energy)."""
        assert self.engine is not None
        counts, series = doc["counts"], doc["timeseries"]
        start = self.engine.measure_start_ns
        interval_ns = s_to_ns(self.interval_s)
        try:
            gpu = self.gpu.report(completed_queries=int(counts["completed"]),
                                  completed_samples=int(counts.get("samples_completed", counts["completed"])),
                                  measure_start_ns=start or None, interval_ns=interval_ns,
                                  n_intervals=len(series) if start else None)
        except Exception as e:  # the run's own figures stand without the GPUs'
            doc["gpu"] = {"status": "unavailable", "reason": f"reporting the GPU figures failed: "
                          f"{type(e).__name__}: {e}", "devices": []}
            return
        per_interval = gpu.pop("intervals", None)
        doc["gpu"] = gpu
        if per_interval and gpu["status"] != "unavailable":
            for point, figures in zip(series, per_interval):
                point["gpu"] = figures
