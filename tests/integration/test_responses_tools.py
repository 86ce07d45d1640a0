"""OpenAI's /v1/responses API and tool calls (--tools), on both HTTP clients, against the
scripted server (tests/servers/scripted.py), whose record of each request (what it was
sent, the tokens and tool calls it answered with, each event's write time) is the truth."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loadgen.results import render_summary
from tests.helpers import run_cli, write
from tests.integration.test_net_servers import run_doc
from tests.servers.scripted_proc import start_scripted

pytestmark = pytest.mark.integration

MS = 1_000_000
ENGINES = ("native", "asyncio")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}},
                                           "x-result": "sunny, 21 C"}},
         {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}]


def _runs(srv, path, *run_args):
    """One run per HTTP client: [(engine, document, the server's log entries of its requests)]."""
    out = []
    for engine in ENGINES:
        before = len(srv.stats()["completion_log"])
        doc = run_doc("--sut", f"openai+{srv.url}{path}", "--model", "m", "--http-engine", engine,
                      "--scenario", "concurrency", "--ramp-up-s", "0", *run_args)
        assert doc["network"]["http_engine"] == engine
        out.append((engine, doc, srv.stats()["completion_log"][before:]))
    return out


def _median_ms(values):
    return float(np.median(np.asarray(values, dtype=np.float64))) / MS


def test_responses_streams_give_ttft_reasoning_usage_and_cached_tokens_on_both_clients(tmp_path):
    # 16 reasoning tokens, then 16 of answer text: first token at 50 ms, first answer at 210 ms.
    with start_scripted(tmp_path, "--ttft-ms", "50", "--itl-ms", "10", "--tokens", "32", "--reasoning-tokens", "16",
                        "--prefix-cache") as srv:
        runs = _runs(srv, "/v1/responses", "--concurrency", "4", "--query-count", "24", "--sample-count", "6",
                     "--input-tokens", "16", "--output-tokens", "32")
        streams = srv.stats()["streams"]
    assert len(streams) == 48 and all(len(s["token_write_ns"]) == 32 and s["usage_sent"] for s in streams)
    truth_ttft = _median_ms([s["token_write_ns"][0] - s["recv_ns"] for s in streams])
    truth_ttfat = _median_ms([s["token_write_ns"][16] - s["recv_ns"] for s in streams])
    assert 50 <= truth_ttft < 55 and 210 <= truth_ttfat < 215
    for engine, doc, log in runs:
        assert doc["counts"]["completed"] == 24 and doc["counts"]["failed"] == 0, engine
        assert doc["counts"]["tokens"] == 32 * 24
        assert all(e["stream"] and e["max_output_tokens"] == 32 and "stream_options" not in e for e in log)
        assert abs(doc["ttft_ns"]["p50"] / MS - truth_ttft) < 4, (engine, doc["ttft_ns"])
        assert abs(doc["ttfat_ns"]["p50"] / MS - truth_ttfat) < 4, (engine, doc["ttfat_ns"])
        assert 9 < doc["tpot_ns"]["p50"] / MS < 11 and 9 < doc["itl_ns"]["p50"] / MS < 11, engine
        tokens = doc["network"]["tokens"]
        assert (tokens["source"], tokens["output_tokens"]) == ("usage", 32 * 24), engine
        assert (tokens["reasoning_tokens"], tokens["reasoning_source"]) == (16 * 24, "usage"), engine
        # The server's record of the prompts' cached words, summed: usage's input_tokens_details.
        assert tokens["cached_tokens"] == sum(e["cached_tokens"] for e in log) > 0, engine
        assert tokens["cached_requests"] == 24 and tokens["tool_calls"] == 0
    assert runs[0][1]["network"]["tokens"]["reasoning_tokens"] == runs[1][1]["network"]["tokens"]["reasoning_tokens"]


def test_responses_not_streamed_are_counted_from_usage_on_both_clients(tmp_path):
    with start_scripted(tmp_path, "--ttft-ms", "5", "--itl-ms", "1", "--tokens", "12", "--reasoning-tokens", "4") \
            as srv:
        runs = _runs(srv, "/v1/responses", "--concurrency", "4", "--query-count", "20", "--no-stream")
    for engine, doc, log in runs:
        assert doc["counts"]["completed"] == 20 and doc["counts"]["tokens"] == 12 * 20, engine
        assert all(e["stream"] is False for e in log) and len(log) == 20
        tokens = doc["network"]["tokens"]
        assert (tokens["output_tokens"], tokens["reasoning_tokens"]) == (12 * 20, 4 * 20), engine


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_tool_calls_are_counted_and_their_results_fed_back_in_the_next_turn(tmp_path, path, stream):
    tools = write(tmp_path / "tools.json", json.dumps(TOOLS))
    responses = path == "/v1/responses"
    with start_scripted(tmp_path, "--ttft-ms", "5", "--itl-ms", "1", "--tokens", "8", "--tool-calls", "2",
                        "--log-messages") as srv:
        runs = _runs(srv, path, "--concurrency", "2", "--query-count", "12", "--turns", "2",
                     "--tools", str(tools), *(() if stream else ("--no-stream",)))
    for engine, doc, log in runs:
        assert doc["counts"]["completed"] == 12 and doc["counts"]["failed"] == 0, engine
        assert len(log) == 12
        called = [e for e in log if e["tool_calls"]]
        fed_back = [e for e in log if len(e["messages"]) > 1]
        # Every first turn carries the tools and is answered with 2 calls (8 tokens of
        # arguments); every second turn feeds the results back and is answered with text.
        assert len(called) + len(fed_back) == 12 and called and fed_back, engine
        assert all(e["tool_choice"] == "auto" and len(e["tools"]) == 2 for e in log)
        tokens = doc["network"]["tokens"]
        assert (tokens["tool_calls"], tokens["tool_call_requests"]) == (2 * len(called), len(called)), engine
        assert tokens["output_tokens"] == 8 * 12
        assert f"; {2 * len(called)} tool calls in {len(called)} answers" in render_summary(doc)
        for e in fed_back:
            assert e["tool_calls"] == 0
            user, *rest = e["messages"]
            assert user["role"] == "user"
            if responses:
                assert [m["type"] for m in rest] == ["function_call", "function_call", "function_call_output",
                                                     "function_call_output"]
                assert [(m["call_id"], m["name"]) for m in rest[:2]] == [("call_0", "get_weather"),
                                                                          ("call_1", "get_weather")]
                assert [(m["call_id"], m["output"]) for m in rest[2:]] == [("call_0", "sunny, 21 C"),
                                                                            ("call_1", "sunny, 21 C")]
                assert "".join(m["arguments"] for m in rest[:2]) == " tok" * 8
            else:
                assistant, *results = rest
                assert assistant["role"] == "assistant" and assistant["content"] is None
                assert [(c["id"], c["function"]["name"]) for c in assistant["tool_calls"]] == \
                    [("call_0", "get_weather"), ("call_1", "get_weather")]
                assert "".join(c["function"]["arguments"] for c in assistant["tool_calls"]) == " tok" * 8
                assert results == [{"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21 C"},
                                   {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]


@pytest.mark.parametrize("content, says", [
    ("[1, 2", "not JSON"),
    ('{"functions": []}', "not an OpenAI tools array"),
    ('[{"type": "function", "function": {"description": "no name"}}]', "tool 1 has no function 'name'"),
    ('[{"type": "web_search"}]', "tool 1 has type 'web_search'"),
])
def test_a_bad_tools_file_is_exit_2_with_one_line_naming_the_file(tmp_path, content, says):
    path = write(tmp_path / "tools.json", content)
    proc = run_cli("run", "--sut", "openai+http://127.0.0.1:9/v1/chat/completions", "--tools", str(path),
                   "--query-count", "1", timeout=30)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and says in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_tools_on_a_completions_target_and_a_missing_file_are_refused(tmp_path):
    tools = write(tmp_path / "tools.json", json.dumps(TOOLS))
    proc = run_cli("run", "--sut", "openai+http://127.0.0.1:9/v1/completions", "--tools", str(tools),
                   "--model", "m", "--query-count", "1", timeout=30)
    assert proc.returncode == 2 and "/v1/chat/completions or /v1/responses" in proc.stderr, proc.stderr
    proc = run_cli("run", "--sut", "openai+http://127.0.0.1:9/v1/chat/completions", "--tools",
                   str(tmp_path / "none.json"), "--query-count", "1", timeout=30)
    assert proc.returncode == 2 and "cannot read " in proc.stderr and "none.json: No such file" in proc.stderr, proc.stderr
