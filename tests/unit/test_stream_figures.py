"""The asyncio OpenAI client's figures of a stream (loadgen/net/openai_stream.py): the
per-token inter-token latency (split by a tokenizer, by usage's count over the text, or
by the events' own counts) and the reasoning figures, on streams fed by hand."""

from __future__ import annotations

import json
from typing import List, Optional, Tuple

import pytest

from loadgen.net.openai_stream import OpenAISUT

from loadgen.net.openai_answers import TokenStream
from loadgen.net.options import NetOptions
from loadgen.net.targets import parse_target

MS = 1_000_000


class _Sink:
    def first_token(self, qid: int, t: int) -> None:
        pass

    def complete_tokens(self, qid: int, t: int, n: int, n_input: int = -1) -> None:
        pass


class _WordCounter:
    """A tokenizer's count: one token per whitespace-separated word."""

    def count(self, text: str) -> int:
        return len(text.split())


def _sut(tokenizer: Optional[_WordCounter] = None) -> OpenAISUT:
    sut = OpenAISUT(parse_target("openai+http://127.0.0.1:1/v1/chat/completions"), NetOptions(), 1)
    sut.sink = _Sink()
    sut.itl_tokenizer = tokenizer
    return sut


def _event(delta: dict) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode() + b"\n\n"


def _run(sut: OpenAISUT, pieces: List[Tuple[int, bytes]], end_ms: int) -> None:
    ts = TokenStream(sut, 1, 0)
    for t_ms, piece in pieces:
        ts.on_data(None, piece, t_ms * MS)
    ts.on_response(None, 200, b"", end_ms * MS)


def _usage(n: int, reasoning: Optional[int] = None) -> bytes:
    usage: dict = {"completion_tokens": n}
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n"


def test_a_tokenizer_counts_each_events_tokens():
    # Usage says 9 (a server miscounting), the words say 1, 4 and 2: the tokenizer wins.
    pieces = [(50, _event({"content": "a"})), (90, _event({"content": "b c d e"})),
              (110, _event({"content": "f g"}) + _usage(9))]
    sut = _sut(_WordCounter())
    _run(sut, pieces, 120)
    h = sut.histograms()["itl_per_token_ns"].histogram
    # 40 ms over 4 tokens, 20 ms over 2: six values of 10 ms (usage's 9 spread by text
    # would give 40 ms / 6 six times and 20 ms / 2 twice).
    assert h.total_count == 6 and h.count_at_value(10 * MS) == 6
    assert sut.report()["tokens"]["itl_per_token_split"] == {"chunks": 0, "text_length": 0, "tokenizer": 1}


def test_without_a_tokenizer_usage_is_spread_by_text_and_without_usage_each_event_counts_its_own():
    pieces = [(50, _event({"content": "aaaa"})), (90, _event({"content": "aaaaaaaaaaaa"}))]
    sut = _sut()
    _run(sut, pieces[:1] + [(90, pieces[1][1] + _usage(4))], 100)  # 1 + 3 tokens: 40 ms / 3
    _run(sut, pieces + [(90, b"data: [DONE]\n\n")], 100)  # no usage: 1 + 1, 40 ms
    h = sut.histograms()["itl_per_token_ns"].histogram
    assert h.total_count == 4
    assert h.count_at_value(13_333_333) == 3 and h.count_at_value(40 * MS) == 1
    assert sut.report()["tokens"]["itl_per_token_split"] == {"chunks": 1, "text_length": 1, "tokenizer": 0}


@pytest.mark.parametrize("usage, source", [(_usage(3, 2), "usage"), (b"data: [DONE]\n\n", "chunks")])
def test_reasoning_figures_of_a_stream(usage, source):
    sut = _sut()
    _run(sut, [(50, _event({"reasoning_content": "x"})), (60, _event({"reasoning": "y"})),
               (75, _event({"content": "z"}) + usage)], 80)
    hists, tokens = sut.histograms(), sut.report()["tokens"]
    assert hists["ttfrt_ns"].histogram.count_at_value(50 * MS) == 1  # from the scheduled time (0)
    assert hists["ttfat_ns"].histogram.count_at_value(75 * MS) == 1
    assert (tokens["reasoning_tokens"], tokens["reasoning_source"]) == (2, source)
    assert hists["reasoning_length_tokens"].histogram.max == 2
    assert sut.live_histograms()["ttfat_ns"].histogram.total_count == 1


def test_a_stream_without_reasoning_counts_none():
    sut = _sut()
    _run(sut, [(50, _event({"content": "z"}) + _usage(1))], 60)
    tokens = sut.report()["tokens"]
    assert (tokens["reasoning_tokens"], tokens["reasoning_source"]) == (0, "none")
    assert sut.histograms()["ttfrt_ns"].histogram.total_count == 0


def test_live_metrics_serve_the_stream_figures():
    from loadgen.stats.histogram import Histogram
    from loadgen.telemetry.live import _run_quantiles

    class _Engine:
        def histogram(self, name: str) -> Histogram:
            return Histogram()

    sut = _sut()
    _run(sut, [(50, _event({"reasoning_content": "x"})), (60, _event({"content": "y z"})),
               (80, _event({"content": "w"}) + _usage(4, 1))], 90)
    families = {f.name: f for f in _run_quantiles(_Engine(), sut, [], [])}
    assert set(families) == {"loadgen_run_itl_seconds", "loadgen_run_itl_per_token_seconds",
                             "loadgen_run_ttfrt_seconds", "loadgen_run_ttfat_seconds"}
    top = {f: max(s.value for s in families[f].samples) for f in families}
    assert abs(top["loadgen_run_ttfat_seconds"] - 0.060) < 1e-4 and abs(top["loadgen_run_ttfrt_seconds"] - 0.050) < 1e-4


def test_an_answer_not_streamed_counts_the_reasoning_its_usage_gives():
    from loadgen.net.openai_answers import WholeResponse

    sut = _sut()
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "a b"}}],
            "usage": {"completion_tokens": 7, "completion_tokens_details": {"reasoning_tokens": 5}}}
    WholeResponse(sut, 1, 0).on_response(None, 200, json.dumps(body).encode(), 10 * MS)
    tokens = sut.report()["tokens"]
    assert (tokens["output_tokens"], tokens["reasoning_tokens"], tokens["reasoning_source"]) == (7, 5, "usage")
