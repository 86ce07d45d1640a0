"""The native gRPC path (``grpc_engine`` "native"): KServe v2 ``ModelInfer`` calls whose
HTTP/2 framing, sending and reading happen in the core (``csrc/grpc_client.cc``, on
nghttp2), with no Python and no gRPC library per call.

The Python client (:class:`~loadgen.net.kserve_grpc.KServeGrpcSUT`) prepares everything
as for grpcio's clients: readiness, model metadata, the serialized requests. The core
multiplexes the calls over HTTP/2 connections opened before the run, and judges each
call's end by its bytes (status and response message) against a cache of verdicts; the
outcomes it has not seen come to :meth:`NativeGrpcSUT.verdict` on the checker thread
(:class:`~loadgen.net.native_http.Checker`), which checks a response message as the
grpcio clients do and names a failed call's error as they do (``grpc_<CODE>``).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

from loadgen import _core
from loadgen.net.kserve_grpc import RPC
from loadgen.net.native_http import NativeHttpSUT

__all__ = ["NativeGrpcSUT", "native_grpc_refusal"]


def native_grpc_refusal(target: Any) -> Optional[str]:
    """None when the native gRPC client can run ``target``, else why not."""
    if not _core.grpc_client_available():
        return ("this build of loadgen has no native gRPC client (nghttp2's header was missing when it was built: "
                "install libnghttp2-dev and reinstall)")
    if target.tls:
        return "the native gRPC client runs plain grpc:// targets, not TLS (grpcs://)"
    return None


class NativeGrpcSUT(NativeHttpSUT):
    """A prepared KServe gRPC client (``inner``), its calls made by the core's gRPC client.

    Args:
        inner: the prepared :class:`~loadgen.net.kserve_grpc.KServeGrpcSUT`.
        io_threads: epoll threads the connections are spread over.
        cpus: the I/O threads' CPUs (empty: not pinned).
        max_calls: calls in flight at most (default: the inner client's ``in_flight``).
    """

    native_http = True  # the engine runs it as it runs the native HTTP client (SUT form native_http)

    def __init__(self, inner: Any, io_threads: int = 1, cpus: Sequence[int] = (),
                 max_calls: Optional[int] = None) -> None:
        why = native_grpc_refusal(inner.target)
        if why is not None:
            raise ValueError(f"--grpc-engine native: {why}")
        import grpc

        self.take_client(inner, io_threads, cpus)
        self.max_calls = int(max_calls if max_calls is not None else inner.in_flight)
        self._codes = {c.value[0]: c for c in grpc.StatusCode}
        self._unknown = grpc.StatusCode.UNKNOWN

    def native_settings(self) -> _core.NativeSutSettings:
        """The engine's settings: kind ``grpc`` with the prepared requests."""
        s = _core.NativeSutSettings(kind=_core.SutKind.grpc)
        h = self.client_settings()
        inner = self.inner
        h.grpc_path = RPC["ModelInfer"]
        h.metadata = list(inner.metadata_md or ())
        h.max_in_flight = self.max_calls
        h.warm_connections = h.connections
        s.http = h
        return s

    def verdict(self, status: int, body: bytes) -> Optional[Tuple[str, str]]:
        """The verdict on a call's end: ``status`` its gRPC status code, ``body`` the
        response message (status 0) or the status message. As the grpcio clients judge it."""
        inner = self.inner
        try:
            if status == 0:
                if not inner.check:
                    return None
                problem = inner.check_body(body, inner.check_pb)
                return None if problem is None else ("invalid_response", problem)
            code = self._codes.get(status, self._unknown)
            failure = inner.failure_of(code, body.decode("utf-8", "replace"))
            # No deadline goes to the server (the core resets a call at its timeout), so a
            # DEADLINE_EXCEEDED is the server's own and fails the query as such.
            return failure if failure is not None else (f"grpc_{code.name}", inner.redactor.excerpt(body, 500))
        except Exception as e:  # a bug in a check must not end the run
            self.check_errors += 1
            return "check_error", f"the response check raised {type(e).__name__}: {e}"

    def report(self) -> Dict[str, Any]:
        out = super().report()
        del out["http_engine"]
        out["grpc_engine"] = "native"
        del out["grpc_calls"]  # grpcio's, which makes no call here
        out["grpc_experiments"] = None  # grpcio makes no call
        out["nghttp2"] = _core.grpc_client_nghttp2_version()
        return out
