"""A scripted gRPC server at the HTTP/2 level (the ``h2`` package), on 127.0.0.1, for the
answers a real gRPC server library never gives: HTTP statuses other than 200, missing
grpc-status, streams reset, compressed or truncated messages, two messages to a unary
call, GOAWAY and connections dropped mid-call.

It serves the KServe v2 methods the clients call before a run (ServerReady, ModelReady,
ModelMetadata of model ``m``: INPUT0 FP32 [1, 16] -> OUTPUT0 FP32 [1, 16]) properly, and
answers ModelInfer as ``mode`` says (see ``MODES``); ``every`` > 1 answers only each
every-th call so and the others properly. Each connection is served by a thread of its
own; ``close()`` (or leaving the ``with``) ends them all. With ``tls`` (certificate and
key files, PEM) it serves ``grpcs://`` (ALPN h2).
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from typing import List, Optional, Tuple

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from loadgen.net import kserve_v2_pb2 as pb

__all__ = ["H2Scripted", "MODES"]

_SERVICE = "/inference.GRPCInferenceService/"

#: How ModelInfer is answered.
MODES = ("ok", "http_503", "http_404", "no_status", "trailers_only", "reset_refused", "reset_internal",
         "compressed", "truncated", "two_messages", "empty_ok", "goaway", "drop")


def _frame(message: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BI", 1 if compressed else 0, len(message)) + message


def _infer_response() -> bytes:
    out = pb.ModelInferResponse(model_name="m", model_version="1")
    out.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 16])
    out.raw_output_contents.append(b"\0" * 64)
    return out.SerializeToString()


def _metadata() -> bytes:
    t = dict(datatype="FP32", shape=[1, 16])
    return pb.ModelMetadataResponse(name="m", versions=["1"], platform="h2-scripted",
                                    inputs=[pb.ModelMetadataResponse.TensorMetadata(name="INPUT0", **t)],
                                    outputs=[pb.ModelMetadataResponse.TensorMetadata(name="OUTPUT0", **t)]
                                    ).SerializeToString()


_OK_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]
_OK_TRAILERS = [("grpc-status", "0")]


class H2Scripted:
    """Use as a context manager; ``url()`` is the ``--sut`` URL."""

    def __init__(self, mode: str = "ok", every: int = 1, tls: Optional[Tuple[str, str]] = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.every = max(1, every)
        self.infer_calls = 0  # ModelInfer calls received
        self.connections = 0  # connections accepted
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._conns: List[socket.socket] = []
        self._threads: List[threading.Thread] = []
        self._closed = threading.Event()
        self._tls: Optional[ssl.SSLContext] = None
        if tls:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(*tls)
            self._tls.set_alpn_protocols(["h2"])

    def url(self, model: str = "m") -> str:
        return f"{'grpcs' if self._tls else 'grpc'}://127.0.0.1:{self.port}/{model}"

    def __enter__(self) -> "H2Scripted":
        t = threading.Thread(target=self._accept, name="h2-scripted-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        try:  # wakes the accept() in progress
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        for t in self._threads:
            t.join(5)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if self._tls is not None:  # the handshake is the connection's thread's
                conn = self._tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            with self._lock:
                self._conns.append(conn)
                self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), name="h2-scripted-conn", daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, sock: socket.socket) -> None:
        h2c = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        h2c.initiate_connection()
        paths = {}
        goaway = False
        try:
            if isinstance(sock, ssl.SSLSocket):
                sock.do_handshake()
            sock.sendall(h2c.data_to_send())
            while not self._closed.is_set():
                data = sock.recv(65536)
                if not data:
                    return
                if goaway:  # the client's frames after it are read and dropped until it closes
                    continue
                for event in h2c.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        paths[event.stream_id] = dict(event.headers).get(":path", "")
                    elif isinstance(event, h2.events.DataReceived):
                        h2c.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        try:
                            what = self._answer(h2c, event.stream_id, paths.pop(event.stream_id, ""))
                        except h2.exceptions.StreamClosedError:  # the client reset it meanwhile
                            continue
                        if what == "drop":
                            sock.sendall(h2c.data_to_send())
                            return
                        if what == "goaway":
                            goaway = True
                            break
                sock.sendall(h2c.data_to_send())
        except (OSError, h2.exceptions.ProtocolError):
            return
        finally:
            sock.close()

    def _answer(self, h2c, sid: int, path: str) -> Optional[str]:
        method = path[len(_SERVICE):] if path.startswith(_SERVICE) else ""
        if method == "ServerReady":
            return self._ok(h2c, sid, pb.ServerReadyResponse(ready=True).SerializeToString())
        if method == "ModelReady":
            return self._ok(h2c, sid, pb.ModelReadyResponse(ready=True).SerializeToString())
        if method == "ModelMetadata":
            return self._ok(h2c, sid, _metadata())
        if method != "ModelInfer":
            h2c.send_headers(sid, _OK_HEADERS + [("grpc-status", "12"), ("grpc-message", "unknown method")],
                             end_stream=True)
            return None
        with self._lock:
            self.infer_calls += 1
            n = self.infer_calls
        mode = self.mode if n % self.every == 0 else "ok"
        body = _infer_response()
        if mode == "ok":
            return self._ok(h2c, sid, body)
        if mode in ("http_503", "http_404"):
            h2c.send_headers(sid, [(":status", mode[-3:]), ("content-type", "text/plain")])
            h2c.send_data(sid, b"not gRPC", end_stream=True)
        elif mode == "no_status":
            h2c.send_headers(sid, _OK_HEADERS)
            h2c.send_data(sid, _frame(body), end_stream=True)
        elif mode == "trailers_only":
            h2c.send_headers(sid, _OK_HEADERS + [("grpc-status", "5"), ("grpc-message", "no%20such%20model")],
                             end_stream=True)
        elif mode in ("reset_refused", "reset_internal"):
            code = h2.errors.ErrorCodes.REFUSED_STREAM if mode == "reset_refused" else h2.errors.ErrorCodes.INTERNAL_ERROR
            h2c.reset_stream(sid, error_code=code)
        elif mode == "compressed":
            self._ok(h2c, sid, body, compressed=True)
        elif mode == "truncated":
            h2c.send_headers(sid, _OK_HEADERS)
            h2c.send_data(sid, _frame(body)[:20])
            h2c.send_headers(sid, _OK_TRAILERS, end_stream=True)
        elif mode == "two_messages":
            h2c.send_headers(sid, _OK_HEADERS)
            h2c.send_data(sid, _frame(body) + _frame(body))
            h2c.send_headers(sid, _OK_TRAILERS, end_stream=True)
        elif mode == "empty_ok":
            h2c.send_headers(sid, _OK_HEADERS)
            h2c.send_headers(sid, _OK_TRAILERS, end_stream=True)
        elif mode == "goaway":  # this call is answered; the connection takes no more
            self._ok(h2c, sid, body)
            h2c.close_connection(last_stream_id=sid)
            return "goaway"
        elif mode == "drop":
            return "drop"
        return None

    def _ok(self, h2c, sid: int, message: bytes, compressed: bool = False) -> None:
        h2c.send_headers(sid, _OK_HEADERS)
        h2c.send_data(sid, _frame(message, compressed))
        h2c.send_headers(sid, _OK_TRAILERS, end_stream=True)
        return None

