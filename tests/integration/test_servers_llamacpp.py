"""loadgen's OpenAI client against a real OpenAI-compatible server: llama-cpp-python's
server (installed from PyPI, see tests/servers/llamacpp.py) on 127.0.0.1, serving a tiny
random llama model on the CPU. The scripted server stays the reference for timing; here
the question is whether loadgen reads a real server's streams and answers right: the
requests it counts are the ones the server answered, its output token counts are the
tokens the server generated (from the server's own log), and the chunked TTFT, TPOT and
inter-token gaps it derives hang together.

Skipped where the server is not installed, unless LOADGEN_REQUIRE_SERVERS=1 (CI) or
LOADGEN_TEST_REAL_LLM=1: then the fixture builds it (about 5 minutes) and a failed install
fails.
"""

from __future__ import annotations

import json
from typing import Iterator, List, Tuple

import pytest

from tests.servers.llamacpp import LlamaCppServer, running_llamacpp
from tests.servers.tiny_llama_gguf import WORDS
from tests.helpers import run_cli

pytestmark = pytest.mark.integration

LOAD = ("--scenario", "concurrency", "--max-issue-delay-ms", "1000", "--interval-s", "0", "--timeout-ms", "60000")


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[LlamaCppServer]:
    yield from running_llamacpp(str(tmp_path_factory.mktemp("llamacpp")))


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory) -> str:
    """The word-level tokenizer of the model's words w0..w999: each is one token to the
    server too (tiny_llama_gguf.py), so loadgen's prompts have exact token counts."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(f"w{i}" for i in range(WORDS))],
                            tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def _run(server: LlamaCppServer, tmp_path, path: str, *args: str) -> Tuple[dict, int, List[int]]:
    """Runs loadgen against ``path``; (its result, the requests the server answered on
    that path meanwhile, the server's decode runs of each generation meanwhile)."""
    answered, runs = server.answered(path), len(server.eval_runs())
    proc = run_cli("run", "--json", "--sut", f"openai+{server.url}{path}", *LOAD, *args,
                   timeout=120, cwd=str(tmp_path))
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:], server.process.log_tail())
    doc = json.loads(proc.stdout)
    return doc, server.answered(path) - answered, server.eval_runs()[runs:]


def _check_counts(doc: dict, n: int, answered: int, runs: List[int]) -> None:
    c = doc["counts"]
    assert doc["valid"], doc["invalid_reasons"]
    assert c["issued"] == c["completed"] == n and c["failed"] == c["timed_out"] == 0, (c, doc["errors"])
    assert answered == n and len(runs) == n
    assert doc["network"]["model"] == "tiny-llama"


def _check_stream_timing(doc: dict, n: int, tokens: int) -> None:
    ttft, tpot, itl = doc["ttft_ns"], doc["tpot_ns"], doc["itl_ns"]
    assert ttft["count"] == n and tpot["count"] == n
    # Every request has at least 2 tokens: n TPOTs, and one gap between each two tokens.
    assert itl["count"] == tokens - n
    # The model is tiny: a token takes well under a millisecond to a few on a busy CPU.
    # Requests wait for each other (the server generates for one at a time), so TTFT can
    # reach several times a whole request; the bounds only catch units or clocks gone wrong.
    assert 10_000 <= ttft["min"] <= ttft["max"] < 30e9
    assert doc["latency_ns"]["min"] >= ttft["min"]
    # The server's chunks often arrive several to a read (its generator runs in a thread
    # pool and hands each chunk over to the event loop): such tokens are 0 ns apart (gaps
    # are recorded as 1 ns), and a request whose tokens all came in one read has a TPOT of
    # 0. Across the run, tokens are spaced by the generation's own pace.
    assert 0 <= tpot["min"] and 1_000 <= tpot["max"] < 1e9
    assert itl["min"] >= 1 and 1_000 <= itl["max"] < 30e9


@pytest.mark.parametrize("http_engine", ["asyncio", "native"])
def test_chat_stream_with_ignore_eos_has_exact_lengths(server, word_tokenizer, tmp_path, http_engine):
    n = 12
    doc, answered, runs = _run(server, tmp_path, "/v1/chat/completions", "--http-engine", http_engine,
                               "--concurrency", "3", "--query-count", str(n),
                               "--tokenizer", word_tokenizer, "--input-tokens", "16:48", "--output-tokens", "4:24",
                               "--ignore-eos")
    _check_counts(doc, n, answered, runs)
    net, llm = doc["network"], doc["llm"]
    # min_tokens = max_tokens: every generation ran to max_tokens, whose last token is
    # sampled and sent but not decoded: one token more than the server's decode runs.
    generated = sum(runs) + n
    # This server sends no usage in streams: loadgen counts the chunks, one per token.
    assert net["tokens"]["source"] == "chunks" and net["tokens"]["queries_counted_from_chunks"] == n
    assert net["tokens"]["output_tokens"] == doc["counts"]["tokens"] == generated
    out = llm["requests"]["output_tokens"]
    assert out["count"] == n and out["sum"] == generated and 4 <= out["min"] <= out["max"] <= 24
    assert llm["input_tokens_exact"] is True and llm["ignore_eos"] is True and llm["stream"] is True
    assert llm["requests"]["input_tokens_sent"] >= 16 * n
    _check_stream_timing(doc, n, generated)
    tps = doc["throughput"]["output_tokens_per_s"]
    assert tps > 0 and abs(tps * doc["duration_s"] - generated) <= 0.05 * generated + 1


@pytest.mark.parametrize("http_engine", ["asyncio", "native"])
def test_completions_stream_ending_at_eos(server, word_tokenizer, tmp_path, http_engine):
    # Without --ignore-eos the model's EOS (about 1 token in 25) ends some requests early;
    # "min_tokens": 2 (merged by --extra-body) keeps every answer to 2 tokens or more.
    n = 16
    doc, answered, runs = _run(server, tmp_path, "/v1/completions", "--http-engine", http_engine,
                               "--concurrency", "2", "--query-count", str(n),
                               "--tokenizer", word_tokenizer, "--input-tokens", "8:32", "--output-tokens", "24:48",
                               "--extra-body", '{"min_tokens": 2}')
    _check_counts(doc, n, answered, runs)
    tokens = doc["network"]["tokens"]["output_tokens"]
    # A generation that ended at EOS output as many tokens as it decoded; one that ended at
    # max_tokens one more. Some did end at EOS, and some before 24 tokens: each request has
    # at least 22 draws where EOS (about 1 in 25) may come, so that none comes in 16
    # requests has a chance below 1e-6.
    at_length = tokens - sum(runs)
    assert 0 <= at_length < n, (tokens, runs)
    assert doc["llm"]["requests"]["output_tokens"]["min"] >= 2
    assert doc["llm"]["requests"]["output_tokens"]["min"] < 24
    assert doc["network"]["tokens"]["source"] == "chunks"
    _check_stream_timing(doc, n, tokens)


@pytest.mark.parametrize("http_engine", ["asyncio", "native"])
def test_no_stream_token_counts_are_the_servers_usage(server, word_tokenizer, tmp_path, http_engine):
    n = 12
    prompts_before = len(server.prompt_lengths())
    doc, answered, runs = _run(server, tmp_path, "/v1/completions", "--http-engine", http_engine,
                               "--concurrency", "4", "--query-count", str(n),
                               "--tokenizer", word_tokenizer, "--input-tokens", "20", "--output-tokens", "6:12",
                               "--ignore-eos", "--no-stream")
    _check_counts(doc, n, answered, runs)
    net = doc["network"]["tokens"]
    assert net["source"] == "usage" and net["queries_counted_from_usage"] == n
    assert net["output_tokens"] == doc["llm"]["requests"]["output_tokens"]["sum"] == sum(runs) + n
    assert doc["llm"]["requests"]["input_tokens_sent"] == 20 * n
    # loadgen's prompts of exactly 20 tokens (with the word tokenizer) are 20 tokens to the
    # server's own tokenizer too: 21 with its BOS.
    lengths = server.prompt_lengths()[prompts_before:]
    assert len(lengths) >= n - 1 and set(lengths) == {21}, lengths
    assert not doc.get("ttft_ns", {}).get("count")  # not streamed: no first token
    assert doc["output_tokens_per_s"]["count"] == n
    assert doc["network"]["http_engine"] == http_engine


@pytest.mark.parametrize("http_engine", ["asyncio", "native"])
def test_streams_that_end_at_once_complete_with_0_tokens(server, tmp_path, http_engine):
    # A logit bias of +100 on EOS (token 2) makes it the first token of every answer: the
    # server streams a role chunk, a finish chunk and [DONE], with no text and no usage.
    n = 8
    doc, answered, runs = _run(server, tmp_path, "/v1/chat/completions", "--http-engine", http_engine,
                               "--concurrency", "2", "--query-count", str(n),
                               "--output-tokens", "4:8", "--extra-body", '{"logit_bias": {"2": 100}}')
    _check_counts(doc, n, answered, runs)
    assert runs == [1] * n  # llama.cpp's floor of 1 (no token was decoded)
    assert doc["counts"]["tokens"] == doc["network"]["tokens"]["output_tokens"] == 0
    assert doc["llm"]["requests"]["output_tokens"]["max"] == 0
    assert not doc.get("ttft_ns", {}).get("count") and not doc.get("tpot_ns", {}).get("count")


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("http_engine", ["asyncio", "native"])
def test_conversations_carry_the_servers_replies(server, word_tokenizer, tmp_path, http_engine, stream):
    # One user, two conversations of three turns: each later turn carries the history
    # (the earlier turns and the server's actual replies), so its prompt is longer.
    n = 6
    prompts_before = len(server.prompt_lengths())
    doc, answered, runs = _run(server, tmp_path, "/v1/chat/completions", "--http-engine", http_engine,
                               "--concurrency", "1", "--query-count", str(n), "--turns", "3", "--think-time-ms", "5",
                               "--tokenizer", word_tokenizer, "--input-tokens", "8", "--output-tokens", "4",
                               "--ignore-eos", *(() if stream else ("--no-stream",)))
    _check_counts(doc, n, answered, runs)
    assert doc["network"]["http_engine"] == http_engine
    conv = doc["llm"]["conversations"]
    assert conv["started"] == conv["finished"] == 2 and conv["turns_completed"] == [2, 2, 2]
    assert conv["follow_ups"]["issued"] == 4 and conv["history_messages_max"] == 5
    # Each turn's input tokens: its own 8, and every earlier turn's 8 and reply's 4 tokens.
    assert doc["llm"]["requests"]["input_tokens_sent"] == 2 * (8 + 20 + 32)
    # The server's own count of the prompts it evaluated grows with the history (its
    # prompt cache skips a prefix it has seen, so not every turn shows).
    lengths = server.prompt_lengths()[prompts_before:]
    assert lengths and max(lengths) > min(lengths) > 8, lengths
