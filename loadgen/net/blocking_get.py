"""A blocking HTTP/1.1 GET on a plain socket, for the slow work before and beside the run:
readiness, metadata and statistics requests, metrics scrapes. Apart from the asyncio client
(:mod:`loadgen.net.http1`), so that a run on the native clients loads no asyncio.

Not urllib: its timeout bounds each socket read, not the request (a server that sends a
byte every half second holds it for ever), it parses responses with http.client's
exceptions (tracebacks for a callers' ValueError/OSError), and it sends every header on
to whatever host a redirect names. ssl is imported for an https:// URL only.
"""

from __future__ import annotations

import re
import socket
import sys
import time
import urllib.parse
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Sequence, Tuple

from loadgen import defaults

if TYPE_CHECKING:
    import ssl

__all__ = ["GetError", "GetResponse", "blocking_get", "same_origin"]

MAX_HEAD_BYTES = 64 * 1024
# "HTTP/1.x", a space, a status code of exactly three digits, then a reason (or nothing).
STATUS_LINE = re.compile(rb"HTTP/1\.[0-9] ([1-9][0-9][0-9])(?:[ \t]([^\r\n]*))?\r?")


_MAX_STATUS_LINE_BYTES = 8 * 1024
_MAX_HEADER_LINES = 100
_MAX_REDIRECTS = 5
_REDIRECT_STATUSES = (301, 302, 303, 307, 308)
_DEFAULT_PORTS = {"http": 80, "https": 443}


class GetError(ValueError):
    """A GET that got no usable response: the message says what was wrong (a reason,
    never a request header's value)."""


class GetResponse(NamedTuple):
    """A response to :func:`blocking_get`. ``headers`` has lower-case names (the last
    of a repeated header); ``url`` is the one that answered, after any redirects."""

    status: int
    reason: str
    headers: Dict[str, str]
    body: bytes
    url: str


def _origin(url: str) -> Tuple[str, str, int]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme, 0)


def same_origin(a: str, b: str) -> bool:
    """Whether two URLs have the same origin: scheme, host and port (a default port
    given or not)."""
    return _origin(a) == _origin(b)


def _without_user(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def blocking_get(url: str, headers: Sequence[Tuple[str, str]] = (), *, timeout_s: float,
                 ssl_context: Optional[ssl.SSLContext] = None,
                 max_bytes: int = defaults.MAX_RESPONSE_BYTES) -> GetResponse:
    """GETs ``url`` over HTTP/1.1, following up to five redirects, within ``timeout_s``
    in all (connects, TLS handshakes, every read; a server that answers slowly fails at
    the deadline however it trickles).

    ``headers`` go only to the URL's own origin (scheme, host and port): a redirect to
    another origin is followed without them (they may hold credentials: Authorization,
    Cookie, an API key), and a later redirect back does not restore them. A user part in
    ``url`` is not sent: the caller makes it a header.

    Args:
        url: an http:// or https:// URL.
        headers: request headers, (name, value).
        timeout_s: bound on the whole GET, redirects included.
        ssl_context: for https (default: the system's verified context).
        max_bytes: most bytes of body; a longer body fails.

    Returns:
        The final response, whatever its status (a redirect past the limit fails).

    Raises:
        GetError: nothing usable answered: connecting failed, the deadline passed, the
            response was not HTTP/1.x (an HTTP/2 or gRPC port), was malformed (a status
            code of other than three digits, a line or head over its limit, more than 100
            header lines), ended early, or its body was over ``max_bytes``.
    """
    deadline = time.monotonic() + timeout_s
    current = _without_user(url)
    own = True  # still at the URL's own origin: the caller's headers may go
    for hop in range(_MAX_REDIRECTS + 1):
        own = own and same_origin(current, url)
        response = _get_once(current, list(headers) if own else [], deadline, timeout_s, ssl_context,
                             max_bytes)
        location = response.headers.get("location")
        if response.status not in _REDIRECT_STATUSES or not location:
            return response
        if hop == _MAX_REDIRECTS:
            break
        try:
            current = _without_user(urllib.parse.urljoin(current, location.strip()))
            scheme = urllib.parse.urlsplit(current).scheme.lower()
        except ValueError:
            raise GetError(f"HTTP {response.status} redirect to a malformed URL") from None
        if scheme not in ("http", "https"):
            raise GetError(f"HTTP {response.status} redirect to a {scheme or 'relative'}: URL, not http(s)")
    raise GetError(f"more than {_MAX_REDIRECTS} redirects")


class _Reader:
    """A socket's bytes, read into ``buf`` under one deadline for the whole GET."""

    def __init__(self, sock: socket.socket, deadline: float, timeout_s: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.buf = bytearray()

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise GetError(f"no complete response within {self.timeout_s:g} s")
        return left

    def more(self) -> bool:
        """Reads what has come (waiting up to the deadline); False at the end of the stream."""
        self.sock.settimeout(self.left())
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            raise GetError(f"no complete response within {self.timeout_s:g} s") from None
        if not data:
            return False
        self.buf += data
        return True


def _get_once(url: str, headers: List[Tuple[str, str]], deadline: float, timeout_s: float,
              ssl_context: Optional[ssl.SSLContext], max_bytes: int) -> GetResponse:
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as e:
        raise GetError(f"not a valid URL ({e})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not host:
        raise GetError("not an http:// or https:// URL with a host")
    port = port or _DEFAULT_PORTS[scheme]
    target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    given = {k.lower() for k, _ in headers}
    lines = [f"GET {target} HTTP/1.1"]
    if "host" not in given:
        lines.append(f"Host: {parts.netloc.rsplit('@', 1)[-1]}")
    lines += [f"{k}: {v}" for k, v in (("User-Agent", "loadgen"), ("Accept", "*/*"),
                                        ("Accept-Encoding", "identity")) if k.lower() not in given]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() != "connection"]
    lines.append("Connection: close")
    try:
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError:
        raise GetError("a request header or the URL is not Latin-1 text") from None
    left = deadline - time.monotonic()
    if left <= 0:
        raise GetError(f"no complete response within {timeout_s:g} s")
    sock: Optional[socket.socket] = None
    try:
        sock = socket.create_connection((host, port), timeout=left)
        if scheme == "https":
            import ssl

            ctx = ssl_context if ssl_context is not None else ssl.create_default_context()
            sock.settimeout(max(deadline - time.monotonic(), 0.001))  # the handshake's deadline, in all
            sock = ctx.wrap_socket(sock, server_hostname=host)
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.sendall(request)
        reader = _Reader(sock, deadline, timeout_s)
        status, reason, response_headers = _read_head(reader)
        if status in _REDIRECT_STATUSES and response_headers.get("location"):
            body = b""  # not read: the connection closes
        else:
            body = _read_body(reader, status, response_headers, max_bytes)
        return GetResponse(status, reason, response_headers, body, url)
    except socket.timeout:
        raise GetError(f"no complete response within {timeout_s:g} s") from None
    except OSError as e:
        ssl_module = sys.modules.get("ssl")  # an SSLError comes only where ssl was imported
        if ssl_module is not None and isinstance(e, ssl_module.SSLError):
            raise GetError(f"TLS: {e}") from None
        raise GetError(e.strerror or f"{type(e).__name__}: {e}") from None
    finally:
        if sock is not None:
            sock.close()


def _not_http1(buf: bytearray) -> GetError:
    if buf[:1] == b"\x00" or (len(buf) > 3 and buf[3] == 0x04):  # an HTTP/2 frame: a SETTINGS first
        return GetError("the server answered with HTTP/2 frames, not HTTP/1.1 (an HTTP/2-only port, such as "
                        "gRPC's? a gRPC server takes a grpc:// URL)")
    return GetError(f"the server's answer is not HTTP/1.x: {bytes(buf[:40])!r}")


def _read_head(r: _Reader) -> Tuple[int, str, Dict[str, str]]:
    """The status, reason and headers of the response (informational ones skipped)."""
    buf = r.buf
    while True:
        while True:  # the status line
            if not b"HTTP/"[:len(buf)] == bytes(buf[:5]):
                raise _not_http1(buf)
            end = buf.find(b"\n")
            if end >= 0:
                break
            if len(buf) > _MAX_STATUS_LINE_BYTES:
                raise GetError(f"a status line longer than {_MAX_STATUS_LINE_BYTES} bytes")
            if not r.more():
                raise GetError("the connection closed before the status line was complete" if buf else
                               "the connection closed before any response")
        if end > _MAX_STATUS_LINE_BYTES:
            raise GetError(f"a status line longer than {_MAX_STATUS_LINE_BYTES} bytes")
        m = STATUS_LINE.fullmatch(bytes(buf[:end]))
        if m is None:
            raise GetError(f"a malformed status line (not 'HTTP/1.x' and a 3-digit code): {bytes(buf[:40])!r}")
        headers: Dict[str, str] = {}
        pos = end + 1
        count = 0
        while True:
            end = buf.find(b"\n", pos)
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise GetError(f"a response head longer than {MAX_HEAD_BYTES // 1024} KiB")
                if not r.more():
                    raise GetError("the connection closed before the response head was complete")
                continue
            line = bytes(buf[pos:end]).rstrip(b"\r")
            pos = end + 1
            if pos > MAX_HEAD_BYTES:
                raise GetError(f"a response head longer than {MAX_HEAD_BYTES // 1024} KiB")
            if not line:
                break
            count += 1
            if count > _MAX_HEADER_LINES:
                raise GetError(f"more than {_MAX_HEADER_LINES} header lines in the response")
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise GetError(f"a malformed header line (number {count}) in the response")
            headers[name.decode("latin-1").lower()] = value.strip().decode("latin-1")
        del buf[:pos]
        status = int(m.group(1))
        if status >= 200:
            return status, (m.group(2) or b"").decode("latin-1").strip(), headers


def _too_large(max_bytes: int) -> GetError:
    return GetError(f"the response is over --max-response-bytes ({max_bytes} bytes)")


def _read_body(r: _Reader, status: int, headers: Dict[str, str], max_bytes: int) -> bytes:
    buf = r.buf
    if status in (204, 304):
        return b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _read_chunked(r, max_bytes)
    length = headers.get("content-length")
    if length is not None:
        if not (length.isascii() and length.isdigit()):
            raise GetError(f"Content-Length {length[:20]!r} is not a non-negative integer")
        n = int(length)
        if n > max_bytes:
            raise _too_large(max_bytes)
        while len(buf) < n:
            if not r.more():
                raise GetError(f"the connection closed after {len(buf)} of the body's {n} bytes")
        return bytes(buf[:n])
    while r.more():  # the body ends where the server closes
        if len(buf) > max_bytes:
            raise _too_large(max_bytes)
    if len(buf) > max_bytes:
        raise _too_large(max_bytes)
    return bytes(buf)


def _read_chunked(r: _Reader, max_bytes: int) -> bytes:
    buf = r.buf
    body = bytearray()
    closed = "the connection closed before the chunked body was complete"
    while True:
        end = buf.find(b"\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise GetError("a chunk-size line longer than 64 KiB")
            if not r.more():
                raise GetError(closed)
            continue
        line = bytes(buf[:end]).split(b";", 1)[0].strip()
        if not line or line.strip(b"0123456789abcdefABCDEF"):
            raise GetError(f"a bad chunk size {line[:20]!r}")
        size = int(line, 16)
        if size == 0:  # the last chunk: trailers (if any) are not needed
            return bytes(body)
        if len(body) + size > max_bytes:
            raise _too_large(max_bytes)
        del buf[:end + 1]
        while len(buf) < size + 2:
            if not r.more():
                raise GetError(closed)
        if buf[size:size + 2] != b"\r\n":
            raise GetError("a chunk not followed by CRLF")
        body += buf[:size]
        del buf[:size + 2]
