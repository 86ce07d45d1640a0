"""The server's own breakdown of a request's time, for Triton targets: the model's
statistics (Triton's statistics extension: ``GET /v2/models/NAME[/versions/V]/stats`` over
HTTP, the ``ModelStatistics`` RPC over gRPC) read when measuring begins and after the run,
as perf_analyzer reads them.

The difference of the two reads gives, per request of the measured window, the server's
averages of its queue, compute-input, compute-infer and compute-output times, its whole
request time and what is left of it (overhead), with its own counts of successful and
failed requests, executions and the mean batch size (inferences / executions). These go
in the result's ``server_breakdown`` section.

Which server is read:

- an ``http(s)://`` KServe target: its own server, when its metadata (``GET /v2``) says
  ``"name": "triton"``; any other server is left alone;
- a ``grpc(s)://`` KServe target: its own server over gRPC, when its ``ServerMetadata``
  says ``triton``: ``inference.GRPCInferenceService/ModelStatistics`` on a channel made as
  the run's gRPC client makes its own (TLS, ``--ca-file``, ``--header`` as metadata), the
  messages of ``proto/triton_stats.proto``; the ``ModelInfer`` traffic is not touched;
- ``--server-stats-url http(s)://HOST:PORT``: that server (Triton's HTTP port), for the
  target's model, whatever the target's protocol; ``none`` turns it off.

Reading never fails a run: a failed read is the named warning ``server_stats_unread``.
With a warm-up the first read is taken when measuring begins; queries in flight across
that moment are the server's in the window, so its count may differ from the client's by
at most the queries then in flight (none without a warm-up: the first read comes before
the first query).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import types
import urllib.parse
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

from loadgen.units import ns_to_s
from loadgen.net.targets import Target, host_port, host_problem, parse_target, redact_url

__all__ = ["MODEL_STATISTICS", "OFF", "PHASES", "SECTION", "WARNING", "StatsWindow", "TritonGrpcStats", "TritonStats",
           "breakdown", "check_options", "merge_breakdowns", "parse_grpc_stats", "parse_stats", "stats_window"]

#: The result's section.
SECTION = "server_breakdown"
#: The named warning of a failed read.
WARNING = "server_stats_unread"
#: ``--server-stats-url`` value that turns the breakdown off.
OFF = "none"
#: The parts of a request's server time, as Triton's ``inference_stats`` names them.
PHASES = ("queue", "compute_input", "compute_infer", "compute_output")
#: Triton's statistics RPC, by its protocol path.
MODEL_STATISTICS = "/inference.GRPCInferenceService/ModelStatistics"
_MAX_STATS_BYTES = 4 << 20
_TIMEOUT_S = 5.0
# Asking an http:// target's server whether it is Triton delays the run's start by at
# most this much (a server that does not answer ``GET /v2`` is not read).
_DETECT_TIMEOUT_S = 2.0
# After the run the server may record a request just after its response went out: the
# last read waits this long at most for the server's count to reach the client's.
_SETTLE_S = 1.0
_SETTLE_STEP_S = 0.05


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A model's cumulative statistics, summed over the versions the server listed:
    ``counts`` and ``ns`` per duration (``success``, ``fail`` and :data:`PHASES`), and the
    inference and execution counts."""

    counts: Dict[str, int]
    ns: Dict[str, int]
    inference_count: int
    execution_count: int


def _int(obj: Any, what: str) -> int:
    try:
        value = int(obj)
    except (TypeError, ValueError):
        raise ValueError(f"{what} is not a count: {str(obj)[:40]!r}") from None
    if value < 0:
        raise ValueError(f"{what} is negative ({value})")
    return value


def parse_stats(body: Any, model: str) -> Snapshot:
    """The :class:`Snapshot` of ``model`` in a statistics answer (bytes, text or parsed).

    Raises:
        ValueError: not a statistics document, or it lists nothing for ``model``.
    """
    try:
        doc = json.loads(body) if isinstance(body, (bytes, str)) else body
    except ValueError:
        raise ValueError("the statistics are not JSON") from None
    entries = doc.get("model_stats") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ValueError("the answer has no model_stats list")
    mine = [e for e in entries if isinstance(e, dict) and e.get("name") == model]
    if not mine:
        raise ValueError(f"the statistics list no model {model!r}")
    counts = dict.fromkeys(("success", "fail") + PHASES, 0)
    ns = dict(counts)
    inferences = executions = 0
    for e in mine:
        stats = e.get("inference_stats")
        if not isinstance(stats, dict):
            raise ValueError(f"model {model!r} version {e.get('version')!r} has no inference_stats")
        for name in counts:
            d = stats.get(name) or {}
            if not isinstance(d, dict):
                raise ValueError(f"inference_stats.{name} is not an object")
            counts[name] += _int(d.get("count", 0), f"inference_stats.{name}.count")
            ns[name] += _int(d.get("ns", 0), f"inference_stats.{name}.ns")
        inferences += _int(e.get("inference_count", 0), "inference_count")
        executions += _int(e.get("execution_count", 0), "execution_count")
    return Snapshot(counts, ns, inferences, executions)


def parse_grpc_stats(raw: bytes, model: str) -> Snapshot:
    """The :class:`Snapshot` of ``model`` in a serialized ``ModelStatisticsResponse`` (the
    gRPC form of the statistics; a model's absent ``inference_stats`` is zeros, as proto3
    reads it).

    Raises:
        ValueError: not such a message, or it lists nothing for ``model``.
    """
    from google.protobuf.message import DecodeError

    from loadgen.net import triton_stats_pb2 as tpb

    try:
        resp = tpb.ModelStatisticsResponse.FromString(raw)
    except DecodeError:
        raise ValueError("the answer is not a ModelStatisticsResponse") from None
    durations = ("success", "fail") + PHASES
    return parse_stats({"model_stats": [
        {"name": e.name, "version": e.version, "inference_count": e.inference_count,
         "execution_count": e.execution_count,
         "inference_stats": {k: {"count": d.count, "ns": d.ns} for k in durations
                             for d in [getattr(e.inference_stats, k)]}}
        for e in resp.model_stats]}, model)


def breakdown(before: Snapshot, after: Snapshot) -> Dict[str, Any]:
    """What the server did between two reads: ``requests`` (successful) and ``failed``,
    ``inferences``, ``executions`` and ``batch_size`` (inferences per execution), and per
    successful request the mean ``request_ns`` and each phase's mean (``queue_ns``, ...),
    with ``overhead_ns`` the request time the phases do not account for (0 at least), as
    perf_analyzer reports them. A counter that went back (the server restarted or the
    model was reloaded) raises ValueError."""
    counts = {k: after.counts[k] - before.counts[k] for k in after.counts}
    ns = {k: after.ns[k] - before.ns[k] for k in after.ns}
    inferences = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    if min(list(counts.values()) + list(ns.values()) + [inferences, executions]) < 0:
        raise ValueError("the server's counters went back between the reads (restarted, or the model reloaded)")
    out: Dict[str, Any] = {"requests": counts["success"], "failed": counts["fail"], "inferences": inferences,
                           "executions": executions,
                           "batch_size": inferences / executions if executions else 0.0,
                           "request_ns": ns["success"] / counts["success"] if counts["success"] else 0.0}
    for phase in PHASES:
        out[f"{phase}_ns"] = ns[phase] / counts[phase] if counts[phase] else 0.0
    out["overhead_ns"] = max(0.0, out["request_ns"] - sum(out[f"{p}_ns"] for p in PHASES))
    return out


def _stats_base(url: str) -> str:
    """``--server-stats-url``'s scheme://host:port[/prefix]; ValueError naming it."""
    shown = redact_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as e:
        raise ValueError(f"--server-stats-url: not a valid URL ({e})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"--server-stats-url {shown}: use Triton's HTTP endpoint, http(s)://HOST:PORT "
                         f"(or {OFF})")
    problem = host_problem(host)
    if problem:
        raise ValueError(f"--server-stats-url {shown}: {problem}")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"--server-stats-url {shown}: give credentials with --header, not in the URL")
    if parts.query or parts.fragment:
        raise ValueError(f"--server-stats-url {shown}: give the server's base URL, without a query")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


class TritonStats:
    """Reads one model's statistics from a Triton server's HTTP endpoint."""

    def __init__(self, base_url: str, model: str, version: str = "",
                 headers: Sequence[Tuple[str, str]] = (), ssl_context: Any = None,
                 timeout_s: float = _TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.version = version
        quoted = urllib.parse.quote(model, safe="")
        path = f"/v2/models/{quoted}" + (f"/versions/{urllib.parse.quote(version, safe='')}" if version else "")
        self.url = self.base_url + path + "/stats"
        self._headers = list(headers)
        self._ssl_context = ssl_context
        self._timeout_s = timeout_s

    def _get(self, url: str, timeout_s: Optional[float] = None) -> bytes:
        from loadgen.net.blocking_get import blocking_get  # imported when a breakdown is read

        r = blocking_get(url, self._headers, timeout_s=timeout_s or self._timeout_s, ssl_context=self._ssl_context,
                         max_bytes=_MAX_STATS_BYTES)
        if r.status != 200:
            said = r.body[:200].decode("utf-8", "replace").strip()
            raise ValueError(f"HTTP {r.status} {r.reason}".rstrip() + (f": {said}" if said else ""))
        return bytes(r.body)

    def is_triton(self) -> bool:
        """Whether the server's metadata (``GET /v2``) names Triton; False when it does
        not answer so."""
        try:
            meta = json.loads(self._get(self.base_url + "/v2", min(self._timeout_s, _DETECT_TIMEOUT_S)))
        except Exception:  # not a KServe server, or not answering: not known to be Triton
            return False
        return isinstance(meta, dict) and str(meta.get("name", "")).lower() == "triton"

    def read(self) -> Snapshot:
        """The model's statistics now; ValueError (with what failed) when unreadable."""
        return parse_stats(self._get(self.url), self.model)

    def close(self) -> None:
        """Nothing to close: each read is a connection of its own."""


class TritonGrpcStats:
    """Reads one model's statistics from a Triton server's gRPC endpoint (a ``grpc(s)://``
    target's own server), with the ``ModelStatistics`` RPC, on one channel of its own
    kept open from the first call to :meth:`close` (the read when measuring begins is
    then one call on a connection already made)."""

    def __init__(self, target: Target, net: Any, timeout_s: float = _TIMEOUT_S) -> None:
        self.target = target
        self.net = net
        self.model = target.model
        self.version = target.version
        self.url = f"{'grpcs' if target.tls else 'grpc'}://{host_port(target)}{MODEL_STATISTICS}"
        self._metadata = tuple((k.lower(), v) for k, v in net.headers) or None
        self._timeout_s = timeout_s
        self._open: Any = None  # the channel, once made

    def _channel(self) -> Any:
        """The synchronous channel, made (on first use) as the run's gRPC client makes
        its own (its TLS credentials and --ca-file): KServeGrpcSUT's construction, on
        this target."""
        if self._open is None:
            from loadgen.net.kserve_grpc import KServeGrpcSUT

            maker: Any = types.SimpleNamespace(target=self.target, net=self.net)
            maker._credentials = lambda: KServeGrpcSUT._credentials(maker)
            self._open = KServeGrpcSUT.sync_channel(maker)
        return self._open

    def close(self) -> None:
        """Closes the channel (a later call makes another)."""
        if self._open is not None:
            self._open.close()
            self._open = None

    def _call(self, method: str, request: Any, timeout_s: float) -> bytes:
        """The serialized answer of the unary ``method``; ValueError naming the RPC's
        status when it fails."""
        from loadgen.net.kserve_grpc import import_grpc

        if self.target.tls and self.net.insecure:  # grpcio always verifies: the core's call, verification off
            return self._native_call(method, request, timeout_s)
        grpc = import_grpc()
        call = self._channel().unary_unary(method, request_serializer=type(request).SerializeToString)
        try:
            return bytes(call(request, timeout=timeout_s, metadata=self._metadata))
        except grpc.RpcError as e:
            said = str(e.details() or "")[:200].strip()
            raise ValueError(f"{method.rsplit('/', 1)[1]}: {e.code().name}" + (f": {said}" if said else "")) from None

    def _native_call(self, method: str, request: Any, timeout_s: float) -> bytes:
        """The answer of ``method`` by the core's unary call (a connection of its own per
        call), for ``grpcs://`` with ``--insecure``; ValueError as :meth:`_call` words it."""
        from loadgen.net.kserve_grpc import CallFailed, native_unary
        from loadgen.net.native import grpc_refusal

        refused = grpc_refusal(self.target)
        if refused is not None:
            raise ValueError(f"{method.rsplit('/', 1)[1]}: --insecure needs the native gRPC client: {refused}")
        try:
            return native_unary(self.target, self.net, method, request.SerializeToString(), timeout_s)
        except CallFailed as e:
            code, _, said = str(e).partition(": ")
            said = said[:200].strip()
            raise ValueError(f"{method.rsplit('/', 1)[1]}: {code}" + (f": {said}" if said else "")) from None

    def is_triton(self) -> bool:
        """Whether the server's ``ServerMetadata`` names Triton; False when it does not
        answer so."""
        from loadgen.net.kserve_grpc import RPC, pb

        try:
            raw = self._call(RPC["ServerMetadata"], pb.ServerMetadataRequest(), min(self._timeout_s, _DETECT_TIMEOUT_S))
            return pb.ServerMetadataResponse.FromString(raw).name.lower() == "triton"
        except Exception:  # not a KServe server, or not answering: not known to be Triton
            return False

    def read(self) -> Snapshot:
        """The model's statistics now; ValueError (with what failed) when unreadable."""
        from loadgen.net import triton_stats_pb2 as tpb

        request = tpb.ModelStatisticsRequest(name=self.model, version=self.version)
        return parse_grpc_stats(self._call(MODEL_STATISTICS, request, self._timeout_s), self.model)


class StatsWindow:
    """The two reads of a run: :meth:`begin` before the engine starts (the read itself,
    without a warm-up), :meth:`measuring` once it has (a thread that reads when measuring
    begins), :meth:`end` after the run, then :meth:`add_to` the document."""

    def __init__(self, stats: Union[TritonStats, TritonGrpcStats], unmeasured_s: float) -> None:
        self.stats = stats
        self.unmeasured_s = unmeasured_s
        self._before: Optional[Snapshot] = None
        self._after: Optional[Snapshot] = None
        self._error = ""
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _read(self) -> Optional[Snapshot]:
        try:
            return self.stats.read()
        except Exception as e:  # whatever failed, the run goes on without the breakdown
            reason = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
            self._error = self._error or reason
            return None

    def begin(self) -> None:
        """Before the engine starts: the first read, when measuring starts with the run."""
        if self.unmeasured_s <= 0:
            self._before = self._read()

    def measuring(self, measure_start_ns: Callable[[], int]) -> None:
        """After the engine started: with a warm-up, a thread reads when measuring begins
        (``measure_start_ns()``, the monotonic clock's ns, 0 until the run started)."""
        if self.unmeasured_s > 0:
            self._thread = threading.Thread(target=self._at_measure_start, args=(measure_start_ns,),
                                            name="loadgen-server-stats", daemon=True)
            self._thread.start()

    def _at_measure_start(self, measure_start_ns: Callable[[], int]) -> None:
        while not measure_start_ns():
            if self._stop.wait(0.01):
                return
        wait_s = ns_to_s(measure_start_ns() - time.monotonic_ns())
        if wait_s > 0 and self._stop.wait(wait_s):
            return
        self._before = self._read()

    def stop(self) -> None:
        """Ends the thread of :meth:`measuring` (the run ended, or failed) and closes
        what the reads held open (:meth:`end` opens it again)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(_TIMEOUT_S + 1)
            self._thread = None
        self.stats.close()

    def end(self, client_resolved: int) -> None:
        """After the run: the last read, taken again (for up to a second) while the
        server's count of requests is below ``client_resolved`` (the client's completed
        and failed queries of the window)."""
        self.stop()
        try:
            if self._before is None:
                return
            deadline = time.monotonic() + _SETTLE_S
            while True:
                self._after = self._read()
                if self._after is None or time.monotonic() >= deadline:
                    return
                done = sum(self._after.counts[k] - self._before.counts[k] for k in ("success", "fail"))
                if done >= client_resolved:
                    return
                time.sleep(_SETTLE_STEP_S)
        finally:
            self.stats.close()

    def add_to(self, doc: Dict[str, Any], interrupted: bool) -> None:
        """Puts the ``server_breakdown`` section in ``doc``, or the warning
        ``server_stats_unread`` saying why there is none. An interrupted run before its
        measuring began has neither."""
        section: Dict[str, Any] = {"source": "triton", "url": self.stats.url, "model": self.stats.model,
                                   "version": self.stats.version,
                                   "window": "after warm-up" if self.unmeasured_s > 0 else "run"}
        error = self._error
        if not error and self._before is None:
            if interrupted:
                return
            error = "the read when measuring began did not happen"
        if not error and self._before is not None and self._after is not None:
            try:
                section.update(breakdown(self._before, self._after))
            except ValueError as e:
                error = str(e)
        if error:
            doc.setdefault("warnings", []).append(
                {"name": WARNING, "message": f"the server's statistics ({self.stats.url}) could not be read: "
                                             f"{error}; the result has no server-side breakdown"})
            return
        doc[SECTION] = section


def check_options(o: Any) -> Optional[Target]:
    """The KServe target whose model's statistics run options ``o`` may read (None: no
    breakdown: not a KServe target, or ``--server-stats-url none``), checked without
    contacting a server.

    Raises:
        ValueError: ``--server-stats-url`` is malformed or given for a target without a
            KServe model; the message names it.
    """
    from loadgen.sut.spec import is_network_sut

    given = getattr(o, "server_stats_url", None)
    if given is not None and given.strip().lower() == OFF:
        return None
    if not is_network_sut(o.sut):
        if given:
            raise ValueError(f"--server-stats-url applies to network targets (--sut URL), not to --sut {o.sut}")
        return None
    target = parse_target(o.sut, template=bool(o.request_template))
    if target.kind not in ("kserve_http", "kserve_grpc"):
        if given:
            raise ValueError(f"--server-stats-url reads a KServe model's statistics; --sut {target.url} "
                             "names no KServe model")
        return None
    if given:
        _stats_base(given)
    return target


def stats_window(o: Any) -> Optional[StatsWindow]:
    """The :class:`StatsWindow` for run options ``o``: with ``--server-stats-url URL``,
    for the target's model on that server; for a KServe target without it, on the
    target's server (over HTTP or gRPC, as the target is) when it is Triton; None
    otherwise (and for ``--server-stats-url none``).

    Raises:
        ValueError: as :func:`check_options`.
    """
    from loadgen.net import net_options
    from loadgen.net.options import ssl_context

    target = check_options(o)
    given = o.server_stats_url
    if target is None:
        return None
    net = net_options(o)
    stats: Union[TritonStats, TritonGrpcStats]
    if given or target.kind == "kserve_http":
        base = _stats_base(given) if given else target.http_base
        context = ssl_context(o.ca_file, o.insecure) if base.lower().startswith("https") else None
        stats = TritonStats(base, target.model, target.version, net.headers, context)
    else:
        stats = TritonGrpcStats(target, net)
    if not given and not stats.is_triton():
        stats.close()
        return None
    return StatsWindow(stats, o.unmeasured_s)


def merge_breakdowns(docs: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The ``server_breakdown`` of workers' results merged (``loadgen merge``); None when
    none has one. Workers that read one URL read one server, each over its own window,
    and those windows overlap (each counts the others' requests too): per server the
    worker whose window counted the most requests stands for it. The servers' counts are
    summed and their per-request times averaged, weighted by their requests."""
    servers: Dict[str, Dict[str, Any]] = {}
    for doc in docs:
        b = doc.get(SECTION)
        if isinstance(b, dict) and b.get("requests", 0) >= servers.get(str(b.get("url")), {}).get("requests", -1):
            servers[str(b.get("url"))] = b
    if not servers:
        return None
    kept = list(servers.values())
    out: Dict[str, Any] = {k: kept[0].get(k, "") for k in ("source", "model", "version", "window")}
    out["url"] = ", ".join(servers)
    out["servers"] = len(kept)
    for key in ("requests", "failed", "inferences", "executions"):
        out[key] = sum(int(b.get(key, 0)) for b in kept)
    out["batch_size"] = out["inferences"] / out["executions"] if out["executions"] else 0.0
    for key in ["request_ns", "overhead_ns"] + [f"{p}_ns" for p in PHASES]:
        total = sum(float(b.get(key, 0.0)) * int(b.get("requests", 0)) for b in kept)
        out[key] = total / out["requests"] if out["requests"] else 0.0
    return out
