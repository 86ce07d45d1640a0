"""Network clients against hostile or broken servers and bad network options: bounded
response bodies (``--max-response-bytes``), secrets that stay secret when a body is cut,
credentials in ``--server-metrics-url``, malformed ``--sut`` URLs, oversized synthetic
tensors and malformed ``Content-Length`` headers.

The servers are small threads in this process on 127.0.0.1 (one thread per connection,
each socket under a timeout); loadgen runs as a subprocess, bounded in time, and its peak
RSS is read from ``os.wait4``.

The tests that start processes or servers are in tests/integration/test_hardening_net.py.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

import pytest

from loadgen.net.http1 import HttpPool, Request, _Connection
from loadgen.net.metrics import MetricsScraper
from loadgen.net.openai_stream import OpenAISUT
from loadgen.net.openai_answers import TokenStream
from loadgen.net.options import NetOptions, Redactor, clip
from loadgen.net.targets import parse_target
from loadgen.net.tensors import MAX_SAMPLE_BYTES, MAX_SYNTHETIC_BYTES, InputSpec, parse_input_spec, synthetic_samples

MIB = 1024 * 1024
SECRET = "Zq9Xv7Kp3Wy5Tn8R"  # no three characters of it in a row occur in loadgen's own text


# ---------------------------------------------------------- row 1: bounded responses


def test_streams_are_bounded_per_event_not_in_total():
    sut = _openai_sut(NetOptions(max_response_bytes=1000))
    stream = TokenStream(sut, 7, 0)
    req = Request(b"", stream, 7, stream=True)
    event = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'
    for _ in range(100):  # 5 KB in all, every event small: fine
        stream.on_data(req, event, 1)
    assert stream.chunks == 100
    from loadgen.net.http1 import ResponseTooLarge

    with pytest.raises(ResponseTooLarge, match="1000 bytes"):
        for _ in range(20):
            stream.on_data(req, b"data: " + b"a" * 100, 2)
    assert stream.buf == b""  # what was held is let go


class _Transport:
    def __init__(self):
        self.closed = False

    def write(self, data):
        pass

    def close(self):
        self.closed = True


class _Handler:
    def __init__(self):
        self.responses, self.errors = [], []

    def on_response(self, req, status, body, t):
        self.responses.append((status, body))

    def on_error(self, req, kind, message):
        self.errors.append((kind, message))

    def on_data(self, req, piece, t):
        pass


def _request(wire: bytes, limit: int = 100, stream: bool = False) -> Tuple[_Handler, _Connection]:
    pool = HttpPool(loop=None, host="127.0.0.1", port=1, size=1, max_response_bytes=limit)  # type: ignore[arg-type]
    conn = _Connection(pool)
    conn.connection_made(_Transport())
    pool._open = 1
    pool._conns.add(conn)
    handler = _Handler()
    conn.send(Request(b"GET / HTTP/1.1\r\n\r\n", handler, stream=stream))
    for i in range(0, len(wire), 7):
        if conn.closed:
            break
        conn.data_received(wire[i:i + 7])
    return handler, conn


@pytest.mark.parametrize("wire, fails", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100, False),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 101\r\n\r\n", True),  # refused before any body
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n32\r\n" + b"x" * 50 + b"\r\n32\r\n" + b"x" * 50
     + b"\r\n0\r\n\r\n", False),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n32\r\n" + b"x" * 50 + b"\r\n33\r\n", True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"x" * 101, True),
])
def test_collected_bodies_over_the_limit_fail_and_close_the_connection(wire, fails):
    handler, conn = _request(wire)
    if fails:
        assert handler.responses == [] and handler.errors[0][0] == "response_too_large", handler.errors
        assert "--max-response-bytes (100 bytes)" in handler.errors[0][1]
        assert conn.transport.closed
    else:
        assert handler.errors == [] and handler.responses == [(200, b"x" * 100)]


def test_a_streamed_body_is_not_bounded_by_its_content_length():
    handler, conn = _request(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000, stream=True)
    assert handler.errors == [] and handler.responses == [(200, b"")]


@pytest.mark.parametrize("wire", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 70000,  # a size line without end
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Trailer: " + b"y" * 70000,  # endless trailers
])
def test_endless_chunk_size_lines_and_trailers_are_malformed(wire):
    handler, conn = _request(wire, limit=10 * MIB)
    assert handler.errors and handler.errors[0][0] == "invalid_response", handler.errors
    assert conn.transport.closed


# ------------------------------------------------ row 17: Content-Length must be a number

@pytest.mark.parametrize("value", [b"-5", b"abc", b"+5", b"5_0", b"0x10", b""])
def test_a_content_length_that_is_not_a_non_negative_integer_is_invalid(value):
    handler, conn = _request(b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n\r\nhello", limit=MIB)
    assert handler.responses == [], "a malformed Content-Length must not read as a body"
    assert handler.errors[0][0] == "invalid_response" and "Content-Length" in handler.errors[0][1]
    assert conn.transport.closed


@pytest.mark.parametrize("size", [b"-5", b"+5", b"0x5", b"5_0"])
def test_a_chunk_size_that_is_not_hex_digits_is_invalid(size):
    handler, _ = _request(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\nhello\r\n0\r\n\r\n",
                          limit=MIB)
    assert handler.responses == [] and handler.errors[0][0] == "invalid_response"


# ------------------------------------------------- row 2: secrets in a cut error body


def _leaks(text: str) -> List[str]:
    """The pieces of SECRET (3 characters or more) in ``text``, less its encoded
    histograms: their base64 (``HISTF...``) is compressed counts, in which any three
    characters occur by chance (about once in 20k characters for one of SECRET's 14)."""
    text = re.sub(r"HISTF[A-Za-z0-9+/]+=*", "", text)
    return sorted({SECRET[i:i + 3] for i in range(len(SECRET) - 2) if SECRET[i:i + 3] in text})


def test_redaction_comes_before_the_cut_and_covers_what_a_cut_leaves():
    r = Redactor([("Authorization", f"Bearer {SECRET}")])
    body = ("x" * 190 + f"Authorization: Bearer {SECRET} and more").encode()
    for limit in range(190, 230):
        assert _leaks(r.excerpt(body, limit)) == [], limit
    # A text someone else cut (marked by clip) loses the start of a secret it ends in.
    assert r.text(clip(body.decode(), 216)).endswith("Bearer [REDACTED]...")
    assert r.text(clip(body.decode(), 214)).endswith("Bearer [REDACTED]...")  # "Zq" went too
    assert r.text(clip(body.decode(), 212)) == clip(body.decode(), 212)  # the cut leaves no part of it
    assert r.excerpt(b"short body", 200) == "short body"


def test_stream_error_bodies_are_redacted_before_the_cut():
    sut = _openai_sut(NetOptions(headers=[("Authorization", f"Bearer {SECRET}")]))
    stream = TokenStream(sut, 3, 0)
    stream.buf = ("e" * 190 + f"Bearer {SECRET}").encode()  # 200 bytes end in the token
    stream.on_response(Request(b"", stream, 3, stream=True), 401, b"", 1)
    [(_, kind, message)] = sut.sink.failed
    assert kind == "http_401" and _leaks(message) == [], message


# ------------------------------------------- row 3: credentials in --server-metrics-url


@pytest.mark.parametrize("url, fragment", [
    ("http://user:pw@[::1/metrics", "not a valid URL"),
    ("http://bad host/metrics", "no host name may have"),
    ("ftp://127.0.0.1/metrics", "http:// or https://"),
])
def test_bad_metrics_urls_name_the_option(url, fragment):
    with pytest.raises(ValueError) as e:
        MetricsScraper(url, 0)
    assert str(e.value).startswith("--server-metrics-url") and fragment in str(e.value)
    assert ":pw@" not in str(e.value)


# ------------------------------------------------------------- row 8: bad --sut URLs


# --------------------------------------------------- row 7: oversized synthetic tensors


def test_input_specs_are_limited_to_64_mib_a_sample():
    assert parse_input_spec(f"X:FP32:{MAX_SAMPLE_BYTES // 4}").shape == (MAX_SAMPLE_BYTES // 4,)
    with pytest.raises(ValueError, match="at most 64 MiB"):
        parse_input_spec(f"X:FP32:{MAX_SAMPLE_BYTES // 4 + 1}")
    with pytest.raises(ValueError, match="at most 64 MiB"):
        parse_input_spec("X:BYTES:100000x100000")


def test_metadata_shapes_too_large_fail_before_allocating_and_big_samples_are_fewer():
    huge = [InputSpec("a", "FP64", (100000, 100000))]  # as a server's metadata might say
    with pytest.raises(ValueError, match="at most 64 MiB"):
        synthetic_samples(huge, 256, 0)
    big = [InputSpec("a", "UINT8", (16 * MIB,))]
    samples = synthetic_samples(big, 256, 0)
    assert len(samples) == MAX_SYNTHETIC_BYTES // (16 * MIB) == 16


# ------------------------------------------------------------------------------ helpers

class _Sink:
    def __init__(self):
        self.failed: List[Tuple[int, str, str]] = []

    def first_token(self, qid, t):
        pass

    def complete_tokens(self, qid, t, n, n_input=-1):
        pass

    def fail(self, qid, kind, message):
        self.failed.append((qid, kind, message))


def _openai_sut(net: Optional[NetOptions] = None) -> OpenAISUT:
    sut = OpenAISUT(parse_target("openai+http://127.0.0.1:1/v1/chat/completions"), net or NetOptions(), 1)
    sut.sink = _Sink()
    return sut
