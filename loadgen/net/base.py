"""What the network SUTs share: :class:`NetworkSUT` (readiness, the response-check
memo, failures, the report) and :class:`HttpSUT` (requests as prepared bytes over the
HTTP/1.1 pool).

Each client does its slow work before the timed run, in :meth:`NetworkSUT.prepare`: it
waits for the server to be ready, reads the model's metadata, and serializes one request
per distinct sample, so that the hot path only sends prepared bytes. Every response is
checked by default; a failed request is counted by its error class (connect_refused,
connection_reset, timeout, http_<status>, grpc_<CODE>, invalid_response) and the run
goes on.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from loadgen import defaults
from loadgen.net.blocking_get import GetError, blocking_get
from loadgen.net.kserve_common import ModelMetadata
from loadgen.net.options import NetOptions, ssl_context
from loadgen.net.targets import Target
from loadgen.sut.forms import LoopSUT
from loadgen.sut.report import NamedHistogram
from loadgen.units import ms_to_ns

if TYPE_CHECKING:  # the asyncio client loads where a run uses it, not on the native clients' path
    import asyncio

    from loadgen.net.http1 import HttpPool, Request

__all__ = ["HttpSUT", "NetworkSUT", "http_get"]

_WARM_MAX = 1024  # connections opened before the run; more open as the load needs them
_MEMO_MAX_BYTES = 64 * 1024  # responses up to this size have their check remembered
_MEMO_MAX_ENTRIES = 4096
# Files a run needs beside its connections (the engine's eventfd, the event loop's own,
# result and record files, telemetry, a live metrics server): kept free of connections.
_FD_RESERVE = 24


def _open_files() -> Optional[Tuple[int, int, int]]:
    """(files open now, the soft and hard limits on them), or None where unknown."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        used = len(os.listdir("/proc/self/fd"))
    except (ImportError, OSError, ValueError):
        return None
    return used, soft, hard


def check_open_files(connections: int, what: str) -> None:
    """Makes room for ``connections`` sockets under the open-file limit (``ulimit -n``):
    the soft limit is raised (up to the hard one) when they would not fit.

    Raises:
        ValueError: they cannot fit; the message names ``what`` (the option that asked
            for them) and both ways out.
    """
    files = _open_files()
    if files is None:
        return
    import resource

    used, soft, hard = files
    need = used + connections + _FD_RESERVE
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard == resource.RLIM_INFINITY or need <= hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
            return
        except (OSError, ValueError):
            pass
    raise ValueError(
        f"{what}: {connections} connections need as many open files, and this process may open {soft} "
        f"(ulimit -n; {used} are open, and the run keeps {_FD_RESERVE} for itself); open fewer connections, "
        f"or raise the limit (ulimit -n {need})")


def _free_files() -> Optional[int]:
    files = _open_files()
    if files is None:
        return None
    import resource

    used, soft, _ = files
    return None if soft == resource.RLIM_INFINITY else max(0, soft - used - _FD_RESERVE)


class NetworkSUT(LoopSUT):
    """What the network clients share: readiness, payloads, checks and the report.

    Args:
        target: the parsed ``--sut`` URL.
        net: the client options.
        pool_size: connections to open when ``net.connections`` is 0.
    """

    protocol = ""

    def __init__(self, target: Target, net: NetOptions, pool_size: int) -> None:
        self.target = target
        self.net = net
        self.connections = net.connections or pool_size
        self.redactor = net.redactor()
        self.check = net.check_responses
        self.ready_wait_s = 0.0
        self.metadata: Optional[ModelMetadata] = None
        self.payload_source = ""
        self.payload_bytes: List[int] = []
        self.checked = 0
        self.sink: Any = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.timeout_ns = ms_to_ns(net.timeout_ms)
        self._memo: Dict[bytes, Optional[str]] = {}

    # -- before the run
    def prepare(self) -> None:
        """Waits for readiness, reads metadata and serializes the requests.

        Raises:
            ValueError: the server never became ready, or the payload does not fit; the
                message says which and what to do.
        """
        raise NotImplementedError

    def wait_ready(self, probe, what: str) -> None:
        """Calls ``probe() -> (ready, detail)`` until it is ready or the readiness
        timeout passes."""
        start = time.monotonic()
        deadline = start + self.net.ready_timeout_s
        detail = ""
        while True:
            ready, detail = probe(max(0.2, min(2.0, deadline - time.monotonic())))
            if ready:
                self.ready_wait_s = time.monotonic() - start
                return
            if time.monotonic() >= deadline:
                raise ValueError(self.redactor.text(
                    f"{what} was not ready within {self.net.ready_timeout_s:g} s ({detail}); check that "
                    "the server is running there, or wait longer with --ready-timeout-s"))
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    # -- what goes in the result document (the ReportingSUT protocol)
    def histograms(self) -> Dict[str, NamedHistogram]:
        """The client's own histograms (none here; see :class:`loadgen.sut.ReportingSUT`)."""
        return {}

    def report(self) -> Dict[str, Any]:
        """What the result document says about the client side (redacted)."""
        out: Dict[str, Any] = {
            "target": self.target.url,
            "protocol": self.protocol,
            "connections": self.connections,
            "ready_wait_s": self.ready_wait_s,
            "response_check": self.check,
            "responses_checked": self.checked,
            "payload": {
                "source": self.payload_source,
                "distinct_requests": len(self.payload_bytes),
                "request_bytes_mean": sum(self.payload_bytes) / len(self.payload_bytes) if self.payload_bytes else 0.0,
            },
            "headers": [f"{k}: {v}" for k, v in self.net.headers],
        }
        if self.target.tls:  # --insecure: the server's certificate was not checked
            out["tls_verified"] = not self.net.insecure
        if self.metadata is not None:
            out["model_metadata"] = self.metadata.as_dict()
        return self.redactor.doc(out)

    def fail_query(self, qid: int, kind: str, message: str) -> None:
        """Fails query ``qid`` with error class ``kind``; secrets are redacted from the
        message."""
        self.sink.fail(qid, kind, self.redactor.text(message))

    def check_body(self, body: bytes, check) -> Optional[str]:
        """``check(body)``, remembered by the response's bytes: a check is a function of
        the bytes alone, and a model answering the same prepared requests mostly sends
        the same bytes back, so most responses are checked by one dictionary lookup."""
        self.checked += 1
        if len(body) > _MEMO_MAX_BYTES:
            return check(body)
        memo = self._memo
        try:
            return memo[body]
        except KeyError:
            problem = check(body)
            if len(memo) < _MEMO_MAX_ENTRIES:
                memo[body] = problem
            return problem


def http_get(url: str, headers: Sequence[Tuple[str, str]], timeout_s: float, ctx,
             max_bytes: int = defaults.MAX_RESPONSE_BYTES) -> Tuple[int, bytes, str]:
    """(status, body, problem) of a GET within ``timeout_s`` in all; status 0 and the
    problem when nothing usable answered (see :func:`~loadgen.net.blocking_get.blocking_get`:
    a deadline passed, a response that is not HTTP/1.x or is malformed, a body over
    ``max_bytes``); "HTTP <status>" as the problem of a status other than 2xx. The
    headers never follow a redirect to another origin."""
    try:
        r = blocking_get(url, headers, timeout_s=timeout_s, ssl_context=ctx, max_bytes=max_bytes)
    except GetError as e:
        return 0, b"", str(e)
    return r.status, r.body, "" if 200 <= r.status < 300 else f"HTTP {r.status}"


class HttpSUT(NetworkSUT):
    """A client over the lean HTTP/1.1 pool: requests are prepared bytes."""

    def __init__(self, target: Target, net: NetOptions, pool_size: int) -> None:
        super().__init__(target, net, pool_size)
        self.ssl = ssl_context(net.ca_file, net.insecure) if target.tls else None
        check_open_files(self.connections, f"--connections {net.connections}" if net.connections else
                         "the connections (one per query in flight: --concurrency, --max-in-flight)")
        self.requests: List[bytes] = []
        self.pool: Optional[HttpPool] = None
        self._request_type: Any = None  # http1.Request, once the pool is open
        self.stream_responses = False
        self.head_only = False

    def get_path(self, path: str, timeout_s: float) -> Tuple[int, bytes, str]:
        """(status, body, problem) of a GET of ``path`` on the target (:func:`http_get`),
        with the run's headers and TLS; for the protocol clients' readiness probes."""
        return http_get(self.target.http_base + path, self.net.headers, timeout_s, self.ssl,
                        self.net.max_response_bytes)

    def serialize(self, method: str, path: str, body: Optional[bytes],
                  headers: Sequence[Tuple[str, str]] = ()) -> bytes:
        """The bytes of one HTTP/1.1 request to the target, with the run's headers."""
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.target.host_header}",
                 "User-Agent: loadgen", "Accept: */*"]
        given = {k.lower() for k, _ in list(headers) + list(self.net.headers)}
        if body is not None:
            if "content-type" not in given:
                lines.append("Content-Type: application/json")
            lines.append(f"Content-Length: {len(body)}")
        lines += [f"{k}: {v}" for k, v in headers]
        lines += [f"{k}: {v}" for k, v in self.net.headers]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return data + body if body is not None else data

    def set_requests(self, requests: List[bytes], source: str) -> None:
        """Sets the prepared requests (each query sends one, by sample index); ``source``
        names where they came from, for the report and the error when there are none."""
        if not requests:
            raise ValueError(f"--payload: {source} gave no requests")
        self.requests = requests
        self.payload_bytes = [len(r) for r in requests]
        self.payload_source = source

    async def open_on_loop(self, loop, sink) -> None:
        from loadgen.net.http1 import HttpPool, Request

        self._request_type = Request  # issue_query's, without an import per query
        self.loop, self.sink = loop, sink
        self.pool = HttpPool(loop, self.target.host, self.target.port, self.connections,
                             ssl_context=self.ssl, server_hostname=self.target.host,
                             max_response_bytes=self.net.max_response_bytes)
        warm = min(self.connections, _WARM_MAX)
        free = _free_files()  # opening them all would leave the engine no file to run with
        self.warm_connections = await self.pool.warm(warm if free is None else min(warm, free))

    async def close_on_loop(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def issue_query(self, query_id: int, sample_index: int, scheduled_ns: int) -> None:
        pool = self.pool
        if pool is None:
            raise RuntimeError("issue_query before open_on_loop: the connection pool is not open")
        req = self._request_type(self.requests[sample_index % len(self.requests)], self, query_id, self.stream_responses,
                                 self.head_only)
        pool.submit(req, scheduled_ns + self.timeout_ns if self.timeout_ns else 0)

    def verdict(self, status: int, body: bytes) -> Optional[Tuple[str, str]]:
        """None for a good response, else its error (kind, message). A function of the
        response's bytes alone: the native client caches it by them."""
        raise NotImplementedError

    def on_response(self, req: Request, status: int, body: bytes, t: int) -> None:
        bad = self.verdict(status, body)
        if bad is not None:
            self.fail_query(req.query_id, *bad)
            return
        self.sink.complete(req.query_id, t)

    def on_error(self, req: Request, kind: str, message: str) -> None:
        self.fail_query(req.query_id, kind, message)

    def report(self) -> Dict[str, Any]:
        out = super().report()
        out["http_engine"] = "asyncio"  # the native client (native.py) says "native"
        if self.pool is not None:
            out.update(connects=self.pool.connects, connect_failures=self.pool.connect_failures,
                       connections_opened_before_run=self.warm_connections, bytes_sent=self.pool.bytes_sent)
        return out
