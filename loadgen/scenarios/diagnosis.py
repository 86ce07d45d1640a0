"""The diagnosis of a run: which side limited it, with its numbers.

Latency is measured from the scheduled time, so a late generator never hides in it; what
lateness can falsify is the *load*. The lateness rule (:func:`judge_lateness`, applied by
:func:`loadgen.scenarios.base.common_invalid_reasons`) makes a run INVALID for the
generator only where its lateness changed what was measured:

- the p99 issue delay (issued - scheduled) is above ``--max-issue-delay-ms``, and
- (a) the offered load fell short of the schedule: an open loop's last queries were
  issued so late that, by the end of issuing, less than :data:`MIN_OFFERED_FRACTION` of
  the queries the schedule asked for by then had gone out; or
- (b) lateness is a material part of latency: the p99 issue delay is above
  ``--max-lateness-share`` of the p99 latency.

Otherwise a late generator is a warning (``generator_late``) with its numbers.

:func:`diagnose` reads a finished document (counts, histograms, the time series, the
``network`` and ``host`` sections where present) and names one cause:

- ``generator``: the generator could not run on time (its issue delay; its threads' CPU,
  their run-queue waits and the machine's steal time say why);
- ``client``: the client ran out of resources: the in-flight cap (``counts.cap_waits``),
  connections or call slots (``network.native.queued_in_client``), or a busy I/O thread;
- ``server``: the server saturated: outstanding queries and latency grew over the run
  while issuing stayed on time;
- ``none``: nothing limited the run.

The client and server causes never make a run invalid by themselves; they are named, and
are warnings (``client_saturated``, ``server_saturated``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from loadgen import defaults
from loadgen.units import NS_PER, format_ns, ms_to_ns, s_to_ms

__all__ = ["CAUSES", "MIN_OFFERED_FRACTION", "OVERLOAD_PREFIX", "WARNING_NAMES", "Lateness", "add_diagnosis",
           "diagnose", "doc_lateness", "end_lateness_ns", "judge_lateness", "lateness_reason"]

#: The causes a diagnosis names.
CAUSES = ("generator", "client", "server", "none")
#: The named warnings a diagnosis gives (others may sit beside them in ``warnings``).
WARNING_NAMES = ("generator_late", "client_saturated", "server_saturated")
#: How the lateness rule's invalid reason starts.
OVERLOAD_PREFIX = "generator overload:"
#: An open loop that offered less than this share of its schedule is invalid (rule a).
MIN_OFFERED_FRACTION = defaults.MIN_OFFERED_FRACTION

# The generator's own saturation rule (telemetry/run.py) says this; it is a generator cause too.
_SATURATED_PREFIX = "generator saturated"
# A count is material past this share of the queries issued (and at least one).
_MATERIAL_SHARE = 0.01
# Connections each held a query this many times the fastest latency or more: the server
# was slower under the load, so waiting queries waited for the server, not the client.
_SLOW_SERVER_HOLD = 3.0
# A thread busier than this fraction of an interval is saturated; intervals shorter than
# this are too coarse (CPU is counted in clock ticks) to judge.
_BUSY = 0.9
_MIN_JUDGED_S = 0.5
# Growth that names a saturated server: outstanding at the end of issuing at least this
# many times (and this many more than) at its start, and the p99 latency this many times.
_GROWTH = 2.0
_MIN_GROWTH = 10
# The generator's resource figures worth naming: steal, and run-queue waits per second.
_STEAL = 0.05
_WAIT_SHARE = 0.05


# --------------------------------------------------------------------- lateness rule

@dataclasses.dataclass(frozen=True)
class Lateness:
    """The lateness rule's figures and verdict.

    Attributes:
        issue_delay_p99_ns, latency_p99_ns: the run's p99 issue delay and latency.
        lateness_share: the first over the second (None without latencies).
        end_lateness_ns: how late the last queries were issued (open loops; None else):
            the median issue delay of the last interval that issued any (the whole
            run's p99 without a time series).
        offered_fraction: the share of the schedule's queries issued by the end of
            issuing, ``1 - end_lateness / issue duration`` (open loops; None else).
        late: the p99 issue delay is above ``--max-issue-delay-ms``.
        short: rule (a): late, and the offered fraction below :data:`MIN_OFFERED_FRACTION`.
        material: rule (b): late, and the lateness share above ``--max-lateness-share``.
    """

    issue_delay_p99_ns: int
    latency_p99_ns: int
    lateness_share: Optional[float]
    end_lateness_ns: Optional[int]
    offered_fraction: Optional[float]
    late: bool
    short: bool
    material: bool

    @property
    def invalid(self) -> bool:
        """The run is invalid for the generator."""
        return self.short or self.material


def end_lateness_ns(points: Sequence[Dict[str, Any]], issue_delay_p99_ns: int) -> int:
    """How late the last queries were issued: the median issue delay of the last
    interval of ``points`` (the engine's or the document's time series) that issued
    any, else ``issue_delay_p99_ns``."""
    for p in reversed(points):
        if int(p.get("issued", 0)) > 0 and "issue_delay_p50_ns" in p:
            return int(p["issue_delay_p50_ns"])
    return issue_delay_p99_ns


def judge_lateness(*, issue_delay_p99_ns: int, latency_p99_ns: int, issue_duration_s: float,
                   points: Sequence[Dict[str, Any]], open_loop: bool, max_issue_delay_ms: float,
                   max_lateness_share: float) -> Lateness:
    """The lateness rule on a run's figures (see the module's docstring).

    Args:
        issue_delay_p99_ns, latency_p99_ns: the run's p99 issue delay and latency.
        issue_duration_s: from the first scheduled time to the last issue.
        points: the time series (each with ``issued`` and ``issue_delay_p50_ns``).
        open_loop: the queries follow a schedule (not a closed loop), so that the
            offered load can fall short of it.
        max_issue_delay_ms, max_lateness_share: the options of those names.
    """
    share = issue_delay_p99_ns / latency_p99_ns if latency_p99_ns > 0 else None
    end_ns: Optional[int] = None
    offered: Optional[float] = None
    if open_loop and issue_duration_s > 0:
        end_ns = end_lateness_ns(points, issue_delay_p99_ns)
        offered = max(0.0, 1.0 - end_ns / (issue_duration_s * NS_PER["s"]))
    late = issue_delay_p99_ns > ms_to_ns(max_issue_delay_ms)
    return Lateness(
        issue_delay_p99_ns=issue_delay_p99_ns, latency_p99_ns=latency_p99_ns, lateness_share=share,
        end_lateness_ns=end_ns, offered_fraction=offered, late=late,
        short=late and offered is not None and offered < MIN_OFFERED_FRACTION,
        material=late and (share is None or share > max_lateness_share),
    )


def lateness_reason(lat: Lateness, max_issue_delay_ms: float, max_lateness_share: float, cap_waits: int) -> str:
    """The invalid reason of a run the lateness rule fails (starts with :data:`OVERLOAD_PREFIX`)."""
    why = []
    if lat.short and lat.offered_fraction is not None and lat.end_lateness_ns is not None:
        why.append(f"the offered load fell short of the schedule: {lat.offered_fraction:.1%} of it by the end of "
                   f"issuing (the last queries left {format_ns(lat.end_lateness_ns)} late), below "
                   f"{MIN_OFFERED_FRACTION:.0%}")
    if lat.material:
        share = "all" if lat.lateness_share is None else f"{lat.lateness_share:.1%}"
        why.append(f"lateness is {share} of the p99 latency of {format_ns(lat.latency_p99_ns)}, above "
                   f"{max_lateness_share:g} (--max-lateness-share)")
    cause = (f"{cap_waits} queries waited for the in-flight cap (--max-in-flight), so the SUT's backlog held the "
             "generator back" if cap_waits else
             "the generator could not issue on schedule (CPU starved, or the SUT adapter is too slow)")
    return (f"{OVERLOAD_PREFIX} p99 issue delay is {_ms(lat.issue_delay_p99_ns)}, above {max_issue_delay_ms:g} ms "
            f"(--max-issue-delay-ms), and {'; and '.join(why)}: {cause}")


def _ms(ns: float) -> str:
    return f"{ns / NS_PER['ms']:.3f} ms"


# ------------------------------------------------------------------------ figures

def _num(d: Any, *keys: str, default: float = 0.0) -> float:
    """``d[k1][k2]...`` as a number, or ``default`` where any is missing."""
    for key in keys:
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return float(d) if isinstance(d, (int, float)) and not isinstance(d, bool) else default


def _effective(doc: Dict[str, Any]) -> Dict[str, Any]:
    e = (doc.get("settings") or {}).get("effective") or {}
    return e if isinstance(e, dict) else {}


def _mode(doc: Dict[str, Any]) -> str:
    engine = (doc.get("settings") or {}).get("engine") or {}
    return str(engine.get("mode") or ("closed" if doc.get("scenario") == "concurrency" else ""))


def doc_lateness(doc: Dict[str, Any]) -> Lateness:
    """:func:`judge_lateness` on a document's figures."""
    e = _effective(doc)
    if _mode(doc) == "offline":  # every query is due at t = 0: issue delay is the backlog by design
        return Lateness(int(_num(doc, "issue_delay_ns", "p99")), int(_num(doc, "latency_ns", "p99")), None, None,
                        None, late=False, short=False, material=False)
    return judge_lateness(
        issue_delay_p99_ns=int(_num(doc, "issue_delay_ns", "p99")),
        latency_p99_ns=int(_num(doc, "latency_ns", "p99")),
        issue_duration_s=_num(doc, "issue_duration_s"),
        points=doc.get("timeseries") or [],
        open_loop=_mode(doc) not in ("closed", "offline"),
        max_issue_delay_ms=float(e.get("max_issue_delay_ms", defaults.MAX_ISSUE_DELAY_MS)),
        max_lateness_share=float(e.get("max_lateness_share", defaults.MAX_LATENESS_SHARE)),
    )


def _host_figures(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The generator's own figures from the ``host`` section: the busiest thread's CPU
    per issuing role (issue, dispatcher, io; the largest of the judged intervals),
    run-queue waits per role (ms in all), the machine's mean steal and busy fractions."""
    host = doc.get("host")
    if not isinstance(host, dict):
        return {}
    ivs = [iv for iv in host.get("intervals") or [] if isinstance(iv, dict)]
    judged = [iv for iv in ivs if _num(iv, "length_s") >= _MIN_JUDGED_S] or ivs
    out: Dict[str, Any] = {}
    for role, key in (("issue", "issue_thread_cpu_fraction"), ("dispatcher", "dispatcher_cpu_fraction"),
                      ("io", "io_thread_cpu_fraction")):
        values = [_num(iv, "busiest_thread", role) for iv in judged if role in (iv.get("busiest_thread") or {})]
        if values:
            out[key] = round(max(values), 4)
    waits = host.get("run_queue_wait_ms")
    if isinstance(waits, dict):
        out["run_queue_wait_ms"] = {str(r): float(v) for r, v in waits.items()}
    steal = [_num(iv, "machine_steal") for iv in ivs if "machine_steal" in iv]
    busy = [_num(iv, "machine_busy") for iv in ivs if "machine_busy" in iv]
    if steal:
        out["steal_fraction"] = round(sum(steal) / len(steal), 4)
    if busy:
        out["machine_busy_fraction"] = round(sum(busy) / len(busy), 4)
    out["event_loop_saturated_intervals"] = len(host.get("saturated") or [])
    return out


def _client_figures(doc: Dict[str, Any]) -> Dict[str, Any]:
    """In-flight cap waits, queries that waited in the client for a connection (or call
    slot), the connections and how long each held a query against the fastest latency."""
    c = doc.get("counts") or {}
    out: Dict[str, Any] = {"cap_waits": int(_num(c, "cap_waits"))}
    net = doc.get("network")
    if not isinstance(net, dict):
        return out
    native = net.get("native")
    if not isinstance(native, dict) or "queued_in_client" not in native:
        return out
    out["queued_in_client"] = int(_num(native, "queued_in_client"))
    out["slot_kind"] = "call slots" if net.get("grpc_engine") else "connections"
    slots = int(_num(net, "max_calls") or (0 if net.get("grpc_engine") else _num(net, "connections")))
    completed, duration_s = _num(c, "completed"), _num(doc, "duration_s")
    fastest = _num(doc, "latency_ns", "min")
    if slots > 0 and completed > 0 and duration_s > 0 and fastest > 0:
        hold_ns = slots * duration_s * NS_PER["s"] / completed
        out.update(slots=slots, slot_hold_ns=int(hold_ns), slot_hold_ratio=round(hold_ns / fastest, 3))
    return out


def _issuing_points(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The time series' whole intervals (a short last one left out) up to the last one
    that issued queries."""
    points = [p for p in doc.get("timeseries") or [] if isinstance(p, dict)]
    whole = max((_num(p, "length_s") for p in points), default=0.0) / 2
    last = max((i for i, p in enumerate(points) if _num(p, "issued") > 0 and _num(p, "length_s") >= whole),
               default=-1)
    return points[:last + 1]


def _server_figures(doc: Dict[str, Any]) -> Dict[str, Any]:
    """Outstanding queries and the p99 latency at the start and the end of issuing."""
    points = _issuing_points(doc)
    out: Dict[str, Any] = {"cancelled": int(_num(doc.get("counts") or {}, "cancelled"))}
    if len(points) < 2:
        return out
    first, last = points[0], points[-1]
    out.update(outstanding_start=int(_num(first, "outstanding")), outstanding_end=int(_num(last, "outstanding")),
               latency_p99_start_ns=int(_num(first, "p99_ns")), latency_p99_end_ns=int(_num(last, "p99_ns")))
    out["outstanding_growth"] = out["outstanding_end"] - out["outstanding_start"]
    return out


def _figures(doc: Dict[str, Any], lat: Lateness) -> Dict[str, Any]:
    e = _effective(doc)
    out: Dict[str, Any] = {
        "issue_delay_p99_ns": lat.issue_delay_p99_ns, "latency_p99_ns": lat.latency_p99_ns,
        "lateness_share": None if lat.lateness_share is None else round(lat.lateness_share, 4),
        "end_lateness_ns": lat.end_lateness_ns,
        "offered_fraction": None if lat.offered_fraction is None else round(lat.offered_fraction, 4),
        "max_issue_delay_ms": float(e.get("max_issue_delay_ms", defaults.MAX_ISSUE_DELAY_MS)),
        "max_lateness_share": float(e.get("max_lateness_share", defaults.MAX_LATENESS_SHARE)),
        "issued": int(_num(doc.get("counts") or {}, "issued")),
    }
    out.update(_host_figures(doc))
    out.update(_client_figures(doc))
    out.update(_server_figures(doc))
    return out


# ------------------------------------------------------------------------ signs

def _material(n: float, issued: float) -> bool:
    return n >= max(1.0, _MATERIAL_SHARE * issued)


def _client_sign(ev: Dict[str, Any]) -> Optional[str]:
    """Why the client ran out of resources, or None."""
    issued = ev["issued"]
    if not issued:
        return None
    if _material(ev["cap_waits"], issued):
        return (f"{ev['cap_waits']:,} of {issued:,} queries ({ev['cap_waits'] / issued:.1%}) waited for the "
                "in-flight cap (--max-in-flight)")
    queued = ev.get("queued_in_client", 0)
    if _material(queued, issued) and ev.get("slot_hold_ratio", 0.0) < _SLOW_SERVER_HOLD:
        kind = ev.get("slot_kind", "connections")
        slots = f"one of {ev['slots']:,} {kind}" if ev.get("slots") else f"one of its {kind}"
        held = (f"; each held a query {format_ns(ev['slot_hold_ns'])}, {ev['slot_hold_ratio']:.1f}x the fastest "
                "latency, so the server was not slower for it" if "slot_hold_ns" in ev else "")
        return (f"{queued:,} of {issued:,} queries ({queued / issued:.1%}) waited in the client for {slots}{held} "
                "(raise --connections)")
    if ev.get("io_thread_cpu_fraction", 0.0) >= _BUSY:
        return f"a client I/O thread was {ev['io_thread_cpu_fraction']:.0%} busy"
    return None


def _server_sign(ev: Dict[str, Any], open_loop: bool) -> Optional[str]:
    """Why the server looks saturated, or None."""
    start, end = ev.get("outstanding_start"), ev.get("outstanding_end")
    if open_loop and start is not None and end is not None:
        p99_start, p99_end = ev["latency_p99_start_ns"], ev["latency_p99_end_ns"]
        if end >= _GROWTH * start and end - start >= _MIN_GROWTH and p99_end >= _GROWTH * max(p99_start, 1):
            return (f"outstanding queries grew from {start:,} to {end:,} and the p99 latency from "
                    f"{format_ns(p99_start)} to {format_ns(p99_end)} over the run")
    queued = ev.get("queued_in_client", 0)
    if _material(queued, ev["issued"]) and ev.get("slot_hold_ratio", 0.0) >= _SLOW_SERVER_HOLD:
        return (f"each of {ev['slots']:,} {ev.get('slot_kind', 'connections')} held a query {format_ns(ev['slot_hold_ns'])}, "
                f"{ev['slot_hold_ratio']:.1f}x the fastest latency, and {queued:,} queries waited for one")
    if ev["cancelled"]:
        return f"{ev['cancelled']:,} queries were still outstanding at the end and were cancelled"
    return None


def _generator_why(ev: Dict[str, Any]) -> str:
    """What held the generator up, from its resource figures."""
    parts = []
    if ev.get("steal_fraction", 0.0) >= _STEAL:
        parts.append(f"the machine's steal time was {ev['steal_fraction']:.0%}")
    waits = ev.get("run_queue_wait_ms") or {}
    issuing = {r: ms for r, ms in waits.items() if r in ("issue", "dispatcher", "io") and ms > 0}
    run_ms = ev.get("run_ms", 0.0)
    if issuing and run_ms > 0 and max(issuing.values()) >= _WAIT_SHARE * run_ms:
        role, ms = max(issuing.items(), key=lambda kv: kv[1])
        parts.append(f"its {role} thread(s) waited {ms:,.0f} ms on a run queue (a busy machine)")
    for key, what in (("issue_thread_cpu_fraction", "issue thread"), ("dispatcher_cpu_fraction", "dispatcher"),
                      ("io_thread_cpu_fraction", "I/O thread")):
        if ev.get(key, 0.0) >= _BUSY:
            parts.append(f"its {what} was {ev[key]:.0%} busy")
    return "; ".join(parts) or "the issuing thread was held up (a SUT call that blocks it, or a pause)"


def _late_text(lat: Lateness) -> str:
    share = f", {lat.lateness_share:.1%} of the p99 latency of {format_ns(lat.latency_p99_ns)}" \
        if lat.lateness_share is not None else ""
    offered = f"; offered {lat.offered_fraction:.1%} of the schedule" if lat.offered_fraction is not None else ""
    return f"p99 issue delay {format_ns(lat.issue_delay_p99_ns)}{share}{offered}"


# ------------------------------------------------------------------------ verdict

def _late_anyway(lat: Lateness, ev: Dict[str, Any]) -> bool:
    """Late within a loose ``--max-issue-delay-ms`` but past the default one and a
    material share of latency: the diagnosis still names it (the validity rule does not)."""
    return (lat.issue_delay_p99_ns > ms_to_ns(defaults.MAX_ISSUE_DELAY_MS) and lat.lateness_share is not None
            and lat.lateness_share > ev["max_lateness_share"])


def _invalid_for_generator(doc: Dict[str, Any]) -> bool:
    """A reason of the lateness rule or of the generator's saturation rule (a merged
    result's say which worker first: ``worker 2: generator saturated ...``)."""
    return any(OVERLOAD_PREFIX in str(r) or _SATURATED_PREFIX in str(r) for r in doc.get("invalid_reasons") or [])


def _warnings(ev: Dict[str, Any], lat: Lateness, client: Optional[str], server: Optional[str],
              invalid: bool) -> List[Dict[str, str]]:
    out = []
    if lat.late:
        held = "made the run INVALID" if invalid else "did not falsify the load (latency counts from the schedule)"
        out.append({"name": "generator_late",
                    "message": f"the generator was late: {_late_text(lat)}; it {held}; {_generator_why(ev)}"})
    if client:
        out.append({"name": "client_saturated", "message": f"the client ran out of resources: {client}"})
    if server:
        out.append({"name": "server_saturated", "message": f"the server saturated: {server}"})
    return out


def _cause(doc: Dict[str, Any], lat: Lateness, client: Optional[str], server: Optional[str],
           ev: Dict[str, Any]) -> Tuple[str, bool, str]:
    """(cause, invalid, summary)."""
    if _invalid_for_generator(doc):
        if ev["cap_waits"] and client:
            return "client", True, f"client: {client}, so the generator fell behind: {_late_text(lat)}; INVALID"
        return "generator", True, f"generator: it could not run on time: {_late_text(lat)}; {_generator_why(ev)}; INVALID"
    if client:
        return "client", False, f"client: {client}"
    if server:
        on_time = f"p99 issue delay {format_ns(lat.issue_delay_p99_ns)}"
        return "server", False, f"server: saturated: {server}, while issuing stayed on time ({on_time})"
    if lat.late and not lat.issue_delay_p99_ns > ms_to_ns(ev["max_issue_delay_ms"]):
        return "generator", False, (f"generator: late within --max-issue-delay-ms {ev['max_issue_delay_ms']:g} ms, "
                                    f"but a material part of these latencies: {_late_text(lat)}; {_generator_why(ev)}")
    if lat.late:
        return "generator", False, (f"generator: late but the load held: {_late_text(lat)}; {_generator_why(ev)}; "
                                    "the latencies count from the schedule, so they stand")
    return "none", False, f"none: nothing limited the run ({_late_text(lat)})"


def diagnose(doc: Dict[str, Any]) -> Tuple[Dict[str, Any], List[Dict[str, str]]]:
    """The document's ``diagnosis`` section and its named warnings.

    Returns:
        ``({"cause", "invalid", "summary", "evidence"}, [{"name", "message"}, ...])``.
    """
    lat = doc_lateness(doc)
    ev = _figures(doc, lat)
    ev["run_ms"] = round(s_to_ms(_num(doc, "duration_s")), 3)
    open_loop = _mode(doc) not in ("closed", "offline")
    if not lat.late and _late_anyway(lat, ev):
        lat = dataclasses.replace(lat, late=True)
    client, server = _client_sign(ev), _server_sign(ev, open_loop)
    cause, invalid, summary = _cause(doc, lat, client, server, ev)
    warnings = _warnings(ev, lat, client, server, invalid)
    return {"cause": cause, "invalid": invalid, "summary": summary, "evidence": ev}, warnings


def add_diagnosis(doc: Dict[str, Any]) -> Dict[str, Any]:
    """Sets ``doc["diagnosis"]`` and the named warnings of :data:`WARNING_NAMES` in
    ``doc["warnings"]`` (others there are kept) from the document as it is now; called
    again once more figures (the host's) or reasons are in. Returns ``doc``."""
    diagnosis, warnings = diagnose(doc)
    doc["diagnosis"] = diagnosis
    kept = [w for w in doc.get("warnings") or [] if isinstance(w, dict) and w.get("name") not in WARNING_NAMES]
    doc["warnings"] = kept + warnings
    return doc
