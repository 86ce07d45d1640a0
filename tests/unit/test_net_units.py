"""The network clients' parts, without a server: HTTP/1.1 response parsing, Server-Sent
Events, KServe v2 JSON and gRPC tensors, templates, targets, redaction, Prometheus text.

The tests that start processes or servers are in tests/integration/test_net_units.py."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.net import kserve_common, kserve_grpc
from loadgen.net.http1 import HttpPool, Request, _Connection
from loadgen.net.metrics import parse_prometheus
from loadgen.net.openai_stream import OpenAISUT
from loadgen.net.openai_answers import TokenStream
from loadgen.net.options import NetOptions, Redactor, parse_header
from loadgen.net.targets import parse_target, redact_url
from loadgen.net.template_http import fill_template
from loadgen.net.tensors import InputSpec, parse_input_spec, synthetic_samples

# ------------------------------------------------------------------------ HTTP parsing

class _Transport:
    def __init__(self):
        self.written = []
        self.closed = False

    def write(self, data):
        self.written.append(data)

    def close(self):
        self.closed = True


class _Handler:
    def __init__(self):
        self.responses, self.errors, self.pieces = [], [], []

    def on_response(self, req, status, body, t):
        self.responses.append((status, body))

    def on_error(self, req, kind, message):
        self.errors.append((kind, message))

    def on_data(self, req, piece, t):
        self.pieces.append(piece)


def _connection():
    pool = HttpPool(loop=None, host="127.0.0.1", port=1, size=1)  # the parser needs no loop
    conn = _Connection(pool)
    conn.connection_made(_Transport())
    pool._open = 1
    pool._conns.add(conn)
    return pool, conn


def _feed(conn, data: bytes, cuts):
    points = sorted({c % (len(data) + 1) for c in cuts})
    last = 0
    for p in points + [len(data)]:
        if p > last:
            conn.data_received(data[last:p])
            last = p


def _chunked(body: bytes, sizes) -> bytes:
    out, i = b"", 0
    for s in sizes:
        part = body[i:i + s]
        if not part:
            break
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
        i += len(part)
    if i < len(body):
        out += f"{len(body) - i:X};ext=1\r\n".encode() + body[i:] + b"\r\n"
    return out + b"0\r\n\r\n"


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), cuts=st.lists(st.integers(0, 10_000), max_size=8),
       chunked=st.booleans(), sizes=st.lists(st.integers(1, 50), max_size=6))
def test_responses_parse_whatever_the_split(body, cuts, chunked, sizes):
    pool, conn = _connection()
    handler = _Handler()
    conn.send(Request(b"GET / HTTP/1.1\r\n\r\n", handler))
    if chunked:
        wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(body, sizes)
    else:
        wire = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-A: b\r\n\r\n" % len(body) + body
    _feed(conn, wire, cuts)
    assert handler.errors == []
    assert handler.responses == [(200, body)]
    assert not conn.closed and list(pool._idle) == [conn]  # kept alive and back in the pool


def test_streamed_body_reaches_the_sink_piece_by_piece():
    pool, conn = _connection()
    handler = _Handler()
    conn.send(Request(b"POST / HTTP/1.1\r\n\r\n", handler, stream=True))
    conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
    assert handler.pieces == [b"hello"] and handler.responses == []
    conn.data_received(b"6\r\n world\r\n0\r\n\r\n")
    assert handler.pieces == [b"hello", b" world"]
    assert handler.responses == [(200, b"")]


@pytest.mark.parametrize("wire, fragment", [
    (b"SSH-2.0-OpenSSH\r\n\r\n", "status line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", "CRLF"),
])
def test_malformed_responses_fail_as_invalid_response(wire, fragment):
    _, conn = _connection()
    handler = _Handler()
    conn.send(Request(b"GET / HTTP/1.1\r\n\r\n", handler))
    conn.data_received(wire)
    assert handler.responses == []
    assert handler.errors[0][0] == "invalid_response" and fragment in handler.errors[0][1]
    assert conn.transport.closed


def test_close_mid_response_is_a_reset_and_close_delimited_body_completes():
    _, conn = _connection()
    handler = _Handler()
    conn.send(Request(b"GET / HTTP/1.1\r\n\r\n", handler))
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")
    conn.connection_lost(None)
    assert handler.errors == [("connection_reset", "connection closed by the server before the response was complete")]

    _, conn = _connection()
    handler = _Handler()
    conn.send(Request(b"GET / HTTP/1.1\r\n\r\n", handler))
    conn.data_received(b"HTTP/1.0 200 OK\r\n\r\nall of it")
    conn.connection_lost(None)
    assert handler.responses == [(200, b"all of it")]


def test_connection_close_header_and_extra_bytes_retire_the_connection():
    pool, conn = _connection()
    handler = _Handler()
    conn.send(Request(b"GET / HTTP/1.1\r\n\r\n", handler))
    conn.data_received(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
    assert handler.responses == [(204, b"")] and conn.transport.closed

    pool, conn = _connection()
    conn.send(Request(b"GET / HTTP/1.1\r\n\r\n", handler))
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokGARBAGE")
    assert conn.transport.closed


# ------------------------------------------------------------------------------- SSE

class _Sink:
    def __init__(self):
        self.first, self.done, self.failed = [], [], []

    def first_token(self, qid, t):
        self.first.append((qid, t))

    def complete_tokens(self, qid, t, n, n_input=-1):
        self.done.append((qid, t, n))

    def fail(self, qid, kind, message):
        self.failed.append((qid, kind, message))


def _openai_sut():
    sut = OpenAISUT.__new__(OpenAISUT)
    OpenAISUT.__init__(sut, parse_target("openai+http://127.0.0.1:1/v1/chat/completions"), NetOptions(), 1)
    sut.sink = _Sink()
    return sut


def _events(n_tokens, usage, chat):
    out = []
    for i in range(n_tokens):
        if chat:
            doc = {"choices": [{"index": 0, "delta": {"content": f" t{i}"}}]}
        else:
            doc = {"choices": [{"index": 0, "text": f" t{i}"}]}
        out.append(b"data: " + json.dumps(doc).encode() + b"\n\n")
    if usage:
        out.append(b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\n' % (n_tokens * 2))
    out.append(b"data: [DONE]\n\n")
    return out


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 20), usage=st.booleans(), chat=st.booleans(),
       cuts=st.lists(st.integers(0, 100_000), max_size=10))
def test_sse_events_are_parsed_whatever_the_split(n, usage, chat, cuts):
    sut = _openai_sut()
    s = TokenStream(sut, 7, 1000)
    events = _events(n, usage, chat)
    # Each event arrives 1 ms after the previous; pieces cut anywhere inside.
    wire, times = b"", []
    for i, e in enumerate(events):
        wire += e
        times += [1_000_000 * (i + 1)] * len(e)
    points = sorted({c % (len(wire) + 1) for c in cuts} | {len(wire)})
    last = 0
    for p in points:
        if p > last:
            s.on_data(None, wire[last:p], times[p - 1])
            last = p
    s.on_response(None, 200, b"", times[-1])
    assert sut.sink.failed == []
    assert s.chunks == n
    assert sut.sink.first == [(7, s.first_ns)]
    assert sut.sink.done == [(7, times[-1], n * 2 if usage else n)]
    assert (sut.tokens_from_usage, sut.tokens_from_chunks) == ((1, 0) if usage else (0, 1))
    assert sut.itl.total_count == n - 1


@pytest.mark.parametrize("events, problem", [
    ([b"data: [DONE]\n\n"], "no tokens"),
    ([b'data: {"choices":[{"text":"a"}]}\n\n'], "without data: [DONE]"),
    ([b"data: not json\n\n"], "not JSON"),
    ([b'data: {"error":{"message":"overloaded"}}\n\n'], "error event"),
])
def test_bad_streams_are_invalid_responses(events, problem):
    sut = _openai_sut()
    s = TokenStream(sut, 1, 0)
    for e in events:
        s.on_data(None, e, 10)
    s.on_response(None, 200, b"", 20)
    assert sut.sink.done == []
    assert sut.sink.failed[0][1] == "invalid_response" and problem in sut.sink.failed[0][2]


# As llama-cpp-python streams an answer whose first token was the model's end (a role
# chunk, a finish chunk, no usage), and as a server with usage says 0 tokens.
_ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}\n\n'


@pytest.mark.parametrize("events", [
    [_ROLE, b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n', b"data: [DONE]\n\n"],
    [b'data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\n', b"data: [DONE]\n\n"],
    [_ROLE, b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":0}}\n\n', b"data: [DONE]\n\n"],
])
def test_a_stream_that_finished_with_no_tokens_completes_with_0(events):
    sut = _openai_sut()
    s = TokenStream(sut, 4, 0)
    for e in events:
        s.on_data(None, e, 10)
    s.on_response(None, 200, b"", 20)
    assert sut.sink.failed == [] and sut.sink.first == []
    assert sut.sink.done == [(4, 20, 0)] and sut.output_lengths[0] == 1


@pytest.mark.parametrize("events, problem", [
    ([_ROLE, b"data: [DONE]\n\n"], "no tokens (and no finish_reason)"),  # finish_reason null is no end
    ([b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'], "without data: [DONE]"),
])
def test_a_stream_with_no_tokens_and_no_end_is_still_invalid(events, problem):
    sut = _openai_sut()
    s = TokenStream(sut, 1, 0)
    for e in events:
        s.on_data(None, e, 10)
    s.on_response(None, 200, b"", 20)
    assert sut.sink.done == [] and problem in sut.sink.failed[0][2]


# ---------------------------------------------------------------------- KServe tensors

def test_input_specs_parse_and_reject_with_reasons():
    assert parse_input_spec("INPUT0:fp32:1x16") == InputSpec("INPUT0", "FP32", (1, 16))
    assert parse_input_spec("x:INT64:[-1, 3]") == InputSpec("x", "INT64", (-1, 3))
    for bad, fragment in (("INPUT0:FP32", "NAME:DTYPE:SHAPE"), ("a:FP99:1", "unknown tensor datatype"),
                          ("a:FP32:0x3", "must be >= 1"), ("a:FP32:ax3", "not an integer")):
        with pytest.raises(ValueError, match=fragment):
            parse_input_spec(bad)


def test_synthetic_samples_are_seeded_and_shaped():
    specs = [InputSpec("a", "FP32", (1, 4)), InputSpec("b", "INT8", (-1, 2)), InputSpec("c", "BYTES", (2,))]
    one, two = synthetic_samples(specs, 3, seed=5), synthetic_samples(specs, 3, seed=5)
    assert all(np.array_equal(x[k], y[k]) for x, y in zip(one, two) for k in "ab")
    assert one[0]["a"].shape == (1, 4) and one[0]["a"].dtype == np.float32
    assert one[0]["b"].shape == (1, 2) and one[0]["c"][0].__class__ is bytes
    assert not np.array_equal(one[0]["a"], synthetic_samples(specs, 1, seed=6)[0]["a"])


OUT = [InputSpec("OUTPUT0", "FP32", (1, 16))]


@pytest.mark.parametrize("body, problem", [
    ({"outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16], "data": list(range(16))}]}, None),
    ({"outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16], "data": [list(range(16))]}]}, None),
    ({"outputs": []}, "no outputs"),
    ({"outputs": [{"name": "WRONG", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}, "OUTPUT0 is missing"),
    ({"outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16}]}, "is INT32"),
    ({"outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 16], "data": [0] * 32}]}, "has shape [2, 16]"),
    ({"outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0] * 15}]}, "15 values"),
    ({"error": "no"}, "no outputs list"),
])
def test_kserve_json_responses_are_checked(body, problem):
    got = kserve_common.check_json_response(json.dumps(body).encode(), OUT)
    assert got == problem if problem is None else problem in got


def test_kserve_non_json_response_is_reported():
    assert "not JSON" in kserve_common.check_json_response(b"<html>", OUT)


@pytest.mark.parametrize("contents", ["raw", "typed"])
@pytest.mark.parametrize("datatype", ["FP32", "FP64", "INT32", "INT64", "UINT8", "BOOL", "BYTES", "FP16"])
def test_grpc_tensors_round_trip_in_both_forms(contents, datatype):
    spec = InputSpec("x", datatype, (2, 3))
    sample = synthetic_samples([spec], 1, seed=1)[0]
    req = kserve_grpc.infer_request("m", "", sample, [spec], contents)
    req = kserve_grpc.pb.ModelInferRequest.FromString(req.SerializeToString())
    assert bool(req.raw_input_contents) == (contents == "raw" or datatype == "FP16")
    # A server answering with the same tensor as output, in the same form.
    resp = kserve_grpc.pb.ModelInferResponse(model_name="m")
    out = resp.outputs.add(name="y", datatype=datatype, shape=[2, 3])
    if req.raw_input_contents:
        resp.raw_output_contents.append(req.raw_input_contents[0])
    else:
        out.contents.CopyFrom(req.inputs[0].contents)
    decoded = kserve_grpc.decode_outputs(resp)["y"]
    assert decoded.shape == (2, 3)
    assert list(decoded.reshape(-1)) == list(sample["x"].reshape(-1))
    assert kserve_grpc.check_response(resp, [InputSpec("y", datatype, (-1, 3))]) is None
    assert "expected" in kserve_grpc.check_response(resp, [InputSpec("y", datatype, (3, 3))])


def test_grpc_responses_with_bad_contents_fail_the_check():
    resp = kserve_grpc.pb.ModelInferResponse()
    resp.outputs.add(name="y", datatype="FP32", shape=[1, 4])
    resp.raw_output_contents.append(b"\0" * 12)  # 3 floats for 4
    assert "3 values" in kserve_grpc.check_response(resp, [])
    resp.raw_output_contents[0] = b"\0" * 7
    assert "whole number" in kserve_grpc.check_response(resp, [])
    resp.raw_output_contents.append(b"")
    assert "2 raw output contents for 1 outputs" in kserve_grpc.check_response(resp, [])
    assert "no outputs" in kserve_grpc.check_response(kserve_grpc.pb.ModelInferResponse(), [])


# ---------------------------------------------------------------- targets and templates

@pytest.mark.parametrize("url, kind, fields", [
    ("http://h:8000/v2/models/resnet/infer", "kserve_http", {"model": "resnet", "version": "", "port": 8000}),
    ("https://h/v2/models/m/versions/3/infer", "kserve_http", {"model": "m", "version": "3", "tls": True,
                                                               "port": 443}),
    ("grpc://127.0.0.1:8001/add_one", "kserve_grpc", {"model": "add_one", "tls": False}),
    ("grpcs://h/m/versions/2", "kserve_grpc", {"model": "m", "version": "2", "tls": True, "port": 443}),
    ("openai+http://h:9/v1/chat/completions", "openai", {"endpoint": "chat", "base_path": ""}),
    ("openai+https://h/api/v1/completions", "openai", {"endpoint": "completions", "base_path": "/api",
                                                       "tls": True}),
    ("http://[::1]:8080/v2/models/m/infer", "kserve_http", {"host": "::1", "host_header": "[::1]:8080"}),
])
def test_targets_parse(url, kind, fields):
    t = parse_target(url)
    assert t.kind == kind
    for k, v in fields.items():
        assert getattr(t, k) == v


def test_template_targets_and_password_redaction():
    t = parse_target("http://u:pw@h:1/v1/models/x:predict", template=True)
    assert t.kind == "template" and t.path == "/v1/models/x:predict" and "pw" not in t.url
    assert redact_url("http://u:pw@h/x") == "http://u:***@h/x"
    with pytest.raises(ValueError, match="--request-template"):
        parse_target("http://h/v1/models/x:predict")


def test_template_placeholders_fill_whole_values_and_inside_strings():
    tpl = {"instances": "{{sample}}", "id": "req-{{sample_index}}", "x": ["{{ sample.a }}", 3], "k": "plain"}
    assert fill_template(tpl, {"a": [1, 2]}, 4) == {"instances": {"a": [1, 2]}, "id": "req-4", "x": [[1, 2], 3],
                                             "k": "plain"}
    with pytest.raises(ValueError, match="no key 'b'"):
        fill_template({"v": "{{sample.b}}"}, {"a": 1}, 0)


# --------------------------------------------------------------------- redaction, metrics

def test_redactor_hides_credentials_but_keeps_the_scheme_word():
    r = Redactor([parse_header("Authorization: Bearer tok123"), parse_header("X-Team: blue"),
                  parse_header("X-Key: k9")], secret_headers=["x-key"])
    doc = {"given": {"header": ["Authorization: Bearer tok123", "X-Key: k9", "X-Team: blue"]},
           "messages": ["HTTP 401: bad token tok123"]}
    out = json.dumps(r.doc(doc))
    assert "tok123" not in out and "k9" not in out and "blue" in out
    assert "Authorization: Bearer [REDACTED]" in out and "bad token [REDACTED]" in out
    assert not Redactor([parse_header("X-Team: blue")])
    with pytest.raises(ValueError):
        parse_header("no colon")


def test_prometheus_text_parses_with_kinds():
    text = ('# HELP req_total Requests.\n# TYPE req_total counter\nreq_total{path="/a b",code="200"} 12\n'
            'req_total{code="500"} 1.5e1\n# TYPE inflight gauge\ninflight 3\n'
            "lat_bucket{le=\"+Inf\"} 7 1700000000\n")
    values, kinds = parse_prometheus(text)
    assert values['req_total{code="200",path="/a b"}'] == 12 and values['req_total{code="500"}'] == 15
    assert values["inflight"] == 3 and values['lat_bucket{le="+Inf"}'] == 7
    assert kinds == {'req_total{code="200",path="/a b"}': "counter", 'req_total{code="500"}': "counter",
                     "inflight": "gauge", 'lat_bucket{le="+Inf"}': "gauge"}
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_prometheus(text + "not a sample line\n")


# ------------------------------------------------------------------------ loop SUTs

def test_a_loop_sut_that_fails_to_open_fails_the_run_instead_of_hanging():
    from loadgen.engine import Engine, EngineSettings
    from loadgen.sut import LoopSUT

    class Broken(LoopSUT):
        async def open_on_loop(self, loop, sink):
            raise ConnectionError("no server at all")

    engine = Engine(EngineSettings(mode="closed", concurrency=2, query_count=10), Broken())
    with pytest.raises(ConnectionError, match="no server at all"):
        engine.run()


def test_a_loop_sut_completes_queries_through_its_sink():
    import asyncio

    from loadgen.engine import Engine, EngineSettings
    from loadgen.sut import LoopSUT

    class Echo(LoopSUT):
        async def open_on_loop(self, loop, sink):
            self.loop, self.sink, self.seen = loop, sink, []

        def issue_query(self, query_id, sample_index, scheduled_ns):
            self.seen.append(sample_index)
            if sample_index % 5 == 0:
                self.loop.call_soon(self.sink.fail, query_id, "odd_sample", f"sample {sample_index}")
            else:
                self.loop.call_later(0.001, lambda: self.sink.complete(query_id, time.monotonic_ns()))

        async def close_on_loop(self):
            await asyncio.sleep(0)

    import time

    sut = Echo()
    for engine_settings in (
            EngineSettings(mode="closed", concurrency=4, query_count=200, sample_order="sequential"),
            EngineSettings(mode="poisson", target_qps=2000, query_count=200, sample_order="sequential")):
        result = Engine(engine_settings, sut).run()
        c = result.counts
        assert c["issued"] == 200 and c["failed"] == 40 and c["completed"] == 160
        assert result.errors == {"odd_sample": 40}
        # Completed by a 1 ms timer (uvloop's fire within about a millisecond of it).
        assert 50_000 < result.latency.value_at_percentile(50) < 10_000_000
