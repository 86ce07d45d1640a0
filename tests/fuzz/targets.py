"""The fuzz targets: one function per parser that reads outside input.

Each takes the fuzzer's bytes and returns normally when the parser behaved: it parsed
the input, or refused it with the error it documents (``EXPECTED``). Anything else
escaping -- an IndexError, UnicodeDecodeError, RecursionError, OverflowError, a broken
invariant (AssertionError) -- is a crash. Nothing here needs atheris: `fuzz_run.py`
drives these under the fuzzer, and tests/unit/test_fuzz_regressions.py replays the seed
corpora and every crash found so far with plain pytest.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import shutil
import tempfile
from typing import Callable, Dict, List, Tuple

from loadgen.net import http1, kserve_common, metrics, openai_answers
from loadgen.net import options as net_options
from loadgen.net.tensors import InputSpec
from loadgen.options import OPTION_SPECS, OptionError, resolve
from loadgen.stats.hdrlog import HistogramLogError, read_log
from loadgen.stats.histogram import HdrDecodeError, Histogram
from loadgen.engine.trace import load_trace

_TMP = tempfile.mkdtemp(prefix="loadgen-fuzz-")
atexit.register(shutil.rmtree, _TMP, True)


def _file(name: str, data: bytes) -> str:
    path = os.path.join(_TMP, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _chunks(data: bytes, seed: int) -> List[bytes]:
    """``data`` cut into pieces of 1..16 bytes (or whole, seed 0), as a socket delivers."""
    if seed == 0:
        return [data]
    out, i, k = [], 0, 0
    while i < len(data):
        n = 1 + (seed + 7 * k) % 16
        out.append(data[i:i + n])
        i += n
        k += 1
    return out


# ------------------------------------------------------------------- HDR payloads

def hdr_decode(data: bytes) -> None:
    """Histogram.decode (base64 text or compressed bytes) and the raw decoders; what
    decodes must also encode, answer queries and decode again to the same counts."""
    decoders: List[Callable[[], Histogram]] = [
        lambda: Histogram.decode(data),
        lambda: Histogram.decode(data.decode("latin-1")),
        lambda: Histogram.decode_compressed(data),
        lambda: Histogram.decode_uncompressed(data),
    ]
    for decode in decoders:
        try:
            h = decode()
        except HdrDecodeError:
            continue
        n = h.total_count
        h.value_at_percentile(99.9)
        _ = h.mean
        back = Histogram.decode(h.encode())
        assert back.total_count == n, (back.total_count, n)


def hdrlog(data: bytes) -> None:
    """A histogram interval log, read as `loadgen hlog` reads a file (UTF-8 text)."""
    stream = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    try:
        for entry in read_log(stream):
            assert entry.histogram.total_count >= 0
    except HistogramLogError:
        pass


# --------------------------------------------------------------------- HTTP/1.1

class _Handler:
    def __init__(self) -> None:
        self.ends: List[Tuple[str, object]] = []
        self.pieces = 0

    def on_data(self, req, piece: bytes, t: int) -> None:
        assert isinstance(piece, bytes) and piece, piece
        self.pieces += 1

    def on_response(self, req, status: int, body: bytes, t: int) -> None:
        self.ends.append(("response", status))

    def on_error(self, req, kind: str, message: str) -> None:
        assert isinstance(message, str)
        self.ends.append(("error", kind))


class _Transport:
    def __init__(self) -> None:
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class _Pool:
    """The part of HttpPool a connection calls back into, without a loop or sockets."""

    _done = http1.HttpPool._done
    _fail = http1.HttpPool._fail
    max_response_bytes = 1024  # small, so that the fuzzer reaches the limit

    def __init__(self) -> None:
        self._waiting: List[object] = []
        self._idle: List[object] = []
        self.bytes_sent = 0

    def _release(self, conn) -> None:
        pass

    def _forget(self, conn) -> None:
        pass


def _exchange(response: bytes, handler, flags: int, stream: bool, head_only: bool = False) -> None:
    """One request on a connection: the response fed in pieces, then the server closes."""
    conn = http1._Connection(_Pool())  # type: ignore[arg-type]
    conn.connection_made(_Transport())
    req = http1.Request(b"GET / HTTP/1.1\r\n\r\n", handler, stream=stream, head_only=head_only)
    conn.send(req)
    for piece in _chunks(response, flags):
        conn.data_received(piece)
    conn.connection_lost(None)


def http1_response(data: bytes) -> None:
    """Response bytes fed to a connection in pieces, then the connection closes: the
    request ends exactly once, in a response or an error, and nothing escapes."""
    flags = data[0] if data else 0
    handler = _Handler()
    _exchange(data[1:], handler, flags >> 2, stream=bool(flags & 1), head_only=bool(flags & 2))
    assert len(handler.ends) == 1, handler.ends


# -------------------------------------------------------------------------- SSE

class _Sink:
    def __init__(self) -> None:
        self.first = 0

    def first_token(self, query_id: int, t: int) -> None:
        self.first += 1


class _StreamSUT:
    max_event_bytes = 512  # small, so that the fuzzer reaches the limit

    def __init__(self, check: bool, responses: bool = False) -> None:
        self.sink = _Sink()
        self.responses = responses  # a /v1/responses stream (typed events)
        redactor = getattr(net_options, "Redactor", None)  # where the version has one
        self.redactor = redactor([("Authorization", "Bearer SECRET")]) if redactor else None
        self.check = check
        self.checked = 0
        self.ends: List[str] = []

    def fail_query(self, query_id: int, kind: str, message: str) -> None:
        assert isinstance(message, str)
        self.ends.append(kind)

    def record_stream(self, stream, t: int) -> None:
        self.ends.append("ok")


def sse_stream(data: bytes, responses: bool = False) -> None:
    """An OpenAI-style event stream (``responses``: a /v1/responses one) as the body of a
    streamed HTTP response (200, or 500 when flags say), in pieces, until the server
    closes: tokens are counted, the query ends exactly once, and nothing escapes."""
    flags = data[0] if data else 0
    sut = _StreamSUT(check=bool(flags & 1), responses=responses)
    stream = openai_answers.TokenStream(sut, 1, 0)  # type: ignore[arg-type]
    status = b"500 Internal Server Error" if flags & 2 else b"200 OK"
    head = b"HTTP/1.1 " + status + b"\r\nContent-Type: text/event-stream\r\n\r\n"
    _exchange(head + data[1:], stream, flags >> 2, stream=True)
    assert len(sut.ends) == 1, sut.ends
    assert sut.sink.first <= 1 and stream.chunks >= sut.sink.first
    assert stream.tool_calls >= 0 and stream.reasoning_chunks <= stream.chunks


def sse_responses_stream(data: bytes) -> None:
    """:func:`sse_stream` on a /v1/responses stream."""
    sse_stream(data, responses=True)


# ----------------------------------------------------------------------- KServe

_KSERVE_EXPECTED = [
    [],
    [InputSpec("OUTPUT0", "FP32", (-1, 4))],
    [InputSpec("OUTPUT0", "INT64", (1,)), InputSpec("OUTPUT1", "BYTES", (2, 2))],
]


def kserve_json(data: bytes) -> None:
    """The check of a REST infer response: None or a description, never an exception;
    and a request body read back as a sample (ValueError naming the file, or a sample)."""
    for expected in _KSERVE_EXPECTED:
        r = kserve_common.check_json_response(data, expected)
        assert r is None or isinstance(r, str), r
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return
    try:
        kserve_common.samples_from_json_body(doc, "fuzz.json")
    except ValueError:
        pass


# ---------------------------------------------------------------------- options

_ENV_NAMES = [s.env for s in OPTION_SPECS if not s.flag_only]


def options_config(data: bytes) -> None:
    """A TOML --config file: options, or OptionError naming the problem."""
    path = _file("config.toml", data)
    try:
        resolve({"config": path}, environ={})
    except OptionError:
        pass


def options_env(data: bytes) -> None:
    """LOADGEN_* variables: each line 'NAME=value' sets LOADGEN_NAME (or, for a name that
    is no option, one picked by a hash of it) to value; options or OptionError."""
    text = data.decode("utf-8", "replace")
    environ: Dict[str, str] = {}
    for line in text.split("\n"):
        key, sep, value = line.partition("=")
        if not sep:
            continue
        name = "LOADGEN_" + key.strip().upper()
        if name not in _ENV_NAMES:
            name = _ENV_NAMES[sum(map(ord, key)) % len(_ENV_NAMES)]
        environ[name] = value.replace("\x00", "")
    try:
        resolve({}, environ=environ)
    except OptionError:
        pass


# ------------------------------------------------------------------- Prometheus

def prometheus(data: bytes) -> None:
    """A scrape as MetricsScraper reads it (UTF-8, bad bytes replaced), as Prometheus text
    (odd first byte: OpenMetrics); float values with a kind each, or ValueError; and the
    scrape added up as a run would."""
    content_type = "application/openmetrics-text" if data[:1] and data[0] & 1 else "text/plain"
    try:
        values, kinds = metrics.parse_prometheus(data[1:].decode("utf-8", "replace"), content_type)
    except ValueError:
        return
    assert set(values) == set(kinds)
    for series, v in values.items():
        assert isinstance(v, float) and kinds[series] in (metrics.COUNTER, metrics.GAUGE)
    tally = metrics._Tally(50)
    tally.add(0.0, values, kinds)
    tally.add(1.0, values, kinds)
    json.dumps(tally.report(), allow_nan=False)


# ------------------------------------------------------------------------ trace

def trace(data: bytes) -> None:
    """A --trace file: text (first byte even) or .npy (odd); offsets or ValueError."""
    flags = data[0] if data else 0
    name = "trace.npy" if flags & 1 else ("trace.ms.txt" if flags & 2 else "trace.txt")
    unit = (None, "us", "s", "ms")[(flags >> 2) & 3]
    path = _file(name, data[1:])
    try:
        arr = load_trace(path, unit)
    except ValueError:
        return
    assert arr.dtype.kind == "i" and arr.ndim == 1 and arr.size > 0 and (arr >= 0).all()


TARGETS: Dict[str, Callable[[bytes], None]] = {
    "hdr_decode": hdr_decode,
    "hdrlog": hdrlog,
    "http1": http1_response,
    "sse": sse_stream,
    "sse_responses": sse_responses_stream,
    "kserve_json": kserve_json,
    "options_config": options_config,
    "options_env": options_env,
    "prometheus": prometheus,
    "trace": trace,
}
