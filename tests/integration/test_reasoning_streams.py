"""Reasoning models and chunks of several tokens, against the scripted server
(tests/servers/scripted.py), whose record of each stream (the kernel's receive time of the
request, the time of each event's write) is the truth; on both HTTP clients.

The issue's case: a model that thinks first (its first token, 50 ms after the request, is
reasoning), then answers, 10 ms a token. Read as before, TTFT waited for the answer
(210 ms here) and TPOT spread the time after it over the answer's tokens alone; and a
server sending 16 tokens a chunk had an 'inter-token' latency of 160 ms."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen.results import render_summary
from tests.integration.test_net_servers import run_doc
from tests.servers.scripted_proc import start_scripted

pytestmark = pytest.mark.integration

MS = 1_000_000
ENGINES = ("native", "asyncio")


def _docs(tmp_path, server_args, *run_args):
    """One run per HTTP client against one scripted server: ({engine: document}, its /stats)."""
    docs = {}
    with start_scripted(tmp_path, *server_args) as srv:
        for engine in ENGINES:
            docs[engine] = run_doc("--sut", f"openai+{srv.url}/v1/chat/completions", "--model", "m",
                                   "--http-engine", engine, "--scenario", "concurrency", "--concurrency", "8",
                                   "--ramp-up-s", "0", *run_args)
        stats = srv.stats()
    return docs, stats


def _median_ms(values):
    return float(np.median(np.asarray(values, dtype=np.float64))) / MS


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_streams_time_the_first_token_of_either_kind(tmp_path, field):
    # 16 reasoning tokens, then 16 of answer: first token at 50 ms, first answer at 210 ms.
    docs, stats = _docs(tmp_path, ("--ttft-ms", "50", "--itl-ms", "10", "--tokens", "32",
                                   "--reasoning-tokens", "16", "--reasoning-field", field),
                        "--query-count", "48")
    streams = [s for s in stats["streams"] if len(s["token_write_ns"]) == 32]
    assert len(streams) == 2 * 48 and all(s["reasoning_tokens"] == 16 for s in streams)
    truth_ttft = _median_ms([s["token_write_ns"][0] - s["recv_ns"] for s in streams])
    truth_ttfat = _median_ms([s["token_write_ns"][16] - s["recv_ns"] for s in streams])
    assert 50 <= truth_ttft < 55 and 210 <= truth_ttfat < 215
    for engine, doc in docs.items():
        assert doc["counts"]["completed"] == 48 and doc["counts"]["tokens"] == 32 * 48, engine
        # The client's times count from the scheduled time (the send), the server's from
        # its receipt: a loose bound on two shared cores.
        assert abs(doc["ttft_ns"]["p50"] / MS - truth_ttft) < 4, (engine, doc["ttft_ns"])
        assert abs(doc["ttfrt_ns"]["p50"] / MS - truth_ttft) < 4, (engine, doc["ttfrt_ns"])
        assert abs(doc["ttfat_ns"]["p50"] / MS - truth_ttfat) < 4, (engine, doc["ttfat_ns"])
        assert doc["ttfrt_ns"]["count"] == doc["ttfat_ns"]["count"] == 48
        assert 9 < doc["tpot_ns"]["p50"] / MS < 11, (engine, doc["tpot_ns"])
        tokens = doc["network"]["tokens"]
        assert (tokens["reasoning_tokens"], tokens["reasoning_source"]) == (16 * 48, "usage"), engine
        assert doc["llm"]["requests"]["reasoning_tokens"] == 16 * 48
        assert doc["reasoning_length_tokens"]["min"] == doc["reasoning_length_tokens"]["max"] == 16
        summary = render_summary(doc)
        assert all(f"\n{label:<12} p50 " in summary for label in ("ttft", "ttfrt", "ttfat", "chunk gap", "itl/token"))
        assert f"{32 * 48:,} output tokens, counted from usage; {16 * 48:,} of them reasoning, counted from usage" \
            in summary
    native, asyncio_ = docs["native"], docs["asyncio"]
    assert native["network"]["tokens"] == asyncio_["network"]["tokens"]


def test_per_token_itl_spreads_each_chunks_gap_over_its_16_tokens(tmp_path):
    # 64 tokens, 16 an event: events 160 ms apart, 10 ms a token.
    docs, stats = _docs(tmp_path, ("--ttft-ms", "50", "--itl-ms", "10", "--tokens", "64",
                                   "--tokens-per-chunk", "16"), "--query-count", "32")
    gaps = [b - a for s in stats["streams"] for a, b in zip(s["token_write_ns"], s["token_write_ns"][1:])]
    # A late write makes one gap longer and the next shorter: the median stays near 160.
    assert len(gaps) == 2 * 32 * 3 and abs(_median_ms(gaps) - 160) < 2
    for engine, doc in docs.items():
        assert doc["counts"]["completed"] == 32 and doc["counts"]["tokens"] == 64 * 32, engine
        assert abs(doc["itl_ns"]["p50"] / MS - 160) < 3, (engine, doc["itl_ns"])  # the gap between chunks
        assert doc["itl_ns"]["count"] == 3 * 32
        assert abs(doc["itl_per_token_ns"]["p50"] / MS - 10) < 0.3, (engine, doc["itl_per_token_ns"])
        assert doc["itl_per_token_ns"]["count"] == 3 * 16 * 32  # each later chunk's 16 tokens
        assert doc["network"]["tokens"]["itl_per_token_split"] == {"chunks": 0, "text_length": 32, "tokenizer": 0}


def test_with_a_tokenizer_the_asyncio_client_counts_each_chunks_tokens(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["tok w1 w2"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    docs, _ = _docs(tmp_path, ("--ttft-ms", "20", "--itl-ms", "5", "--tokens", "32", "--tokens-per-chunk", "8"),
                    "--query-count", "16", "--tokenizer", str(tmp_path / "tokenizer.json"), "--input-tokens", "8")
    # The native client never tokenizes: it spreads usage's count by the chunks' text.
    assert docs["asyncio"]["network"]["tokens"]["itl_per_token_split"] == {"chunks": 0, "text_length": 0,
                                                                           "tokenizer": 16}
    assert docs["native"]["network"]["tokens"]["itl_per_token_split"] == {"chunks": 0, "text_length": 16,
                                                                          "tokenizer": 0}
    for engine, doc in docs.items():
        assert doc["itl_per_token_ns"]["count"] == 3 * 8 * 16, engine
        assert abs(doc["itl_per_token_ns"]["p50"] / MS - 5) < 0.3, (engine, doc["itl_per_token_ns"])
