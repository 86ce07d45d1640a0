"""A non-streamed OpenAI answer counted natively (csrc/sse.cc ``read_whole_answer``, which
the native client uses for ``--no-stream`` completions and chat) against the asyncio
client's own check and count (``WholeResponse`` in loadgen/net/openai_answers.py): every
answer the core counts, the asyncio client completes with the same output and reasoning
tokens; the core leaves the rest (errors, no choices, no usage) to that check."""

from __future__ import annotations

import json
from typing import Any, Optional, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen import _core
from loadgen.net.native import _AnswerSink
from loadgen.net.openai_stream import OpenAISUT
from loadgen.net.openai_answers import WholeResponse
from loadgen.net.options import NetOptions
from loadgen.net.targets import parse_target


def _asyncio_outcome(body: bytes, check: bool = True) -> Tuple[Optional[str], int, int]:
    """(error kind or None, output tokens, reasoning tokens counted from usage or -1) of
    the asyncio client's check and count of a 200 answer ``body``."""
    sut = OpenAISUT(parse_target("openai+http://127.0.0.1:9/v1/completions"), NetOptions(model="m"), 1)
    sut.check = check
    sut.sink = _AnswerSink(None)  # type: ignore[arg-type]  # nothing is scheduled here
    WholeResponse(sut, 1, 0).on_response(None, 200, body, 10)
    kind, _, n, _ = sut.sink.outcome
    return kind, n, sut.reasoning_tokens if sut.reasoning_from_usage else -1


def _agrees(body: bytes) -> Optional[Tuple[int, int]]:
    native = _core.read_whole_answer(body)
    if native is not None:
        for check in (True, False):
            assert _asyncio_outcome(body, check) == (None, native[0], native[1]), body
    return native


@pytest.mark.parametrize("body, counts", [
    (b'{"id":"c1","object":"text_completion","choices":[{"index":0,"text":" a b","finish_reason":"length"}],'
     b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}', (2, -1)),
    (b'{"choices":[{"message":{"role":"assistant","content":"x"}}],"usage":{"completion_tokens":7,'
     b'"completion_tokens_details":{"reasoning_tokens":4}}}\n', (7, 4)),
    (b' {"choices": [1], "usage": {"completion_tokens": 0}} ', (0, -1)),
    (b'{"choices":[{}],"usage":{"completion_tokens":1,"completion_tokens_details":{"reasoning_tokens":true}}}',
     (1, -1)),
    (b'{"choices":[{}],"usage":{"completion_tokens":2147483647}}', (2147483647, -1)),
    (b'{"usage":{"completion_tokens":1},"choices":[],"choices":[{}]}', (1, -1)),  # the last key counts
])
def test_answers_the_core_counts_count_as_on_asyncio(body, counts):
    assert _agrees(body) == counts


@pytest.mark.parametrize("body", [
    b'{"error": {"message": "overloaded"}, "choices": [{}], "usage": {"completion_tokens": 1}}',
    b'{"choices": [], "usage": {"completion_tokens": 1}}',
    b'{"choices": {"0": {}}, "usage": {"completion_tokens": 1}}',
    b'{"choices": [{"text": "one two"}]}',  # no usage: the asyncio check counts words
    b'{"choices": [{}], "usage": {"completion_tokens": 1.0}}',
    b'{"choices": [{}], "usage": {"completion_tokens": true}}',
    b'{"choices": [{}], "usage": {"completion_tokens": -1}}',
    b'{"choices": [{}], "usage": {"completion_tokens": 2147483648}}',
    b'{"choices": [{}], "usage": {"completion_tokens": 1}} x',
    b'[{"choices": [{}], "usage": {"completion_tokens": 1}}]',
    b'<html>busy</html>',
    b'',
])
def test_the_rest_is_left_to_the_python_check(body):
    assert _agrees(body) is None


_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-5, 2**31 + 5) | st.floats(allow_nan=False)
                       | st.text(max_size=5),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                    max_size=3),
                       max_leaves=6)
_USAGE = st.fixed_dictionaries({}, optional={
    "completion_tokens": st.integers(-2, 2**31 + 2) | _VALUES,
    "completion_tokens_details": st.fixed_dictionaries({}, optional={"reasoning_tokens": st.integers(-2, 9) | _VALUES})
    | _VALUES,
})
_ANSWERS = st.fixed_dictionaries({}, optional={
    "choices": st.lists(st.fixed_dictionaries({}, optional={"text": st.text(max_size=5)}) | _VALUES, max_size=2)
    | _VALUES,
    "usage": _USAGE | _VALUES,
    "error": _VALUES,
    "id": st.text(max_size=5),
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_ANSWERS, indent=st.sampled_from([None, 1]))
def test_every_answer_the_core_counts_the_asyncio_check_counts_alike(doc: Any, indent):
    native = _agrees(json.dumps(doc, indent=indent).encode())
    usage = doc.get("usage")
    certain = ("error" not in doc and isinstance(doc.get("choices"), list) and bool(doc["choices"])
               and isinstance(usage, dict) and type(usage.get("completion_tokens")) is int
               and 0 <= usage["completion_tokens"] <= 2**31 - 1)
    assert (native is not None) == certain, doc
