"""A lean HTTP/1.1 client on asyncio transports (uvloop when installed), for the hot path.

Requests are prepared bytes (request line, headers and body serialized before the timed
run); sending one is a single ``transport.write``. Responses are parsed as they arrive:
``Content-Length`` bodies, chunked bodies (with each piece handed to a streaming sink as
it arrives, stamped with its receive time), and bodies delimited by the connection's
close. Connections are kept alive and reused; a pool holds at most ``size`` of them, and
requests wait in order for a free one.

A response body is bounded (``max_response_bytes``): a collected body past it (a
``Content-Length`` over it is refused at once, a chunked or close-delimited body when it
gets there) fails its request as ``response_too_large`` and closes the connection, so a
server that sends without end costs memory up to the bound, not more. A streamed body is
not collected; its handler bounds what it keeps (per event) and raises
:class:`ResponseTooLarge` from ``on_data`` to fail the request the same way. The head,
each chunk-size line and the trailers are bounded by 64 KiB each.

Everything here is callback-driven: no coroutine or task per request. A request ends in
exactly one call of its handler's ``on_response`` or ``on_error``, unless it timed out
or the pool was closed (then in neither).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from typing import Deque, List, Optional

from loadgen import defaults
from loadgen.units import ns_to_s
from loadgen.net.blocking_get import MAX_HEAD_BYTES, STATUS_LINE, GetError, GetResponse, blocking_get, same_origin

__all__ = ["GetError", "GetResponse", "HttpPool", "Request", "ResponseTooLarge", "blocking_get",
           "connect_error_kind", "read_limited", "same_origin"]

_monotonic_ns = time.monotonic_ns
_HEAD, _BODY_LENGTH, _BODY_CHUNKED, _BODY_EOF = range(4)
_MAX_HEAD_BYTES = MAX_HEAD_BYTES
_STATUS_LINE = STATUS_LINE


def connect_error_kind(exc: BaseException) -> str:
    """The error class of a failed connect."""
    if isinstance(exc, ConnectionRefusedError):
        return "connect_refused"
    if isinstance(exc, ssl.SSLError):
        return "tls_error"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "connect_timeout"
    return "connect_error"


def read_limited(response, max_bytes: int) -> Optional[bytes]:
    """The body of a blocking (``http.client``/``urllib``) response, or None when it is
    longer than ``max_bytes``; read in pieces of at most 1 MiB, so that neither a large
    limit nor a large body is allocated up front."""
    pieces: List[bytes] = []
    total = 0
    while True:
        piece = response.read(min(1 << 20, max_bytes + 1 - total))
        if not piece:
            return b"".join(pieces)
        total += len(piece)
        if total > max_bytes:
            return None
        pieces.append(piece)


class ResponseTooLarge(Exception):
    """A response over the size limit; the request fails as ``response_too_large`` and
    its connection is closed. A streaming handler raises it from ``on_data`` when what it
    must hold at once (an event) is over the limit."""


class Request:
    """One request in flight, or waiting for a connection.

    Args:
        data: the whole request, serialized.
        handler: gets ``on_response(req, status, body, t_ns)`` once the response is
            complete (for a streamed request the body is empty: the pieces went to
            ``on_data``), or ``on_error(req, kind, message)`` if it fails; for a streamed
            request also ``on_data(req, piece, t_ns)`` for each piece of body as it arrives.
        query_id: the query this request serves (for the handler).
        stream: hand the body to ``handler.on_data`` as it arrives instead of collecting it.
        head_only: the request is a HEAD (its response has no body).
    """

    __slots__ = ("data", "handler", "query_id", "stream", "head_only", "conn", "timer", "finished")

    def __init__(self, data: bytes, handler, query_id: int = 0, stream: bool = False,
                 head_only: bool = False) -> None:
        self.data = data
        self.handler = handler
        self.query_id = query_id
        self.stream = stream
        self.head_only = head_only
        self.conn: Optional[_Connection] = None
        self.timer: Optional[asyncio.TimerHandle] = None
        self.finished = False


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self, pool: "HttpPool") -> None:
        self.pool = pool
        self.transport: Optional[asyncio.Transport] = None
        self.request: Optional[Request] = None
        self.closed = False
        self._buf = bytearray()
        self._state = _HEAD
        self._status = 0
        self._remaining = 0
        self._body: List[bytes] = []
        self._keep_alive = True
        self._got_bytes = False
        self._body_bytes = 0

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.closed = True
        self.pool._forget(self)
        req = self.request
        if req is None:
            return
        if self._state == _BODY_EOF and exc is None:
            self._finish(_monotonic_ns())
            return
        self.request = None
        if isinstance(exc, ConnectionResetError) or exc is None:
            what = "reset by peer" if exc is not None else "closed by the server"
            phase = "before the response was complete" if self._got_bytes else "before any response"
            self.pool._fail(req, "connection_reset", f"connection {what} {phase}")
        else:
            self.pool._fail(req, "connection_error", f"{type(exc).__name__}: {exc}")

    def data_received(self, data: bytes) -> None:
        # Parsed at once, stamped when the loop hands the bytes over. (Stamping every
        # socket's bytes first and parsing after would date a burst of completions
        # earlier, but the closed loop's next queries would then carry the whole
        # burst's parsing as issue delay; measured, TTFT agreed less with the truth.)
        t = _monotonic_ns()
        if self.request is None:  # bytes nobody asked for: the connection is unusable
            self._close()
            return
        self._got_bytes = True
        buf = self._buf
        buf += data
        try:
            self._parse(buf, t)
        except ValueError as e:
            self._abort("invalid_response", f"malformed HTTP response: {e}")
        except ResponseTooLarge as e:
            self._abort("response_too_large", str(e))

    def _abort(self, kind: str, message: str) -> None:
        """Fails the request in progress and closes the connection (what is left of the
        response cannot be skipped reliably)."""
        req = self.request
        self.request = None
        self._buf.clear()
        self._body = []
        self._close()
        if req is not None:
            self.pool._fail(req, kind, message)

    # -- sending
    def send(self, req: Request) -> None:
        self.request = req
        req.conn = self
        self._state = _HEAD
        self._body = []
        self._body_bytes = 0
        self._got_bytes = False
        if self.transport is None:  # the pool only sends on connections it has connected
            raise RuntimeError("HTTP request sent on a connection that is not connected")
        self.transport.write(req.data)

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- parsing
    def _parse(self, buf: bytearray, t: int) -> None:
        while True:
            req = self.request
            if req is None:
                return
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > _MAX_HEAD_BYTES:
                        raise ValueError("response headers longer than 64 KiB")
                    return
                head = bytes(buf[:end])
                del buf[:end + 4]
                self._head(req, head)
            elif state == _BODY_LENGTH:
                n = min(self._remaining, len(buf))
                if n:
                    self._piece(req, bytes(buf[:n]), t)
                    del buf[:n]
                    self._remaining -= n
                if self._remaining:
                    return
                self._finish(t)
            elif state == _BODY_CHUNKED:
                if self._remaining == 0:  # at a chunk-size line
                    end = buf.find(b"\r\n")
                    if end < 0:
                        if len(buf) > _MAX_HEAD_BYTES:
                            raise ValueError("chunk-size line longer than 64 KiB")
                        return
                    line = bytes(buf[:end]).split(b";", 1)[0].strip()
                    # Hex digits only: int() would also take a sign, "0x" or underscores.
                    if not line or line.strip(b"0123456789abcdefABCDEF"):
                        raise ValueError(f"bad chunk size {line[:20]!r}")
                    size = int(line, 16)
                    if size == 0:  # last chunk; skip trailers up to the blank line
                        tail = buf.find(b"\r\n\r\n", end)
                        if tail < 0:
                            if len(buf) > _MAX_HEAD_BYTES:
                                raise ValueError("chunked trailers longer than 64 KiB")
                            return
                        del buf[:tail + 4]
                        self._finish(t)
                        continue
                    if not req.stream and self._body_bytes + size > self.pool.max_response_bytes:
                        raise ResponseTooLarge(self._too_large(f"a chunk of {size} bytes after "
                                                               f"{self._body_bytes} bytes of body"))
                    del buf[:end + 2]
                    self._remaining = size + 2  # data and its CRLF
                take = min(self._remaining - 2, len(buf)) if self._remaining > 2 else 0
                if take > 0:
                    self._piece(req, bytes(buf[:take]), t)
                    del buf[:take]
                    self._remaining -= take
                if self._remaining <= 2:
                    if len(buf) < self._remaining:
                        return
                    if buf[:self._remaining] != b"\r\n"[2 - self._remaining:]:
                        raise ValueError("chunk not followed by CRLF")
                    del buf[:self._remaining]
                    self._remaining = 0
                else:
                    return
            else:  # _BODY_EOF: everything until the server closes
                if buf:
                    self._piece(req, bytes(buf), t)
                    buf.clear()
                return

    def _head(self, req: Request, head: bytes) -> None:
        first = head.split(b"\n", 1)[0]
        m = _STATUS_LINE.fullmatch(first)
        if m is None:  # a code of other than three digits would be misread as one
            raise ValueError(f"status line {first[:40]!r}")
        status = int(m.group(1))
        if 100 <= status < 200:  # informational (100 Continue): the real head follows
            return
        self._status = status
        lower = head.lower()
        self._keep_alive = not (b"\r\nconnection: close" in lower or head.startswith(b"HTTP/1.0"))
        if req.head_only or status in (204, 304):
            self._state = _HEAD
            self._finish(_monotonic_ns())
            return
        if b"\r\ntransfer-encoding:" in lower and b"chunked" in lower.split(b"\r\ntransfer-encoding:", 1)[1].split(b"\r\n", 1)[0]:
            self._state = _BODY_CHUNKED
            self._remaining = 0
            return
        i = lower.find(b"\r\ncontent-length:")
        if i >= 0:
            value = lower[i + 17:].split(b"\r\n", 1)[0].strip()
            # Digits only: int() would also take a sign, spaces or underscores, and a
            # negative length must not read as an empty body.
            if not value.isdigit() or not value.isascii():
                raise ValueError(f"Content-Length {value[:20]!r} is not a non-negative integer")
            self._remaining = int(value)
            if not req.stream and self._remaining > self.pool.max_response_bytes:
                raise ResponseTooLarge(self._too_large(f"Content-Length {self._remaining}"))
            self._state = _BODY_LENGTH
            if self._remaining == 0:
                self._finish(_monotonic_ns())
            return
        self._state = _BODY_EOF
        self._keep_alive = False

    def _piece(self, req: Request, data: bytes, t: int) -> None:
        if req.stream:
            req.handler.on_data(req, data, t)
        else:
            self._body_bytes += len(data)
            if self._body_bytes > self.pool.max_response_bytes:
                raise ResponseTooLarge(self._too_large(f"{self._body_bytes} bytes of body so far"))
            self._body.append(data)

    def _too_large(self, what: str) -> str:
        return (f"HTTP {self._status} response over --max-response-bytes "
                f"({self.pool.max_response_bytes} bytes): {what}; the connection was closed")

    def _finish(self, t: int) -> None:
        req = self.request
        self.request = None
        self._state = _HEAD
        body = b"".join(self._body) if self._body else b""
        self._body = []
        if not self._keep_alive or self._buf:  # bytes past the response: out of step
            self._close()
        if req is None:  # abandoned while its response was read: nobody to tell
            return
        self.pool._done(req, self, self._status, body, t)


class HttpPool:
    """Up to ``size`` keep-alive connections to one server.

    Args:
        loop: the event loop everything runs on.
        host, port: the server.
        size: most connections open at once (>= 1).
        ssl_context: for https; None for plain HTTP.
        server_hostname: name checked against the certificate (default: host).
        connect_timeout_s: bound on each connect.
        max_response_bytes: most bytes of a collected response body (see the module's
            docstring); a larger one fails its request as ``response_too_large``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, host: str, port: int, size: int,
                 ssl_context: Optional[ssl.SSLContext] = None, server_hostname: Optional[str] = None,
                 connect_timeout_s: float = 10.0, max_response_bytes: int = defaults.MAX_RESPONSE_BYTES) -> None:
        if size < 1:
            raise ValueError(f"connection pool size must be >= 1, got {size}")
        if max_response_bytes < 1:
            raise ValueError(f"max_response_bytes must be >= 1, got {max_response_bytes}")
        self.max_response_bytes = max_response_bytes
        self.loop = loop
        self.host, self.port, self.size = host, port, size
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname if ssl_context is not None else None
        self.connect_timeout_s = connect_timeout_s
        self._idle: Deque[_Connection] = collections.deque()
        self._waiting: Deque[Request] = collections.deque()
        self._open = 0  # connections open or being opened
        self._conns: set = set()
        self.connects = 0
        self.connect_failures = 0
        self.bytes_sent = 0
        self.closing = False

    def submit(self, req: Request, timeout_at_ns: int = 0) -> None:
        """Sends ``req`` on a free connection, opening one if the pool has room, else
        queues it. With ``timeout_at_ns`` (monotonic ns), a request not done by then is
        abandoned (its connection closed) and ends in neither callback."""
        if timeout_at_ns:
            delay = ns_to_s(timeout_at_ns - _monotonic_ns())
            req.timer = self.loop.call_later(max(delay, 0.0), self._expire, req)
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                self.bytes_sent += len(req.data)
                conn.send(req)
                return
        self._waiting.append(req)
        if self._open < self.size:
            self._open += 1
            self.loop.create_task(self._connect())

    async def warm(self, count: int) -> int:
        """Opens up to ``count`` connections now (before the timed run, as a steady client
        would have them); returns how many opened. Failures are not errors here: requests
        that find no connection open their own and count their failures."""
        count = min(count, self.size - self._open)
        self._open += count
        results = await asyncio.gather(*(self._connect(warming=True) for _ in range(count)))
        return sum(results)

    async def _connect(self, warming: bool = False) -> bool:
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _Connection(self), self.host, self.port,
                                            ssl=self.ssl_context, server_hostname=self.server_hostname),
                self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as e:
            self._open -= 1
            if warming:
                return False
            self.connect_failures += 1
            kind = connect_error_kind(e)
            # Fail one waiting request per failed connect, so that a dead server fails
            # requests at the rate they arrive instead of all at once or never.
            while self._waiting:
                req = self._waiting.popleft()
                if not req.finished:
                    self._fail(req, kind, f"connecting to {self.host}:{self.port}: {e.strerror or e}"
                               if isinstance(e, OSError) and e.strerror else
                               f"connecting to {self.host}:{self.port}: {type(e).__name__}: {e}")
                    break
            if self._waiting and self._open < self.size and not self.closing:
                self._open += 1
                self.loop.create_task(self._connect())
            return False
        self.connects += 1
        self._conns.add(conn)
        if self.closing:
            conn._close()
            return False
        self._release(conn)
        return True

    def _release(self, conn: _Connection) -> None:
        if conn.closed:
            return
        waiting = self._waiting
        while waiting:
            req = waiting.popleft()
            if not req.finished:
                self.bytes_sent += len(req.data)
                conn.send(req)
                return
        self._idle.append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._open -= 1
        self._conns.discard(conn)
        try:
            self._idle.remove(conn)
        except ValueError:
            pass
        if self._waiting and self._open < self.size and not self.closing:
            self._open += 1
            self.loop.create_task(self._connect())

    def _done(self, req: Request, conn: _Connection, status: int, body: bytes, t: int) -> None:
        self._release(conn)
        if req.finished:
            return
        req.finished = True
        if req.timer is not None:
            req.timer.cancel()
        req.handler.on_response(req, status, body, t)

    def _fail(self, req: Request, kind: str, message: str) -> None:
        if req.finished:
            return
        req.finished = True
        if req.timer is not None:
            req.timer.cancel()
        req.handler.on_error(req, kind, message)

    def _expire(self, req: Request) -> None:
        if req.finished:
            return
        req.finished = True
        conn = req.conn
        if conn is not None and conn.request is req:
            conn.request = None
            conn._close()  # its response may still come: the connection cannot be reused

    def close(self) -> None:
        """Closes every connection, in use or not (the end of a run); requests still in
        flight or waiting end in neither callback."""
        self.closing = True
        self._waiting.clear()
        for conn in list(self._conns):
            if conn.request is not None:
                conn.request.finished = True
                conn.request = None
            conn._close()
        self._idle.clear()
