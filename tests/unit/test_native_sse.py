"""Server-Sent Events of OpenAI streams read natively (csrc/sse.cc, loadgen._core.SseScanner)
against the asyncio client's TokenStream (loadgen/net/openai_answers.py): a differential
property test on generated streams split at random (chat and completions streams with tool
calls, and /v1/responses streams of typed events), then the native client end to end
against the scripted server (tests/servers/scripted.py), whose record is the truth.

The tests that start processes or servers are in tests/integration/test_native_sse.py."""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field
from typing import List, Optional

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from loadgen import _core
from loadgen.net.http1 import ResponseTooLarge
from loadgen.net.native import NativeOpenAISUT
from loadgen.net.openai_answers import TokenStream, token_itl
from loadgen.net.options import NetOptions

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
    reasoning: tuple = ()  # (reasoning tokens seen, usage's reasoning count, first reasoning, first answer)
    events: list = field(default_factory=list)
    itl: tuple = ()  # the per-token ITL with usage's count, and counting each event's own
    cached: int = -1  # usage.prompt_tokens_details.cached_tokens
    tool_calls: int = 0


def _python_extra(ts: TokenStream) -> dict:
    return {"reasoning": (ts.reasoning_chunks, ts.usage_reasoning_tokens, ts.first_reasoning_ns, ts.first_answer_ns),
            "events": list(ts.events), "itl": (token_itl(ts.events, ts.usage_tokens), token_itl(ts.events, -1)),
            "cached": ts.usage_cached_tokens, "tool_calls": ts.tool_calls}


def _native_extra(s) -> dict:
    return {"reasoning": (s.reasoning_chunks, s.usage_reasoning_tokens, s.first_reasoning_ns, s.first_answer_ns),
            "events": s.events, "itl": (s.token_itl(s.usage_tokens), s.token_itl(-1)), "cached": s.usage_cached_tokens,
            "tool_calls": s.tool_calls}


class _Sink:
    def __init__(self) -> None:
        self.first: List[int] = []

    def first_token(self, qid: int, t: int) -> None:
        self.first.append(t)


class _Sut:
    """What TokenStream asks of its OpenAISUT while events arrive."""

    def __init__(self, max_event_bytes: int, responses: bool = False) -> None:
        self.max_event_bytes = max_event_bytes
        self.responses = responses
        self.sink = _Sink()
        self.redactor = NetOptions().redactor()


def _native_words(max_event_bytes: int, responses: bool = False) -> NativeOpenAISUT:
    """A NativeOpenAISUT with only what stream_verdict() reads: the core's problems worded."""
    out = NativeOpenAISUT.__new__(NativeOpenAISUT)
    out.inner = _Sut(max_event_bytes, responses)
    return out


def python_outcome(pieces: List[bytes], limit: int, responses: bool = False) -> Outcome:
    sut = _Sut(limit, responses)
    ts = TokenStream(sut, 1, 0)
    t = 0
    for t, piece in enumerate(pieces, 1):
        try:
            ts.on_data(None, piece, t * 1000)
        except ResponseTooLarge as e:
            return Outcome(ts.chunks, int(ts.usage_tokens), ts.done, ts.finished, ts.first_ns, ts.gaps, str(e),
                           **_python_extra(ts))
    held = ts.buf
    if ts.buf.strip():
        ts._event(ts.buf, (t + 1) * 1000)
    assert sut.sink.first == ([ts.first_ns] if ts.first_ns else [])
    return Outcome(ts.chunks, int(ts.usage_tokens), ts.done, ts.finished, ts.first_ns, ts.gaps, ts.error, held,
                   **_python_extra(ts))


def native_outcome(pieces: List[bytes], limit: int, responses: bool = False) -> Outcome:
    s = _core.SseScanner(limit, responses)
    s.start()
    words = _native_words(limit, responses)
    t = 0
    for t, piece in enumerate(pieces, 1):
        if not s.feed(piece, t * 1000):
            _, message = words.stream_verdict(7, 200, str(s.held_over).encode())
            return Outcome(s.chunks, s.usage_tokens, s.done, s.finished, s.first_ns, s.gaps, message,
                           **_native_extra(s))
    held = s.held
    s.finish((t + 1) * 1000)
    error = words.stream_verdict(s.problem, 200, s.problem_data)[1] if s.problem else None
    return Outcome(s.chunks, s.usage_tokens, s.done, s.finished, s.first_ns, s.gaps, error, held, **_native_extra(s))


# ---------------------------------------------------------------- generated streams

_text = st.sampled_from(["", "a", " hi", "\u00e9t\u00e9", '"', "\\", "\n", "{}", "\ud83d\ude00", "data: x"])
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), _text,
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e-400, 5e-324]))
_json = st.recursive(_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["text", "content", "delta", "choices", "finish_reason", "usage",
                                     "completion_tokens", "error", "x", "reasoning_content", "reasoning",
                                     "completion_tokens_details", "reasoning_tokens", "prompt_tokens_details",
                                     "cached_tokens", "tool_calls", "id", "function", "arguments", "type",
                                     "item", "response", "output_tokens"]), inner, max_size=4)),
    max_leaves=12)
_tokens = st.one_of(st.integers(-3, 40), st.booleans(), st.none(), st.just(2.0), st.just("7"),
                    st.just(2**31 - 1), st.just(2**31), st.just(2**63 - 1), st.just(-2**63), st.just(2**64))


@st.composite
def _tool_call(draw):
    call = {"index": draw(st.integers(0, 2))}
    if draw(st.booleans()):
        call["id"] = draw(st.one_of(st.just("call_1"), _text, st.none(), st.integers(0, 1)))
    fn = {"arguments": draw(st.one_of(_text, st.none(), st.integers(0, 1), st.just("{\"a\": 1}")))}
    if draw(st.booleans()):
        fn["name"] = "f"
    call["function"] = draw(st.one_of(st.just(fn), _scalar))
    return call


@st.composite
def _choice(draw):
    chat = draw(st.booleans())
    c = {"index": 0}
    text = draw(st.one_of(_text, st.none(), st.integers(0, 2), st.lists(st.integers(), max_size=1)))
    if chat:
        thought = draw(st.one_of(_text, st.none(), st.integers(0, 2)))
        c["delta"] = draw(st.one_of(st.just({"content": text}), st.just({}), st.just({"role": "assistant"}),
                                    st.none(), st.just(text), st.just({"reasoning_content": thought}),
                                    st.just({"reasoning": thought}), st.just({"content": text, "reasoning": thought}),
                                    st.just({"reasoning_content": thought, "content": None}),
                                    st.builds(lambda calls: {"tool_calls": calls, "content": None},
                                              st.one_of(st.lists(_tool_call(), max_size=2), _scalar))))
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
        details = st.builds(lambda n, r: {"completion_tokens": n, "completion_tokens_details": {"reasoning_tokens": r}},
                            _tokens, _tokens)
        cached = st.builds(lambda n, c: {"completion_tokens": n, "prompt_tokens_details": {"cached_tokens": c}},
                           _tokens, _tokens)
        return dumps({"choices": draw(st.lists(_choice(), max_size=1)),
                      "usage": draw(st.one_of(st.just(None), st.builds(lambda n: {"completion_tokens": n}, _tokens),
                                              details, cached))})
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
        key = draw(st.sampled_from(["\\u0065rror", "t\\u0065xt", "\\u0063hoices", "usag\\u0065", "text\\u0000",
                                    "r\\u0065asoning"]))
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


_RESPONSE_TYPES = ["response.output_text.delta", "response.reasoning_text.delta", "response.reasoning_summary_text.delta",
                   "response.function_call_arguments.delta", "response.output_item.added", "response.completed",
                   "response.incomplete", "response.failed", "error", "response.created", "response.output_text.done",
                   "response.function_call_arguments.done", "x"]


@st.composite
def _response_payload(draw) -> str:
    """A /v1/responses event's data."""
    kind = draw(st.sampled_from(["typed", "typed", "typed", "json", "garbage", "done", "escaped"]))
    dumps = draw(st.sampled_from([lambda o: json.dumps(o, separators=(",", ":")), json.dumps,
                                  lambda o: json.dumps(o, ensure_ascii=False)]))
    if kind == "done":
        return "[DONE]"
    if kind == "json":
        return dumps(draw(_json))
    if kind == "garbage":
        return draw(st.sampled_from(["{", "nul", '{"type":"response.output_text.delta","delta":"a"} {}', "[1]",
                                     '{"type":"response.output_text.delta","delta":NaN}',
                                     '{"type":"response.output_text.delta","delta":0.0e5}']))
    if kind == "escaped":
        return draw(st.sampled_from([
            '{"type":"response.output_text.d\\u0065lta","delta":"x"}', '{"typ\\u0065":"error"}',
            '{"type":"response.completed","response":{"usag\\u0065":{"output_tokens":3}}}',
            '{"type":"response.output_text.delta","delta":"a","type":"x"}',
            '{"type":"response.output_item.added","item":{"type":"function_call","type":"message"}}']))
    doc = {"type": draw(st.one_of(st.sampled_from(_RESPONSE_TYPES), _scalar))}
    if draw(st.booleans()):
        doc["delta"] = draw(st.one_of(_text, _scalar, st.just(" tok")))
    if draw(st.booleans()):
        doc["item"] = draw(st.one_of(st.builds(lambda t: {"type": t, "id": "fc_1", "call_id": "call_1", "name": "f",
                                                          "arguments": ""},
                                               st.sampled_from(["function_call", "message", "reasoning", ""])),
                                     _scalar))
    if draw(st.booleans()):
        usage = st.builds(lambda n, r, c: {"input_tokens": 3, "output_tokens": n,
                                           "output_tokens_details": {"reasoning_tokens": r},
                                           "input_tokens_details": {"cached_tokens": c}}, _tokens, _tokens, _tokens)
        doc["response"] = draw(st.one_of(st.builds(lambda u: {"status": "completed", "usage": u, "error": None},
                                                   st.one_of(usage, _scalar)), _scalar))
    if draw(st.integers(0, 5)) == 0:
        doc["error"] = draw(st.one_of(_scalar, st.just({"code": "server_error", "message": "boom"})))
    if draw(st.booleans()):
        doc["sequence_number"] = draw(st.integers(0, 9))
    return dumps(doc)


@st.composite
def _event(draw, payloads=_payload) -> bytes:
    payload = draw(payloads()).encode("utf-8", "surrogatepass")
    form = draw(st.sampled_from(["data: ", "data: ", "data:", "data:\t", "multi", "comment", "noise"]))
    if form == "multi":
        cut = draw(st.integers(0, len(payload)))
        body = b"data: " + payload[:cut] + draw(st.sampled_from([b"\n", b"\r\n"])) + b"data:" + payload[cut:]
    elif form == "comment":
        body = b": ping\nevent: response.output_text.delta\r\ndata: " + payload
    elif form == "noise":
        body = draw(st.binary(max_size=12))
    else:
        body = form.encode() + payload
    return body + draw(st.sampled_from([b"\n\n", b"\n\n", b"\r\n\r\n", b"\n", b"\r\n", b"\n\n\n"]))


@st.composite
def streams(draw, payloads=_payload) -> bytes:
    return (b"".join(draw(st.lists(_event(payloads), max_size=8)))
            + draw(st.sampled_from([b"", b"data: [DONE]", b" \r\n"])))


def _split(data: bytes, cuts: List[int]) -> List[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    pieces, prev = [], 0
    for p in points + [len(data)]:
        pieces.append(data[prev:p])
        prev = p
    return pieces


def _agree(pieces: List[bytes], limit: int, responses: bool = False) -> None:
    try:
        want = python_outcome(pieces, limit, responses)
    except TypeError:  # a truthy "choices" that is a number: Python fails there (see csrc/sse.h)
        assume(False)
        return
    got = native_outcome(pieces, limit, responses)
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
@given(data=st.binary(max_size=160), cuts=st.lists(st.integers(0, 160), max_size=6), responses=st.booleans())
def test_native_scanner_agrees_on_any_bytes(data, cuts, responses):
    _agree(_split(data, cuts), 1 << 20, responses)


@settings(max_examples=600, **SETTINGS)
@given(data=streams(_response_payload), cuts=st.lists(st.integers(0, 600), max_size=8))
def test_native_scanner_agrees_with_token_stream_on_responses_streams(data, cuts):
    _agree(_split(data, cuts), 1 << 20, responses=True)


@settings(max_examples=150, **SETTINGS)
@given(data=streams(_response_payload), cuts=st.lists(st.integers(0, 300), max_size=6), limit=st.integers(1, 120))
def test_native_scanner_agrees_on_responses_events_over_the_limit(data, cuts, limit):
    _agree(_split(data, cuts), limit, responses=True)


SEEDS = sorted((pathlib.Path(__file__).resolve().parents[1] / "fuzz" / "corpus" / "sse_scanner").iterdir())


@pytest.mark.parametrize("path", SEEDS, ids=[p.name for p in SEEDS])
def test_the_fuzzers_seeds_agree_with_token_stream(path):
    raw = path.read_bytes()
    data = raw[2:]  # the fuzzer's split seed and bound (and bit 2: a responses stream) come first
    responses = len(raw) > 1 and bool(raw[1] & 4)
    _agree([data[:7], data[7:]], 1 << 20, responses)
    _agree([data], 300, responses)


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


def _both(pieces: List[bytes]) -> Outcome:
    got = native_outcome(pieces, 1 << 20)
    assert got == python_outcome(pieces, 1 << 20)
    return got


def _chat(delta: dict) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode() + b"\n\n"


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_deltas_are_tokens_of_the_stream_counted_apart(field):
    usage = b'data: {"choices":[],"usage":{"completion_tokens":5,"completion_tokens_details":{"reasoning_tokens":2}}}\n\n'
    pieces = [_chat({"role": "assistant", field: "Let"}), _chat({field: " me", "content": None}),
              _chat({"content": "A"}), _chat({"content": "B", field: ""}), _chat({"content": "C"}) + usage,
              b"data: [DONE]\n\n"]
    got = _both(pieces)
    assert (got.chunks, got.first_ns, got.usage_tokens, got.error) == (5, 1000, 5, None)
    assert got.reasoning == (2, 2, 1000, 3000)  # seen, usage's count, first reasoning, first answer
    assert [e[:2] for e in got.events] == [(1000, 1), (2000, 1), (3000, 1), (4000, 1), (5000, 1)]


def test_a_stream_of_reasoning_alone_has_no_answer_token():
    got = _both([_chat({"reasoning_content": "hmm"}) + _chat({"reasoning_content": "..."}) + b"data: [DONE]\n\n"])
    assert got.chunks == 2 and got.reasoning == (2, -1, 1000, 0)


def test_per_token_itl_spreads_a_chunks_gap_over_its_tokens():
    # The case: 16 tokens a chunk, 160 ms apart; usage says 64 tokens.
    ms = 1_000_000
    s = _core.SseScanner()
    s.start()
    ts = TokenStream(_Sut(1 << 20), 1, 0)
    for i in range(4):
        piece = _chat({"content": " tok" * 16})
        s.feed(piece, (50 + 160 * i) * ms)
        ts.on_data(None, piece, (50 + 160 * i) * ms)
    tail = b'data: {"choices":[],"usage":{"completion_tokens":64}}\n\ndata: [DONE]\n\n'
    s.feed(tail, 600 * ms)
    ts.on_data(None, tail, 600 * ms)
    assert s.gaps == ts.gaps == [160 * ms] * 3  # the gap between chunks
    assert s.token_itl(64) == token_itl(ts.events, 64) == [(10 * ms, 16)] * 3  # per token
    assert s.token_itl(-1) == [(160 * ms, 1)] * 3  # no count: each chunk one token, as it counted


def test_a_usage_count_is_spread_over_events_by_their_text():
    pieces = [_chat({"content": "abcd"}), _chat({"content": "abcdefghijkl"}), b"data: [DONE]\n\n"]
    got = _both(pieces)
    assert [e[2] for e in got.events] == [4, 12]
    assert got.itl[1] == [(1000, 1)]
    s = _core.SseScanner()
    s.start()
    s.feed(pieces[0], 0)
    s.feed(pieces[1], 3000)
    # 4 tokens by weight 4:12 -> 1 and 3: the second event's gap is spread over 3.
    assert s.token_itl(4) == token_itl([(0, 1, 4), (3000, 1, 12)], 4) == [(1000, 3)]


def test_an_event_given_no_token_by_the_spread_passes_its_gap_on():
    events = [(0, 1, 100), (10, 1, 1), (20, 1, 100)]
    assert token_itl(events, 2) == [(20, 1)]  # k = 1, 0, 1: the sum of the values' spans is the stream's
    s = _core.SseScanner()
    s.start()
    for t, w in ((0, 100), (10, 1), (20, 100)):
        s.feed(_chat({"content": "x" * w}), t)
    assert s.events == events and s.token_itl(2) == [(20, 1)]


# ---------------------------------------------------------------- end to end




def test_cached_prompt_tokens_are_read_from_the_final_usage():
    usage = b'data: {"choices":[],"usage":{"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":48}}}\n\n'
    got = _both([_chat({"content": "a"}) + _chat({"content": "b"}) + usage + b"data: [DONE]\n\n"])
    assert got.cached == 48 and got.usage_tokens == 2
    bad = usage.replace(b"48", b"-1")
    assert _both([_chat({"content": "a"}) + bad + b"data: [DONE]\n\n"]).cached == -1


def _resp(doc: dict) -> bytes:
    return b"event: " + str(doc.get("type")).encode() + b"\ndata: " + json.dumps(doc).encode() + b"\n\n"


def _both_responses(pieces: List[bytes]) -> Outcome:
    got = native_outcome(pieces, 1 << 20, responses=True)
    assert got == python_outcome(pieces, 1 << 20, responses=True)
    return got


_COMPLETED = _resp({"type": "response.completed", "response": {"status": "completed", "usage": {
    "input_tokens": 7, "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 2},
    "input_tokens_details": {"cached_tokens": 4}}}})


def test_responses_events_count_answer_and_reasoning_tokens_and_the_completed_usage():
    pieces = [_resp({"type": "response.created", "response": {"status": "in_progress", "usage": None}}),
              _resp({"type": "response.reasoning_text.delta", "delta": "Let"}),
              _resp({"type": "response.reasoning_summary_text.delta", "delta": " me"}),
              _resp({"type": "response.output_text.delta", "delta": "A"}),
              _resp({"type": "response.output_text.delta", "delta": ""}),  # empty: no token
              _resp({"type": "response.output_text.delta", "delta": "BC"}),
              # The whole text again: not a token (nor would its "text" be in a chat stream's reading).
              _resp({"type": "response.output_text.done", "text": "ABC"}), _COMPLETED]
    got = _both_responses(pieces)
    assert (got.chunks, got.usage_tokens, got.done, got.finished, got.error) == (4, 5, True, True, None)
    assert got.reasoning == (2, 2, 2000, 4000) and got.cached == 4
    assert [e[2] for e in got.events] == [3, 3, 1, 2]  # the deltas' bytes


def test_a_responses_stream_ends_at_completed_or_incomplete_not_at_done():
    delta = _resp({"type": "response.output_text.delta", "delta": "A"})
    assert not _both_responses([delta]).done
    assert _both_responses([delta, _resp({"type": "response.incomplete", "response": {"usage": None}})]).done


@pytest.mark.parametrize("event, says", [
    ({"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "sequence_number": 3},
     'the server sent an error event: {"type": "error", "code": "rate_limit_exceeded", "message": "slow down"}'),
    ({"type": "response.failed", "response": {"status": "failed", "error": {"code": "server_error",
                                                                              "message": "boom"}}},
     'the server sent an error event: {"code": "server_error", "message": "boom"}'),
    ({"type": "response.output_text.delta", "delta": "x", "error": {"code": "e"}},
     'the server sent an error event: {"code": "e"}'),
])
def test_responses_error_events_fail_the_stream_with_their_class(event, says):
    got = _both_responses([_resp({"type": "response.output_text.delta", "delta": "A"}), _resp(event)])
    assert got.error == says and got.chunks == 1


def test_responses_output_tokens_out_of_range_is_worded_with_its_field():
    bad = _COMPLETED.replace(b'"output_tokens": 5', b'"output_tokens": -3')
    got = _both_responses([_resp({"type": "response.output_text.delta", "delta": "A"}), bad])
    assert got.error == f"usage.output_tokens -3 is out of range (0 to {2**31 - 1})" and got.usage_tokens == -1


def test_responses_function_calls_are_counted_and_their_arguments_are_tokens():
    added = {"type": "response.output_item.added", "output_index": 0,
             "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": ""}}
    pieces = [_resp(added), _resp({"type": "response.function_call_arguments.delta", "item_id": "fc_1",
                                   "delta": '{"city":'}),
              _resp({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": '"Oslo"}'}),
              _resp({**added, "item": {**added["item"], "id": "fc_2", "call_id": "call_2"}}),
              _resp({"type": "response.output_item.added", "item": {"type": "message", "id": "m"}}), _COMPLETED]
    got = _both_responses(pieces)
    assert got.tool_calls == 2 and got.chunks == 2
    ts = TokenStream(_Sut(1 << 20, True), 1, 0)
    ts.calls = []
    ts.read_whole(b"".join(pieces), 5)
    assert ts.calls == [{"id": "call_1", "name": "f", "arguments": '{"city":"Oslo"}', "item": "fc_1"},
                        {"id": "call_2", "name": "f", "arguments": "", "item": "fc_2"}]


def test_chat_tool_call_deltas_are_counted_and_their_arguments_are_tokens():
    first = {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}
    pieces = [_chat({"role": "assistant", "content": None, "tool_calls": [first]}),
              _chat({"tool_calls": [{"index": 0, "function": {"arguments": '{"x":'}}]}),
              _chat({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
              _chat({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "g", "arguments": "{}"}}]}),
              b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\ndata: [DONE]\n\n']
    got = _both(pieces)
    assert got.tool_calls == 2 and got.chunks == 3 and got.finished and got.error is None
    assert [e[2] for e in got.events] == [7, 2, 2]  # the arguments' bytes as written (\" is 2)
    ts = TokenStream(_Sut(1 << 20), 1, 0)
    ts.texts, ts.calls = [], []
    ts.read_whole(b"".join(pieces), 5)
    assert [(c["id"], c["name"], c["arguments"]) for c in ts.calls] == [("call_a", "f", '{"x":1}'),
                                                                        ("call_b", "g", "{}")]


def test_a_responses_stream_without_completed_is_worded_alike_by_both_clients():
    from loadgen.net.openai_answers import NO_COMPLETED, NO_DONE

    class _Failing(_Sut):
        check = True
        checked = 0
        failed: Optional[tuple] = None

        def fail_query(self, qid, kind, message):
            self.failed = (kind, message)

    for responses, says in ((True, NO_COMPLETED), (False, NO_DONE)):
        sut = _Failing(1 << 20, responses)
        ts = TokenStream(sut, 1, 0)
        body = _resp({"type": "response.output_text.delta", "delta": "A"}) if responses else _chat({"content": "A"})
        ts.on_data(None, body, 5)
        ts.on_response(None, 200, b"", 6)
        assert sut.failed == ("invalid_response", says)
        assert _native_words(1 << 20, responses).stream_verdict(6, 200, b"") == ("invalid_response", says)
