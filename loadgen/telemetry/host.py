"""The generator's own health during a run: CPU time per thread role, memory, and the
machine's CPU busy and steal time, per interval, from ``/proc``.

Roles come from thread names and ids: the native threads name themselves from one table
in the core, exported with their roles as ``_core.THREAD_ROLES`` (``lg-issue``,
``lg-monitor``, ``lg-sut``, ``lg-records``: the JSON lines writer of ``--record-requests``,
and the native HTTP and gRPC clients' I/O threads ``lg-http`` and ``lg-grpc``, role
``io``); Python threads do not name themselves to the kernel, so the dispatcher (which runs the event loop
for network targets and async SUTs) is known by its thread id; the main thread is the
process id; everything else (a SUT's own threads, gRPC's, the samplers) is ``other``.

Per-thread CPU time is read from ``/proc/self/task/<tid>/stat`` (user + system, in clock
ticks of 1/``SC_CLK_TCK`` s, usually 10 ms): figures for intervals much shorter than a
second are coarse, and the saturation rule judges only intervals of at least
:data:`MIN_JUDGED_S`. How long each thread waited on a run queue, ready to run but not
running (a busy or CPU-limited machine), is read from ``/proc/self/task/<tid>/schedstat``
(its second field, in ns) where the kernel keeps it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from loadgen import _core
from loadgen.units import ms_to_s, ns_to_ms, ns_to_s

__all__ = ["MIN_JUDGED_S", "SATURATED_FRACTION", "HostSampler", "read_machine_cpu", "read_thread_cpu",
           "read_thread_wait"]

#: An event loop busier than this fraction of an interval is saturated.
SATURATED_FRACTION = 0.9
#: Intervals shorter than this are not judged (tick resolution).
MIN_JUDGED_S = 0.5

#: name -> role of the native threads, from the core's table of the names they take.
NATIVE_ROLES: Mapping[str, str] = _core.THREAD_ROLES
ROLES = ("issue", "dispatcher", "io", "monitor", "native_sut", "records", "main", "other")


def _ticks_per_s() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux
        return 100


def _thread_files(proc: str, name: str) -> Iterator[Tuple[int, str]]:
    """(tid, text of /proc/self/task/<tid>/<name>) of every thread of this process; a
    thread that ended meanwhile is left out."""
    base = os.path.join(proc, "self", "task")
    try:
        tids = os.listdir(base)
    except OSError:
        return
    for tid in tids:
        try:
            with open(os.path.join(base, tid, name), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if tid.isdigit():
            yield int(tid), text


def read_thread_cpu(proc: str = "/proc") -> Dict[int, Tuple[str, int]]:
    """tid -> (name, user + system CPU ticks) of every thread of this process."""
    out: Dict[int, Tuple[str, int]] = {}
    for tid, text in _thread_files(proc, "stat"):
        # "tid (comm) state ..." where comm may hold spaces and parentheses.
        lpar, rpar = text.find("("), text.rfind(")")
        if lpar < 0 or rpar < 0:
            continue
        fields = text[rpar + 2:].split()
        try:
            out[tid] = (text[lpar + 1:rpar], int(fields[11]) + int(fields[12]))
        except (IndexError, ValueError):
            continue
    return out


def read_thread_wait(proc: str = "/proc") -> Dict[int, int]:
    """tid -> ns it has waited on a run queue (ready, not running), of every thread of
    this process whose ``schedstat`` the kernel keeps; empty where it keeps none."""
    out: Dict[int, int] = {}
    for tid, text in _thread_files(proc, "schedstat"):
        try:
            out[tid] = int(text.split()[1])
        except (IndexError, ValueError):  # no schedstats
            continue
    return out


def read_machine_cpu(proc: str = "/proc") -> Optional[Tuple[int, int, int]]:
    """(total, idle + iowait, steal) ticks of all CPUs from /proc/stat; None if unreadable."""
    try:
        with open(os.path.join(proc, "stat"), encoding="utf-8") as f:
            line = f.readline()
    except OSError:
        return None
    parts = line.split()
    if not parts or parts[0] != "cpu":
        return None
    values = [int(v) for v in parts[1:]]
    values += [0] * (8 - len(values))
    # user nice system idle iowait irq softirq steal (guest time is inside user).
    return sum(values[:8]), values[3] + values[4], values[7]


def _rss_bytes(proc: str) -> Optional[int]:
    try:
        with open(os.path.join(proc, "self", "statm"), encoding="utf-8") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class _Snapshot:
    t_ns: int
    threads: Dict[int, Tuple[str, int]]
    waits: Dict[int, int]
    machine: Optional[Tuple[int, int, int]]
    rss: Optional[int]


@dataclass
class HostSampler:
    """Samples the process's threads and the machine every ``interval_s`` on a thread of
    its own (``loadgen-host``), from :meth:`start` to :meth:`stop`.

    Args:
        interval_s: the sampling interval (the run's time-series interval).
        dispatcher_tid: returns the dispatcher thread's id (None when the SUT has none).
        proc: the /proc to read (tests point it elsewhere).
    """

    interval_s: float
    dispatcher_tid: Callable[[], Optional[int]] = lambda: None
    proc: str = "/proc"
    poll_s: float = 0.2
    _snaps: List[_Snapshot] = field(default_factory=list)
    # Every thread's last-seen (name, ticks), ended ones too: a thread that ends keeps
    # the CPU it used up to the last poll (at most poll_s of it is not seen).
    _known: Dict[int, Tuple[str, int]] = field(default_factory=dict)
    _waits: Dict[int, int] = field(default_factory=dict)  # likewise, run-queue waits (ns)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None
    error: str = ""

    def poll(self) -> None:
        """Reads every thread's CPU time now (the thread does this every ``poll_s``)."""
        self._known.update(read_thread_cpu(self.proc))
        self._waits.update(read_thread_wait(self.proc))

    def snapshot(self) -> None:
        """Takes one sample now (the thread does this every interval)."""
        self.poll()
        self._snaps.append(_Snapshot(time.monotonic_ns(), dict(self._known), dict(self._waits),
                                     read_machine_cpu(self.proc), _rss_bytes(self.proc)))

    def start(self) -> None:
        self.snapshot()
        self._thread = threading.Thread(target=self._loop, name="loadgen-host", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        poll_s = min(self.poll_s, self.interval_s)
        next_snapshot = time.monotonic() + self.interval_s
        try:
            while not self._stop.wait(max(0.0, min(poll_s, next_snapshot - time.monotonic()))):
                if time.monotonic() >= next_snapshot - 1e-3:
                    self.snapshot()
                    next_snapshot += self.interval_s
                else:
                    self.poll()
        except Exception as e:  # the run goes on without host figures
            self.error = f"host sampling stopped: {type(e).__name__}: {e}"

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        self.snapshot()

    def _role(self, tid: int, name: str, dispatcher: Optional[int]) -> str:
        role = NATIVE_ROLES.get(name)
        if role is not None:
            return role
        if dispatcher is not None and tid == dispatcher:
            return "dispatcher"
        if tid == os.getpid():
            return "main"
        return "other"

    def intervals(self, origin_ns: Optional[int] = None) -> List[Dict[str, Any]]:
        """One entry per pair of successive samples: its start offset and length (s,
        from ``origin_ns`` on the monotonic clock, default the first sample), the CPU of
        each role as a fraction of one CPU, the busiest thread of each role, the time the
        role's threads waited on a run queue (``run_queue_wait_ms``, summed over them;
        absent where the kernel keeps no schedstats), RSS, and the machine's busy and
        steal fractions."""
        dispatcher = self.dispatcher_tid()
        out: List[Dict[str, Any]] = []
        t0 = origin_ns if origin_ns is not None else (self._snaps[0].t_ns if self._snaps else 0)
        for a, b in zip(self._snaps, self._snaps[1:]):
            length_s = ns_to_s(b.t_ns - a.t_ns)
            if length_s <= 0:
                continue
            entry: Dict[str, Any] = {"t_s": ns_to_s(a.t_ns - t0), "length_s": length_s,
                                     **self._cpu(a, b, length_s, dispatcher), "rss_bytes": b.rss}
            waits = self._waits_ms(a, b, dispatcher)
            if waits:
                entry["run_queue_wait_ms"] = waits
            if a.machine is not None and b.machine is not None and b.machine[0] > a.machine[0]:
                total = b.machine[0] - a.machine[0]
                entry["machine_busy"] = round(1.0 - (b.machine[1] - a.machine[1]) / total, 4)
                entry["machine_steal"] = round((b.machine[2] - a.machine[2]) / total, 4)
            out.append(entry)
        return out

    def _cpu(self, a: _Snapshot, b: _Snapshot, length_s: float, dispatcher: Optional[int]) -> Dict[str, Any]:
        """``cpu`` (per role) and ``busiest_thread`` (per role) between two samples."""
        hz = _ticks_per_s()
        cpu: Dict[str, float] = {}
        busiest: Dict[str, float] = {}
        for tid, (name, ticks) in b.threads.items():
            before = a.threads.get(tid)
            used = (ticks - before[1] if before is not None else ticks) / hz / length_s
            role = self._role(tid, name, dispatcher)
            cpu[role] = cpu.get(role, 0.0) + used
            busiest[role] = max(busiest.get(role, 0.0), used)
        return {"cpu": {r: round(v, 4) for r, v in sorted(cpu.items())},
                "busiest_thread": {r: round(v, 4) for r, v in sorted(busiest.items())}}

    def _waits_ms(self, a: _Snapshot, b: _Snapshot, dispatcher: Optional[int]) -> Dict[str, float]:
        """Per role, the ms its threads waited on a run queue between two samples."""
        waits: Dict[str, float] = {}
        for tid, ns in b.waits.items():
            name = b.threads.get(tid, ("", 0))[0]
            role = self._role(tid, name, dispatcher)
            waits[role] = waits.get(role, 0.0) + ns_to_ms(ns - a.waits.get(tid, 0))
        return {r: round(v, 3) for r, v in sorted(waits.items())}

    def report(self, event_loop: bool, origin_ns: Optional[int] = None) -> Dict[str, Any]:
        """The ``host`` section: per-interval figures, totals per role (CPU seconds and
        ``run_queue_wait_ms``, where the kernel keeps schedstats), peak RSS, and ``saturated``: intervals in which the dispatcher's event loop was
        busier than :data:`SATURATED_FRACTION` (judged only when ``event_loop``: a
        dispatcher that runs a synchronous SUT is busy with the SUT's own work). Busy is
        the thread's CPU (``cpu``) plus its wait on a run queue (``run_queue``): a loop
        that always has work is saturated whether it gets a whole CPU or shares one."""
        ivs = self.intervals(origin_ns)
        cpu_s: Dict[str, float] = {}
        for iv in ivs:
            for role, frac in iv["cpu"].items():
                cpu_s[role] = cpu_s.get(role, 0.0) + frac * float(iv["length_s"])
        wait_ms: Dict[str, float] = {}
        for iv in ivs:
            for role, ms in (iv.get("run_queue_wait_ms") or {}).items():
                wait_ms[role] = wait_ms.get(role, 0.0) + ms
        rss = [int(iv["rss_bytes"]) for iv in ivs if iv.get("rss_bytes") is not None]
        saturated = []
        if event_loop:
            for iv in ivs:
                # Busy is running or ready to run: on a shared node a loop that always has
                # work gets only part of a CPU, and waits on a run queue for the rest.
                ran = float(iv["busiest_thread"].get("dispatcher", 0.0))
                ready = ms_to_s(float((iv.get("run_queue_wait_ms") or {}).get("dispatcher", 0.0))) / float(iv["length_s"])
                busy = round(ran + ready, 4)
                if float(iv["length_s"]) >= MIN_JUDGED_S and busy > SATURATED_FRACTION:
                    saturated.append({"t_s": iv["t_s"], "busy": busy, "cpu": ran, "run_queue": round(ready, 4)})
        out: Dict[str, Any] = {
            "interval_s": self.interval_s,
            "cpu_s": {r: round(v, 3) for r, v in sorted(cpu_s.items())},
            **({"run_queue_wait_ms": {r: round(v, 3) for r, v in sorted(wait_ms.items())}} if wait_ms else {}),
            "peak_rss_bytes": max(rss) if rss else None,
            "event_loop_judged": event_loop,
            "saturated": saturated,
            "intervals": ivs,
        }
        if self.error:
            out["error"] = self.error
        return out
