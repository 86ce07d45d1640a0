"""A scripted KServe v2 gRPC server in the test's own process (grpcio), on 127.0.0.1.

It serves one model, ``m`` (INPUT0 FP32 [1, 16] -> OUTPUT0 = INPUT0 + 1), and answers
ModelInfer as its ``script`` says: after ``delay_s``; with status ``code`` on every
``fail_every``-th call (0: never); with bytes that are not a ModelInferResponse
(``garbage``); or with ``pad_bytes`` more bytes of output. It counts the calls it answered
the most it had at once (``max_busy``), and keeps the metadata of the last one. With ``tls`` (certificate and key, PEM) it serves
gRPC over TLS (``grpcs://``). It listens on ``port`` (0, the default: a free one).
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any, Dict, Optional, Tuple

import grpc
import numpy as np

from loadgen.net import kserve_v2_pb2 as pb

__all__ = ["ScriptedGrpc"]

_SERVICE = "inference.GRPCInferenceService"


class ScriptedGrpc:
    """Use as a context manager; ``target`` is ``127.0.0.1:PORT``, ``url(model)`` the
    ``--sut`` URL."""

    def __init__(self, *, delay_s: float = 0.0, code: Optional[grpc.StatusCode] = None, fail_every: int = 0,
                 garbage: bool = False, pad_bytes: int = 0, threads: int = 32,
                 tls: Optional[Tuple[bytes, bytes]] = None, port: int = 0) -> None:
        self.script: Dict[str, Any] = dict(delay_s=delay_s, code=code, fail_every=fail_every, garbage=garbage,
                                           pad_bytes=pad_bytes)
        self.calls = 0  # ModelInfer calls received
        self.answered = 0  # ModelInfer calls answered OK
        self.busy = 0
        self.max_busy = 0  # the most ModelInfer calls in progress at once
        self.last_metadata: Dict[str, str] = {}
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
        handlers = {name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in (
            ("ServerReady", lambda req, ctx: pb.ServerReadyResponse(ready=True).SerializeToString()),
            ("ModelReady", lambda req, ctx: pb.ModelReadyResponse(ready=True).SerializeToString()),
            ("ModelMetadata", self._metadata), ("ModelInfer", self._infer))}
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
        if tls:
            creds = grpc.ssl_server_credentials([(tls[1], tls[0])])
            self.port = self._server.add_secure_port(f"127.0.0.1:{port}", creds)
        else:
            self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        self.target = f"127.0.0.1:{self.port}"
        self.scheme = "grpcs" if tls else "grpc"

    def url(self, model: str = "m") -> str:
        return f"{self.scheme}://{self.target}/{model}"

    def __enter__(self) -> "ScriptedGrpc":
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None).wait(10)

    def _metadata(self, req: bytes, ctx: Any) -> bytes:
        t = dict(datatype="FP32", shape=[1, 16])
        return pb.ModelMetadataResponse(name="m", versions=["1"], platform="scripted",
                                        inputs=[pb.ModelMetadataResponse.TensorMetadata(name="INPUT0", **t)],
                                        outputs=[pb.ModelMetadataResponse.TensorMetadata(name="OUTPUT0", **t)]
                                        ).SerializeToString()

    def _infer(self, req: bytes, ctx: Any) -> bytes:
        with self._lock:
            self.calls += 1
            self.busy += 1
            self.max_busy = max(self.max_busy, self.busy)
            n = self.calls
            self.last_metadata = {k: v for k, v in ctx.invocation_metadata()}
        try:
            return self._answer(n, req, ctx)
        finally:
            with self._lock:
                self.busy -= 1

    def _answer(self, n: int, req: bytes, ctx: Any) -> bytes:
        s = self.script
        if s["delay_s"]:
            time.sleep(s["delay_s"])
        if s["code"] is not None and s["fail_every"] and n % s["fail_every"] == 0:
            ctx.abort(s["code"], f"scripted failure of call {n}")
        if s["garbage"]:
            return b"\xff\xff\xff not a message"
        request = pb.ModelInferRequest.FromString(req)
        x = np.frombuffer(request.raw_input_contents[0], dtype="<f4") + 1
        resp = pb.ModelInferResponse(model_name="m", model_version="1")
        resp.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 16])
        resp.raw_output_contents.append(x.astype("<f4").tobytes())
        if s["pad_bytes"]:
            resp.id = "x" * s["pad_bytes"]
        with self._lock:
            self.answered += 1
        return resp.SerializeToString()
