"""The native HTTP/1.1 response parser (csrc/http_parser.cc, loadgen._core.HttpResponseParser)
against the asyncio client's parser (loadgen/net/http1.py): each rule on its own, then a
differential property test. Both parsers get the same bytes split the same way and must
agree on the outcome: the status, body, keep-alive and bytes left past the response, or
the error kind and message, or the connection's close completing the response."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import List, Optional, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen import _core
from loadgen.net import http1

LIMIT = 64 * 1024  # http1.py's bound on the head, a chunk-size line and the trailers
CORPUS = pathlib.Path(__file__).resolve().parents[1] / "fuzz" / "corpus"
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass
class Outcome:
    kind: str  # "response", or the error kind
    status: int = 0
    body: bytes = b""
    keep_alive: bool = False
    left: int = 0  # bytes fed past the response
    message: str = ""


# ---------------------------------------------------------------- the asyncio parser


class _Handler:
    def __init__(self) -> None:
        self.ends: List[Outcome] = []
        self.streamed: List[bytes] = []

    def on_data(self, req, piece: bytes, t: int) -> None:
        self.streamed.append(piece)

    def on_response(self, req, status: int, body: bytes, t: int) -> None:
        self.ends.append(Outcome("response", status, body))

    def on_error(self, req, kind: str, message: str) -> None:
        self.ends.append(Outcome(kind, message=message))


class _Transport:
    def __init__(self) -> None:
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class _Pool:
    """What a connection calls back into, without a loop or sockets."""

    _done = http1.HttpPool._done
    _fail = http1.HttpPool._fail

    def __init__(self, max_response_bytes: int) -> None:
        self.max_response_bytes = max_response_bytes

    def _release(self, conn) -> None:
        pass

    def _forget(self, conn) -> None:
        pass


def python_outcome(pieces: Sequence[bytes], head_only=False, stream=False, max_body=64 << 20) -> Outcome:
    handler = _Handler()
    conn = http1._Connection(_Pool(max_body))  # type: ignore[arg-type]
    conn.connection_made(_Transport())
    conn.send(http1.Request(b"GET / HTTP/1.1\r\n\r\n", handler, stream=stream, head_only=head_only))
    left = 0
    for i, piece in enumerate(pieces):
        conn.data_received(piece)
        if handler.ends:
            left = len(conn._buf) + sum(len(p) for p in pieces[i + 1:])
            break
    else:
        conn.connection_lost(None)
    assert len(handler.ends) == 1, handler.ends
    out = handler.ends[0]
    if out.kind == "response":
        out.keep_alive = conn._keep_alive
        out.left = left
        if stream:
            assert out.body == b""
            out.body = b"".join(handler.streamed)
    return out


# ---------------------------------------------------------------- the native parser


def native_outcome(pieces: Sequence[bytes], head_only=False, stream=False, max_body=64 << 20,
                   parser: Optional[_core.HttpResponseParser] = None) -> Outcome:
    p = parser or _core.HttpResponseParser(max_head_bytes=LIMIT, max_body_bytes=max_body)
    streamed: List[bytes] = []
    p.set_body_callback(streamed.append if stream else None)
    p.start(head_only)
    for i, piece in enumerate(pieces):
        result, consumed = p.feed(piece)
        assert 0 <= consumed <= len(piece)
        if result == "error":
            assert p.error_kind in ("invalid_response", "response_too_large")
            return Outcome(p.error_kind, message=p.error_message)
        if result == "complete":
            left = len(piece) - consumed + sum(len(q) for q in pieces[i + 1:])
            break
        assert result == "need_more" and consumed == len(piece), (result, consumed)
    else:
        if not p.eof_completes():  # what the client says of a close in the middle
            phase = "before the response was complete" if p.got_bytes else "before any response"
            return Outcome("connection_reset", message=f"connection closed by the server {phase}")
        left = 0
    if stream:
        assert p.body == b""
    return Outcome("response", p.status, b"".join(streamed) if stream else p.body, p.keep_alive, left)


def both(pieces, **kw) -> Outcome:
    """The outcome both parsers agree on (the test fails where they differ)."""
    if isinstance(pieces, bytes):
        pieces = [pieces]
    native = native_outcome(pieces, **kw)
    python = python_outcome(pieces, **kw)
    assert native == python, f"native {native} != python {python} for {pieces!r} {kw}"
    return native


def bytewise(data: bytes) -> List[bytes]:
    return [data[i:i + 1] for i in range(len(data))]


def ok(status=200, body=b"", keep_alive=True, left=0) -> Outcome:
    return Outcome("response", status, body, keep_alive, left)


def invalid(what: str) -> Outcome:
    return Outcome("invalid_response", message=f"malformed HTTP response: {what}")


def too_large(status: int, limit: int, what: str) -> Outcome:
    return Outcome("response_too_large", message=f"HTTP {status} response over --max-response-bytes "
                                                 f"({limit} bytes): {what}; the connection was closed")


# ---------------------------------------------------------------- the rules, one by one

JSON = b'{"model_name":"m","outputs":[{"name":"y","datatype":"FP32","shape":[1],"data":[0.5]}]}'
OK_LENGTH = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
             % (len(JSON), JSON))
OK_CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"%x\r\n%s\r\n0\r\n\r\n" % (len(JSON), JSON))


@pytest.mark.parametrize("split", ["whole", "bytewise"])
def test_content_length_and_chunked_bodies_whole_or_byte_by_byte(split):
    cut = (lambda d: [d]) if split == "whole" else bytewise
    assert both(cut(OK_LENGTH)) == ok(body=JSON)
    assert both(cut(OK_CHUNKED)) == ok(body=JSON)
    assert both(cut(OK_LENGTH + b"HTTP/1.1")) == ok(body=JSON, left=8)
    assert both(cut(OK_CHUNKED + b"xy")) == ok(body=JSON, left=2)


@pytest.mark.parametrize("line,status", [
    (b"HTTP/1.1 404 Not Found", 404), (b"HTTP/1.1 200", 200), (b"HTTP/1.1 999 x", 999),
    (b"HTTP/1.1 200\tOK", 200), (b"HTTP/1.1 204 ", 204),
    (b"HTTP/1.1 +20 X", None), (b"HTTP/1.1  20X", None), (b"HTTP/1.1 1_0 X", None), (b"HTTP/1.1 -1 X", None),
    (b"HTTP/1.1 20", None), (b"HTTP/1.1 7\t", None), (b"HTTP/1.1 2000 OK", None), (b"HTTP/1.1 099 X", None),
    (b"HTTP/1.1 " + b"9" * 23 + b" OK", None), (b"HTTP/1.1 200OK", None), (b"HTTP/1.1 200 a\rb", None),
    (b"HTTP/1.1 2x0 OK", None), (b"HTTP/1.1 _10", None), (b"HTTP/1.1 + 1", None), (b"HTTP/1.1 ", None),
    (b"HTTP/2.0 200 OK", None), (b"ICY 200 OK", None), (b"http/1.1 200 OK", None), (b"HTTP/1.", None),
    (b"HTTP/1.x 200 OK", None), (b"HTTP/1.1 2\x000", None), (b"HTTP/1.1 \xa01'", None), (b"HTTP/1.1 1__", None),
])
def test_the_status_code_is_exactly_three_digits(line, status):
    # A code of more or fewer digits (23 nines, "20", "+20") was read from bytes 9 to 11
    # as a status (http_999, 20); it is a malformed response now, in both parsers.
    head = line + b"\r\nContent-Length: 0"
    out = both(head + b"\r\n\r\n")
    first = (line + b"\r")[:40]  # the message shows the line up to its LF
    assert out == (invalid(f"status line {first!r}") if status is None else ok(status))


def test_status_line_in_the_message_is_cut_at_40_bytes():
    line = b"HTTP/1.1 OK " + b"'\"" * 30
    assert both(line + b"\r\n\r\n") == invalid(f"status line {line[:40]!r}")


def test_informational_heads_are_skipped_even_when_split_anywhere():
    data = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early\r\nLink: x\r\n\r\n" + OK_LENGTH
    assert both(data) == ok(body=JSON)
    assert both(bytewise(data)) == ok(body=JSON)
    # Only the 1xx arrives before the close: bytes seen, response incomplete.
    assert both(b"HTTP/1.1 100 Continue\r\n\r\n") == Outcome(
        "connection_reset", message="connection closed by the server before the response was complete")


@pytest.mark.parametrize("head,keep_alive", [
    (b"HTTP/1.1 200 OK\r\nConnection: close", False), (b"HTTP/1.1 200 OK\r\nCONNECTION: Close", False),
    (b"HTTP/1.1 200 OK\r\nconnection: closed", False), (b"HTTP/1.1 200 OK\r\nConnection:close", True),
    (b"HTTP/1.1 200 OK\r\nConnection: keep-alive", True), (b"HTTP/1.0 200 OK", False),
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive", False), (b"HTTP/1.1 200 Connection: close", True),
])
def test_keep_alive_is_off_on_connection_close_or_http_1_0(head, keep_alive):
    assert both(head + b"\r\nContent-Length: 2\r\n\r\nab") == ok(body=b"ab", keep_alive=keep_alive)


def test_head_requests_and_204_304_have_no_body():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    assert both(head + b"hello", head_only=True) == ok(left=5)
    assert both(b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n", head_only=True) == ok()
    assert both(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello") == ok(204, left=5)
    assert both(b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n") == ok(304)


@pytest.mark.parametrize("te,chunked", [
    (b"chunked", True), (b"gzip, chunked", True), (b" CHUNKED ", True), (b"notchunked", True),
    (b"identity", False), (b"chunk", False),
])
def test_chunked_when_the_first_transfer_encoding_line_names_it(te, chunked):
    framed = b"2\r\nab\r\n0\r\n\r\n" if chunked else b"ab"
    data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: " + te + b"\r\nContent-Length: 2\r\n\r\n" + framed
    assert both(data) == ok(body=b"ab")
    second = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n\r\nab"
    assert both(second) == ok(body=b"ab", keep_alive=False)  # neither framing: until the close


def test_chunk_sizes_extensions_trailers_and_leading_zeros():
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    body = b"A;name=v\r\n0123456789\r\n0001 ; x\r\nZ\r\n00\r\nTrailer: 1\r\nOther: 2\r\n\r\n"
    assert both(head + body) == ok(body=b"0123456789Z")
    assert both(bytewise(head + body)) == ok(body=b"0123456789Z")
    assert both([head + b"3\r\nabc\r", b"\n0\r\n\r", b"\n"]) == ok(body=b"abc")


@pytest.mark.parametrize("size", [b"0x5", b"-5", b"+5", b"5_0", b"", b"zz", b" ", b"\xff5"])
def test_a_chunk_size_must_be_hex_digits(size):
    data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\nhello\r\n0\r\n\r\n"
    assert both(data) == invalid(f"bad chunk size {size.strip()[:20]!r}")


@pytest.mark.parametrize("after", [b"XY", b"\rX", b"\n\r", b" \r\n", b"X\n", b"\n\n"])
def test_a_chunk_must_be_followed_by_crlf(after):
    data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc" + after + b"0\r\n\r\n"
    assert both(data) == invalid("chunk not followed by CRLF")
    assert both(bytewise(data)) == invalid("chunk not followed by CRLF")


@pytest.mark.parametrize("value", [b"-1", b"+5", b"5x", b"", b"1_0", b"5 5", b"\xd9\xa3", b"0x10", b"ABC"])
def test_content_length_must_be_ascii_digits(value):
    data = b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n\r\nhello"
    assert both(data) == invalid(f"Content-Length {value.lower().strip()[:20]!r} is not a non-negative integer")


def test_content_length_spaces_leading_zeros_and_the_first_header_counts():
    assert both(b"HTTP/1.1 200 OK\r\nContent-Length:\t 0003 \r\n\r\nabcd") == ok(body=b"abc", left=1)
    assert both(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\nContent-Length: 3\r\n\r\nabc") == ok(body=b"a", left=2)


def test_a_content_length_of_more_than_4300_digits_fails_as_python_int_does():
    digits = b"0" * 4300 + b"1"
    assert both(b"HTTP/1.1 200 OK\r\nContent-Length: " + digits + b"\r\n\r\nx").message == (
        "malformed HTTP response: Exceeds the limit (4300 digits) for integer string conversion: "
        "value has 4301 digits; use sys.set_int_max_str_digits() to increase the limit")
    assert both(b"HTTP/1.1 200 OK\r\nContent-Length: " + digits[1:] + b"\r\n\r\nx") == ok(body=b"x")
    big = b"9" * 4000
    assert both(b"HTTP/1.1 200 OK\r\nContent-Length: " + big + b"\r\n\r\nx", max_body=10) == too_large(
        200, 10, f"Content-Length {big.decode()}")


def test_without_framing_the_body_runs_until_the_close():
    data = b"HTTP/1.1 200 OK\r\nX: y\r\n\r\nsome"
    assert both([data, b" more", b" bytes"]) == ok(body=b"some more bytes", keep_alive=False)
    p = _core.HttpResponseParser()
    p.start()
    assert p.feed(data) == ("need_more", len(data))
    assert p.eof_completes() and p.body == b"some"


def test_a_close_before_the_end_is_a_reset_before_or_after_the_first_byte():
    assert both([]) == Outcome("connection_reset", message="connection closed by the server before any response")
    assert both(OK_LENGTH[:-1]).message == "connection closed by the server before the response was complete"
    assert both(OK_CHUNKED[:-2]).kind == "connection_reset"


def test_head_chunk_line_and_trailers_are_bounded_while_incomplete():
    big = b"X-Filler: " + b"a" * LIMIT
    assert both([b"HTTP/1.1 200 OK\r\n", big]) == invalid("response headers longer than 64 KiB")
    # Arriving whole, a long head is complete before the bound is checked (as in http1.py).
    assert both(b"HTTP/1.1 200 OK\r\n" + big + b"\r\nContent-Length: 1\r\n\r\nz") == ok(body=b"z")
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert both([head, b"1;" + b"e" * LIMIT]) == invalid("chunk-size line longer than 64 KiB")
    assert both([head + b"0\r\n", b"T: " + b"t" * LIMIT]) == invalid("chunked trailers longer than 64 KiB")
    # The trailers' bound counts from the last chunk's size line, as http1.py's buffer does.
    just = b"T: " + b"t" * (LIMIT - 6)  # with "0\r\n": LIMIT bytes held, not more
    assert both([head + b"0\r\n", just, b"\r\n\r\n"]) == ok()
    assert both([head + b"0\r\n", just + b"x", b"\r\n\r\n"]) == invalid("chunked trailers longer than 64 KiB")


def test_the_bounds_can_be_set_and_name_themselves_in_the_message():
    p = _core.HttpResponseParser(max_head_bytes=100, max_body_bytes=5)
    p.start()
    assert p.feed(b"x" * 101)[0] == "error"
    assert p.error_message == "malformed HTTP response: response headers longer than 100 bytes"
    p = _core.HttpResponseParser(max_head_bytes=2048)
    p.start()
    assert p.feed(b"x" * 2049)[0] == "error"
    assert p.error_message == "malformed HTTP response: response headers longer than 2 KiB"
    for bad in (dict(max_head_bytes=0), dict(max_body_bytes=0), dict(max_body_bytes=-5)):
        with pytest.raises(ValueError, match="must be >= 1"):
            _core.HttpResponseParser(**bad)


def test_a_body_over_the_limit_fails_as_soon_as_it_is_known():
    assert both(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n", max_body=10) == too_large(
        200, 10, "Content-Length 11")
    assert both(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789", max_body=10) == ok(body=b"0123456789")
    chunked = b"HTTP/1.1 500 E\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n5\r\n"
    assert both(chunked, max_body=10) == too_large(500, 10, "a chunk of 5 bytes after 6 bytes of body")
    eof = [b"HTTP/1.1 200 OK\r\n\r\n1234", b"567", b"8901"]
    assert both(eof, max_body=10) == too_large(200, 10, "11 bytes of body so far")
    assert both(eof, max_body=10, stream=True) == ok(body=b"12345678901", keep_alive=False)
    assert both(chunked + b"ghijk\r\n0\r\n\r\n", max_body=10, stream=True) == ok(500, b"abcdefghijk")


def test_huge_chunk_sizes_print_in_decimal_up_to_python_s_digit_limit():
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    size = b"1" + b"0" * 40
    assert both(head + size + b"\r\n") == too_large(200, 64 << 20, f"a chunk of {16 ** 40} bytes after 0 bytes of body")
    below = 10 ** 4300 - 1  # 4300 decimal digits: printed; one more and str() refuses
    assert both(head + b"%x\r\n" % below, max_body=3).message.endswith(f"a chunk of {below} bytes after 0 bytes "
                                                                       "of body; the connection was closed")
    for value in (10 ** 4300, 16 ** 3572, 16 ** 5000):
        assert both(head + b"%x\r\n" % value, max_body=3) == invalid(
            "Exceeds the limit (4300 digits) for integer string conversion; "
            "use sys.set_int_max_str_digits() to increase the limit")
    # Streamed, a huge chunk is taken as it comes.
    assert both([head + size + b"\r\n", b"abc"], stream=True).kind == "connection_reset"


def test_streaming_hands_the_body_over_in_pieces_and_collects_nothing():
    pieces: List[bytes] = []
    p = _core.HttpResponseParser(max_body_bytes=1)
    p.set_body_callback(pieces.append)
    p.start()
    data = OK_CHUNKED
    assert p.feed(data[:len(data) // 2]) == ("need_more", len(data) // 2)
    assert p.feed(data[len(data) // 2:])[0] == "complete"
    assert b"".join(pieces) == JSON and len(pieces) == 2 and p.body == b""
    with pytest.raises(TypeError, match="callable"):
        p.set_body_callback(5)


def test_an_exception_from_the_body_callback_propagates_and_the_parser_needs_start():
    def boom(piece):
        raise KeyError("from the callback")

    p = _core.HttpResponseParser()
    p.set_body_callback(boom)
    p.start()
    with pytest.raises(KeyError, match="from the callback"):
        p.feed(OK_LENGTH)
    with pytest.raises(RuntimeError, match="start"):
        p.feed(b"more")
    p.set_body_callback(None)
    p.start()
    assert p.feed(OK_LENGTH) == ("complete", len(OK_LENGTH)) and p.body == JSON


def test_one_parser_serves_response_after_response():
    p = _core.HttpResponseParser(max_body_bytes=1000)
    for data, out in [(OK_LENGTH, ok(body=JSON)), (bytewise(OK_CHUNKED), ok(body=JSON)),
                      (b"HTTP/1.1 204 N\r\n\r\n", ok(204)), (OK_CHUNKED, ok(body=JSON))]:
        assert native_outcome([data] if isinstance(data, bytes) else data, max_body=1000, parser=p) == out
        assert p.got_bytes
    p.start()
    assert not p.got_bytes and p.body == b"" and p.error_kind == "" and p.error_message == ""
    p.feed(b"HTTP/1.1 200")
    p.start()  # a partial head is forgotten too
    assert p.feed(OK_LENGTH) == ("complete", len(OK_LENGTH))
    with pytest.raises(RuntimeError, match="start"):
        p.feed(b"HTTP/1.1 200 OK\r\n\r\n")


def test_microbenchmark_times_a_complete_response_and_refuses_an_incomplete_one():
    assert 0 < _core.time_http_parse_ns(OK_LENGTH, pieces=3, iterations=1000) < 1e8
    with pytest.raises(ValueError, match="exactly one complete response"):
        _core.time_http_parse_ns(OK_LENGTH[:-1], iterations=10)
    with pytest.raises(ValueError, match="exactly one complete response"):
        _core.time_http_parse_ns(OK_LENGTH + b"x", iterations=10)


# ---------------------------------------------------------------- differential


def _split(data: bytes, cuts: List[int]) -> List[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:]) if b > a]


def often(usual, *others):
    """One of the values, ``usual`` as often as all the others together."""
    return st.sampled_from([usual] * max(len(others), 1) + list(others))


@st.composite
def responses(draw) -> bytes:
    """A response, often valid, often wrong in one place, and sometimes corrupted further."""
    out = b"".join(draw(st.lists(st.sampled_from([b"HTTP/1.1 100 Continue\r\n\r\n",
                                                  b"HTTP/1.1 103 Hints\r\nLink: </x>\r\n\r\n"]), max_size=2)))
    version = draw(often(b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.", b"http/1.1"))
    code = draw(st.one_of(often(b"200", b"204", b"304", b"500", b"101", b"+20", b"2x0", b" 1_", b"2_4"),
                          st.binary(min_size=3, max_size=3)) if draw(often(True, False)) else st.just(b"200"))
    body = draw(st.binary(min_size=draw(often(1, 0)), max_size=40))
    framing = draw(st.sampled_from(["length", "chunked", "eof", "none"]))
    headers = [b"Content-Type: application/json"]
    if draw(st.booleans()):
        headers.append(draw(st.sampled_from([b"Connection: close", b"connection: keep-alive", b"CONNECTION: CLOSE"])))
    if framing == "length":
        value = draw(st.one_of(st.just(b"%d" % len(body)), often(b"%d" % len(body), b"-1", b"+3", b"", b"0", b"007",
                                                                  b"3x"), st.integers(0, 60).map(lambda n: b"%d" % n)))
        headers.append(draw(st.sampled_from([b"Content-Length: ", b"content-length:", b"CONTENT-LENGTH:  "])) + value)
    elif framing == "chunked":
        headers.append(draw(st.sampled_from([b"Transfer-Encoding: chunked", b"transfer-encoding: gzip, CHUNKED"])))
    head = version + b" " + code + b" Reason\r\n" + b"\r\n".join(draw(st.permutations(headers))) + b"\r\n\r\n"
    if framing == "chunked":
        rest, chunks = body, []
        while rest:
            n = draw(st.integers(1, len(rest)))
            size = draw(often(b"%x" % n, b"%X;ext=1" % n, b"00%x " % n, b"-1", b"0x1", b"", b"g", b"%x" % (n + 1)))
            end = draw(often(b"\r\n", b"\n", b"XY", b"X\n"))
            chunks.append(size + b"\r\n" + rest[:n] + end)
            rest = rest[n:]
        last = draw(often(b"0\r\n\r\n", b"000;x\r\nT: v\r\n\r\n", b"0\r\n", b"0\r\nT\r\n"))
        body = b"".join(chunks) + last
    out += head + body
    if draw(st.booleans()):
        out += draw(st.sampled_from([b"", b"HTTP/1.1 200 OK\r\n\r\n", b"junk"]))
    for _ in range(draw(often(0, 1, 2))):  # corruption: a byte replaced, dropped or inserted
        i = draw(st.integers(0, max(len(out) - 1, 0)))
        what = draw(st.sampled_from(["replace", "drop", "insert"]))
        b = draw(st.sampled_from([b"\r", b"\n", b"0", b"a", b":", b" ", b"\xff"]))
        out = (out[:i] + b + out[i + 1:] if what == "replace" else out[:i] + out[i + 1:] if what == "drop"
               else out[:i] + b + out[i:])
    return out


@settings(max_examples=600, **SETTINGS)
@given(data=responses(), cuts=st.lists(st.integers(0, 400), max_size=8), head_only=often(False, True),
       stream=st.booleans(), max_body=st.sampled_from([1, 5, 16, 64, 1 << 20]))
def test_native_and_asyncio_parsers_agree(data, cuts, head_only, stream, max_body):
    both(_split(data, cuts), head_only=head_only, stream=stream, max_body=max_body)


@settings(max_examples=300, **SETTINGS)
@given(data=st.binary(max_size=120), cuts=st.lists(st.integers(0, 120), max_size=6), stream=st.booleans())
def test_native_and_asyncio_parsers_agree_on_arbitrary_bytes_after_a_head(data, cuts, stream):
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    both(_split(head + data, cuts), stream=stream, max_body=16)
    both(_split(b"HTTP/1.1 200 OK\r\n" + data, cuts), stream=stream, max_body=16)


SEEDS = sorted(p for name in ("http1", "http_parser") for p in (CORPUS / name).glob("*"))


@pytest.mark.parametrize("path", SEEDS, ids=[f"{p.parent.name}/{p.name}" for p in SEEDS])
def test_native_and_asyncio_parsers_agree_on_the_fuzz_seeds(path):
    raw = path.read_bytes() or b"\0\0"
    if path.parent.name == "http1":  # flags: stream, HEAD; then the response
        modes, data = [(bool(raw[0] & 1), bool(raw[0] & 2))], raw[1:]
    else:  # flags (HEAD, split), limits; then the response
        modes, data = [(False, bool(raw[0] & 1)), (True, bool(raw[0] & 1))], raw[2:]
    for stream, head_only in modes:
        for step in (0, 1, 7, 1 + raw[0] % 16):
            pieces = [data] if step == 0 else [data[i:i + step] for i in range(0, len(data), step)]
            both(pieces, stream=stream, head_only=head_only, max_body=1024)
