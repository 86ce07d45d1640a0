"""OpenAI-compatible streaming: ``/v1/completions`` or ``/v1/chat/completions`` with
``"stream": true``, Server-Sent Events parsed as they arrive. Time to first token and time
per output token go to the engine; each gap between token chunks, the per-token
inter-token latency, the times to the first reasoning and first answer token, and the
output tokens per second of each request are this client's own histograms.

A token is a choice whose ``delta.content`` (chat) or ``text`` (completions) is
non-empty (an answer token), or whose ``delta.reasoning_content`` or ``delta.reasoning``
is (a reasoning token, as vLLM, SGLang and DeepSeek stream a reasoning model's thinking):
both are tokens of the stream (time to first token is the first of either), and the
reasoning ones are counted apart.

``/v1/responses`` streams typed events instead (OpenAI's Responses API): every event is
read as JSON; a ``response.output_text.delta`` or ``response.function_call_arguments.delta``
with a non-empty ``delta`` is an answer token, a ``response.reasoning_text.delta`` or
``response.reasoning_summary_text.delta`` one a reasoning token, a
``response.output_item.added`` whose item is a ``function_call`` a tool call, and
``response.completed`` (or ``response.incomplete``) ends the stream, as ``data: [DONE]``
does a chat stream, with the usage (``output_tokens``,
``output_tokens_details.reasoning_tokens``, ``input_tokens_details.cached_tokens``) in its
``response``; ``error`` and ``response.failed`` are the stream's error.

Chat tool calls (``--tools``): a delta's ``tool_calls`` element with a truthy ``id``
starts a call (counted), and one with a non-empty ``function.arguments`` makes the
choice an answer token when it has no text or reasoning."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from loadgen.defaults import sample_seed_of
from loadgen.llm.models import ModelMix, parse_model_mix
from loadgen.llm.tools import Tools, load_tools
from loadgen.llm.workload import LlmOptions, Workload, build_workload, length_stats
from loadgen.net.base import HttpSUT
from loadgen.net.http1 import Request, ResponseTooLarge
from loadgen.net.options import NetOptions, clip
from loadgen.net.payloads import payload_kind, read_jsonl
from loadgen.net.targets import Target
from loadgen.stats.histogram import Histogram
from loadgen.sut.report import NamedHistogram

__all__ = ["OpenAISUT", "TokenStream", "WholeResponse", "event_token_counts", "token_itl"]

# A non-empty "text" (completions) or "content" (chat delta) string value.
_TOKEN_FIELD = re.compile(rb'"(?:text|content)"\s*:\s*"(?!")')
# A non-empty reasoning string value (chat delta): vLLM's and DeepSeek's, or another family's.
_REASONING_FIELD = re.compile(rb'"(?:reasoning_content|reasoning)"\s*:\s*"(?!")')
# Every text string of an event, as written (escapes undone or not: an estimate's weight):
# a chat or completions event's texts and tool call arguments, a responses event's delta.
_TEXT_STRING = re.compile(rb'"(?:text|content|reasoning_content|reasoning|arguments)"\s*:\s*"([^"\\]*(?:\\.[^"\\]*)*)',
                          re.S)
_DELTA_STRING = re.compile(rb'"delta"\s*:\s*"([^"\\]*(?:\\.[^"\\]*)*)', re.S)
# A choice's finish_reason given (a string, not null).
_FINISH_REASON = re.compile(rb'"finish_reason"\s*:\s*"')


#: The end-of-stream checks' problems (``--no-check`` skips them).
NO_TOKENS = "the stream had no tokens (and no finish_reason)"
NO_DONE = "the stream ended without data: [DONE]"
NO_COMPLETED = "the stream ended without response.completed"

#: The usage fields of chat and completions answers and of ``/v1/responses`` answers:
#: (output tokens, their details (reasoning_tokens), the prompt's details (cached_tokens)).
CHAT_USAGE = ("completion_tokens", "completion_tokens_details", "prompt_tokens_details")
RESPONSES_USAGE = ("output_tokens", "output_tokens_details", "input_tokens_details")
# /v1/responses stream events: those whose delta is an answer or a reasoning token, and
# those that end a stream.
_ANSWER_DELTAS = ("response.output_text.delta", "response.function_call_arguments.delta")
_REASONING_DELTAS = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
_RESPONSE_ENDS = ("response.completed", "response.incomplete")
_RESPONSE_ERRORS = ("error", "response.failed")


def event_problem(data: bytes, doc: Any) -> str:
    """What is wrong with an event whose ``data`` is not a plain token chunk: ``doc`` is
    its JSON (a ValueError when it is not JSON), not an object, or has an ``error`` (or
    is a ``/v1/responses`` ``error`` or ``response.failed`` event: its error, with its
    class, is the message)."""
    if isinstance(doc, ValueError):
        return f"an event is not JSON: {clip(data, 80)!r}"
    if not isinstance(doc, dict):
        return f"an event is not a JSON object: {clip(data, 80)!r}"
    if "error" in doc and (doc["error"] or doc.get("type") not in _RESPONSE_ERRORS):
        error = doc["error"]
    else:
        response = doc.get("response")
        error = response.get("error") if isinstance(response, dict) else None
        if not error:
            error = {k: v for k, v in doc.items() if k not in ("sequence_number", "response")}
    return f"the server sent an error event: {clip(json.dumps(error), 200)}"


def _responses_error(doc: Dict[str, Any]) -> bool:
    """Whether a ``/v1/responses`` stream event is an error: a truthy ``error``, or an
    ``error`` or ``response.failed`` event."""
    return bool(doc.get("error")) or doc.get("type") in _RESPONSE_ERRORS


def too_large_text(max_event_bytes: int, held: int) -> str:
    """The message of a stream event over the limit."""
    return (f"a stream event over --max-response-bytes ({max_event_bytes} bytes): "
            f"{held} bytes with no end of event; the connection was closed")


#: The most output tokens an answer's ``usage.completion_tokens`` may say (a request's
#: record holds its count as a 32-bit integer); a count outside 0 to this is a protocol
#: error of that answer (``invalid_response``), not a number to record.
MAX_TOKEN_COUNT = 2**31 - 1
_MAX_RATE = 2**62  # milli-tokens/s past any histogram's range: recorded as out of range


def _token_count(usage: Any, key: str = "completion_tokens") -> Tuple[Optional[int], Optional[str]]:
    """(the ``completion_tokens`` (or ``key``) of a ``usage`` object, or None when it gives
    none; the problem when the count is out of range, else None)."""
    n = usage.get(key) if isinstance(usage, dict) else None
    if not isinstance(n, int) or isinstance(n, bool):
        return None, None
    if not 0 <= n <= MAX_TOKEN_COUNT:
        return None, bad_count_text(str(n), key)
    return n, None


def bad_count_text(digits: str, key: str = "completion_tokens") -> str:
    """The problem of an answer whose ``usage.key`` (``digits``) is out of range."""
    return f"usage.{key} {clip(digits, 40)} is out of range (0 to {MAX_TOKEN_COUNT})"


def _reasoning_count(usage: Any, section: str = "completion_tokens_details", key: str = "reasoning_tokens") -> \
        Optional[int]:
    """``usage.completion_tokens_details.reasoning_tokens`` (or ``usage.section.key``) when
    it is a count in range, else None (no error: the answer's own count is what is
    checked)."""
    details = usage.get(section) if isinstance(usage, dict) else None
    n = details.get(key) if isinstance(details, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_TOKEN_COUNT:
        return None
    return n


def _cached_count(usage: Any, section: str = "prompt_tokens_details") -> Optional[int]:
    """``usage.prompt_tokens_details.cached_tokens`` (or ``usage.section.cached_tokens``:
    the prompt's tokens the server's prefix cache held) when it is a count in range, else
    None."""
    return _reasoning_count(usage, section, "cached_tokens")


def text_weight(data: bytes, responses: bool = False) -> int:
    """An event's text weight: the raw bytes of its ``text``, ``content``,
    ``reasoning_content``, ``reasoning`` and ``arguments`` strings as written (of a
    ``/v1/responses`` event, ``responses``: its ``delta`` strings), at least 1."""
    found = (_DELTA_STRING if responses else _TEXT_STRING).findall(data)
    n = len(found[0]) if len(found) == 1 else sum(map(len, found))  # one string: the usual event
    return n if n > 0 else 1


def event_token_counts(events: List[Tuple[int, int, int]], total_tokens: int) -> List[int]:
    """Each event's tokens k as :func:`token_itl` counts them: its own count without a
    total (``total_tokens`` < 0), else the total spread over the events by weight
    (cumulative rounding, halves up, so that the k sum to the total; a k may be 0)."""
    if total_tokens < 0:
        return [k for _, k, _ in events]
    weight = sum(w for _, _, w in events)
    out: List[int] = []
    cum = given = 0
    for _, _, w in events:
        cum += w
        upto = (total_tokens * cum * 2 + weight) // (weight * 2)
        out.append(upto - given)
        given = upto
    return out


def token_itl(events: List[Tuple[int, int, int]], total_tokens: int) -> List[Tuple[int, int]]:
    """The per-token inter-token latency of one stream as (value_ns, count) pairs.

    ``events`` are the stream's events that held tokens, in order, as (time_ns, tokens,
    weight); ``total_tokens`` is the count the server gave (``usage.completion_tokens``;
    negative: none). Each event's tokens k are its own count without a total, else the
    total spread over the events by weight (cumulative rounding, halves up, so that the k
    sum to the total; a k may be 0). Of the events with k > 0, each after the first
    contributes (its time - the previous one's) / k, rounded and at least 1 ns, k times:
    an event of 16 tokens 160 ms after the last gives 16 values of 10 ms.
    """
    out: List[Tuple[int, int]] = []
    prev_t = -1
    for (t, _, _), k in zip(events, event_token_counts(events, total_tokens)):
        if k <= 0:
            continue
        if prev_t >= 0:
            out.append((max(1, (t - prev_t + k // 2) // k), k))
        prev_t = t
    return out


def _tokens_per_s_milli(n: int, elapsed_ns: int) -> int:
    """``n`` tokens in ``elapsed_ns`` as milli-tokens/s (at least 1), capped where no
    histogram reaches (such a rate is counted as out of range, not raised on)."""
    return min(max(1, round(n * 1e12 / elapsed_ns)), _MAX_RATE)


def loads_json(text: str) -> Any:
    """json.loads, with nesting too deep to parse (RecursionError) a ValueError too."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _response_call(item: Dict[str, Any]) -> Dict[str, Any]:
    """A ``/v1/responses`` ``function_call`` output item as a call: its ``call_id`` (the
    id its result names), name, arguments so far and item id."""
    return {"id": str(item.get("call_id") or item.get("id") or ""), "name": str(item.get("name") or ""),
            "arguments": str(item.get("arguments") or ""), "item": item.get("id")}


def whole_calls(doc: Dict[str, Any], responses: bool) -> List[Dict[str, Any]]:
    """The tool calls of a non-streamed answer: each chat choice's ``message.tool_calls``,
    or the ``function_call`` items of a ``/v1/responses`` answer's ``output``, as calls
    (``id``, ``name``, ``arguments``)."""
    out: List[Dict[str, Any]] = []
    if responses:
        for item in doc.get("output") or ():
            if isinstance(item, dict) and item.get("type") == "function_call":
                out.append(_response_call(item))
        return out
    for c in doc.get("choices") or ():
        msg = c.get("message") if isinstance(c, dict) else None
        calls = msg.get("tool_calls") if isinstance(msg, dict) else None
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict):
                fn = call.get("function")
                fn = fn if isinstance(fn, dict) else {}
                out.append({"id": str(call.get("id") or ""), "name": str(fn.get("name") or ""),
                            "arguments": str(fn.get("arguments") or "")})
    return out


def whole_text(doc: Dict[str, Any], responses: bool) -> str:
    """The answer text of a non-streamed chat or completions answer (its first choice
    with text), or of a ``/v1/responses`` answer (its messages' ``output_text`` parts)."""
    if responses:
        parts = []
        for item in doc.get("output") or ():
            if isinstance(item, dict) and item.get("type") == "message":
                for c in item.get("content") or ():
                    if isinstance(c, dict) and c.get("type") == "output_text" and isinstance(c.get("text"), str):
                        parts.append(c["text"])
        return "".join(parts)
    for c in doc.get("choices") or ():
        if isinstance(c, dict):
            msg = c.get("message")
            if isinstance(msg, dict) and isinstance(msg.get("content"), str):
                return str(msg["content"])
    return ""


class TokenStream:
    """One streamed completion: Server-Sent Events parsed as they arrive, tokens timed."""

    __slots__ = ("sut", "query_id", "scheduled_ns", "buf", "first_ns", "last_ns", "chunks", "usage_tokens",
                 "done", "finished", "error", "gaps", "texts", "n_input", "reasoning_chunks",
                 "usage_reasoning_tokens", "first_reasoning_ns", "first_answer_ns", "events", "event_texts",
                 "model_id", "usage_cached_tokens", "responses", "tool_calls", "calls")

    def __init__(self, sut: "OpenAISUT", query_id: int, scheduled_ns: int) -> None:
        self.sut = sut
        self.query_id = query_id
        self.scheduled_ns = scheduled_ns
        self.buf = bytearray()  # what has come of the event not yet ended
        self.first_ns = 0
        self.last_ns = 0
        self.chunks = 0
        self.usage_tokens = -1
        self.done = False
        self.finished = False  # a choice's finish_reason came (an answer of 0 tokens is one then)
        self.error: Optional[str] = None
        self.gaps: List[int] = []
        # The answer's text pieces, kept only when a conversation needs the reply
        # (multi-turn): then every event is parsed in full.
        self.texts: Optional[List[str]] = None
        self.n_input = -1  # the request's input tokens, when the workload knows them
        self.reasoning_chunks = 0
        self.usage_reasoning_tokens = -1  # usage.completion_tokens_details.reasoning_tokens
        self.usage_cached_tokens = -1  # usage.prompt_tokens_details.cached_tokens
        self.first_reasoning_ns = 0
        self.first_answer_ns = 0
        # The events that held tokens: (time, tokens, text weight), for the per-token ITL.
        self.events: List[Tuple[int, int, int]] = []
        # With a tokenizer (--tokenizer): each such event's text, to count its tokens.
        self.event_texts: Optional[List[str]] = [] if getattr(sut, "itl_tokenizer", None) is not None else None
        self.model_id = 0  # the request's model among the run's (--model a=3,b=1)
        self.responses = bool(getattr(sut, "responses", False))  # a /v1/responses stream
        self.tool_calls = 0
        # The answer's tool calls (id, name, arguments), kept with texts (a conversation).
        self.calls: Optional[List[Dict[str, Any]]] = None

    def on_data(self, req: Optional[Request], piece: bytes, t: int) -> None:
        # One buffer, appended to, searched only where an event's end may newly be (from
        # the last 3 bytes held on), and cut once per piece: linear in the stream, so that
        # a large event costs its bytes, not their square.
        buf = self.buf
        held = len(buf)
        buf += piece
        start = held - 3 if held > 3 else 0
        lf = buf.find(b"\n\n", start)
        crlf = buf.find(b"\r\n\r\n", start)
        pos = 0
        while lf >= 0 or crlf >= 0:
            if crlf < 0 or 0 <= lf < crlf:  # the earlier of the two ends
                end, pos_next = lf, lf + 2
            else:
                end, pos_next = crlf, crlf + 4
            event = bytes(buf[pos:end])
            pos = pos_next
            # A terminator not found stays not found: the buffer does not grow here.
            if 0 <= lf < pos:
                lf = buf.find(b"\n\n", pos)
            if 0 <= crlf < pos:
                crlf = buf.find(b"\r\n\r\n", pos)
            self._event(event, t)
        if pos:
            del buf[:pos]
        if len(buf) > self.sut.max_event_bytes:  # a stream is bounded per event, not in total
            held = len(buf)
            self.buf = bytearray()
            raise ResponseTooLarge(too_large_text(self.sut.max_event_bytes, held))

    def read_whole(self, body: bytes, t: int) -> None:
        """A whole stream's bytes (``body``, read by the native client), parsed as if they
        had arrived at ``t``; an event over the limit ends the parse (the client has
        judged the stream already)."""
        try:
            self.on_data(None, body, t)
        except ResponseTooLarge:
            return
        if self.buf.strip():
            self._event(bytes(self.buf), t)

    def _event(self, event: bytes, t: int) -> None:
        if event.startswith(b"data: {") and b"\n" not in event:  # the usual one-line event
            data = event[6:]
        else:
            data = b"\n".join(line[5:].lstrip() for line in event.replace(b"\r\n", b"\n").split(b"\n")
                              if line.startswith(b"data:"))
        if not data:
            return
        if data == b"[DONE]":
            self.done = True
            return
        before = self.chunks
        self._data(data, t)
        if self.chunks != before:
            self.events.append((t, self.chunks - before, text_weight(data, self.responses)))

    def _data(self, data: bytes, t: int) -> None:
        if self.responses:
            self._response_event(data, t)
            return
        # Fast path: a plain token chunk (no usage, no error, no tool call) is recognised
        # without building its JSON; anything else is parsed in full.
        if (data[:1] == b"{" and data[-1:] == b"}" and b'"usage"' not in data and b'"error"' not in data
                and b'"tool_calls"' not in data and self.texts is None and self.event_texts is None):
            if _TOKEN_FIELD.search(data):
                self._token(t, False)
            elif _REASONING_FIELD.search(data):
                self._token(t, True)
            elif not self.finished and _FINISH_REASON.search(data):
                self.finished = True
            return
        try:
            doc = loads_json(data.decode("utf-8", "replace"))
        except ValueError as e:
            doc = e
        if not isinstance(doc, dict) or "error" in doc:
            self.error = self.error or event_problem(data, doc)
            return
        self._usage(doc.get("usage"), CHAT_USAGE)
        pieces = []
        for choice in doc.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            arguments = self._tool_call_deltas(calls) if isinstance(calls, list) else []
            if text:
                if self.texts is not None and isinstance(text, str):
                    self.texts.append(text)
                pieces.append(text)
                self._token(t, False)
            elif isinstance(delta, dict) and (delta.get("reasoning_content") or delta.get("reasoning")):
                pieces.append(delta.get("reasoning_content") or delta.get("reasoning"))
                self._token(t, True)
            elif arguments:
                pieces += arguments
                self._token(t, False)
            if choice.get("finish_reason"):
                self.finished = True
        if pieces and self.event_texts is not None:
            self.event_texts.append("".join(p for p in pieces if isinstance(p, str)))

    def _usage(self, usage: Any, keys: Tuple[str, str, str]) -> None:
        """An answer's ``usage`` (``keys``: :data:`CHAT_USAGE` or :data:`RESPONSES_USAGE`)."""
        n, problem = _token_count(usage, keys[0])
        if problem is not None:
            self.error = self.error or problem
        elif n is not None:
            self.usage_tokens = n
        reasoning_count = _reasoning_count(usage, keys[1])
        if reasoning_count is not None:
            self.usage_reasoning_tokens = reasoning_count
        cached = _cached_count(usage, keys[2])
        if cached is not None:
            self.usage_cached_tokens = cached

    def _tool_call_deltas(self, calls: List[Any]) -> List[Any]:
        """A chat delta's ``tool_calls``: each element with a truthy ``id`` starts a call
        (counted; kept in :attr:`calls` in a conversation); returns the truthy
        ``function.arguments`` pieces (an answer token when there are any)."""
        out = []
        for c in calls:
            if not isinstance(c, dict):
                continue
            fn = c.get("function")
            fn = fn if isinstance(fn, dict) else {}
            if c.get("id"):
                self.tool_calls += 1
                if self.calls is not None:
                    self.calls.append({"index": c.get("index"), "id": str(c["id"]), "name": str(fn.get("name") or ""),
                                       "arguments": ""})
            arguments = fn.get("arguments")
            if arguments:
                out.append(arguments)
                if self.calls and isinstance(arguments, str):
                    same = [k for k in self.calls if k["index"] == c.get("index")]
                    (same[-1] if same else self.calls[-1])["arguments"] += arguments
        return out

    def _response_event(self, data: bytes, t: int) -> None:
        """A ``/v1/responses`` stream event (every one is read as JSON; see the module doc)."""
        try:
            doc = loads_json(data.decode("utf-8", "replace"))
        except ValueError as e:
            doc = e
        if not isinstance(doc, dict) or _responses_error(doc):
            self.error = self.error or event_problem(data, doc)
            return
        kind = doc.get("type")
        if kind in _ANSWER_DELTAS or kind in _REASONING_DELTAS:
            delta = doc.get("delta")
            if not delta:
                return
            if isinstance(delta, str):
                if kind == _ANSWER_DELTAS[0] and self.texts is not None:
                    self.texts.append(delta)
                elif kind == _ANSWER_DELTAS[1] and self.calls:
                    same = [k for k in self.calls if k["item"] == doc.get("item_id")]
                    (same[-1] if same else self.calls[-1])["arguments"] += delta
            if self.event_texts is not None:
                self.event_texts.append(delta if isinstance(delta, str) else "")
            self._token(t, kind in _REASONING_DELTAS)
        elif kind == "response.output_item.added":
            item = doc.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                self.tool_calls += 1
                if self.calls is not None:
                    self.calls.append(_response_call(item))
        elif kind in _RESPONSE_ENDS:
            self.done = self.finished = True
            response = doc.get("response")
            self._usage(response.get("usage") if isinstance(response, dict) else None, RESPONSES_USAGE)

    def _token(self, t: int, reasoning: bool) -> None:
        if reasoning:
            if self.first_reasoning_ns == 0:
                self.first_reasoning_ns = t
            self.reasoning_chunks += 1
        elif self.first_answer_ns == 0:
            self.first_answer_ns = t
        if self.first_ns == 0:
            self.first_ns = t
            self.sut.sink.first_token(self.query_id, t)
        else:
            self.gaps.append(t - self.last_ns)
        self.last_ns = t
        self.chunks += 1

    def on_response(self, req: Request, status: int, body: bytes, t: int) -> None:
        sut = self.sut
        if status != 200:
            text = sut.redactor.excerpt(self.buf, 200)
            self.buf = bytearray()
            sut.fail_query(self.query_id, f"http_{status}", f"HTTP {status}: {text}")
            return
        if self.buf.strip():
            self._event(bytes(self.buf), t)
        problem = self.error
        if problem is None and sut.check:
            sut.checked += 1
            # A stream may end at once (the model's first token was its end): 0 tokens,
            # when the server said the choice finished or its usage says 0.
            if self.chunks == 0 and not (self.finished or self.usage_tokens == 0):
                problem = NO_TOKENS
            elif not self.done:
                problem = NO_COMPLETED if self.responses else NO_DONE
        if problem is not None:
            sut.fail_query(self.query_id, "invalid_response", problem)
            return
        sut.record_stream(self, t)

    def on_error(self, req: Request, kind: str, message: str) -> None:
        self.sut.fail_query(self.query_id, kind, message)


class WholeResponse:
    """One answer not streamed (``--no-stream``, or ``/v1/embeddings``): the whole JSON
    body, its output tokens from ``usage.completion_tokens``; no time to first token."""

    __slots__ = ("sut", "query_id", "scheduled_ns", "n_input", "model_id")

    def __init__(self, sut: "OpenAISUT", query_id: int, scheduled_ns: int) -> None:
        self.sut = sut
        self.query_id = query_id
        self.scheduled_ns = scheduled_ns
        self.n_input = -1
        self.model_id = 0

    def on_response(self, req: Optional[Request], status: int, body: bytes, t: int) -> None:
        sut = self.sut
        if status != 200:
            sut.fail_query(self.query_id, f"http_{status}", f"HTTP {status}: {sut.redactor.excerpt(body, 200)}")
            return
        embeddings = sut.target.endpoint == "embeddings"
        try:
            doc = loads_json(body.decode("utf-8", "replace"))
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            sut.fail_query(self.query_id, "invalid_response", f"not a JSON object: {clip(body, 80)!r}")
            return
        responses = sut.responses
        problem = _whole_problem(doc, embeddings, responses) if sut.check else None
        if sut.check:
            sut.checked += 1
        if problem is not None:
            sut.fail_query(self.query_id, "invalid_response", problem)
            return
        n, problem = _token_count(doc.get("usage"), RESPONSES_USAGE[0] if responses else CHAT_USAGE[0])
        if problem is not None and not embeddings:
            sut.fail_query(self.query_id, "invalid_response", problem)
            return
        if embeddings:
            n = -1
        elif n is None and responses:
            n = len(whole_text(doc, True).split())
        elif n is None:
            n = sum(len(str((c.get("message") or {}).get("content") or c.get("text") or "").split())
                    for c in doc.get("choices") or () if isinstance(c, dict))
        sut.record_whole(self, t, n, doc)

    def on_error(self, req: Request, kind: str, message: str) -> None:
        self.sut.fail_query(self.query_id, kind, message)


def _whole_problem(doc: Dict[str, Any], embeddings: bool, responses: bool = False) -> Optional[str]:
    """What is wrong with a non-streamed answer (None when nothing): an error object, no
    choices, or (embeddings) no ``data`` list of embeddings; a ``/v1/responses`` answer:
    a truthy ``error``, ``"status": "failed"``, or no ``output`` items."""
    if responses:
        if doc.get("error") or doc.get("status") == "failed":
            return f"the server sent an error: {clip(json.dumps(doc.get('error')), 200)}"
        output = doc.get("output")
        if not isinstance(output, list) or not output:
            return "no 'output' items in the answer"
        return None
    if "error" in doc:
        return f"the server sent an error: {clip(json.dumps(doc['error']), 200)}"
    if embeddings:
        data = doc.get("data")
        if not isinstance(data, list) or not data:
            return "no 'data' list of embeddings"
        if not all(isinstance(d, dict) and isinstance(d.get("embedding"), (list, str)) for d in data):
            return "an item of 'data' has no 'embedding'"
        return None
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no 'choices' in the answer"
    return None


class ModelFigures:
    """One model's share of a run with a model mix: requests sent and answered, output
    tokens, and the answered requests' latency and TTFT (ns, from the scheduled time)."""

    __slots__ = ("sent", "answered", "output_tokens", "latency", "ttft")

    def __init__(self, significant_figures: int) -> None:
        self.sent = self.answered = self.output_tokens = 0
        self.latency = Histogram(significant_figures=significant_figures, highest_trackable_value=3_600_000_000_000)
        self.ttft = Histogram(significant_figures=significant_figures, highest_trackable_value=3_600_000_000_000)

    def record(self, scheduled_ns: int, first_ns: int, t: int, n: int) -> None:
        """An answer completed at ``t`` with ``n`` output tokens (``first_ns``: its first
        token, 0 for none)."""
        self.answered += 1
        self.output_tokens += n
        self.latency.record(max(1, t - scheduled_ns))
        if first_ns:
            self.ttft.record(max(1, first_ns - scheduled_ns))

    def report(self) -> Dict[str, Any]:
        """``count`` (answered), ``sent``, ``output_tokens``, ``latency_ns``, ``ttft_ns``."""
        from loadgen.results.document import histogram_summary

        return {"count": self.answered, "sent": self.sent, "output_tokens": self.output_tokens,
                "latency_ns": histogram_summary(self.latency), "ttft_ns": histogram_summary(self.ttft)}


def _source(usage: int, chunks: int) -> str:
    """Where requests' counts came from: ``usage``, ``chunks``, ``mixed`` or ``none``."""
    return "usage" if usage and not chunks else "chunks" if chunks and not usage else "mixed" if usage else "none"


class OpenAISUT(HttpSUT):
    """OpenAI-compatible ``/v1/completions`` or ``/v1/chat/completions`` with
    ``"stream": true``: time to first token (of either kind), to the first reasoning and
    the first answer token, each gap between token chunks, the per-token inter-token
    latency, time per output token and output tokens per second, with the token count
    from the ``usage`` the server sends, else from the chunks."""

    protocol = "openai_stream"

    def __init__(self, target: Target, net: NetOptions, pool_size: int, significant_figures: int = 3) -> None:
        super().__init__(target, net, pool_size)
        self.max_event_bytes = net.max_response_bytes
        self.model_mix: Optional[ModelMix] = parse_model_mix(net.model)
        self.model = self.model_mix.names[0] if self.model_mix else None
        # With a model mix: each prepared request's model (an index into the mix's names)
        # and each model's figures.
        self.request_models: List[int] = []
        self.model_figures = [ModelFigures(significant_figures) for _ in (self.model_mix.names if self.model_mix
                                                                          and self.model_mix.mixed else ())]
        def times() -> Histogram:  # ns, up to an hour
            return Histogram(significant_figures=significant_figures, highest_trackable_value=3_600_000_000_000)

        self._itl = times()
        # Recorded under _gaps_lock too (live metrics read them from another thread).
        self.ttfrt, self.ttfat, self.itl_per_token = times(), times(), times()
        self.reasoning_length_hist = Histogram(significant_figures=significant_figures)
        self.reasoning_tokens = 0
        self.reasoning_from_usage = 0
        self.reasoning_from_chunks = 0
        # usage.prompt_tokens_details.cached_tokens: their sum, and the answers that gave it.
        self.cached_tokens = 0
        self.cached_from_usage = 0
        # Tool calls made (--tools), and the answers that made at least one.
        self.tool_calls = 0
        self.tool_call_requests = 0
        self.responses = target.endpoint == "responses"  # /v1/responses: its events and usage
        self.tools: Optional[Tools] = None
        if net.llm is not None and net.llm.tools:
            if target.endpoint not in ("chat", "responses"):
                raise ValueError(f"--tools {net.llm.tools}: tools go to a /v1/chat/completions or /v1/responses "
                                 f"target, not {target.path}")
            self.tools = load_tools(net.llm.tools, net.llm.tool_choice)
        elif net.llm is not None and net.llm.tool_choice:
            raise ValueError(f"--tool-choice {net.llm.tool_choice}: give the tools with --tools FILE")
        # How each request's tokens were spread over its events for the per-token ITL.
        self.split_by_chunks = 0
        self.split_by_text = 0
        self.split_by_tokenizer = 0
        self.itl_tokenizer: Optional[Any] = None  # --tokenizer: counts each event's tokens
        self.tokens_per_s = Histogram(significant_figures=significant_figures)  # milli-tokens/s
        # Lengths of the requests answered: input tokens (when the workload knows them)
        # and output tokens.
        self.input_lengths = Histogram(significant_figures=significant_figures)
        self.output_length_hist = Histogram(significant_figures=significant_figures)
        self._gaps: List[int] = []  # inter-token gaps not yet in the histogram
        self._gaps_lock = threading.Lock()  # live metrics flush them from another thread
        self.tokens_from_usage = 0
        self.tokens_from_chunks = 0
        self.output_tokens = 0
        self.stream_responses = (net.llm.stream if net.llm is not None else True) and target.endpoint != "embeddings"
        self.workload: Optional[Workload] = None
        self.input_lens: List[int] = []  # by body, when the workload says
        self.input_tokens_sent = 0
        self.output_lengths: Counter[int] = Counter()  # output tokens -> completed requests
        self.embeddings = 0
        # --images: each prepared request's image bytes (empty: none), and what was sent.
        self.image_bytes: List[int] = []
        self.images_sent = 0
        self.image_bytes_sent = 0

    def prepare(self) -> None:
        base = self.target.http_base + self.target.base_path
        models_path = self.target.base_path + "/v1/models"
        listed: List[str] = []

        def probe(timeout_s: float):
            status, body, problem = self.get_path(models_path, timeout_s)
            if status == 200:
                try:
                    listed[:] = [str(m["id"]) for m in json.loads(body).get("data", [])]
                except (ValueError, KeyError, TypeError, AttributeError):
                    pass
                return True, ""
            if status in (404, 405) and (self.model or self.net.payload):  # no /v1/models here
                return True, ""
            return False, f"GET {base}/v1/models: {problem or status}"

        self.wait_ready(probe, f"OpenAI server {base}")
        if not self.model and not self.net.payload:
            if not listed:
                raise ValueError(f"GET {base}/v1/models listed no model; give --model NAME")
            self.model = listed[0]
        bodies, source = self._bodies()
        for b in bodies:
            self.add_tools(b)
        if self.model_figures:
            assert self.model_mix is not None
            index = {name: i for i, name in enumerate(self.model_mix.names)}
            self.request_models = [index.get(str(b.get("model")), 0) for b in bodies]
        llm = self.llm_options()
        if llm.tokenizer and self.stream_responses:
            from loadgen.llm.tokenizer import load_tokenizer

            self.itl_tokenizer = load_tokenizer(llm.tokenizer)
        self.set_requests([self.serialize("POST", self.target.path,
                                            json.dumps(b, separators=(",", ":")).encode()) for b in bodies], source)

    def add_tools(self, body: Dict[str, Any]) -> None:
        """Puts the run's ``tools`` and ``tool_choice`` (``--tools``) in a request body."""
        if self.tools is not None:
            body.update(self.tools.body_fields(self.target.endpoint))

    def llm_options(self) -> LlmOptions:
        """The run's LLM workload options (the defaults when the run gave none)."""
        n = self.net
        if n.llm is not None:
            return n.llm
        # Drawn with the sample seed of the base seed, as a CLI run draws them.
        return LlmOptions(max_tokens=n.max_tokens, prompt_words=n.prompt_words, sample_count=n.sample_count,
                          seed=sample_seed_of(n.seed))

    def _bodies(self) -> Tuple[List[dict], str]:
        endpoint = self.target.endpoint
        llm = self.llm_options()
        if not self.net.payload:
            work = build_workload(llm, endpoint, self.model)
            for body, name in zip(work.bodies, self.drawn_models(len(work.bodies))):
                body["model"] = name
            self.workload = work
            self.input_lens = [int(x) for x in work.input_tokens]
            self.image_bytes = work.image_bytes
            return work.bodies, work.source
        if llm.images:
            raise ValueError(f"--images {llm.images}: images go in the requests loadgen builds, not in --payload's")
        if payload_kind(self.net.payload) != "jsonl":
            raise ValueError("--payload: an OpenAI target takes a .jsonl file of request bodies")
        key = {"chat": "messages", "embeddings": "input", "responses": "input"}.get(endpoint, "prompt")
        bodies = []
        lines = read_jsonl(self.net.payload)[: self.net.sample_count]
        drawn = self.drawn_models(len(lines))
        for i, b in enumerate(lines):
            if not isinstance(b, dict):
                raise ValueError(f"--payload: {self.net.payload}: line {i + 1} is not a JSON object")
            if key not in b:
                raise ValueError(f"--payload: {self.net.payload}: line {i + 1} has no {key!r} "
                                 f"(this target is {self.target.path})")
            b = dict(b)
            if "model" not in b and not self.model:
                raise ValueError(f"--payload: {self.net.payload}: line {i + 1} has no 'model'; give --model NAME")
            b.setdefault("model", drawn[i] if drawn else self.model)
            if endpoint != "embeddings":
                b["stream"] = self.stream_responses
                if self.stream_responses and endpoint != "responses":
                    b.setdefault("stream_options", {"include_usage": True})
                else:
                    b.pop("stream_options", None)
            bodies.append(b)
        return bodies, self.net.payload

    def drawn_models(self, count: int) -> List[str]:
        """The models of ``count`` prepared requests, drawn by weight with the sample seed
        when ``--model`` is a mix; empty otherwise (each body keeps its model)."""
        mix = self.model_mix
        if mix is None or not mix.mixed:
            return []
        return [mix.names[i] for i in mix.draw(self.llm_options().seed, count)]

    def model_of(self, qid: int, sample_index: int) -> int:
        """The model (its index in the mix) of query ``qid``, made from prepared request
        ``sample_index``, when the run has a model mix: the native client's checks use it."""
        return self.request_models[sample_index % len(self.request_models)]

    def count_model(self, handler: Any, i: int) -> None:
        """Gives ``handler`` (a request from prepared request ``i``) its model and counts
        it sent, when the run has a model mix."""
        if self.request_models:
            handler.model_id = m = self.request_models[i]
            self.model_figures[m].sent += 1

    def count_images_sent(self, info: Dict[str, Any]) -> None:
        """Adds the images sent (``count``) and their bytes to ``info["images"]``, when
        the run sends images."""
        if "images" in info:
            info["images"] = {**info["images"], "count": self.images_sent, "bytes": self.image_bytes_sent}

    def count_images(self, i: int) -> None:
        """Counts the images of prepared request ``i`` sent (``--images``)."""
        if self.image_bytes:
            self.images_sent += self.llm_options().images_per_request
            self.image_bytes_sent += self.image_bytes[i]

    def issue_query(self, query_id: int, sample_index: int, scheduled_ns: int) -> None:
        i = sample_index % len(self.requests)
        self.count_images(i)
        handler = TokenStream(self, query_id, scheduled_ns) if self.stream_responses else WholeResponse(self, query_id,
                                                                                                scheduled_ns)
        self.count_model(handler, i)
        req = Request(self.requests[i], handler, query_id, self.stream_responses)
        pool = self.pool
        if pool is None:
            raise RuntimeError("issue_query before open_on_loop: the connection pool is not open")
        if self.input_lens:
            handler.n_input = n_in = self.input_lens[i]
            self.input_tokens_sent += n_in
        pool.submit(req, scheduled_ns + self.timeout_ns if self.timeout_ns else 0)

    def record_whole(self, w: "WholeResponse", t: int, n: int, doc: Dict[str, Any]) -> None:
        """A non-streamed answer ``doc``: ``n`` output tokens (from ``usage``; -1 for
        none, as for embeddings), completed at ``t``."""
        if n < 0:
            self.embeddings += 1
            if self.model_figures:
                self.model_figures[w.model_id].record(w.scheduled_ns, 0, t, 0)
            self.sink.complete_tokens(w.query_id, t, -1, w.n_input)  # the input tokens go in its record
            return
        self.tokens_from_usage += 1
        self.output_tokens += n
        self.output_lengths[n] += 1
        keys = RESPONSES_USAGE if self.responses else CHAT_USAGE
        reasoning = _reasoning_count(doc.get("usage"), keys[1])
        self._record_reasoning(-1 if reasoning is None else reasoning, 0)
        cached = _cached_count(doc.get("usage"), keys[2])
        self._record_cached(-1 if cached is None else cached)
        self._record_tool_calls(len(whole_calls(doc, self.responses)))
        elapsed = t - w.scheduled_ns
        if elapsed > 0 and n > 0:
            self.tokens_per_s.record(_tokens_per_s_milli(n, elapsed))
        self._lengths(w.n_input, n)
        if self.model_figures:
            self.model_figures[w.model_id].record(w.scheduled_ns, 0, t, n)
        self.sink.complete_tokens(w.query_id, t, n, w.n_input)

    def record_stream(self, s: TokenStream, t: int) -> None:
        if s.usage_tokens >= 0:
            n = s.usage_tokens
            self.tokens_from_usage += 1
        else:
            n = s.chunks
            self.tokens_from_chunks += 1
        self.output_tokens += n
        self.output_lengths[n] += 1
        self._record_reasoning(s.usage_reasoning_tokens, s.reasoning_chunks)
        self._record_cached(s.usage_cached_tokens)
        self._record_tool_calls(s.tool_calls)
        events, total = s.events, s.usage_tokens
        if s.event_texts is not None and self.itl_tokenizer is not None:
            count = self.itl_tokenizer.count
            events = [(t_j, count(text), w) for (t_j, _, w), text in zip(s.events, s.event_texts)]
            total = -1
            per_token = token_itl(events, -1)
            self.split_by_tokenizer += 1
        else:
            per_token = token_itl(s.events, s.usage_tokens)
            if s.usage_tokens >= 0:
                self.split_by_text += 1
            else:
                self.split_by_chunks += 1
        with self._gaps_lock:
            gaps = self._gaps
            gaps += s.gaps
            if len(gaps) >= 8192:
                self._flush_gaps()
            for value, k in per_token:
                self.itl_per_token.record_n(value, k)
            if s.first_reasoning_ns:
                self.ttfrt.record(max(1, s.first_reasoning_ns - s.scheduled_ns))
            if s.first_answer_ns:
                self.ttfat.record(max(1, s.first_answer_ns - s.scheduled_ns))
        elapsed = t - s.scheduled_ns
        if elapsed > 0 and n > 0:
            self.tokens_per_s.record(_tokens_per_s_milli(n, elapsed))
        self._lengths(s.n_input, n)
        if self.model_figures:
            self.model_figures[s.model_id].record(s.scheduled_ns, s.first_ns, t, n)
        # A conversation's turns keep no token events: the native client checks them from
        # their bytes alone, and both clients' records say the same.
        if events and getattr(self.sink, "keeps_token_events", False) and not getattr(self, "follow_ups", False):
            self.sink.complete_stream(s.query_id, t, n, s.n_input, [e[0] for e in events],
                                      event_token_counts(events, total))
            return
        self.sink.complete_tokens(s.query_id, t, n, s.n_input)

    def _record_reasoning(self, usage_count: int, chunks: int) -> None:
        """An answer's reasoning tokens: usage's count when the server gave one (>= 0),
        else its reasoning chunks (an answer with neither counts nowhere)."""
        usage = usage_count >= 0
        r = usage_count if usage else chunks
        if not usage and r == 0:
            return
        if usage:
            self.reasoning_from_usage += 1
        else:
            self.reasoning_from_chunks += 1
        self.reasoning_tokens += r
        if r > 0:
            self.reasoning_length_hist.record(r)

    def _record_tool_calls(self, calls: int) -> None:
        """An answer's tool calls."""
        if calls > 0:
            self.tool_calls += calls
            self.tool_call_requests += 1

    def _record_cached(self, cached: int) -> None:
        """An answer's cached prompt tokens (-1: its usage gave none)."""
        if cached >= 0:
            self.cached_from_usage += 1
            self.cached_tokens += cached

    def _lengths(self, n_input: int, n_output: int) -> None:
        if n_input > 0:
            self.input_lengths.record(n_input)
        if n_output > 0:
            self.output_length_hist.record(n_output)

    def _flush_gaps(self) -> None:
        """Records the gaps kept so far; the caller holds ``_gaps_lock``."""
        if self._gaps:
            self._itl.record_array(np.maximum(np.asarray(self._gaps, dtype=np.int64), 1))
            self._gaps.clear()

    @property
    def itl(self) -> Histogram:
        """Every inter-token gap so far (ns), in one histogram. Any thread."""
        with self._gaps_lock:
            self._flush_gaps()
        return self._itl

    def live_histograms(self) -> Dict[str, NamedHistogram]:
        """The token histograms in ns so far (copies), for live metrics
        (``--metrics-port``): callable from any thread while the run goes on, unlike
        :meth:`histograms`."""
        with self._gaps_lock:
            self._flush_gaps()
            return {"itl_ns": NamedHistogram(self._itl.copy(), "ns"),
                    "itl_per_token_ns": NamedHistogram(self.itl_per_token.copy(), "ns"),
                    "ttfrt_ns": NamedHistogram(self.ttfrt.copy(), "ns"),
                    "ttfat_ns": NamedHistogram(self.ttfat.copy(), "ns")}

    def histograms(self) -> Dict[str, NamedHistogram]:
        """Each gap between token chunks (``itl_ns``), the per-token inter-token latency
        (``itl_per_token_ns``), the times to the first reasoning and first answer token
        (``ttfrt_ns``, ``ttfat_ns``; from the scheduled time, of the streams that had one),
        the output tokens per second of each request (recorded as milli-tokens/s), and
        the input, output and reasoning lengths of the requests answered (tokens; input
        lengths when the workload knows them, reasoning lengths of the requests that had
        reasoning)."""
        return {
            "itl_ns": NamedHistogram(self.itl, "ns"),
            "itl_per_token_ns": NamedHistogram(self.itl_per_token, "ns"),
            "ttfrt_ns": NamedHistogram(self.ttfrt, "ns"),
            "ttfat_ns": NamedHistogram(self.ttfat, "ns"),
            "output_tokens_per_s": NamedHistogram(self.tokens_per_s, "tokens/s", scale=1000.0,
                                                  recorded_unit="milli-tokens/s"),
            "input_length_tokens": NamedHistogram(self.input_lengths, "tokens"),
            "output_length_tokens": NamedHistogram(self.output_length_hist, "tokens"),
            "reasoning_length_tokens": NamedHistogram(self.reasoning_length_hist, "tokens"),
        }

    def report(self) -> Dict[str, Any]:
        out = super().report()
        u, c = self.tokens_from_usage, self.tokens_from_chunks
        out["model"] = self.net.model if self.model_figures else self.model
        if self.model_figures:
            assert self.model_mix is not None
            out["models"] = {d["name"]: {"weight": d["weight"], "share": d["share"], **f.report()}
                             for d, f in zip(self.model_mix.describe(), self.model_figures)}
        out["tokens"] = {
            "source": _source(u, c),
            "queries_counted_from_usage": u,
            "queries_counted_from_chunks": c,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "reasoning_source": _source(self.reasoning_from_usage, self.reasoning_from_chunks),
            "itl_per_token_split": {"chunks": self.split_by_chunks, "text_length": self.split_by_text,
                                    "tokenizer": self.split_by_tokenizer},
            "cached_tokens": self.cached_tokens,
            "cached_requests": self.cached_from_usage,
            # Of the input tokens sent, by loadgen's count (exact with --tokenizer).
            "cached_share": self.cached_tokens / self.input_tokens_sent if self.input_tokens_sent else None,
            "tool_calls": self.tool_calls,
            "tool_call_requests": self.tool_call_requests,
        }
        if self.workload is not None:
            out["llm"] = self.llm_section()
        return out

    def llm_section(self) -> Dict[str, Any]:
        """The result's ``llm`` section: the workload, and the input and output lengths
        of the requests sent and answered."""
        info = dict(self.workload.info) if self.workload is not None else {}
        lengths = sorted(self.output_lengths.items())
        values = np.repeat(np.asarray([k for k, _ in lengths], dtype=np.int64), [c for _, c in lengths])
        self.count_images_sent(info)
        info["requests"] = {"input_tokens_sent": self.input_tokens_sent,
                            "output_tokens": length_stats(values),
                            "reasoning_tokens": self.reasoning_tokens,
                            "embeddings": self.embeddings}
        return info
