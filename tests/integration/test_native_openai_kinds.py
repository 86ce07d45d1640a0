"""OpenAI answers not streamed (``--no-stream``) and ``/v1/embeddings`` on the native
client against the asyncio client: each kind runs on both against the scripted server
(tests/servers/scripted.py), whose record is the truth, and the result's counts and keys
agree; a bad answer fails with the same error class and message on both. Multi-turn
conversations on both clients are in tests/integration/test_multi_turn.py."""

from __future__ import annotations

import itertools
import json
import socket

import pytest

from tests.helpers import _send, _Server
from tests.integration.test_net_servers import run_doc
from tests.servers.scripted_proc import start_scripted

ENGINES = ("native", "asyncio")
LOAD = ("--model", "m", "--scenario", "concurrency", "--concurrency", "4", "--query-count", "60")


def _docs(url, *args, expect=0):
    return {e: run_doc("--sut", url, "--http-engine", e, *args, expect=expect) for e in ENGINES}


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _same_result(native, asyncio_):
    """The keys and counts both clients report alike; which client ran."""
    assert (native["network"]["http_engine"], asyncio_["network"]["http_engine"]) == ("native", "asyncio")
    # The native client adds how long responses waited in the socket (kernel receive stamps).
    assert set(native) - set(asyncio_) <= {"receive_wait_ns"} and set(asyncio_) <= set(native)
    assert set(native["network"]) - set(asyncio_["network"]) == {"io_threads", "native"}
    assert native["network"]["tokens"] == asyncio_["network"]["tokens"]
    assert native["llm"]["requests"] == asyncio_["llm"]["requests"]
    assert native["network"]["responses_checked"] == asyncio_["network"]["responses_checked"]
    for key in ("completed", "failed", "timed_out", "tokens"):
        assert native["counts"][key] == asyncio_["counts"][key], key
    for key in ("output_tokens_per_s", "input_length_tokens", "output_length_tokens", "reasoning_length_tokens"):
        assert native.get(key, {}).get("count", 0) == asyncio_.get(key, {}).get("count", 0), key


@pytest.mark.integration
@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_answers_not_streamed_count_as_on_asyncio_and_as_the_server_sent(tmp_path, endpoint):
    rec = {e: tmp_path / f"{e}.jsonl" for e in ENGINES}
    with start_scripted(tmp_path, "--ttft-ms", "2", "--itl-ms", "0.5", "--tokens", "7",
                        "--reasoning-tokens", "3") as srv:
        docs = {e: run_doc("--sut", f"openai+{srv.url}/v1/{endpoint}", "--http-engine", e, "--no-stream", *LOAD,
                           "--input-tokens", "5:12", "--record-requests", str(rec[e])) for e in ENGINES}
        st = srv.stats()
    native, asyncio_ = docs["native"], docs["asyncio"]
    _same_result(native, asyncio_)
    log = st["completion_log"]
    # Every request the server answered was counted (60 a client), and none streamed.
    assert len(log) == 120 and not any(e["stream"] for e in log)
    assert native["counts"]["completed"] == 60 and native["counts"]["failed"] == 0
    tokens = native["network"]["tokens"]
    assert tokens["queries_counted_from_usage"] == 60 and tokens["output_tokens"] == 7 * 60
    assert native["counts"]["tokens"] == 7 * 60
    # usage.completion_tokens_details.reasoning_tokens: a chat answer's (the server says 3).
    assert tokens["reasoning_tokens"] == (3 * 60 if endpoint.startswith("chat") else 0)
    # Answers not streamed have no first token; each is checked, and these (JSON objects
    # with choices and usage) natively, none by the Python check.
    assert not native.get("ttft_ns", {}).get("count")
    assert native["network"]["responses_checked"] == 60 and native["network"]["native"]["checked_in_python"] == 0
    # Each request's input tokens are the server's prompt words, on both clients (the
    # native run went first).
    for e, answered in (("native", log[:60]), ("asyncio", log[60:])):
        records = _records(rec[e])
        assert sorted(r["input_tokens"] for r in records) == sorted(x["prompt_words"] for x in answered)
        assert docs[e]["llm"]["requests"]["input_tokens_sent"] == sum(x["prompt_words"] for x in answered)


@pytest.mark.integration
def test_embeddings_count_as_on_asyncio_with_input_tokens_per_s(tmp_path):
    rec = {e: tmp_path / f"{e}.jsonl" for e in ENGINES}
    with start_scripted(tmp_path) as srv:
        docs = {e: run_doc("--sut", f"openai+{srv.url}/v1/embeddings", "--http-engine", e, *LOAD,
                           "--record-requests", str(rec[e])) for e in ENGINES}
        st = srv.stats()
    native, asyncio_ = docs["native"], docs["asyncio"]
    _same_result(native, asyncio_)
    assert st["requests"]["embeddings"] == 120
    for doc in (native, asyncio_):
        assert doc["counts"]["completed"] == 60 and doc["counts"]["failed"] == 0
        assert doc["llm"]["requests"]["embeddings"] == 60 and doc["counts"]["tokens"] == 0
        sent = doc["llm"]["requests"]["input_tokens_sent"]
        assert sent > 0
        # The throughput an embeddings run has: its input tokens per second.
        assert doc["throughput"]["input_tokens_per_s"] == pytest.approx(sent / doc["duration_s"])
        assert "output_tokens_per_s" not in doc["throughput"]
    for e in ENGINES:  # each request's record holds its input tokens
        records = _records(rec[e])
        assert len(records) == 60 and sum(r["input_tokens"] for r in records) == docs[e]["llm"]["requests"][
            "input_tokens_sent"]


@pytest.mark.integration
def test_the_summary_shows_input_tokens_per_s_for_embeddings(tmp_path):
    from tests.helpers import run_cli

    with start_scripted(tmp_path) as srv:
        proc = run_cli("run", "--sut", f"openai+{srv.url}/v1/embeddings", *LOAD, "--max-issue-delay-ms", "50",
                       timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "input tokens/s sent" in proc.stdout, proc.stdout


def _whole_route(answer: bytes):
    """Every POST answered with the same JSON ``answer``; a GET with 404."""
    def route(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
        return _send(sock, 404 if method != "POST" else 200, answer if method == "POST" else b"")
    return route


def _canned_docs(endpoint: str, answer: bytes, expect: int = 1):
    srv = _Server(_whole_route(answer))
    try:
        url = f"openai+http://127.0.0.1:{srv.port}/v1/{endpoint}"
        args = ("--model", "m", "--scenario", "concurrency", "--concurrency", "2", "--query-count", "6")
        return _docs(url, *args, *(() if endpoint == "embeddings" else ("--no-stream",)), expect=expect)
    finally:
        srv.stop()


@pytest.mark.integration
@pytest.mark.parametrize("endpoint, answer, says", [
    ("completions", b'{"error": {"message": "overloaded"}}',
     'invalid_response: the server sent an error: {"message": "overloaded"}'),
    ("chat/completions", b"<html>no</html>", "invalid_response: not a JSON object: '<html>no</html>'"),
    ("chat/completions", b'{"choices": []}', "invalid_response: no 'choices' in the answer"),
    ("completions", b'{"choices": [{"text": "a"}], "usage": {"completion_tokens": 99999999999}}',
     "invalid_response: usage.completion_tokens 99999999999 is out of range (0 to 2147483647)"),
    ("embeddings", b'{"data": []}', "invalid_response: no 'data' list of embeddings"),
])
def test_a_bad_answer_fails_as_on_asyncio(endpoint, answer, says):
    docs = _canned_docs(endpoint, answer)
    native, asyncio_ = docs["native"], docs["asyncio"]
    assert native["network"]["http_engine"] == "native"
    assert native["errors"] == asyncio_["errors"] and native["errors"]["counts"] == {"invalid_response": 6}
    assert native["errors"]["messages"][0] == says


def _alternating_route(answers):
    """Every POST answered with the next of ``answers`` in turn; a GET with 404."""
    posts = itertools.count()

    def route(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
        if method != "POST":
            return _send(sock, 404, b"")
        return _send(sock, 200, answers[next(posts) % len(answers)])
    return route


@pytest.mark.integration
def test_answers_counted_natively_and_in_python_add_up_as_on_asyncio():
    """One user; every other answer has no usage (its words are counted, by the Python
    check on the native client), the rest usage with reasoning tokens (counted in the
    core): the figures of both add up to the asyncio client's."""
    answers = (b'{"choices": [{"text": "one two"}], "usage": {"completion_tokens": 5, '
               b'"completion_tokens_details": {"reasoning_tokens": 2}}}',
               b'{"choices": [{"text": "one two three"}]}')
    docs = {}
    for engine in ENGINES:
        srv = _Server(_alternating_route(answers))
        try:
            docs[engine] = run_doc("--sut", f"openai+http://127.0.0.1:{srv.port}/v1/completions", "--model", "m",
                                   "--http-engine", engine, "--no-stream", "--scenario", "concurrency",
                                   "--concurrency", "1", "--query-count", "8")
        finally:
            srv.stop()
    native, asyncio_ = docs["native"], docs["asyncio"]
    _same_result(native, asyncio_)
    assert native["network"]["native"]["checked_in_python"] == 4 and native["network"]["responses_checked"] == 8
    assert native["counts"]["tokens"] == 4 * 5 + 4 * 3
    tokens = native["network"]["tokens"]
    assert tokens["queries_counted_from_usage"] == 8 and tokens["reasoning_tokens"] == 4 * 2
    assert native["llm"]["requests"]["output_tokens"]["min"] == 3 and native["output_length_tokens"]["count"] == 8
    assert native["reasoning_length_tokens"]["count"] == 4 == asyncio_["reasoning_length_tokens"]["count"]


@pytest.mark.integration
def test_an_answer_without_usage_counts_its_words_as_on_asyncio():
    docs = _canned_docs("chat/completions", b'{"choices": [{"message": {"content": "one two three"}}]}', expect=0)
    for doc in docs.values():
        assert doc["counts"]["completed"] == 6 and doc["counts"]["tokens"] == 18
    assert docs["native"]["network"]["tokens"] == docs["asyncio"]["network"]["tokens"]


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["no-stream", "embeddings", "turns", "turns-no-stream"])
@pytest.mark.parametrize("mode", ["closed", "poisson"])
def test_in_process_kinds_through_the_python_api(tmp_path, kind, mode):
    """Each kind on the native client in this process (as the sanitizer runs drive it):
    the engine API, the checker thread's verdicts with their token counts, a
    conversation's follow-ups, and the counts against the server's."""
    from loadgen.engine import Engine, EngineSettings
    from loadgen.llm.workload import LlmOptions
    from loadgen.net import open_target
    from loadgen.net.native import NativeOpenAISUT
    from loadgen.net.options import NetOptions

    turns = 3 if kind.startswith("turns") else 1
    llm = LlmOptions(max_tokens=5, prompt_words=8, sample_count=16, seed=1, stream=kind == "turns", turns=turns,
                     think_time_ms="1")
    endpoint = "embeddings" if kind == "embeddings" else "chat/completions"
    with start_scripted(tmp_path, "--ttft-ms", "2", "--itl-ms", "1", "--tokens", "5", "--log-messages") as srv:
        sut = open_target(f"openai+{srv.url}/v1/{endpoint}",
                          NetOptions(http_engine="native", connections=4, model="m", llm=llm), pool_size=4)
        assert isinstance(sut, NativeOpenAISUT)
        settings = (EngineSettings(mode="closed", concurrency=4, query_count=120) if mode == "closed" else
                    EngineSettings(mode="poisson", target_qps=400, query_count=120, max_in_flight=4))
        result = Engine(settings, sut).run()
        stats = srv.stats()
    report = sut.report()
    c = result.counts
    assert report["http_engine"] == "native" and c["issued"] == 120 and c["failed"] == 0 and c["timed_out"] == 0
    answered = stats["requests"].get("embeddings" if kind == "embeddings" else "chat_completions", 0)
    assert answered == c["completed"] + c["cancelled"] and c["completed"] >= 100
    assert report["native"]["responses"] == answered
    # Answers not streamed, outside a conversation, are counted in the core; embeddings and
    # every turn by the Python check.
    assert report["native"]["checked_in_python"] == (0 if kind == "no-stream" else answered)
    if kind == "embeddings":
        assert report["llm"]["requests"]["embeddings"] == c["completed"] and c["tokens"] == 0
    else:
        assert c["tokens"] == 5 * c["completed"] == report["tokens"]["output_tokens"]
    if turns > 1:
        conv = report["llm"]["conversations"]
        assert sum(conv["turns_completed"]) == c["completed"] and conv["follow_ups"]["issued"] > 0
        assert conv["started"] == conv["finished"] + conv["cut_short"]["failed_turn"] + conv["cut_short"]["run_ended"]
        log = stats["completion_log"]
        assert max(len(e["messages"]) for e in log) == 5
        # Each later turn carries the replies the server gave (5 tokens each).
        assert all(m["content"] == " tok" * 5 for e in log for m in e["messages"][1::2])
