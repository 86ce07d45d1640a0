"""The scripted test server (tests/servers/scripted.py) itself: its endpoints, its faults,
its streaming format, and that its timing is what it says it is.

Clients here are plain sockets and http.client, each operation under a timeout. Timing is
checked against the server's own record (GET /stats: when each request was read and each
event written, on time.monotonic_ns(), the same clock in every process) and against when
a raw client received each event.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import signal
import socket
import threading
import time
from typing import Any

import pytest

from tests.servers.scripted_proc import Scripted, start_scripted

pytestmark = pytest.mark.integration

MS = 1_000_000
INPUT = [float(i) for i in range(16)]
INFER_BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": INPUT}]}


@pytest.fixture
def start(tmp_path):
    """start(*args) -> a running server, stopped after the test."""
    servers: list[Scripted] = []

    def _start(*args: object) -> Scripted:
        servers.append(start_scripted(tmp_path, *args))
        return servers[-1]

    yield _start
    for s in servers:
        s.stop()


def request(s: Scripted, method: str, path: str, body: Any = None,
            conn: http.client.HTTPConnection | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-cased headers, body) of one request, on conn or a connection of its own."""
    c = conn or http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        if conn is None:
            c.close()


def post_raw(sock: socket.socket, path: str, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))


def read_stream(sock: socket.socket) -> tuple[bytes, list[tuple[int, bytes]]]:
    """(response head, [(receive time ns, event payload)]) of one chunked SSE response; an
    event's receive time is that of the recv() that completed it."""
    buf, ends = b"", []
    while not buf.endswith(b"\r\n0\r\n\r\n"):
        data = sock.recv(65536)
        ends.append((len(buf) + len(data), time.monotonic_ns()))
        assert data, f"connection closed mid-stream after {buf!r}"
        buf += data
    head, pos = buf[:buf.index(b"\r\n\r\n")], buf.index(b"\r\n\r\n") + 4
    events = []
    while (size := int(buf[pos:buf.index(b"\r\n", pos)], 16)) > 0:
        start = buf.index(b"\r\n", pos) + 2
        payload = buf[start:start + size]
        assert payload.startswith(b"data: ") and payload.endswith(b"\n\n"), payload
        events.append((next(t for n, t in ends if n >= start + size), payload[6:-2]))
        pos = start + size + 2
    return head, events


def stream(s: Scripted, path: str, body: dict[str, Any]) -> tuple[bytes, list[tuple[int, bytes]]]:
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        post_raw(sock, path, {**body, "stream": True})
        return read_stream(sock)


def metrics(s: Scripted) -> dict[str, float]:
    """{'name{labels}': value} of GET /metrics; checks that every sample has HELP and TYPE."""
    status, headers, body = request(s, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    lines = body.decode().splitlines()
    samples = {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in lines if not ln.startswith("#"))}
    for name in {k.partition("{")[0] for k in samples}:
        assert f"# HELP {name} " in body.decode() and f"# TYPE {name} " in body.decode()
    return samples


# --- process, health, metadata -----------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_port_line_and_clean_exit_on_signal(start, sig):
    s = start()
    with open(s.proc.log_path, "rb") as f:
        assert f.read() == b"PORT %d\n" % s.port
    assert request(s, "GET", "/v2/health/live")[0] == 200
    os.kill(s.pid, sig)
    assert s.proc.proc.wait(5) == 0


def test_max_runtime_ends_the_server(start):
    s = start("--max-runtime-s", 0.3)
    assert s.proc.proc.wait(5) == 0


def test_kill(start):
    s = start()
    s.kill()
    assert s.proc.proc.returncode == -signal.SIGKILL


def test_ready_after(start):
    s = start("--ready-after-s", 1.0)
    t0 = time.monotonic()
    assert request(s, "GET", "/v2/health/ready")[0] == 503
    assert request(s, "GET", "/v2/models/m/ready")[0] == 503
    assert request(s, "GET", "/v2/health/live")[0] == 200
    while request(s, "GET", "/v2/health/ready")[0] != 200:
        assert time.monotonic() - t0 < 5, "not ready after 5 s"
        time.sleep(0.05)
    assert time.monotonic() - t0 > 0.5
    assert request(s, "GET", "/v2/models/m/ready")[0] == 200


@pytest.mark.parametrize("with_inputs", [True, False])
def test_metadata(start, with_inputs):
    s = start() if with_inputs else start("--no-metadata-inputs")
    status, _, body = request(s, "GET", "/v2/models/resnet")
    meta = json.loads(body)
    assert status == 200
    assert {k: meta[k] for k in ("name", "versions", "platform")} == {
        "name": "resnet", "versions": ["1"], "platform": "scripted"}
    if with_inputs:
        assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}]
        assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}]
    else:
        assert "inputs" not in meta and "outputs" not in meta


# --- infer and its faults ----------------------------------------------------------------

def test_infer_answer_on_a_kept_alive_connection(start):
    s = start()
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)
    try:
        for data in (INPUT, [INPUT]):  # flat or nested data
            body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": data}]}
            status, headers, raw = request(s, "POST", "/v2/models/m1/infer", body, conn)
            assert status == 200 and headers["content-type"] == "application/json"
            assert json.loads(raw) == {"model_name": "m1", "model_version": "1", "outputs": [
                {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16], "data": [x + 1 for x in INPUT]}]}
    finally:
        conn.close()
    stats = s.stats()
    assert (stats["infer_requests"], stats["infer_ok"], stats["stream_requests"]) == (2, 2, 0)


def infer_outcome(s: Scripted) -> str:
    """What one infer request on a fresh connection got: ok, malformed, wrong, empty,
    closed or 'status CODE'."""
    try:
        status, _, raw = request(s, "POST", "/v2/models/m/infer", INFER_BODY)
    except http.client.RemoteDisconnected:
        return "closed"
    if status != 200:
        assert "error" in json.loads(raw)
        return f"status {status}"
    try:
        outputs = json.loads(raw)["outputs"]
    except ValueError:
        return "malformed"
    if not outputs:
        return "empty"
    if outputs[0]["name"] == "WRONG":
        assert outputs[0]["shape"] == [1, 3] and len(outputs[0]["data"]) == 3
        return "wrong"
    assert outputs[0]["data"] == [x + 1 for x in INPUT]
    return "ok"


@pytest.mark.parametrize("args, expected", [
    (["--malformed-every", 3], ["ok", "ok", "malformed", "ok", "ok", "malformed"]),
    (["--wrong-output-every", 2], ["ok", "wrong", "ok", "wrong", "ok", "wrong"]),
    (["--empty-outputs-every", 3], ["ok", "ok", "empty", "ok", "ok", "empty"]),
    (["--status-every", "2:503"], ["ok", "status 503", "ok", "status 503", "ok", "status 503"]),
    (["--close-every", 2], ["ok", "closed", "ok", "closed", "ok", "closed"]),
    (["--status-every", "3:500", "--wrong-output-every", 2, "--close-every", 5],
     ["ok", "wrong", "status 500", "wrong", "closed", "status 500"]),
])
def test_infer_faults(start, args, expected):
    s = start(*args)
    assert [infer_outcome(s) for _ in expected] == expected
    stats = s.stats()
    assert (stats["infer_requests"], stats["infer_ok"]) == (len(expected), expected.count("ok"))


def test_stall_after(start):
    s = start("--stall-after", 2)
    assert [infer_outcome(s), infer_outcome(s)] == ["ok", "ok"]
    stalled = []
    for _ in range(2):
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=0.3)
        stalled.append(sock)
        post_raw(sock, "/v2/models/m/infer", INFER_BODY)
        with pytest.raises(socket.timeout):  # no answer, and no end of connection
            sock.recv(1)
    m = metrics(s)
    assert m['scripted_requests_total{endpoint="infer"}'] == 4 and m["scripted_inflight"] == 2
    assert s.stats()["infer_requests"] == 4
    s.stop()  # exits cleanly with stalled connections open
    assert s.proc.proc.returncode == 0
    for sock in stalled:
        sock.close()


def test_delay(start):
    s = start("--delay-ms", 100)
    t0 = time.monotonic()
    assert infer_outcome(s) == "ok"
    assert 0.1 <= time.monotonic() - t0 < 2


@pytest.mark.parametrize("method, path, body, status", [
    ("POST", "/v2/models/m/infer", b"{not json", 400),
    ("POST", "/v2/models/m/infer", {"inputs": []}, 400),
    ("POST", "/v1/completions", b"{not json", 400),
    ("POST", "/v1/chat/completions", b"[1, 2]", 400),
    ("GET", "/nowhere", None, 404),
    ("GET", "/v2/models/m/infer", None, 404),
])
def test_bad_requests(start, method, path, body, status):
    s = start()
    got, headers, raw = request(s, method, path, body)
    assert got == status and "error" in json.loads(raw)
    assert s.stats()["infer_ok"] == 0


def test_metrics(start):
    s = start("--status-every", "2:503", "--tokens", 2, "--ttft-ms", 1, "--itl-ms", 1)
    assert metrics(s) == {'scripted_requests_total{endpoint="infer"}': 0,
                          'scripted_requests_total{endpoint="completions"}': 0,
                          'scripted_requests_total{endpoint="chat_completions"}': 0,
                          'scripted_requests_total{endpoint="metrics"}': 1, "scripted_inflight": 0}
    assert [infer_outcome(s) for _ in range(3)] == ["ok", "status 503", "ok"]
    stream(s, "/v1/completions", {"prompt": "a"})
    request(s, "GET", "/nowhere")
    m = metrics(s)
    assert m['scripted_requests_total{endpoint="infer"}'] == 3
    assert m['scripted_requests_total{endpoint="completions"}'] == 1
    assert m['scripted_requests_total{endpoint="metrics"}'] == 2
    assert m['scripted_responses_total{status="200"}'] == 4  # 2 infer, 1 stream, 1 metrics
    assert m['scripted_responses_total{status="503"}'] == 1
    assert m['scripted_responses_total{status="404"}'] == 1
    assert m["scripted_inflight"] == 0


# --- OpenAI streaming format -------------------------------------------------------------

FAST = ("--ttft-ms", 5, "--itl-ms", 1)


def check_stream(head: bytes, events: list[tuple[int, bytes]], chat: bool, usage: bool,
                 token_counts: list[int], prompt_tokens: int) -> None:
    """The whole format of one streamed answer."""
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"\r\nContent-Type: text/event-stream\r\n" in head and b"\r\nTransfer-Encoding: chunked\r\n" in head
    assert events[-1][1] == b"[DONE]"
    chunks = [json.loads(e) for _, e in events[:-1]]
    assert all(c["object"] == ("chat.completion.chunk" if chat else "text_completion") for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and all(c["model"] == "m" for c in chunks)
    n = len(token_counts)
    tokens, final, rest = chunks[:n], chunks[n], chunks[n + 1:]
    for i, (c, count) in enumerate(zip(tokens, token_counts)):
        (choice,) = c["choices"]
        assert choice["finish_reason"] is None
        if chat:
            assert choice["delta"] == {"content": " tok" * count, **({"role": "assistant"} if i == 0 else {})}
        else:
            assert choice["text"] == " tok" * count
    assert final["choices"][0]["finish_reason"] == "length"
    if usage:
        (u,) = rest
        total = sum(token_counts)
        assert u["choices"] == [] and u["usage"] == {
            "prompt_tokens": prompt_tokens, "completion_tokens": total, "total_tokens": prompt_tokens + total}
    else:
        assert rest == []


@pytest.mark.parametrize("chat", [False, True])
def test_stream_format(start, chat):
    s = start(*FAST, "--tokens", 5)
    if chat:
        body = {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": [{"type": "text", "text": "say hi"}]}]}
    else:
        body = {"model": "m", "prompt": "one two three"}
    head, events = stream(s, "/v1/chat/completions" if chat else "/v1/completions", body)
    check_stream(head, events, chat, True, [1] * 5, 4 if chat else 3)
    (record,) = s.stats()["streams"]
    assert (record["tokens"], record["tokens_per_event"], record["usage_sent"]) == (5, 1, True)
    assert len(record["token_write_ns"]) == 5


@pytest.mark.parametrize("args, include_usage, usage", [
    ((), None, True), (("--no-usage",), None, False), (("--no-usage",), True, True), (("--no-usage",), False, False),
])
def test_usage_chunk(start, args, include_usage, usage):
    s = start(*FAST, "--tokens", 3, *args)
    body: dict[str, Any] = {"model": "m", "prompt": "x"}
    if include_usage is not None:
        body["stream_options"] = {"include_usage": include_usage}
    check_stream(*stream(s, "/v1/completions", body), chat=False, usage=usage, token_counts=[1] * 3, prompt_tokens=1)
    assert s.stats()["streams"][0]["usage_sent"] is usage


@pytest.mark.parametrize("chat", [False, True])
def test_tokens_per_chunk(start, chat):
    s = start("--ttft-ms", 20, "--itl-ms", 5, "--tokens", 10, "--tokens-per-chunk", 3)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]} if chat else {"model": "m", "prompt": "hi"}
    head, events = stream(s, "/v1/chat/completions" if chat else "/v1/completions", body)
    check_stream(head, events, chat, True, [3, 3, 3, 1], 1)
    (record,) = s.stats()["streams"]
    assert (record["tokens"], record["tokens_per_event"], len(record["token_write_ns"])) == (10, 3, 4)
    # An event is written when its last token is due: tokens 2, 5, 8 and 9.
    due = [record["recv_ns"] + 20 * MS + last * 5 * MS for last in (2, 5, 8, 9)]
    assert all(0 <= w - d < 20 * MS for w, d in zip(record["token_write_ns"], due))


def test_first_chunk_tokens(start):
    s = start("--ttft-ms", 20, "--itl-ms", 5, "--tokens", 10, "--tokens-per-chunk", 4, "--first-chunk-tokens", 1,
              "--selector", "epoll")
    check_stream(*stream(s, "/v1/completions", {"model": "m", "prompt": "hi"}), False, True, [1, 4, 4, 1], 1)
    (record,) = s.stats()["streams"]
    assert (record["tokens_per_event"], record["first_event_tokens"], len(record["token_write_ns"])) == (4, 1, 4)
    # Tokens 0, 4, 8 and 9 end the events; epoll's waits may make a write up to 1 ms late.
    due = [record["recv_ns"] + 20 * MS + last * 5 * MS for last in (0, 4, 8, 9)]
    assert all(0 <= w - d < 20 * MS for w, d in zip(record["token_write_ns"], due, strict=True))


def test_large_answer_sent_whole_before_close(start):
    """A /stats larger than the socket buffers can hold (over 4 MiB), asked with
    Connection: close by a client that reads late, arrives whole: the server closes only
    once all of it is sent."""
    s = start("--ttft-ms", 0, "--itl-ms", 0, "--tokens", 10000, "--no-usage")
    socks = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(40)]
    try:
        for sock in socks:
            post_raw(sock, "/v1/completions", {"model": "m", "prompt": "x", "stream": True})
        for sock in socks:  # each answer's end, unparsed
            data = b""
            while not data.endswith(b"0\r\n\r\n"):
                data += sock.recv(1 << 20)
    finally:
        for sock in socks:
            sock.close()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", s.port))
        sock.sendall(b"GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        time.sleep(0.3)  # the server has written what the buffers hold, and holds the rest
        data = b""
        while piece := sock.recv(1 << 20):
            data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert length > 5_000_000 and len(body) == length
    assert sum(len(r["token_write_ns"]) for r in json.loads(body)["streams"]) == 40 * 10000


@pytest.mark.parametrize("max_tokens, n", [(3, 3), (100, 6)])
def test_max_tokens_and_keep_alive(start, max_tokens, n):
    s = start(*FAST, "--tokens", 6)
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        for path in ("/v1/completions", "/v1/chat/completions"):
            post_raw(sock, path, {"model": "m", "prompt": "a", "messages": [], "max_tokens": max_tokens,
                                  "stream": True})
            check_stream(*read_stream(sock), chat="chat" in path, usage=True, token_counts=[1] * n,
                         prompt_tokens=1 if "chat" not in path else 0)
    assert [r["tokens"] for r in s.stats()["streams"]] == [n, n]


@pytest.mark.parametrize("chat", [False, True])
def test_non_streaming(start, chat):
    s = start("--ttft-ms", 30, "--itl-ms", 10, "--tokens", 4)
    t0 = time.monotonic()
    status, _, raw = request(s, "POST", "/v1/chat/completions" if chat else "/v1/completions",
                             {"model": "m", "messages": [{"role": "user", "content": "a b"}], "prompt": "a b"})
    elapsed = time.monotonic() - t0
    answer = json.loads(raw)
    assert status == 200 and 0.060 <= elapsed < 1  # ttft + 3 * itl
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "length"
    if chat:
        assert answer["object"] == "chat.completion"
        assert choice["message"] == {"role": "assistant", "content": " tok" * 4}
    else:
        assert answer["object"] == "text_completion" and choice["text"] == " tok" * 4
    assert answer["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    assert s.stats()["stream_requests"] == 0


# --- timing --------------------------------------------------------------------------------
# The two cores of the test machine are shared with other processes: a busy one can hold
# any process back for a scheduler slice or more (several ms) now and then, so each timing
# check gets up to three tries, and a server that misses its times systematically still fails.

TRIES = 3


@pytest.mark.alone
def test_single_stream_timing(start):
    """Every event of one stream is written within 2 ms of its due time, and a raw client
    receives it within 2 ms of the write."""
    s = start("--ttft-ms", 50, "--itl-ms", 10, "--tokens", 32)
    tries = []
    for _ in range(TRIES):
        _, events = stream(s, "/v1/completions", {"model": "m", "prompt": "x"})
        record = s.stats()["streams"][-1]
        writes = record["token_write_ns"]
        assert len(writes) == len(events) - 3 == 32  # and the final chunk, usage, [DONE]
        late = [w - (record["recv_ns"] + 50 * MS + i * 10 * MS) for i, w in enumerate(writes)]
        delivery = [t - w for (t, _), w in zip(events, writes)]
        tries.append(f"write - due {min(late) / MS:.3f}..{max(late) / MS:.3f} ms, "
                     f"receive - write {min(delivery) / MS:.3f}..{max(delivery) / MS:.3f} ms")
        if max(map(abs, late)) <= 2 * MS and all(0 <= d <= 2 * MS for d in delivery):
            return
    pytest.fail("; ".join(tries))


def p99(values: list[int]) -> int:
    """Nearest-rank 99th percentile (of 64 values: the largest)."""
    return sorted(values)[math.ceil(0.99 * len(values)) - 1]


def run_streams(s: Scripted, n: int) -> None:
    """n streams on n connections, started together, each read to its end by a thread."""
    barrier = threading.Barrier(n, timeout=10)
    results: list[int | BaseException] = []

    def client() -> None:
        try:
            with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
                barrier.wait()
                post_raw(sock, "/v1/completions", {"model": "m", "prompt": "x", "stream": True})
                results.append(len(read_stream(sock)[1]))
        except (OSError, AssertionError, threading.BrokenBarrierError) as e:
            results.append(e)

    threads = [threading.Thread(target=client) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [32 + 3] * n  # tokens, final chunk, usage, [DONE]


@pytest.mark.alone
def test_64_concurrent_streams_first_token(start):
    """64 streams started together: the first token is written within 3 ms of recv + ttft
    at p99."""
    s = start("--ttft-ms", 50, "--itl-ms", 10, "--tokens", 32)
    tries = []
    for k in range(TRIES):
        run_streams(s, 64)
        streams = s.stats()["streams"][64 * k:]
        first = [abs(r["token_write_ns"][0] - r["recv_ns"] - 50 * MS) for r in streams]
        assert len(first) == 64
        tries.append(f"|first token - due|: p50 {sorted(first)[32] / MS:.3f} ms, p99 {p99(first) / MS:.3f} ms")
        if p99(first) <= 3 * MS:
            return
    pytest.fail("; ".join(tries))
