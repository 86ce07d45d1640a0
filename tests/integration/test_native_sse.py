"""Server-Sent Events of OpenAI streams read natively (csrc/sse.cc, loadgen._core.SseScanner)
against the asyncio client's TokenStream (loadgen/net/openai_answers.py): a differential
property test on generated streams split at random, then the native client end to end
against the scripted server (tests/servers/scripted.py), whose record is the truth.

The tests that start processes; the in-process ones are in tests/unit/test_native_sse.py."""

from __future__ import annotations

import json
import socket

import pytest

from loadgen.net.native import NativeOpenAISUT
from loadgen.net.options import NetOptions
from tests.helpers import _send, _Server
from tests.integration.test_net_servers import run_doc
from tests.servers.scripted_proc import start_scripted

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
                             "output_tokens": 12 * 160, "reasoning_tokens": 0, "reasoning_source": "none",
                             "itl_per_token_split": {"chunks": 0, "text_length": 160, "tokenizer": 0},
                             "cached_tokens": 0, "cached_requests": 0, "cached_share": 0.0,
                             "tool_calls": 0, "tool_call_requests": 0}
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
    # One token a chunk: the per-token inter-token latency is the gap between chunks.
    assert doc["itl_per_token_ns"]["count"] == 11 * 160
    assert abs(doc["itl_per_token_ns"]["p50"] - doc["itl_ns"]["p50"]) < 0.01 * doc["itl_ns"]["p50"]
    assert doc["ttfat_ns"]["count"] == 160 and doc.get("ttfrt_ns", {}).get("count", 0) == 0
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
