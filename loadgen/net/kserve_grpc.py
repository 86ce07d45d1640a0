"""KServe v2 over gRPC: the codec (ModelInfer requests built from samples, in raw or
typed contents; responses decoded from either form; the protocol's RPC paths) and
:class:`KServeGrpcSUT`, the client on grpcio's public API (``grpc_engine`` "grpcio"),
whose preparation the native client (:mod:`loadgen.net.native`) shares.

Messages are from ``kserve_v2.proto`` (generated into :mod:`loadgen.net.kserve_v2_pb2`).
grpcio itself is imported only when a client is made (``pip install 'loadgen[grpc]'``),
by :func:`import_grpc`.
"""

from __future__ import annotations

import collections
import functools
import math
import os
import struct
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from loadgen.net import kserve_v2_pb2 as pb
from loadgen.net.base import NetworkSUT
from loadgen.net.kserve_common import KServeInputs, ModelMetadata, check_outputs, samples_from_json_body
from loadgen.net.options import NetOptions
from loadgen.net.payloads import payload_kind, read_jsonl
from loadgen.net.targets import Target, host_port
from loadgen.net.tensors import InputSpec, datatype_of, numpy_dtype
from loadgen.sut.forms import CallbackSUT
from loadgen.units import NS_PER, ns_to_s, s_to_ns

__all__ = ["CallFailed", "KServeGrpcSUT", "RPC", "check_response", "decode_outputs", "import_grpc", "infer_request",
           "metadata_from_pb", "native_unary", "output_summary", "pb", "status_name"]

_monotonic_ns = time.monotonic_ns

#: The protocol's method paths.
RPC = {name: f"/inference.GRPCInferenceService/{name}" for name in (
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")}

# datatype -> field of InferTensorContents (FP16/BF16 have none: raw only)
_TYPED_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
    "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
# Raw contents are little-endian.
_RAW_DTYPE = {k: v.newbyteorder("<") for k, v in
              ((k, numpy_dtype(k)) for k in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8",
                                             "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"))}


def _raw_bytes(arr: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        parts = []
        for v in arr.reshape(-1):
            b = v if isinstance(v, bytes) else str(v).encode()
            parts.append(struct.pack("<I", len(b)) + b)
        return b"".join(parts)
    return np.ascontiguousarray(arr, dtype=_RAW_DTYPE[datatype]).tobytes()


def infer_request(model: str, version: str, sample: Dict[str, np.ndarray], specs: Sequence[InputSpec],
                  contents: str = "raw", outputs: Sequence[str] = ()) -> pb.ModelInferRequest:
    """A ModelInferRequest for one sample.

    Args:
        contents: "raw" (``raw_input_contents``, the compact form) or "typed" (each input's
            ``contents`` field; FP16 inputs still go raw, as the protocol has no typed field
            for them, so they force raw for the whole request).
    """
    if contents not in ("raw", "typed"):
        raise ValueError(f"contents must be 'raw' or 'typed', got {contents!r}")
    req = pb.ModelInferRequest(model_name=model, model_version=version)
    use_raw = contents == "raw" or any(s.datatype not in _TYPED_FIELD for s in specs)
    for spec in specs:
        arr = np.asarray(sample[spec.name])
        t = req.inputs.add(name=spec.name, datatype=spec.datatype, shape=list(arr.shape))
        if use_raw:
            req.raw_input_contents.append(_raw_bytes(arr, spec.datatype))
        else:
            field = getattr(t.contents, _TYPED_FIELD[spec.datatype])
            flat = arr.reshape(-1)
            if spec.datatype == "BYTES":
                field.extend(v if isinstance(v, bytes) else str(v).encode() for v in flat)
            else:
                field.extend(flat.astype(numpy_dtype(spec.datatype)).tolist())
    for name in outputs:
        req.outputs.add(name=name)
    return req


def _count_bytes_elements(raw: bytes) -> int:
    n, i = 0, 0
    while i + 4 <= len(raw):
        (size,) = struct.unpack_from("<I", raw, i)
        i += 4 + size
        n += 1
    return n if i == len(raw) else -2  # -2: malformed length prefixes


def output_summary(resp: pb.ModelInferResponse) -> Tuple[List[tuple], Optional[str]]:
    """(name, datatype, shape, element count) per output, from raw or typed contents, and
    a problem with the contents' layout (None when there is none)."""
    raw = resp.raw_output_contents
    if raw and len(raw) != len(resp.outputs):
        return [], f"{len(raw)} raw output contents for {len(resp.outputs)} outputs"
    out = []
    for i, o in enumerate(resp.outputs):
        dt = o.datatype.upper()
        if raw:
            if dt == "BYTES":
                count = _count_bytes_elements(raw[i])
                if count == -2:
                    return [], f"output {o.name}: malformed BYTES raw contents"
            elif dt in _RAW_DTYPE:
                size = _RAW_DTYPE[dt].itemsize
                if len(raw[i]) % size:
                    return [], f"output {o.name}: {len(raw[i])} raw bytes is not a whole number of {dt}"
                count = len(raw[i]) // size
            else:
                count = -1
        else:
            field = _TYPED_FIELD.get(dt)
            count = len(getattr(o.contents, field)) if field else -1
        out.append((o.name, dt, tuple(o.shape), count))
    return out, None


def check_response(resp: pb.ModelInferResponse, expected: Sequence[InputSpec]) -> Optional[str]:
    """None when the response's outputs match ``expected``; else what is wrong."""
    summary, problem = output_summary(resp)
    if problem:
        return problem
    return check_outputs(summary, expected)


def decode_outputs(resp: pb.ModelInferResponse) -> Dict[str, np.ndarray]:
    """Each output as a numpy array of its shape, from raw or typed contents."""
    out: Dict[str, np.ndarray] = {}
    raw = resp.raw_output_contents
    for i, o in enumerate(resp.outputs):
        dt, shape = o.datatype.upper(), tuple(o.shape)
        if raw:
            if dt == "BYTES":
                items, data, j = [], raw[i], 0
                while j + 4 <= len(data):
                    (size,) = struct.unpack_from("<I", data, j)
                    items.append(data[j + 4:j + 4 + size])
                    j += 4 + size
                arr = np.array(items, dtype=object)
            else:
                arr = np.frombuffer(raw[i], dtype=_RAW_DTYPE[dt]).astype(numpy_dtype(dt))
        else:
            values = list(getattr(o.contents, _TYPED_FIELD[dt]))
            arr = np.array(values, dtype=numpy_dtype(dt))
        out[o.name] = arr.reshape(shape)
    return out


def metadata_from_pb(resp: pb.ModelMetadataResponse) -> ModelMetadata:
    """ModelMetadata from its gRPC form."""
    def tensors(items) -> List[InputSpec]:
        return [InputSpec(t.name, t.datatype.upper(), tuple(t.shape)) for t in items]
    return ModelMetadata(resp.name, list(resp.versions), resp.platform, tensors(resp.inputs), tensors(resp.outputs))


# ------------------------------------------------------------------------------ client

#: What grpcio is told before its first import (see :func:`import_grpc`).
GRPC_EXPERIMENTS = "-event_engine_client"
_grpc_experiments: Optional[str] = None  # what grpcio was imported with, once known


def import_grpc():
    """grpcio, imported with its client connections on the epoll poller of the thread
    that waits for completions (``GRPC_EXPERIMENTS=-event_engine_client``), unless
    ``GRPC_EXPERIMENTS`` is set already. grpcio's default hands every event from its own
    poller thread to the waiting one: about five more context switches per call, a
    third more client CPU. It reads the variable once, at import; the process's
    environment is left as it was.

    Raises:
        ValueError: grpcio is not installed.
    """
    global _grpc_experiments
    if "grpc" in sys.modules:
        import grpc
        return grpc
    given = os.environ.get("GRPC_EXPERIMENTS")
    if given is None:
        os.environ["GRPC_EXPERIMENTS"] = GRPC_EXPERIMENTS
    try:
        import grpc
    except ImportError:
        raise ValueError("gRPC targets need grpcio: pip install 'loadgen[grpc]'") from None
    finally:
        if given is None:
            del os.environ["GRPC_EXPERIMENTS"]
    _grpc_experiments = GRPC_EXPERIMENTS if given is None else given
    return grpc


class CallFailed(Exception):
    """A unary call made before the run failed; its text is "CODE: details"."""


def native_unary(target: Target, net: NetOptions, method: str, request: bytes, timeout_s: float) -> bytes:
    """The response message of one unary call of ``method`` (its path) made by the core's
    client (``_core.grpc_unary_call``) on a connection of its own, with the run's TLS
    settings (``--ca-file``, ``--insecure``) and metadata.

    Raises:
        CallFailed: the call failed ("CODE: details", grpcio's code names).
        ValueError: the host does not resolve, or the CA file does not load.
    """
    from loadgen import _core
    from loadgen.net.native import grpc_settings

    try:
        code, text = _core.grpc_unary_call(grpc_settings(target, net), method, request, max(s_to_ns(timeout_s), NS_PER["ms"]))  # at least 1 ms
    except RuntimeError as e:  # a CA file that does not load
        raise ValueError(str(e)) from None
    if code == 0:
        return bytes(text)
    raise CallFailed(f"{status_name(code)}: {text.decode('utf-8', 'replace')}")


def status_name(code: int) -> str:
    """grpcio's name of the gRPC status ``code`` ("UNAVAILABLE"; "UNKNOWN" for a code it has not)."""
    grpc = import_grpc()
    return next((c.name for c in grpc.StatusCode if c.value[0] == code), "UNKNOWN")


class KServeGrpcSUT(CallbackSUT, KServeInputs, NetworkSUT):
    """KServe v2 gRPC ``ModelInfer`` on grpcio's public API, with no event loop: each call
    is started with ``.future()`` on a synchronous channel from the thread that hands out
    the query, and its done-callback, on the channel's completion thread, stamps the
    response and completes the query in the engine (see :class:`loadgen.sut.CallbackSUT`);
    in a closed loop that callback also starts the next call, so one thread wakes per
    call. Requests are serialized before the run and sent as bytes.

    Calls in flight are capped at ``pool_size`` (the concurrency, the in-flight cap, or
    64 for an uncapped open loop); queries over the cap wait in order and start as calls
    end.
    """

    protocol = "kserve_v2_grpc"
    grpc_engine = "grpcio"

    def __init__(self, target: Target, net: NetOptions, pool_size: int, native_calls: bool = False) -> None:
        # One HTTP/2 channel carries many concurrent calls; more channels only help at
        # very high concurrency, so the default is one per 64 in flight.
        super().__init__(target, net, max(1, math.ceil(pool_size / 64)))
        grpc = import_grpc()
        if target.tls and net.insecure and not native_calls:
            raise ValueError("--insecure is not available for grpcs:// on grpcio (grpcio always verifies); "
                             "give the server's CA with --ca-file, or run the native client (--grpc-engine native "
                             "or auto, in a build with nghttp2 and OpenSSL)")
        #: prepare()'s calls (readiness, metadata) are the core's (:func:`native_unary`), not grpcio's.
        self.native_calls = native_calls
        self.requests: List[bytes] = []
        # None rather than an empty tuple: grpc skips its metadata handling then.
        self.metadata_md = tuple((k.lower(), v) for k, v in net.headers) or None
        self.channels: list = []
        self.calls: list = []
        self.in_flight = max(1, pool_size)  # calls in flight at most
        self._decode = pb.ModelInferResponse.FromString
        self._check = check_response
        self._deadline_exceeded = grpc.StatusCode.DEADLINE_EXCEEDED
        self._rpc_error = grpc.RpcError
        self._cancelled_error = grpc.FutureCancelledError
        self._lock = threading.Lock()
        self._running = 0  # calls started and not yet ended
        self._next_call = 0
        self._closed = False
        self._waiting: collections.deque = collections.deque()
        self._n_requests = 0
        self._holds: List[Tuple[Any, threading.Event]] = []  # (call, its release) per channel

    def _credentials(self):
        import grpc

        if not self.target.tls:
            return None
        root = None
        if self.net.ca_file:
            from loadgen.files import CERT_LIMIT_BYTES, read_bytes
            root = read_bytes(self.net.ca_file, what="--ca-file", limit_bytes=CERT_LIMIT_BYTES)
        return grpc.ssl_channel_credentials(root_certificates=root)

    def sync_channel(self, options=None):
        """A new blocking grpcio channel to the target (TLS as the run says)."""
        import grpc

        creds = self._credentials()
        target = host_port(self.target)
        return (grpc.secure_channel(target, creds, options=options) if creds
                else grpc.insecure_channel(target, options=options))

    def run_options(self) -> list:
        """The grpcio channel options of the run's channels."""
        # No retries: a load generator counts a failed call, it does not hide it, and
        # the retry machinery costs CPU on every call.
        # A response over --max-response-bytes fails in grpcio (RESOURCE_EXHAUSTED) before
        # it is held whole; its option is an int32.
        return [("grpc.max_receive_message_length", min(self.net.max_response_bytes, 2**31 - 1)),
                ("grpc.max_send_message_length", -1),
                ("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0)]

    def failure_of(self, code, details: Optional[str]) -> Optional[Tuple[str, str]]:
        """(kind, message) of a failed call; None for a deadline the run's timeout set
        (the engine counts that query as timed out)."""
        if code == self._deadline_exceeded and self.timeout_ns:
            return None
        text = self.redactor.excerpt(details or code.name, 500)
        kind = f"grpc_{code.name}"
        if kind == "grpc_RESOURCE_EXHAUSTED" and "larger than max" in text:
            kind = "response_too_large"
            text = f"response over --max-response-bytes ({self.net.max_response_bytes} bytes): {text}"
        return kind, text

    def report(self):
        out = super().report()
        out["grpc_engine"] = self.grpc_engine
        out["grpc_calls"] = "future"  # how the calls are made: .future() and its done-callback
        out["grpc_experiments"] = _grpc_experiments
        return out

    def prepare(self) -> None:
        """Waits for the server and model to be ready, reads the model's metadata and
        serializes the requests; the calls are the core's (:attr:`native_calls`) or grpcio's."""
        if self.native_calls:
            self._prepare_with(self._native_call)
            return
        channel = self.sync_channel()
        try:
            self._prepare_with(functools.partial(self._grpcio_call, channel))
        finally:
            channel.close()

    def _grpcio_call(self, channel: Any, method: str, request: Any, response_type: Any, timeout_s: float) -> Any:
        """One unary call on grpcio's ``channel``; :class:`CallFailed` when it fails."""
        import grpc

        call = channel.unary_unary(RPC[method], request_serializer=type(request).SerializeToString,
                                   response_deserializer=response_type.FromString)
        try:
            return call(request, timeout=timeout_s, metadata=self.metadata_md)
        except grpc.RpcError as e:
            raise CallFailed(f"{e.code().name}: {e.details()}") from None

    def _native_call(self, method: str, request: Any, response_type: Any, timeout_s: float) -> Any:
        """One unary call made by the core (:func:`native_unary`)."""
        return response_type.FromString(native_unary(self.target, self.net, RPC[method], request.SerializeToString(),
                                                     timeout_s))

    def _prepare_with(self, call: Any) -> None:
        """prepare() with ``call(method, request, response_type, timeout_s)`` making the calls."""
        name, version = self.target.model, self.target.version

        def probe(timeout_s: float):
            try:
                if not call("ServerReady", pb.ServerReadyRequest(), pb.ServerReadyResponse, timeout_s).ready:
                    return False, "ServerReady: not ready"
                if not call("ModelReady", pb.ModelReadyRequest(name=name, version=version), pb.ModelReadyResponse,
                            timeout_s).ready:
                    return False, f"ModelReady({name!r}): not ready"
                return True, ""
            except CallFailed as e:
                return False, str(e)

        self.wait_ready(probe, f"gRPC server {host_port(self.target)}")
        try:
            self.metadata = metadata_from_pb(call("ModelMetadata", pb.ModelMetadataRequest(name=name, version=version),
                                                  pb.ModelMetadataResponse, 10.0))
        except CallFailed as e:
            if not self.net.inputs and not self.net.payload:
                raise ValueError(f"ModelMetadata({name!r}) failed ({e}); give --input NAME:DTYPE:SHAPE or "
                                 "--payload FILE") from None
        self.prepare_requests()

    def prepare_requests(self) -> None:
        """Serializes the run's requests (from --payload or synthetic samples of the
        metadata's or --input's specs); what prepare() does once the server answered."""
        name, version = self.target.model, self.target.version
        self.expected = self.expected_outputs()
        if self.net.payload and payload_kind(self.net.payload) == "jsonl":
            bodies = read_jsonl(self.net.payload)[: self.net.sample_count]
            samples = [samples_from_json_body(b, f"--payload {self.net.payload} line {i + 1}")
                       for i, b in enumerate(bodies)]
            specs = [InputSpec(k, datatype_of(v), tuple(v.shape)) for k, v in samples[0].items()]
            source = self.net.payload
        else:
            samples, specs, source = self.samples()
        self.requests = [infer_request(name, version, s, specs, self.net.grpc_contents).SerializeToString()
                         for s in samples]
        self.payload_bytes = [len(r) for r in self.requests]
        self.payload_source = source + f" ({self.net.grpc_contents} contents)"

    def open(self, sink: Any) -> None:
        """Opens the channels, each connected by one ServerReady call and holding its
        completion thread, before the run."""
        self.sink = sink
        options = self.run_options()
        try:
            for _ in range(self.connections):
                ch = self.sync_channel(options)
                self.channels.append(ch)
                try:  # connects now rather than in the first measured call; a failure shows in the run
                    ch.unary_unary(RPC["ServerReady"])(b"", timeout=min(5.0, self.net.ready_timeout_s),
                                                       metadata=self.metadata_md)
                except self._rpc_error:
                    pass
                self.calls.append(ch.unary_unary(RPC["ModelInfer"]))
                self._holds.append(self._hold(ch))
        except BaseException:
            self.close()
            raise
        self._n_requests = len(self.requests)

    def _hold(self, channel: Any) -> Tuple[Any, threading.Event]:
        """Keeps the channel's completion thread for the run. grpcio starts that thread
        when a channel's first call starts and ends it when its last call ends, so an
        open loop whose calls all end between two arrivals would start a thread per call
        (and wait for it on the issuing thread). The hold is a call that stays in
        progress: a client-streaming ServerReady whose request stream sends nothing until
        released (the server waits for the request: a unary method reads one message).
        :meth:`close` cancels it. Should a server or proxy end it early, the run goes on
        as grpcio manages the thread by itself."""
        release = threading.Event()

        def nothing():  # the request stream: no message, ended when released
            release.wait()
            return
            yield

        call = channel.stream_unary(RPC["ServerReady"]).future(nothing(), metadata=self.metadata_md)
        return call, release

    def close(self) -> None:
        """Ends the holds and closes the channels; the calls they still carry end
        unreported (the engine has resolved their queries)."""
        self._closed = True
        for call, release in self._holds:
            call.cancel()
            release.set()  # the request stream's thread ends
        self._holds.clear()
        for ch in self.channels:
            ch.close()

    def issue_query(self, query_id: int, sample_index: int, scheduled_ns: int) -> None:
        data = self.requests[sample_index % self._n_requests]
        with self._lock:
            if self._running >= self.in_flight:
                self._waiting.append((query_id, data, scheduled_ns))
                return
            self._running += 1
        self._start(query_id, data, scheduled_ns)

    def _start(self, qid: int, data: bytes, scheduled_ns: int) -> None:
        i = self._next_call % len(self.calls)
        self._next_call += 1
        try:
            future = self.calls[i].future(data, timeout=self.call_timeout_s(scheduled_ns), metadata=self.metadata_md)
        except BaseException:
            self._ended()
            raise
        future.add_done_callback(functools.partial(self._done, qid))

    def _ended(self) -> None:
        # One call ended: the oldest waiting query, if any, takes its place.
        with self._lock:
            if not self._waiting:
                self._running -= 1
                return
            qid, data, scheduled_ns = self._waiting.popleft()
        try:
            self._start(qid, data, scheduled_ns)
        except BaseException as e:  # fails that query only
            self.fail_query(qid, type(e).__name__, str(e))

    def _done(self, qid: int, future: Any) -> None:
        # On grpcio's completion thread, which logs and drops what a callback raises: an
        # error here fails the query instead of leaving it to the timeout.
        t = _monotonic_ns()
        if self._closed:
            return
        try:
            self._ended()
            self._resolve(qid, future, t)
        except Exception as e:
            self.fail_query(qid, type(e).__name__, f"the response handling raised: {e}")

    def _resolve(self, qid: int, future: Any, t: int) -> None:
        try:
            raw = future.result()
        except self._rpc_error as e:
            failure = self.failure_of(e.code(), e.details())
            if failure is None:  # a deadline the timeout set: the engine counts it as timed out
                self.sink.timed_out(qid)
            else:
                self.fail_query(qid, *failure)
            return
        except self._cancelled_error:
            self.fail_query(qid, "grpc_CANCELLED", "the call was cancelled")
            return
        if raw is None:  # grpcio's result for a call that ended OK with no message
            self.fail_query(qid, "invalid_response", "the call ended OK without a response message")
            return
        self.answered(qid, raw, t)

    def check_pb(self, raw: bytes) -> Optional[str]:
        """The problem with a serialized ModelInferResponse, or None when it is good."""
        try:
            return self._check(self._decode(raw), self.expected)
        except Exception as e:  # protobuf's DecodeError and friends
            return f"the response does not decode: {type(e).__name__}: {e}"

    def call_timeout_s(self, scheduled_ns: int) -> Optional[float]:
        """What is left of the run's timeout for a query scheduled at ``scheduled_ns``
        (None: no timeout)."""
        if not self.timeout_ns:
            return None
        return max(ns_to_s(scheduled_ns + self.timeout_ns - _monotonic_ns()), 0.0)

    def answered(self, qid: int, raw: bytes, t_ns: int) -> None:
        """Query ``qid`` got response ``raw`` at ``t_ns``: checked, then completed or failed."""
        if self.check:
            problem = self.check_body(raw, self.check_pb)
            if problem is not None:
                self.fail_query(qid, "invalid_response", problem)
                return
        self.sink.complete(qid, t_ns)
