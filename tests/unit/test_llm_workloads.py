"""LLM workloads (loadgen/llm): token-length distributions, prompts built to exact token
counts with a tokenizer trained here, datasets (JSON lines, ShareGPT), and runs of each
workload form against the scripted server, whose own log of the requests it answered is
what loadgen's counts and lengths are compared with. The CLI runs as a subprocess with
the test's tmp_path as its working directory; every server is ended by its PID.

The tests that start processes or servers are in tests/integration/test_llm_workloads.py."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from loadgen.llm import LlmOptions, build_workload, parse_dist
from loadgen.llm.tokenizer import load_tokenizer

tokenizers = pytest.importorskip("tokenizers")

VOCAB = [f"w{i}" for i in range(400)]


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory):
    """A word-level tokenizer (one token per vocabulary word), saved as tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(VOCAB)] * 2, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def bpe_tokenizer(tmp_path_factory):
    """A small BPE tokenizer, whose re-encoding of decoded text merges differently."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = ["the quick brown fox jumps over the lazy dog", "servers answer requests under load with latency"]
    tok.train_from_iterator(corpus * 50, trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("bpe")
    tok.save(str(path / "tokenizer.json"))
    return str(path)  # a directory holding tokenizer.json


# ------------------------------------------------------------------ distributions

@pytest.mark.parametrize("text, kind", [("512", "fixed"), ("128:1024", "uniform"), ("mean=512,sd=128", "normal"),
                                        ("normal:mean=5,sd=1", "normal"),
                                        ("lognormal:mean=300,sd=100,min=10,max=900", "lognormal")])
def test_distribution_forms(text, kind):
    d = parse_dist(text)
    x = d.draw(np.random.default_rng(1), 5000)
    assert d.kind == kind and x.dtype == np.int64 and x.min() >= d.lo >= 1 and x.max() <= d.hi
    if kind == "fixed":
        assert set(x) == {512}
    if kind == "uniform":
        assert x.min() == 128 and x.max() == 1024
    if kind == "lognormal":
        assert abs(x.mean() - 300) < 10 and abs(x.std() - 100) < 10


@pytest.mark.parametrize("text, says", [("", "empty"), ("abc", "not a whole number"), ("0", "not in 1.."),
                                        ("9:3", "above its high end"), ("mean=5", "needs mean= and sd="),
                                        ("mean=5,sd=1,foo=2", "'foo=2'"), ("mean=-1,sd=1", "mean must be > 0"),
                                        ("mean=5,sd=1,min=9,max=3", "min 9 is above max 3")])
def test_distribution_errors_say_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=None) as e:
        parse_dist(text)
    assert says in str(e.value)


def test_normal_draws_are_clipped_to_min_and_max():
    x = parse_dist("mean=10,sd=50,min=5,max=20").draw(np.random.default_rng(0), 2000)
    assert x.min() == 5 and x.max() == 20


# ------------------------------------------------------------------ prompts

@pytest.mark.parametrize("which", ["word", "bpe"])
def test_prompts_have_exact_token_counts_and_follow_the_distribution(which, word_tokenizer, bpe_tokenizer):
    # Seeded: the same draws every time (a KS p-value under 0.01 happens to 1 seed in 100).
    path = word_tokenizer if which == "word" else bpe_tokenizer
    o = LlmOptions(sample_count=300, input_tokens="mean=200,sd=40", tokenizer=path, seed=3)
    w = build_workload(o, "completions", "m")
    tok = load_tokenizer(path)
    counted = np.asarray([tok.count(b["prompt"]) for b in w.bodies])
    assert list(counted) == list(w.input_tokens) and w.info["input_tokens_exact"] is True
    assert stats.kstest(counted, stats.norm(200, 40).cdf).pvalue > 0.01
    assert stats.kstest(counted, stats.norm(260, 40).cdf).pvalue < 1e-6  # the test can fail


def test_shared_prefixes_by_group_and_seeded(word_tokenizer):
    o = LlmOptions(sample_count=12, input_tokens="20:40", shared_prefix_tokens=16, prefix_groups=3,
                   tokenizer=word_tokenizer, seed=3)
    w = build_workload(o, "chat", "m")
    texts = [b["messages"][0]["content"] for b in w.bodies]
    heads = [" ".join(t.split()[:16]) for t in texts]
    assert len(set(heads)) == 3 and all(heads[i] == heads[i % 3] for i in range(12))
    assert [len(t.split()) for t in texts] == list(w.input_tokens) and min(w.input_tokens) >= 36
    again = build_workload(o, "chat", "m")
    assert again.bodies == w.bodies
    other = build_workload(LlmOptions(**{**o.__dict__, "seed": 4}), "chat", "m")
    assert other.bodies != w.bodies


def test_without_a_tokenizer_lengths_are_words_and_marked_approximate():
    w = build_workload(LlmOptions(sample_count=5, input_tokens="30", output_tokens="7", ignore_eos=True,
                                  extra_body='{"temperature": 0}'), "completions", "m")
    assert w.info["input_tokens_exact"] is False
    assert all(len(b["prompt"].split()) == 30 for b in w.bodies)
    assert all(b["max_tokens"] == b["min_tokens"] == 7 and b["ignore_eos"] is True and b["temperature"] == 0
               for b in w.bodies)


def test_tokenizer_not_found_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="--tokenizer"):
        load_tokenizer(str(tmp_path / "nothing-here"))


# ------------------------------------------------------------------ runs against the scripted server


def test_distinct_prompts_are_capped_whatever_the_sample_count():
    from loadgen.llm.workload import MAX_PROMPTS

    w = build_workload(LlmOptions(sample_count=10**12, input_tokens="4"), "completions", "m")
    assert len(w.bodies) == MAX_PROMPTS and "wrap around" in w.source


def test_model_mix_parses_names_and_weights_and_draws_reproducibly():
    from loadgen.llm.models import parse_model_mix

    assert parse_model_mix(None) is None
    one = parse_model_mix("meta-llama/Llama-3-8B")
    assert one is not None and one.names == ("meta-llama/Llama-3-8B",) and not one.mixed
    mix = parse_model_mix("a=3, b=1,c")
    assert mix is not None and mix.names == ("a", "b", "c") and mix.weights == (3.0, 1.0, 1.0)
    assert mix.shares() == [0.6, 0.2, 0.2]
    drawn = mix.draw(7, 5000)
    assert drawn == mix.draw(7, 5000) and drawn != mix.draw(8, 5000)
    assert abs(drawn.count(0) / 5000 - 0.6) < 0.04 and abs(drawn.count(2) / 5000 - 0.2) < 0.04


@pytest.mark.parametrize("text, says", [("a=0", "positive"), ("a=x", "must be a number"), ("=2", "no model name"),
                                        ("a,,b", "no model name"), ("a,a=2", "given twice"), ("a=inf", "positive")])
def test_model_mix_errors_say_what_is_wrong(text, says):
    from loadgen.llm.models import parse_model_mix

    with pytest.raises(ValueError, match=says):
        parse_model_mix(text)
