"""OpenAI-compatible targets on the asyncio client: ``/v1/completions``,
``/v1/chat/completions``, ``/v1/responses`` and ``/v1/embeddings``, streamed or not.
:class:`OpenAISUT` builds the requests (the workload of ``loadgen.llm``, ``--payload``
lines, model mixes, tools and images), issues them, and keeps the figures: time to first
token and time per output token go to the engine; each gap between token chunks, the
per-token inter-token latency, the times to the first reasoning and first answer token,
and the output tokens per second of each request are this client's own histograms. How an
answer is read (what a token is, the Responses API's events, tool calls) is in
:mod:`loadgen.net.openai_answers`."""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from loadgen.defaults import sample_seed_of
from loadgen.llm.models import ModelMix, parse_model_mix
from loadgen.llm.tools import Tools, load_tools
from loadgen.llm.workload import LlmOptions, Workload, build_workload, length_stats
from loadgen.net.base import HttpSUT
from loadgen.net.openai_answers import (CHAT_USAGE, RESPONSES_USAGE, TokenStream, WholeResponse, cached_count,
                                        event_token_counts, reasoning_count, token_itl, tokens_per_s_milli,
                                        whole_calls)
from loadgen.net.http1 import Request
from loadgen.net.options import NetOptions
from loadgen.net.payloads import payload_kind, read_jsonl
from loadgen.net.targets import Target
from loadgen.stats.histogram import Histogram
from loadgen.sut.report import NamedHistogram

__all__ = ["OpenAISUT", "TokenStream", "WholeResponse", "event_token_counts", "token_itl"]

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
        reasoning = reasoning_count(doc.get("usage"), keys[1])
        self._record_reasoning(-1 if reasoning is None else reasoning, 0)
        cached = cached_count(doc.get("usage"), keys[2])
        self._record_cached(-1 if cached is None else cached)
        self._record_tool_calls(len(whole_calls(doc, self.responses)))
        elapsed = t - w.scheduled_ns
        if elapsed > 0 and n > 0:
            self.tokens_per_s.record(tokens_per_s_milli(n, elapsed))
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
            self.tokens_per_s.record(tokens_per_s_milli(n, elapsed))
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
