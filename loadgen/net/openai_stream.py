"""OpenAI-compatible streaming: ``/v1/completions`` or ``/v1/chat/completions`` with
``"stream": true``, Server-Sent Events parsed as they arrive. Time to first token and time
per output token go to the engine; each inter-token gap and the output tokens per second
of each request are this client's own histograms."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from loadgen.defaults import sample_seed_of
from loadgen.llm.workload import LlmOptions, Workload, build_workload, length_stats
from loadgen.net.base import HttpSUT
from loadgen.net.http1 import Request, ResponseTooLarge
from loadgen.net.options import NetOptions, clip
from loadgen.net.payloads import payload_kind, read_jsonl
from loadgen.net.targets import Target
from loadgen.stats.histogram import Histogram
from loadgen.sut.report import NamedHistogram

__all__ = ["OpenAISUT", "TokenStream", "WholeResponse"]

# A non-empty "text" (completions) or "content" (chat delta) string value.
_TOKEN_FIELD = re.compile(rb'"(?:text|content)"\s*:\s*"(?!")')
# A choice's finish_reason given (a string, not null).
_FINISH_REASON = re.compile(rb'"finish_reason"\s*:\s*"')


#: The end-of-stream checks' problems (``--no-check`` skips them).
NO_TOKENS = "the stream had no tokens (and no finish_reason)"
NO_DONE = "the stream ended without data: [DONE]"


def event_problem(data: bytes, doc: Any) -> str:
    """What is wrong with an event whose ``data`` is not a plain token chunk: ``doc`` is
    its JSON (a ValueError when it is not JSON), not an object, or has an ``error``."""
    if isinstance(doc, ValueError):
        return f"an event is not JSON: {clip(data, 80)!r}"
    if not isinstance(doc, dict):
        return f"an event is not a JSON object: {clip(data, 80)!r}"
    return f"the server sent an error event: {clip(json.dumps(doc['error']), 200)}"


def too_large_text(max_event_bytes: int, held: int) -> str:
    """The message of a stream event over the limit."""
    return (f"a stream event over --max-response-bytes ({max_event_bytes} bytes): "
            f"{held} bytes with no end of event; the connection was closed")


#: The most output tokens an answer's ``usage.completion_tokens`` may say (a request's
#: record holds its count as a 32-bit integer); a count outside 0 to this is a protocol
#: error of that answer (``invalid_response``), not a number to record.
MAX_TOKEN_COUNT = 2**31 - 1
_MAX_RATE = 2**62  # milli-tokens/s past any histogram's range: recorded as out of range


def _token_count(usage: Any) -> Tuple[Optional[int], Optional[str]]:
    """(the ``completion_tokens`` of a ``usage`` object, or None when it gives none; the
    problem when the count is out of range, else None)."""
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(n, int) or isinstance(n, bool):
        return None, None
    if not 0 <= n <= MAX_TOKEN_COUNT:
        return None, f"usage.completion_tokens {clip(str(n), 40)} is out of range (0 to {MAX_TOKEN_COUNT})"
    return n, None


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


class TokenStream:
    """One streamed completion: Server-Sent Events parsed as they arrive, tokens timed."""

    __slots__ = ("sut", "query_id", "scheduled_ns", "buf", "first_ns", "last_ns", "chunks", "usage_tokens",
                 "done", "finished", "error", "gaps", "texts", "n_input")

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

    def on_data(self, req: Request, piece: bytes, t: int) -> None:
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
        # Fast path: a plain token chunk (no usage, no error) is recognised without
        # building its JSON; anything else is parsed in full.
        if (data[:1] == b"{" and data[-1:] == b"}" and b'"usage"' not in data and b'"error"' not in data
                and self.texts is None):
            if _TOKEN_FIELD.search(data):
                self._token(t)
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
        n, problem = _token_count(doc.get("usage"))
        if problem is not None:
            self.error = self.error or problem
        elif n is not None:
            self.usage_tokens = n
        for choice in doc.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if text:
                if self.texts is not None and isinstance(text, str):
                    self.texts.append(text)
                self._token(t)
            if choice.get("finish_reason"):
                self.finished = True

    def _token(self, t: int) -> None:
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
                problem = NO_DONE
        if problem is not None:
            sut.fail_query(self.query_id, "invalid_response", problem)
            return
        sut.record_stream(self, t)

    def on_error(self, req: Request, kind: str, message: str) -> None:
        self.sut.fail_query(self.query_id, kind, message)


class WholeResponse:
    """One answer not streamed (``--no-stream``, or ``/v1/embeddings``): the whole JSON
    body, its output tokens from ``usage.completion_tokens``; no time to first token."""

    __slots__ = ("sut", "query_id", "scheduled_ns", "n_input")

    def __init__(self, sut: "OpenAISUT", query_id: int, scheduled_ns: int) -> None:
        self.sut = sut
        self.query_id = query_id
        self.scheduled_ns = scheduled_ns
        self.n_input = -1

    def on_response(self, req: Request, status: int, body: bytes, t: int) -> None:
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
        problem = _whole_problem(doc, embeddings) if sut.check else None
        if sut.check:
            sut.checked += 1
        if problem is not None:
            sut.fail_query(self.query_id, "invalid_response", problem)
            return
        n, problem = _token_count(doc.get("usage"))
        if problem is not None and not embeddings:
            sut.fail_query(self.query_id, "invalid_response", problem)
            return
        if embeddings:
            n = -1
        elif n is None:
            n = sum(len(str((c.get("message") or {}).get("content") or c.get("text") or "").split())
                    for c in doc.get("choices") or () if isinstance(c, dict))
        sut.record_whole(self, t, n, doc)

    def on_error(self, req: Request, kind: str, message: str) -> None:
        self.sut.fail_query(self.query_id, kind, message)


def _whole_problem(doc: Dict[str, Any], embeddings: bool) -> Optional[str]:
    """What is wrong with a non-streamed answer (None when nothing): an error object, no
    choices, or (embeddings) no ``data`` list of embeddings."""
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


class OpenAISUT(HttpSUT):
    """OpenAI-compatible ``/v1/completions`` or ``/v1/chat/completions`` with
    ``"stream": true``: time to first token, each inter-token gap, time per output token
    and output tokens per second, with the token count from the ``usage`` the server
    sends, else from the chunks."""

    protocol = "openai_stream"

    def __init__(self, target: Target, net: NetOptions, pool_size: int, significant_figures: int = 3) -> None:
        super().__init__(target, net, pool_size)
        self.max_event_bytes = net.max_response_bytes
        self.model = net.model
        self._itl = Histogram(significant_figures=significant_figures, highest_trackable_value=3_600_000_000_000)
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
        self.set_requests([self.serialize("POST", self.target.path,
                                            json.dumps(b, separators=(",", ":")).encode()) for b in bodies], source)

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
            self.workload = work
            self.input_lens = [int(x) for x in work.input_tokens]
            return work.bodies, work.source
        if payload_kind(self.net.payload) != "jsonl":
            raise ValueError("--payload: an OpenAI target takes a .jsonl file of request bodies")
        key = {"chat": "messages", "embeddings": "input"}.get(endpoint, "prompt")
        bodies = []
        for i, b in enumerate(read_jsonl(self.net.payload)[: self.net.sample_count]):
            if not isinstance(b, dict):
                raise ValueError(f"--payload: {self.net.payload}: line {i + 1} is not a JSON object")
            if key not in b:
                raise ValueError(f"--payload: {self.net.payload}: line {i + 1} has no {key!r} "
                                 f"(this target is {self.target.path})")
            b = dict(b)
            if "model" not in b and not self.model:
                raise ValueError(f"--payload: {self.net.payload}: line {i + 1} has no 'model'; give --model NAME")
            b.setdefault("model", self.model)
            if endpoint != "embeddings":
                b["stream"] = self.stream_responses
                if self.stream_responses:
                    b.setdefault("stream_options", {"include_usage": True})
                else:
                    b.pop("stream_options", None)
            bodies.append(b)
        return bodies, self.net.payload

    def issue_query(self, query_id: int, sample_index: int, scheduled_ns: int) -> None:
        i = sample_index % len(self.requests)
        handler = TokenStream(self, query_id, scheduled_ns) if self.stream_responses else WholeResponse(self, query_id,
                                                                                                scheduled_ns)
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
            self.sink.complete(w.query_id, t)
            return
        self.tokens_from_usage += 1
        self.output_tokens += n
        self.output_lengths[n] += 1
        elapsed = t - w.scheduled_ns
        if elapsed > 0 and n > 0:
            self.tokens_per_s.record(_tokens_per_s_milli(n, elapsed))
        self._lengths(w.n_input, n)
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
        with self._gaps_lock:
            gaps = self._gaps
            gaps += s.gaps
            if len(gaps) >= 8192:
                self._flush_gaps()
        elapsed = t - s.scheduled_ns
        if elapsed > 0 and n > 0:
            self.tokens_per_s.record(_tokens_per_s_milli(n, elapsed))
        self._lengths(s.n_input, n)
        self.sink.complete_tokens(s.query_id, t, n, s.n_input)

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
        """The inter-token gaps so far, for live metrics (``--metrics-port``): callable
        from any thread while the run goes on, unlike :meth:`histograms`."""
        return {"itl_ns": NamedHistogram(self.itl, "ns")}

    def histograms(self) -> Dict[str, NamedHistogram]:
        """Each inter-token gap (ns), the output tokens per second of each request
        (recorded as milli-tokens/s), and the input and output lengths of the requests
        answered (tokens; input lengths when the workload knows them)."""
        return {
            "itl_ns": NamedHistogram(self.itl, "ns"),
            "output_tokens_per_s": NamedHistogram(self.tokens_per_s, "tokens/s", scale=1000.0,
                                                  recorded_unit="milli-tokens/s"),
            "input_length_tokens": NamedHistogram(self.input_lengths, "tokens"),
            "output_length_tokens": NamedHistogram(self.output_length_hist, "tokens"),
        }

    def report(self) -> Dict[str, Any]:
        out = super().report()
        u, c = self.tokens_from_usage, self.tokens_from_chunks
        out["model"] = self.model
        out["tokens"] = {
            "source": "usage" if u and not c else "chunks" if c and not u else "mixed" if u and c else "none",
            "queries_counted_from_usage": u,
            "queries_counted_from_chunks": c,
            "output_tokens": self.output_tokens,
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
        info["requests"] = {"input_tokens_sent": self.input_tokens_sent,
                            "output_tokens": length_stats(values),
                            "embeddings": self.embeddings}
        return info
