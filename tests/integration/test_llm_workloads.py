"""LLM workloads (loadgen/llm): token-length distributions, prompts built to exact token
counts with a tokenizer trained here, datasets (JSON lines, ShareGPT), and runs of each
workload form against the scripted server, whose own log of the requests it answered is
what loadgen's counts and lengths are compared with. The CLI runs as a subprocess with
the test's tmp_path as its working directory; every server is ended by its PID.

The tests that start processes; the in-process ones are in tests/unit/test_llm_workloads.py."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from tests.helpers import run_cli
from tests.servers.scripted_proc import start_scripted
from tests.unit import test_llm_workloads as unit

word_tokenizer = unit.word_tokenizer  # the unit tests' fixture

SERVER = ("--ttft-ms", "1", "--itl-ms", "0", "--tokens", "4096", "--tokens-per-chunk", "64")


LOAD = ("--scenario", "concurrency", "--concurrency", "4", "--max-issue-delay-ms", "1000", "--interval-s", "0")


def _run(tmp_path, *args, expect=0):
    proc = run_cli("run", "--json", *LOAD, *args, timeout=60, cwd=str(tmp_path))
    assert proc.returncode == expect, (proc.returncode, proc.stderr[-2000:])
    return json.loads(proc.stdout) if expect in (0, 1) else proc


def _log(srv):
    st = srv.stats()
    return st["requests"], st["completion_log"]


def test_synthetic_run_counts_and_lengths_equal_the_servers(tmp_path, word_tokenizer):
    with start_scripted(tmp_path, *SERVER) as srv:
        doc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/completions", "--query-count", "300",
                   "--sample-count", "300", "--sample-order", "sequential", "--sample-seed", "3", "--tokenizer", word_tokenizer,
                   "--input-tokens", "mean=120,sd=30", "--output-tokens", "lognormal:mean=40,sd=15,max=200",
                   "--shared-prefix-tokens", "8", "--prefix-groups", "4", "--record-requests", "r.jsonl")
        requests, log = _log(srv)
    c, llm = doc["counts"], doc["llm"]
    assert c["completed"] == requests["completions"] == len(log) == 300 and c["failed"] == 0
    # One pass over the samples: the server saw each prompt once; its word count is the
    # token count of this word-level tokenizer (the 8-token prefix comes on top).
    prompt_tokens = np.asarray([e["prompt_words"] for e in log]) - 8
    assert stats.kstest(prompt_tokens, stats.norm(120, 30).cdf).pvalue > 0.01
    served = np.asarray([e["completion_tokens"] for e in log])
    assert sorted(served) == sorted(e["max_tokens"] for e in log)
    sigma2 = np.log1p((15 / 40) ** 2)
    lognorm = stats.lognorm(np.sqrt(sigma2), scale=np.exp(np.log(40) - sigma2 / 2))
    assert stats.kstest(served, lognorm.cdf).pvalue > 0.01
    assert llm["requests"]["output_tokens"]["sum"] == doc["network"]["tokens"]["output_tokens"] == served.sum()
    assert llm["requests"]["input_tokens_sent"] == sum(e["prompt_words"] for e in log)
    assert llm["source"] == "synthetic" and llm["input_tokens_exact"] is True and llm["prefix_groups"] == 4
    assert llm["input_tokens"]["kind"] == "normal" and llm["output_tokens"]["kind"] == "lognormal"
    # Each request's input and output tokens: in its record, and in the length histograms.
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert sorted(r["input_tokens"] for r in records) == sorted(e["prompt_words"] for e in log)
    assert sorted(r["output_tokens"] for r in records) == sorted(served)
    for key, values in (("input_length_tokens", [e["prompt_words"] for e in log]), ("output_length_tokens", served)):
        h = doc[key]
        assert h["count"] == 300 and h["min"] == min(values) and h["max"] == max(values)
        assert abs(h["mean"] - np.mean(values)) < 0.01 * np.mean(values)


def test_dataset_chat_no_stream_ignore_eos_and_extra_body(tmp_path):
    data = tmp_path / "prompts.jsonl"
    lines = [{"messages": [{"role": "user", "content": "w1 w2 w3"}], "max_tokens": 5},
             {"prompt": "w4 w5", "max_tokens": 9},
             {"prompt": " ".join(["w6"] * 50)}]  # filtered out by --dataset-max-input-tokens
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    with start_scripted(tmp_path, *SERVER) as srv:
        doc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/chat/completions", "--dataset", str(data),
                   "--dataset-max-input-tokens", "10", "--query-count", "40", "--no-stream", "--ignore-eos",
                   "--extra-body", '{"temperature": 0, "top_p": 0.5}')
        requests, log = _log(srv)
    c = doc["counts"]
    assert c["completed"] == requests["chat_completions"] == len(log) == 40 and c["failed"] == 0
    assert {e["max_tokens"] for e in log} == {5, 9} and {e["prompt_words"] for e in log} == {3, 2}
    assert all(e["stream"] is False and e["ignore_eos"] is True and e["min_tokens"] == e["max_tokens"]
               and e["temperature"] == 0 and e["top_p"] == 0.5 and "stream_options" not in e for e in log)
    assert doc["network"]["tokens"]["output_tokens"] == sum(e["completion_tokens"] for e in log)
    assert "ttft_ns" not in doc or not doc["ttft_ns"].get("count")
    llm = doc["llm"]
    assert llm["source"] == "dataset" and llm["records_read"] == 3 and llm["records_used"] == 2
    assert llm["input_tokens_exact"] is False and llm["stream"] is False


def test_sharegpt_with_a_tokenizer_takes_reply_lengths_as_max_tokens(tmp_path, word_tokenizer):
    convs = [{"conversations": [{"from": "human", "value": "w1 w2 w3 w4"}, {"from": "gpt", "value": "w5 w6 w7"}]},
             {"conversations": [{"from": "gpt", "value": "w1"}]},  # no human turn: skipped
             {"conversations": [{"from": "human", "value": "w8"}, {"from": "gpt", "value": "w9 w10"}]}]
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(convs))
    with start_scripted(tmp_path, *SERVER) as srv:
        doc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/completions", "--dataset", str(data),
                   "--tokenizer", word_tokenizer, "--dataset-min-input-tokens", "2", "--query-count", "30")
        requests, log = _log(srv)
    assert doc["counts"]["completed"] == requests["completions"] == 30
    assert {(e["prompt_words"], e["max_tokens"]) for e in log} == {(4, 3)}
    assert doc["llm"]["layout"] == "sharegpt" and doc["llm"]["records_read"] == 2


def test_embeddings_endpoint(tmp_path):
    with start_scripted(tmp_path, *SERVER) as srv:
        doc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/embeddings", "--query-count", "50",
                   "--input-tokens", "16")
        requests = srv.stats()["requests"]
    assert doc["counts"]["completed"] == requests["embeddings"] == 50 and doc["counts"]["failed"] == 0
    assert doc["llm"]["endpoint"] == "embeddings" and doc["llm"]["requests"]["embeddings"] == 50
    assert doc["llm"]["requests"]["input_tokens_sent"] == 50 * 16


@pytest.mark.parametrize("engine", ["asyncio", "native", "auto"])
@pytest.mark.parametrize("endpoint, extra", [("completions", ()), ("chat/completions", ("--no-stream",))])
def test_model_mix_follows_its_weights_and_counts_equal_the_servers(tmp_path, endpoint, extra, engine):
    """Both clients keep each model's figures (the native client in the core, by request
    group); auto runs a mix natively."""
    args = ("--query-count", "400", "--sample-count", "400", "--sample-order", "sequential", "--sample-seed", "5",
            "--model", "base=3,lora-a=1", "--http-engine", engine, *extra)
    with start_scripted(tmp_path, *SERVER) as srv:
        doc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/{endpoint}", *args)
        _, log = _log(srv)
    assert doc["network"]["http_engine"] == ("asyncio" if engine == "asyncio" else "native")
    served = Counter(e["model"] for e in log)
    assert set(served) == {"base", "lora-a"} and sum(served.values()) == 400
    # 400 draws at 3:1: the share of base is 0.75 with a standard deviation of about 0.022.
    assert abs(served["base"] / 400 - 0.75) < 0.09, served
    models = doc["network"]["models"]
    assert doc["network"]["model"] == "base=3,lora-a=1"
    for name, share in (("base", 0.75), ("lora-a", 0.25)):
        m = models[name]
        assert m["count"] == m["sent"] == served[name] == m["latency_ns"]["count"], (name, m, served)
        assert m["share"] == share and m["output_tokens"] == sum(e["completion_tokens"] for e in log
                                                                  if e["model"] == name)
        assert m["ttft_ns"]["count"] == (0 if extra else served[name])
        assert 0 < m["latency_ns"]["p50"] <= m["latency_ns"]["max"]
    # The same sample seed draws the same models.
    with start_scripted(tmp_path, *SERVER) as srv:
        _run(tmp_path, "--sut", f"openai+{srv.url}/v1/{endpoint}", *args)
        _, again = _log(srv)
    assert Counter(e["model"] for e in again) == served


@pytest.mark.parametrize("engine", ["asyncio", "native"])
@pytest.mark.parametrize("extra", [("--turns", "2", "--think-time-ms", "1"),
                                   ("--turns", "2", "--think-time-ms", "1", "--no-stream")],
                         ids=["conversations", "conversations-no-stream"])
def test_model_mix_figures_of_conversations_equal_the_servers(tmp_path, engine, extra):
    """A conversation's turns count in its model on both clients: natively, its follow-ups
    carry their conversation's group into the core, and answers not streamed, which the
    Python check counts, carry their model there."""
    with start_scripted(tmp_path, *SERVER) as srv:
        doc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/chat/completions", "--http-engine", engine,
                   "--query-count", "120", "--sample-count", "60", "--sample-seed", "5",
                   "--model", "base=3,lora-a=1", *extra)
        _, log = _log(srv)
    assert doc["network"]["http_engine"] == engine and doc["counts"]["failed"] == 0
    served = Counter(e["model"] for e in log)
    assert set(served) == {"base", "lora-a"} and sum(served.values()) == doc["counts"]["completed"]
    if engine == "native":  # every turn goes to the Python side (its reply makes the next turn)
        assert doc["network"]["native"]["checked_in_python"] == doc["counts"]["completed"]
    models = doc["network"]["models"]
    for name in ("base", "lora-a"):
        m = models[name]
        assert m["count"] == m["sent"] == served[name] == m["latency_ns"]["count"], (name, m, served)
        assert m["output_tokens"] == sum(e["completion_tokens"] for e in log if e["model"] == name), (name, m)
        assert m["ttft_ns"]["count"] == (0 if "--no-stream" in extra else served[name])


@pytest.mark.parametrize("engine", ["asyncio", "native"])
def test_prefix_hit_ratio_and_cached_tokens_equal_the_servers(tmp_path, engine):
    with start_scripted(tmp_path, *SERVER, "--prefix-cache") as srv:
        doc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/completions", "--http-engine", engine,
                   "--query-count", "300", "--sample-count", "300", "--sample-order", "sequential",
                   "--input-tokens", "16", "--shared-prefix-tokens", "40", "--prefix-groups", "2",
                   "--prefix-hit-ratio", "0.3")
        _, log = _log(srv)
    llm, tokens = doc["llm"], doc["network"]["tokens"]
    assert len(log) == 300 and llm["prefix_hit_ratio"] == 0.3
    # 300 draws at 0.3: about 90 hits (a standard deviation of about 8).
    assert 50 < llm["prefix_hits"] < 130, llm["prefix_hits"]
    cached = [e["cached_tokens"] for e in log]
    # A hit after its group's first shares the whole 40-word prefix; a miss's fresh prefix
    # shares at most a few words by chance.
    assert sum(c >= 40 for c in cached) == llm["prefix_hits"] - 2
    assert tokens["cached_tokens"] == sum(cached) and tokens["cached_requests"] == 300
    assert tokens["cached_share"] == pytest.approx(sum(cached) / (300 * 56))


@pytest.mark.parametrize("args, says", [
    (("--prefix-hit-ratio", "0.5"), "--shared-prefix-tokens"),
    (("--model", "a=3,b=0"), "--model"),
    (("--model", "a=3,a=1"), "given twice"),
    (("--extra-body", "[1]"), "--extra-body"),
    (("--input-tokens", "many"), "--input-tokens"),
    (("--dataset", "BAD"), "line 2"),
    (("--dataset", "MISSING"), "cannot read"),
    (("--tokenizer", "TOKDIR"), "--tokenizer"),
])
def test_bad_workload_input_exits_2_naming_it(tmp_path, args, says):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "w1"}\n{"prompt": 3}\n')
    subst = {"BAD": str(bad), "MISSING": str(tmp_path / "missing.jsonl"), "TOKDIR": str(tmp_path / "no-tok")}
    args = tuple(subst.get(a, a) for a in args)
    with start_scripted(tmp_path, *SERVER) as srv:
        proc = _run(tmp_path, "--sut", f"openai+{srv.url}/v1/completions", "--query-count", "5", *args, expect=2)
    assert says in proc.stderr, proc.stderr
    if "BAD" in subst and args[-1] == str(bad):
        assert str(bad) in proc.stderr
