"""Reading an OpenAI-compatible answer as the asyncio client receives it: a stream's
Server-Sent Events (:class:`TokenStream`) or a whole JSON answer (:class:`WholeResponse`),
and the token counts, inter-token gaps and tool calls taken from them. The native client's
stream scanner (``csrc/sse.cc``) reads streams the same way; the differential tests
(``tests/unit/test_native_sse.py``) hold the two to one reading.

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
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple


from loadgen.net.http1 import Request, ResponseTooLarge
from loadgen.net.options import clip


if TYPE_CHECKING:
    from loadgen.net.openai_stream import OpenAISUT

__all__ = ["TokenStream", "WholeResponse", "event_token_counts", "token_itl", "whole_calls", "whole_text"]

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


def reasoning_count(usage: Any, section: str = "completion_tokens_details", key: str = "reasoning_tokens") -> \
        Optional[int]:
    """``usage.completion_tokens_details.reasoning_tokens`` (or ``usage.section.key``) when
    it is a count in range, else None (no error: the answer's own count is what is
    checked)."""
    details = usage.get(section) if isinstance(usage, dict) else None
    n = details.get(key) if isinstance(details, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_TOKEN_COUNT:
        return None
    return n


def cached_count(usage: Any, section: str = "prompt_tokens_details") -> Optional[int]:
    """``usage.prompt_tokens_details.cached_tokens`` (or ``usage.section.cached_tokens``:
    the prompt's tokens the server's prefix cache held) when it is a count in range, else
    None."""
    return reasoning_count(usage, section, "cached_tokens")


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


def tokens_per_s_milli(n: int, elapsed_ns: int) -> int:
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
        reasoning = reasoning_count(usage, keys[1])
        if reasoning is not None:
            self.usage_reasoning_tokens = reasoning
        cached = cached_count(usage, keys[2])
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
