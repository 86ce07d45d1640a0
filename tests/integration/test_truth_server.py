"""The native truth server (tests/servers/truth_server.cc): built with g++, its chat
completion stream and record checked by hand, then a short loadgen run against it whose
counts equal the server's record, and the server's timing as scripted."""

from __future__ import annotations

import http.client
import json
import math
import subprocess
import sys

import pytest

from tests.servers.procs import require_servers
from tests.servers.truth_server import TruthServerUnavailable, build_truth_server, start_truth_server

MS = 1_000_000
TTFT_MS, ITL_MS, TOKENS, PER_CHUNK = 50, 10, 64, 8
EVENTS = 1 + math.ceil((TOKENS - 1) / PER_CHUNK)  # a 1-token first event, then 8 each: 9


@pytest.fixture(scope="module")
def binary() -> str:
    try:
        return build_truth_server()
    except TruthServerUnavailable as e:
        if require_servers():
            pytest.fail(str(e))
        pytest.skip(str(e))


@pytest.fixture
def server(binary, tmp_path):
    srv = start_truth_server(tmp_path, "--ttft-ms", TTFT_MS, "--itl-ms", ITL_MS, "--tokens", TOKENS,
                             "--tokens-per-chunk", PER_CHUNK, "--first-chunk-tokens", 1, "--max-runtime-s", 120)
    yield srv
    srv.stop()


def post(port: int, body: dict) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def due_ns(stream: dict, i: int) -> int:
    """When event i of a recorded stream was due: when its last token was."""
    last = min(stream["tokens"], stream["first_event_tokens"] + i * stream["tokens_per_event"])
    return stream["recv_ns"] + TTFT_MS * MS + (last - 1) * ITL_MS * MS


def test_one_stream_as_the_scripted_server_sends_it(server):
    status, headers, raw = post(server.port, {"model": "m", "stream": True, "max_tokens": 20,
                                              "messages": [{"role": "user", "content": "three short words"}],
                                              "stream_options": {"include_usage": True}})
    assert status == 200 and headers["content-type"] == "text/event-stream"
    events = [line[len("data: "):] for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    (stream,) = server.stats()["streams"]
    assert {c["id"] for c in chunks} == {f"chatcmpl-{stream['recv_ns']}"}  # GuideLLM's matching relies on it
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    text = "".join(d.get("content", "") for d in deltas)
    assert text.split() == ["tok"] * 20  # max_tokens 20 under --tokens 64: 1 + 8 + 8 + 3
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 20, "total_tokens": 23}
    assert (stream["tokens"], stream["tokens_per_event"], stream["first_event_tokens"]) == (20, 8, 1)
    assert len(stream["token_write_ns"]) == 4 and stream["usage_sent"]
    # its own lateness per write is write - due, due at recv + ttft + (last token - 1) * itl
    assert stream["write_late_ns"] == [w - due_ns(stream, i) for i, w in enumerate(stream["token_write_ns"])]
    assert all(late >= 0 for late in stream["write_late_ns"])


def test_other_requests_and_bad_bodies(server):
    status, _, raw = post(server.port, {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "a"}]})
    answer = json.loads(raw)
    assert status == 200 and answer["choices"][0]["message"]["content"].split() == ["tok"] * 3
    assert answer["usage"]["completion_tokens"] == 3
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", "/v1/chat/completions", b"{not json")
    bad = conn.getresponse()
    assert bad.status == 400 and b"bad completion request" in bad.read()
    conn.request("GET", "/v2/health/ready")  # the same keep-alive connection
    missing = conn.getresponse()
    assert missing.status == 404 and b"no route for GET /v2/health/ready" in missing.read()
    conn.close()
    stats = server.stats()
    assert stats["streams"] == [] and stats["requests"]["chat_completions"] == 2


@pytest.mark.parametrize("argv, message", [
    (["--tokens", "0"], "--tokens 0: not a positive whole number"),
    (["--port", "70000"], "--port 70000: out of range"),
    (["--ttft"], "--ttft needs a value"),
    (["--speed", "2"], "unknown option --speed"),
])
def test_bad_options_are_named(binary, argv, message):
    p = subprocess.run([binary, *argv], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and message in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.alone
def test_loadgen_counts_equal_the_record_and_the_server_keeps_its_script(server):
    r = subprocess.run([sys.executable, "-m", "loadgen", "run", "--sut", f"openai+{server.url}/v1/chat/completions",
                        "--model", "m", "--scenario", "concurrency", "--concurrency", "50", "--duration-s", "2",
                        "--ramp-up-s", "0", "--max-tokens", str(TOKENS), "--json", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    stats = server.stats()
    streams = stats["streams"]
    # 50 streams of 9 events over 0.69 s, closed loop, 2 s: some 150 requests
    assert doc["counts"]["failed"] == 0 and doc["counts"]["completed"] >= 100
    assert doc["counts"]["issued"] == doc["counts"]["completed"] == len(streams) == stats["requests"]["chat_completions"]
    assert all(len(s["token_write_ns"]) == EVENTS and s["usage_sent"] for s in streams)
    assert doc["network"]["tokens"]["output_tokens"] == sum(s["tokens"] for s in streams) == TOKENS * len(streams)
    # The server's timing as scripted: first write 50 ms after the receipt, then every
    # 80 ms (8 tokens of 10 ms); bounds loose enough for a busy machine.
    for s in streams:
        w = s["token_write_ns"]
        assert TTFT_MS * MS <= w[0] - s["recv_ns"] <= (TTFT_MS + 25) * MS
        assert all(0 <= late <= 25 * MS for late in s["write_late_ns"])
        assert s["write_late_ns"] == [x - due_ns(s, i) for i, x in enumerate(w)]
    late = sorted(x for s in streams for x in s["write_late_ns"])
    assert late[len(late) // 2] < 5 * MS  # the median write within 5 ms of its due time
