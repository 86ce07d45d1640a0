"""Server-Sent Events of OpenAI streams read natively (csrc/sse.cc, loadgen._core.SseScanner)
against the asyncio client's TokenStream (loadgen/net/openai_stream.py): a differential
property test on generated streams split at random, then the native client end to end
against the scripted server (tests/servers/scripted.py), whose record is the truth."""

from __future__ import annotations

import json
import pathlib
import socket
from dataclasses import dataclass, field
from typing import List, Optional

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from loadgen import _core
from loadgen.net.http1 import ResponseTooLarge
from loadgen.net.native_http import NativeOpenAISUT
from loadgen.net.openai_stream import TokenStream
from loadgen.net.options import NetOptions
from tests.servers.scripted_proc import start_scripted
from tests.helpers import _send, _Server
from tests.integration.test_net_servers import run_doc

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass
class Outcome:
    chunks: int = 0
    usage_tokens: int = -1
    done: bool = False
    finished: bool = False
    first_ns: int = 0
    gaps: List[int] = field(default_factory=list)
    error: Optional[str] = None
    held: bytes = b""


class _Sink:
    def __init__(self) -> None:
        self.first: List[int] = []

    def first_token(self, qid: int, t: int) -> None:
        self.first.append(t)


class _Sut:
    """What TokenStream asks of its OpenAISUT while events arrive."""

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self.sink = _Sink()
        self.redactor = NetOptions().redactor()


def _native_words(max_event_bytes: int) -> NativeOpenAISUT:
    """A NativeOpenAISUT with only what stream_verdict() reads: the core's problems worded."""
    out = NativeOpenAISUT.__new__(NativeOpenAISUT)
    out.inner = _Sut(max_event_bytes)
    return out


def python_outcome(pieces: List[bytes], limit: int) -> Outcome:
    sut = _Sut(limit)
    ts = TokenStream(sut, 1, 0)
    t = 0
    for t, piece in enumerate(pieces, 1):
        try:
            ts.on_data(None, piece, t * 1000)
        except ResponseTooLarge as e:
            return Outcome(ts.chunks, int(ts.usage_tokens), ts.done, ts.finished, ts.first_ns, ts.gaps, str(e))
    held = ts.buf
    if ts.buf.strip():
        ts._event(ts.buf, (t + 1) * 1000)
    assert sut.sink.first == ([ts.first_ns] if ts.first_ns else [])
    return Outcome(ts.chunks, int(ts.usage_tokens), ts.done, ts.finished, ts.first_ns, ts.gaps, ts.error, held)


def native_outcome(pieces: List[bytes], limit: int) -> Outcome:
    s = _core.SseScanner(limit)
    s.start()
    words = _native_words(limit)
    t = 0
    for t, piece in enumerate(pieces, 1):
        if not s.feed(piece, t * 1000):
            _, message = words.stream_verdict(7, 200, str(s.held_over).encode())
            return Outcome(s.chunks, s.usage_tokens, s.done, s.finished, s.first_ns, s.gaps, message)
    held = s.held
    s.finish((t + 1) * 1000)
    error = words.stream_verdict(s.problem, 200, s.problem_data)[1] if s.problem else None
    return Outcome(s.chunks, s.usage_tokens, s.done, s.finished, s.first_ns, s.gaps, error, held)


# ---------------------------------------------------------------- generated streams

_text = st.sampled_from(["", "a", " hi", "\u00e9t\u00e9", '"', "\\", "\n", "{}", "\ud83d\ude00", "data: x"])
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), _text,
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e-400, 5e-324]))
_json = st.recursive(_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["text", "content", "delta", "choices", "finish_reason", "usage",
                                     "completion_tokens", "error", "x"]), inner, max_size=4)), max_leaves=12)
_tokens = st.one_of(st.integers(-3, 40), st.booleans(), st.none(), st.just(2.0), st.just("7"),
                    st.just(2**31 - 1), st.just(2**31), st.just(2**63 - 1), st.just(-2**63), st.just(2**64))


@st.composite
def _choice(draw):
    chat = draw(st.booleans())
    c = {"index": 0}
    text = draw(st.one_of(_text, st.none(), st.integers(0, 2), st.lists(st.integers(), max_size=1)))
    if chat:
        c["delta"] = draw(st.one_of(st.just({"content": text}), st.just({}), st.just({"role": "assistant"}),
                                    st.none(), st.just(text)))
        if draw(st.booleans()):
            c["text"] = text
    else:
        c["text"] = text
    c["finish_reason"] = draw(st.one_of(st.none(), st.sampled_from(["stop", "length", "", 0, 1, [], [0]])))
    return c


@st.composite
def _payload(draw) -> str:
    kind = draw(st.sampled_from(["token", "token", "token", "usage", "error", "done", "json", "garbage",
                                 "dup", "escaped", "deep"]))
    dumps = draw(st.sampled_from([
        lambda o: json.dumps(o, separators=(",", ":")), json.dumps,
        lambda o: json.dumps(o, ensure_ascii=False), lambda o: json.dumps(o, indent=1)]))
    if kind == "token":
        return dumps({"id": "x", "object": "chunk", "choices": draw(st.lists(_choice(), max_size=3))})
    if kind == "usage":
        return dumps({"choices": draw(st.lists(_choice(), max_size=1)),
                      "usage": draw(st.one_of(st.just(None), st.builds(lambda n: {"completion_tokens": n}, _tokens)))})
    if kind == "error":
        return dumps({"error": draw(_json)})
    if kind == "done":
        return "[DONE]"
    if kind == "json":
        return dumps(draw(_json))
    if kind == "dup":
        n, m = draw(_tokens), draw(_tokens)
        return f'{{"usage":{{"completion_tokens":{json.dumps(n)}}},"choices":[{{"text":"a"}}],"usage":' \
               f'{{"completion_tokens":{json.dumps(m)},"completion_tokens":null}},"choices":{draw(st.sampled_from(["[]", "{}", "null", chr(34) + "s" + chr(34)]))}}}'
    if kind == "escaped":
        key = draw(st.sampled_from(["\\u0065rror", "t\\u0065xt", "\\u0063hoices", "usag\\u0065", "text\\u0000"]))
        return '{"choices":[{"%s":"x"}],"%s":1}' % (key, key)
    if kind == "deep":
        d = draw(st.integers(1, 60))
        return '{"choices":[{"text":' + "[" * d + "1" + "]" * d + "}]}"
    return draw(st.sampled_from(["{", "{}x", "nul", "[1,]", '{"a":01}', "{'a':1}", '"\x01"', "NaN", "-Infinity",
                                 "1.", "1e", '{"text":"a"} {}', "\ufeff{}", '{"text":"\\x"}', "\xff{}",
                                 '{"choices":[{"text":1e-400,"finish_reason":2.5e-324}]}',
                                 '{"choices":[{"text":0.000e99,"finish_reason":1E400}],"usage":[]}',
                                 '{"choices":[{"delta":{"content":-0},"finish_reason":-0.0}]}',
                                 '{"usage":{"completion_tokens":-0},"choices":[{"text":NaN}]}',
                                 '{"choices":[{"text":-Infinity}],"usage":{"completion_tokens":1.0}}',
                                 ' {"choices" : [ { "text" : "a" } ] } ', '{"choices":[{"text":"\\ud800"}]}']))


@st.composite
def _event(draw) -> bytes:
    payload = draw(_payload()).encode("utf-8", "surrogatepass")
    form = draw(st.sampled_from(["data: ", "data: ", "data:", "data:\t", "multi", "comment", "noise"]))
    if form == "multi":
        cut = draw(st.integers(0, len(payload)))
        body = b"data: " + payload[:cut] + draw(st.sampled_from([b"\n", b"\r\n"])) + b"data:" + payload[cut:]
    elif form == "comment":
        body = b": ping\nevent: x\r\ndata: " + payload
    elif form == "noise":
        body = draw(st.binary(max_size=12))
    else:
        body = form.encode() + payload
    return body + draw(st.sampled_from([b"\n\n", b"\n\n", b"\r\n\r\n", b"\n", b"\r\n", b"\n\n\n"]))


@st.composite
def streams(draw) -> bytes:
    return b"".join(draw(st.lists(_event(), max_size=8))) + draw(st.sampled_from([b"", b"data: [DONE]", b" \r\n"]))


def _split(data: bytes, cuts: List[int]) -> List[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    pieces, prev = [], 0
    for p in points + [len(data)]:
        pieces.append(data[prev:p])
        prev = p
    return pieces


def _agree(pieces: List[bytes], limit: int) -> None:
    try:
        want = python_outcome(pieces, limit)
    except TypeError:  # a truthy "choices" that is a number: Python fails there (see csrc/sse.h)
        assume(False)
        return
    got = native_outcome(pieces, limit)
    assert got == want, pieces


@settings(max_examples=800, **SETTINGS)
@given(data=streams(), cuts=st.lists(st.integers(0, 600), max_size=8))
def test_native_scanner_agrees_with_token_stream(data, cuts):
    _agree(_split(data, cuts), 1 << 20)


@settings(max_examples=300, **SETTINGS)
@given(data=streams(), cuts=st.lists(st.integers(0, 300), max_size=6), limit=st.integers(1, 120))
def test_native_scanner_agrees_on_events_over_the_limit(data, cuts, limit):
    _agree(_split(data, cuts), limit)


@settings(max_examples=300, **SETTINGS)
@given(data=st.binary(max_size=160), cuts=st.lists(st.integers(0, 160), max_size=6))
def test_native_scanner_agrees_on_any_bytes(data, cuts):
    _agree(_split(data, cuts), 1 << 20)


SEEDS = sorted((pathlib.Path(__file__).resolve().parents[1] / "fuzz" / "corpus" / "sse_scanner").iterdir())


@pytest.mark.parametrize("path", SEEDS, ids=[p.name for p in SEEDS])
def test_the_fuzzers_seeds_agree_with_token_stream(path):
    data = path.read_bytes()[2:]  # the fuzzer's split seed and bound come first
    _agree([data[:7], data[7:]], 1 << 20)
    _agree([data], 300)


@pytest.mark.parametrize("pieces, says", [
    ([b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[{"text":"b"}]}\n\ndata: [DONE]\n\n'], None),
    ([b'data: {"usage":{"completion_tokens":true}}\n\n'], None),
    ([b"data: {not json}x\n\n"], "an event is not JSON: '{not json}x'"),
    ([b"data: [1, 2]\n\n"], "an event is not a JSON object: '[1, 2]'"),
    ([b'data: {"error": {"message": "boom", "code": 1.0}}\n\n'],
     'the server sent an error event: {"message": "boom", "code": 1.0}'),
])
def test_each_rule_worded_as_the_asyncio_client(pieces, says):
    got = native_outcome(pieces, 1 << 20)
    assert got == python_outcome(pieces, 1 << 20) and got.error == says


def test_bool_completion_tokens_are_no_count_as_in_python():
    s = _core.SseScanner()
    s.start()
    s.feed(b'data: {"usage":{"completion_tokens":false},"choices":[]}\n\n', 5)
    assert s.usage_tokens == -1 and s.chunks == 0 and s.problem == 0


@pytest.mark.parametrize("count", [2**63, 2**63 - 1, 2**64 + 5, 10**30, 2**31, -1, -(2**63)])
def test_a_completion_tokens_out_of_range_fails_the_stream_and_its_tokens_still_count(count):
    # 2**63 or more was clamped and summed into the run's tokens, which wrapped negative.
    pieces = [b'data: {"choices":[{"text":"a"}]}\n\n',
              b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\ndata: [DONE]\n\n' % count]
    got = native_outcome(pieces, 1 << 20)
    assert got == python_outcome(pieces, 1 << 20)
    assert got.usage_tokens == -1 and got.chunks == 1
    assert got.error == f"usage.completion_tokens {count} is out of range (0 to {2**31 - 1})"


def test_a_truthy_number_of_choices_counts_no_choice():
    # Python raises TypeError iterating it; the native scanner counts none (csrc/sse.h).
    s = _core.SseScanner()
    s.start()
    s.feed(b'data: {"choices":5,"usage":{"completion_tokens":3}}\n\n', 5)
    assert s.chunks == 0 and s.usage_tokens == 3 and s.problem == 0


def test_scan_costs_well_under_a_microsecond_per_event():
    stream = b"".join(b'data: {"id":"c","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
                      for _ in range(32)) + b'data: {"choices":[],"usage":{"completion_tokens":32}}\n\ndata: [DONE]\n\n'
    assert 0 < _core.time_sse_scan_ns(stream, pieces=34, iterations=200) < 5000
    with pytest.raises(ValueError):
        _core.time_sse_scan_ns(b"data: x", iterations=10)


# ---------------------------------------------------------------- end to end

NATIVE = ("--http-engine", "native")


def _stream_doc(srv, endpoint, *args):
    return run_doc("--sut", f"openai+{srv.url}/v1/{endpoint}", "--model", "m", "--scenario", "concurrency", *args)


@pytest.mark.integration
@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_counts_tokens_and_timing_equal_the_servers(tmp_path, endpoint):
    with start_scripted(tmp_path, "--ttft-ms", "20", "--itl-ms", "3", "--tokens", "12") as srv:
        doc = _stream_doc(srv, endpoint, *NATIVE, "--concurrency", "16", "--query-count", "160")
        stats = srv.stats()
    c, net = doc["counts"], doc["network"]
    assert net["http_engine"] == "native" and net["protocol"] == "openai_stream"
    assert c["completed"] == stats["stream_requests"] == 160 and c["failed"] == 0
    assert net["tokens"] == {"source": "usage", "queries_counted_from_usage": 160, "queries_counted_from_chunks": 0,
                             "output_tokens": 12 * 160}
    assert c["tokens"] == 12 * 160 and net["responses_checked"] == 160
    assert net["native"]["checked_in_python"] == 0  # every stream judged natively
    assert doc["llm"]["requests"]["output_tokens"]["sum"] == 12 * 160
    assert doc["llm"]["requests"]["input_tokens_sent"] > 0
    assert doc["input_length_tokens"]["count"] == 160 and doc["output_length_tokens"]["min"] == 12
    # The server's configured pace: TTFT from 20 ms, gaps of 3 ms (two shared cores: loose bounds).
    truth_ttft = sorted(s["token_write_ns"][0] - s["recv_ns"] for s in stats["streams"])
    assert abs(doc["ttft_ns"]["p50"] - truth_ttft[len(truth_ttft) // 2]) < 2e6
    assert 20e6 <= doc["ttft_ns"]["p50"] < 30e6
    assert 2e6 < doc["itl_ns"]["p50"] < 4.5e6 and doc["itl_ns"]["count"] == 11 * 160
    assert 2e6 < doc["tpot_ns"]["p50"] < 4.5e6 and doc["tpot_ns"]["count"] == 160
    assert 12 / 0.08 < doc["output_tokens_per_s"]["p50"] < 12 / 0.05


@pytest.mark.integration
def test_the_result_has_the_asyncio_clients_keys(tmp_path):
    docs = {}
    with start_scripted(tmp_path, "--ttft-ms", "5", "--itl-ms", "1", "--tokens", "6", "--no-usage",
                        "--tokens-per-chunk", "2") as srv:
        for engine in ("native", "asyncio"):
            docs[engine] = _stream_doc(srv, "completions", "--http-engine", engine, "--concurrency", "4",
                                       "--query-count", "40")
    native, asyncio_ = docs["native"], docs["asyncio"]
    # The native client adds how long responses waited in the socket (kernel receive stamps).
    assert set(native) - set(asyncio_) == {"receive_wait_ns"} and set(asyncio_) <= set(native)
    assert set(native["network"]) - set(asyncio_["network"]) == {"io_threads", "native"}
    assert (native["network"]["http_engine"], asyncio_["network"]["http_engine"]) == ("native", "asyncio")
    assert native["network"]["tokens"] == asyncio_["network"]["tokens"]
    assert native["llm"]["requests"] == asyncio_["llm"]["requests"]
    for key in ("itl_ns", "output_tokens_per_s", "input_length_tokens", "output_length_tokens"):
        assert native[key]["count"] == asyncio_[key]["count"], key


@pytest.mark.integration
def test_a_non_200_answer_fails_as_on_asyncio(tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"model": "m", "prompt": "hi", "max_tokens": "many"}) + "\n")
    with start_scripted(tmp_path) as srv:
        native, asyncio_ = [run_doc("--sut", f"openai+{srv.url}/v1/completions", "--payload", str(tmp_path / "p.jsonl"),
                                    "--http-engine", e, "--query-count", "5", "--max-error-rate", "1", expect=1)
                            for e in ("native", "asyncio")]
    assert native["errors"]["counts"] == {"http_400": 5}
    assert native["errors"] == asyncio_["errors"]
    assert native["errors"]["messages"][0].startswith("http_400: HTTP 400: {")


def _canned_route(events: bytes):
    """Every POST answered with the same chunked Server-Sent Events; a GET with 404."""
    def route(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
        if method != "POST":
            return _send(sock, 404, b"")
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                     + b"%x\r\n" % len(events) + events + b"\r\n0\r\n\r\n")
        return True
    return route


def _canned_docs(events: bytes, *args: str):
    srv = _Server(_canned_route(events))
    try:
        return [run_doc("--sut", f"openai+http://127.0.0.1:{srv.port}/v1/chat/completions", "--model", "m",
                        "--http-engine", e, "--scenario", "concurrency", "--concurrency", "2", "--query-count", "6",
                        *args, expect=1 if "--no-response-check" not in args else 0) for e in ("native", "asyncio")]
    finally:
        srv.stop()


_TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'


@pytest.mark.integration
@pytest.mark.parametrize("events, says", [
    (_TOKEN + b'data: {"error": {"message": "overloaded", "code": 503}}\n\ndata: [DONE]\n\n',
     'invalid_response: the server sent an error event: {"message": "overloaded", "code": 503}'),
    (_TOKEN + b"data: {oops\n\ndata: [DONE]\n\n", "invalid_response: an event is not JSON: '{oops'"),
    (_TOKEN * 2, "invalid_response: the stream ended without data: [DONE]"),
    (b"data: [DONE]\n\n", "invalid_response: the stream had no tokens (and no finish_reason)"),
])
def test_failed_streams_are_worded_as_on_asyncio(events, says):
    native, asyncio_ = _canned_docs(events)
    assert native["errors"] == asyncio_["errors"] and native["errors"]["counts"] == {"invalid_response": 6}
    assert native["errors"]["messages"][0] == says
    assert native.get("ttft_ns", {}).get("count", 0) == asyncio_.get("ttft_ns", {}).get("count", 0)


@pytest.mark.integration
def test_an_event_over_the_limit_fails_as_on_asyncio():
    native, asyncio_ = _canned_docs(_TOKEN + b"data: " + b"x" * 300, "--max-response-bytes", "100")
    assert native["errors"] == asyncio_["errors"] and native["errors"]["counts"] == {"response_too_large": 6}
    assert native["errors"]["messages"][0] == ("response_too_large: a stream event over --max-response-bytes "
                                               "(100 bytes): 306 bytes with no end of event; the connection was closed")
    assert native.get("ttft_ns", {}).get("count", 0) == asyncio_.get("ttft_ns", {}).get("count", 0)


@pytest.mark.integration
def test_no_response_check_completes_streams_without_done():
    native, asyncio_ = _canned_docs(_TOKEN * 3, "--no-response-check")
    for doc in (native, asyncio_):
        assert doc["counts"]["completed"] == 6 and doc["counts"]["tokens"] == 18
        assert doc["network"]["responses_checked"] == 0


@pytest.mark.integration
@pytest.mark.parametrize("args, says", [(("--turns", "2"), "multi-turn"), (("--no-stream",), "--no-stream")])
def test_what_stays_on_asyncio_is_refused_by_native(tmp_path, args, says):
    from tests.helpers import run_cli

    with start_scripted(tmp_path) as srv:
        proc = run_cli("run", "--sut", f"openai+{srv.url}/v1/chat/completions", "--model", "m", *NATIVE,
                       "--query-count", "2", *args)
    assert proc.returncode == 2 and "--http-engine native" in proc.stderr and says in proc.stderr, proc.stderr


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["closed", "poisson"])
def test_in_process_native_streams_through_the_python_api(tmp_path, mode):
    """The native client's OpenAI streams in this process (as the sanitizer runs drive
    it): the engine API, the figures read while the run goes on, and the counts against
    the server's."""
    from loadgen.engine import Engine, EngineSettings
    from loadgen.net import open_target

    with start_scripted(tmp_path, "--ttft-ms", "2", "--itl-ms", "1", "--tokens", "5") as srv:
        sut = open_target(f"openai+{srv.url}/v1/chat/completions",
                          NetOptions(http_engine="native", connections=4, model="m"), pool_size=4)
        assert isinstance(sut, NativeOpenAISUT)
        settings = (EngineSettings(mode="closed", concurrency=4, query_count=200) if mode == "closed" else
                    EngineSettings(mode="poisson", target_qps=500, query_count=200, max_in_flight=4))
        engine = Engine(settings, sut)
        engine.start()
        seen = []
        while not engine.wait(0.05):
            seen.append(sut.live_histograms()["itl_ns"].histogram.total_count)
        result = engine.result()
        stats = srv.stats()
    assert stats["stream_requests"] == 200
    assert seen == sorted(seen)
    report, hists = sut.report(), sut.histograms()
    assert report["tokens"]["output_tokens"] == 5 * 200 and report["responses_checked"] == 200
    assert hists["itl_ns"].histogram.total_count == 4 * 200
    assert hists["output_length_tokens"].histogram.total_count == 200
    assert report["native"]["responses"] == 200
    assert result.counts["completed"] == 200 and result.counts["failed"] == 0 and result.counts["tokens"] == 1000
