"""The native network client (``--http-engine native``, ``--grpc-engine native``): one
client in the core (``csrc/net_client.h``) whose requests go out, and whose responses are
read and judged, with no Python per query, over either of two protocols on one I/O core:
HTTP/1.1 (``csrc/http_client.cc``; :class:`NativeHttpSUT` for KServe REST and request
templates, :class:`NativeOpenAISUT` for OpenAI targets) or gRPC over HTTP/2
(``csrc/grpc_client.cc``, on nghttp2, no gRPC library per call; :class:`NativeGrpcSUT` for
KServe v2 ``ModelInfer``).

The Python client prepares everything as for its asyncio or grpcio path (readiness,
metadata, the serialized requests), then hands the bytes to the engine as a native SUT
(:class:`NativeClientSUT`, SUT form ``native_client``). Each response (a gRPC call's end:
its status and message) is judged by the client's own ``verdict`` (status and body, a
function of the bytes): the core caches verdicts by the response's bytes, and the
responses it has not seen come to the Python side in batches on a checker thread
(:class:`Checker`), so that every response is checked and the usual model answering the
same prepared requests costs one lookup. The gRPC verdict checks a response message as
the grpcio clients do and names a failed call's error as they do (``grpc_<CODE>``).

OpenAI streams (:class:`NativeOpenAISUT`) are read in the core as their events arrive
(``csrc/sse.cc``, the semantics of :class:`~loadgen.net.openai_answers.TokenStream`): first
tokens, completions with their token counts and the client's figures (gaps between token
chunks, the per-token inter-token latency, times to the first reasoning and answer token,
reasoning counts, tokens per second, lengths) are native; only a failed stream comes to
the Python side, for its message. Answers not streamed (``--no-stream``, and
``/v1/embeddings``) are sent and read natively (``check_each``: no verdict cache, since
counting them needs the answer and its query). A completions or chat answer (without
``--tools``) whose count is certain (a JSON object with choices and ``usage.completion_tokens``:
``read_whole_answer`` in ``csrc/sse.h``) is counted and completed in the core; every other
answer, and every embeddings and ``/v1/responses`` answer, comes to the Python side, where the asyncio client's
own code checks and counts it (:class:`~loadgen.net.openai_answers.WholeResponse`) and the
verdict carries the token counts. A multi-turn conversation's turns (``--turns``) come to the Python side too, a
stream with its bytes: :class:`~loadgen.net.openai_turns.ConversationSUT` reads the
reply, hands the next turn's request to the core (``net_add_request``) and schedules it
as the engine's follow-up, before the turn is completed. A model mix (``--model
a=3,b=1``) gives each request its model's group: the core keeps each group's figures
(:meth:`NativeOpenAISUT._model_figures` adds those the Python check kept).
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple

from loadgen import _core, defaults
from loadgen.stats.histogram import Histogram
from loadgen.sut.report import NamedHistogram
from loadgen.units import s_to_ns

__all__ = ["Checker", "NativeClientSUT", "NativeGrpcSUT", "NativeHttpSUT", "NativeOpenAISUT", "check_tls",
           "grpc_refusal", "grpc_settings", "http_refusal", "native_sut"]

_TAKE_MAX = 256

# The core's SseProblem codes (csrc/sse.h) of a failed stream.
_NOT_JSON, _NOT_OBJECT, _ERROR_EVENT, _HTTP_STATUS, _NO_TOKENS, _NO_DONE, _TOO_LARGE, _BAD_TOKEN_COUNT = range(1, 9)


# The core's stream histograms and the OpenAISUT attributes that hold them.
_STREAM_HISTOGRAMS = (("ttfrt_ns", "ttfrt"), ("ttfat_ns", "ttfat"), ("itl_per_token_ns", "itl_per_token"),
                      ("reasoning_length_tokens", "reasoning_length_hist"))
# What answers not streamed add to: the counts and histograms that the core (the answers
# it counted) and the inner client's own check (the rest) both keep.
_WHOLE_COUNTS = ("tokens_from_usage", "tokens_from_chunks", "output_tokens", "checked", "reasoning_tokens",
                 "reasoning_from_usage", "reasoning_from_chunks")
_WHOLE_HISTOGRAMS = (("tokens_per_s_milli", "tokens_per_s"), ("input_length_tokens", "input_lengths"),
                     ("output_length_tokens", "output_length_hist"), ("reasoning_length_tokens", "reasoning_length_hist"))


def _bad_token_count_text(digits: bytes, responses: bool = False) -> str:
    """The message of a stream whose ``usage.completion_tokens`` (``usage.output_tokens``
    of a ``/v1/responses`` stream; ``digits``, an integer's text) is outside 0 to
    ``_core.MAX_TOKEN_COUNT``, as the asyncio client words it."""
    from loadgen.net.openai_answers import bad_count_text

    return bad_count_text(digits.decode("ascii", "replace"), "output_tokens" if responses else "completion_tokens")


# Why a build without OpenSSL refuses a TLS target natively (the scheme follows).
_NO_TLS = ("this build of loadgen has no TLS in its native clients (OpenSSL's header was missing when it was built: "
           "install libssl-dev and reinstall), so no ")


def http_refusal(target: Any, net: Any = None) -> Optional[str]:
    """None when the native client's HTTP/1.1 protocol can run a ``--sut`` target
    (:class:`~loadgen.net.targets.Target`) with client options ``net``
    (:class:`~loadgen.net.options.NetOptions`), else why not (``--http-engine native``'s
    error; ``auto`` then takes the asyncio client)."""
    what = {"kserve_grpc": "gRPC"}.get(target.kind)
    if what is None and target.tls and not _core.tls_available():
        return _NO_TLS + "https://"
    if what is None and target.kind == "openai" and target.endpoint not in ("completions", "chat", "responses",
                                                                                  "embeddings"):
        what = f"OpenAI {target.path}"
    if what is None:
        return None
    return ("the native HTTP/1.1 client runs KServe REST, --request-template and OpenAI completions, embeddings, "
            f"chat and responses targets over http:// and https://, not {what}")


def grpc_refusal(target: Any) -> Optional[str]:
    """None when the native client's gRPC protocol can run ``target``, else why not
    (``--grpc-engine native``'s error; ``auto`` then takes a grpcio client)."""
    if not _core.grpc_client_available():
        return ("this build of loadgen has no native gRPC client (nghttp2's header was missing when it was built: "
                "install libnghttp2-dev and reinstall)")
    if target.tls and not _core.tls_available():
        return _NO_TLS + "grpcs://"
    return None


def check_tls(target: Any, net: Any, protocol: str) -> None:
    """One TLS handshake with ``target`` as the native client's connections make it
    (verification against ``net.ca_file`` or the system store unless ``net.insecure``,
    the host name, ALPN ``h2`` for ``protocol`` "grpc", else ``http/1.1``): a
    certificate that does not verify, or a server that refuses the handshake, is said
    before anything else is asked of the server. A server not listening yet is waited for
    as the readiness check waits (``net.ready_timeout_s``), and left to that check to
    name when it never comes.

    Raises:
        ValueError: the handshake failed; the message says why.
    """
    deadline = time.monotonic() + max(0.0, float(net.ready_timeout_s))
    while True:
        try:
            host = _numeric_host(target.host, target.port)
            why = _core.tls_check(host, int(target.port), target.host, net.ca_file or "", bool(net.insecure),
                                  "h2" if protocol == "grpc" else "http/1.1", s_to_ns(defaults.TLS_CHECK_TIMEOUT_S))
        except ValueError:  # not resolved (yet)
            why = _NOT_CONNECTED
        except RuntimeError as e:  # a CA file that does not load
            raise ValueError(str(e)) from None
        if not why:
            return
        if not why.startswith(_NOT_CONNECTED):
            raise ValueError(f"TLS with {target.host}:{target.port}: {why}"
                             + ("" if net.insecure else " (--ca-file names the CA that signed the server's "
                                "certificate; --insecure skips the check)"))
        if time.monotonic() >= deadline:
            return
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def grpc_settings(target: Any, net: Any) -> _core.NetClientSettings:
    """The core client's connection settings for ``target`` over gRPC (server, TLS, the
    :authority a certificate is checked against, metadata, response bound): what a unary
    call before the run (``_core.grpc_unary_call``: readiness, metadata) needs."""
    from loadgen.net.targets import host_port

    h = _core.NetClientSettings()
    h.protocol = _core.NetProtocol.grpc
    h.host = _numeric_host(target.host, target.port)
    h.port = int(target.port)
    h.max_response_bytes = min(int(net.max_response_bytes), 1 << 32)
    h.metadata = [(k.lower(), v) for k, v in net.headers]
    if target.tls:
        h.tls = True
        h.server_name = target.host
        h.ca_file = net.ca_file or ""
        h.insecure = bool(net.insecure)
        h.authority = host_port(target) or ""
    return h


# How the core's tls_check() begins a connect that failed (the server is not there yet).
_NOT_CONNECTED = "connecting to "


def _numeric_host(host: str, port: int) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise ValueError(f"cannot resolve {host!r}: {e.strerror or e}") from None
    return str(infos[0][4][0])


class NativeClientSUT:
    """A prepared network client (``inner``) whose queries the core's native network
    client makes: the engine runs it as the SUT form ``native_client`` (its
    :meth:`native_settings`, kind ``SutKind.net_client``) and judges the responses the
    core has no verdict for with its :meth:`verdict` (:meth:`start_checker`). The
    protocol's own classes are :class:`NativeHttpSUT` (with :class:`NativeOpenAISUT`) and
    :class:`NativeGrpcSUT`.
    """

    #: The SUT form the engine runs it as (``loadgen.sut.forms.classify_sut``).
    native_client = True
    #: The core client's protocol.
    net_protocol: ClassVar[_core.NetProtocol]
    #: The key of the result's network section that says which client ran ("native").
    engine_key: ClassVar[str]

    def take_client(self, inner: Any, io_threads: int, cpus: Sequence[int]) -> None:
        """Takes over the prepared client ``inner`` (its target, requests and checks)."""
        self.inner = inner
        self.io_threads = io_threads
        self.cpus = list(cpus)
        self.protocol = inner.protocol
        self.core: Optional[_core.Engine] = None
        self.host = _numeric_host(inner.target.host, inner.target.port)
        self.check_errors = 0

    def native_settings(self) -> _core.NativeSutSettings:
        """The engine's settings: kind ``net_client`` with the client's settings."""
        s = _core.NativeSutSettings(kind=_core.SutKind.net_client)
        s.net = self.client_settings()
        return s

    def client_settings(self) -> _core.NetClientSettings:
        """The native client's settings for this run: the protocol, the server, the
        connections and the prepared requests."""
        h = _core.NetClientSettings()
        h.protocol = self.net_protocol
        h.host = self.host
        h.port = int(self.inner.target.port)
        h.connections = int(self.inner.connections)
        h.io_threads = int(self.io_threads)
        h.requests = list(self.inner.requests)
        h.max_response_bytes = int(self.inner.net.max_response_bytes)
        h.timeout_ns = int(self.inner.timeout_ns or 0)
        h.cpus = self.cpus
        if self.inner.target.tls:
            h.tls = True
            h.server_name = self.inner.target.host
            h.ca_file = self.inner.net.ca_file or ""
            h.insecure = bool(self.inner.net.insecure)
        return h

    def start_checker(self, core: _core.Engine) -> Checker:
        """Starts the thread that judges the responses ``core`` has no verdict for (the
        engine calls this once it has started the run, and joins the checker it gets at
        the end: ``join(timeout_s)``, then ``error``)."""
        checker = Checker(core, self)
        checker.start()
        return checker

    def verdict(self, status: int, body: bytes) -> Optional[Tuple[str, str]]:
        """The inner client's verdict; a check that raises fails its query as check_error."""
        try:
            out: Optional[Tuple[str, str]] = self.inner.verdict(status, body)
            return out
        except Exception as e:  # a bug in a check must not end the run
            self.check_errors += 1
            return "check_error", f"the response check raised {type(e).__name__}: {e}"

    def verdicts(self, batch: List[Tuple[Any, ...]]) -> List[Tuple[Any, ...]]:
        """The verdicts on a batch of responses from ``net_take_unchecked`` (id, t_ns,
        status, body, problem, ...), as ``net_resolve`` takes them."""
        out: List[Tuple[Any, ...]] = []
        for qid, t, status, body, problem, *_ in batch:
            bad = self.stream_verdict(problem, status, body) if problem else self.verdict(status, body)
            out.append((qid, t, status, body, bad[0], bad[1]) if bad else (qid, t, status, body, None, ""))
        return out

    def stream_verdict(self, problem: int, status: int, body: bytes) -> Tuple[str, str]:
        """The error of a stream the core failed (OpenAI streams only: see :class:`NativeOpenAISUT`)."""
        raise RuntimeError(f"{self.protocol}: the core reported a stream problem ({problem}) for a client without "
                           "streams")

    # -- what goes in the result document (the ReportingSUT protocol)
    def histograms(self) -> Dict[str, NamedHistogram]:
        out: Dict[str, NamedHistogram] = self.inner.histograms()
        wait = self._receive_wait()
        if wait is not None:
            out["receive_wait_ns"] = NamedHistogram(wait, "ns")
        return out

    def _receive_wait(self) -> Optional[Histogram]:
        """Per read, how long the bytes had waited in the socket since the kernel received
        them (its SO_TIMESTAMPNS stamp): the client's own lateness in reading, which is in
        the latencies (they end when the client read the last bytes)."""
        core = self.core.net_receive_wait() if self.core is not None else None
        return Histogram.from_core(core) if core is not None and core.total_count else None

    def report(self) -> Dict[str, Any]:
        out: Dict[str, Any] = self.inner.report()
        stats = dict(self.core.net_stats()) if self.core is not None else {}
        out[self.engine_key] = "native"
        out["io_threads"] = self.io_threads
        out.update(connects=stats.get("connects", 0), connect_failures=stats.get("connect_failures", 0),
                   connections_opened_before_run=stats.get("connections_opened_before_run", 0),
                   bytes_sent=stats.get("bytes_sent", 0))
        # With checks on, every response is checked: by the cache of verdicts, or by the
        # client's own check (which counts what it checked).
        checked = int(getattr(self.inner, "checked", 0))
        out["responses_checked"] = checked + stats.get("cache_hits", 0) if checked else 0
        out["native"] = {"responses": stats.get("responses", 0), "verdict_cache_hits": stats.get("cache_hits", 0),
                         "checked_in_python": stats.get("checked_outside", 0),
                         "closed_by_timeout": stats.get("closed_by_timeout", 0),
                         "queued_in_client": stats.get("queued", 0), "check_errors": self.check_errors}
        if stats.get("handed_over"):
            out["native"]["handed_to_io_thread"] = stats["handed_over"]
        if self.inner.target.tls:  # handshakes, all made as connections opened (most before the run)
            out["native"]["tls_handshakes"] = stats.get("tls_handshakes", 0)
            out["native"]["tls_resumed"] = stats.get("tls_resumed", 0)
        wait = self._receive_wait()
        if wait is not None:
            out["native"]["receive_wait_ns"] = {"p50": wait.value_at_percentile(50),
                                                "p99": wait.value_at_percentile(99), "max": wait.max}
        return out


class Checker:
    """The thread that judges the responses the core has no verdict for yet: it takes
    them in batches, asks the SUT's :meth:`NativeClientSUT.verdicts` (each response's
    :meth:`NativeClientSUT.verdict`, or an OpenAI answer's check and count), and hands the
    verdicts back (the core completes or fails the queries and caches the verdicts it
    may). It ends when the client has closed and nothing is left."""

    def __init__(self, core: _core.Engine, sut: NativeClientSUT) -> None:
        self.core = core
        self.sut = sut
        sut.core = core
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="loadgen-net-check", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)

    def _run(self) -> None:
        core, verdicts = self.core, self.sut.verdicts
        try:
            while True:
                batch = core.net_take_unchecked(_TAKE_MAX, 0.05)
                if batch is None:
                    return
                if not batch:
                    continue
                core.net_resolve(verdicts(batch))
        except BaseException as e:  # reported by the engine's wait()
            self.error = e


class NativeHttpSUT(NativeClientSUT):
    """A prepared HTTP client (``inner``: KServe REST or a request template), its
    requests made by the core's client over HTTP/1.1.

    Args:
        inner: the prepared :class:`~loadgen.net.base.HttpSUT` (its requests serialized).
        io_threads: epoll threads the connections are spread over.
        cpus: the I/O threads' CPUs (empty: not pinned).
    """

    net_protocol = _core.NetProtocol.http1
    engine_key = "http_engine"

    def __init__(self, inner: Any, io_threads: int = 1, cpus: Sequence[int] = ()) -> None:
        why = http_refusal(inner.target, inner.net)
        if why is not None:
            raise ValueError(f"--http-engine native: {why}")
        if inner.target.kind == "openai" and not isinstance(self, NativeOpenAISUT):
            raise ValueError("an OpenAI client runs natively as a NativeOpenAISUT (see native_sut())")
        self.take_client(inner, io_threads, cpus)

    def client_settings(self) -> _core.NetClientSettings:
        h = super().client_settings()
        h.warm_connections = min(4096, h.connections)  # all before the run: a connect mid-run costs the issuing thread
        h.head_only = bool(getattr(self.inner, "head_only", False))
        return h


class _AnswerSink:
    """The sink of the asyncio client's own checks (:class:`~loadgen.net.openai_answers.WholeResponse`,
    :class:`~loadgen.net.openai_turns.ConversationSUT`) when they judge the native client's
    answers on its checker thread: the outcome they report (:attr:`outcome`: error kind or
    None, message, output and input tokens) becomes the answer's verdict; follow-ups go to
    the engine as they come (before the verdict completes the turn)."""

    def __init__(self, core: _core.Engine) -> None:
        self.core = core
        self.outcome: Tuple[Optional[str], str, int, int] = (None, "", -1, -1)

    def complete(self, qid: int, t_ns: int) -> None:
        self.outcome = (None, "", -1, -1)

    def complete_tokens(self, qid: int, t_ns: int, n_tokens: int, n_input: int = -1) -> None:
        self.outcome = (None, "", n_tokens, n_input)

    def fail(self, qid: int, kind: str, message: str) -> None:
        self.outcome = (kind, message, -1, -1)

    def first_token(self, qid: int, t_ns: int) -> None:
        """The core reported it as the stream came."""

    def follow_up(self, tag: int, at_ns: int) -> bool:
        return bool(self.core.follow_up(tag, at_ns))

    def follow_ups(self) -> Dict[str, int]:
        return dict(self.core.follow_ups())


class NativeOpenAISUT(NativeHttpSUT):
    """A prepared :class:`~loadgen.net.openai_stream.OpenAISUT` (completions, chat, responses
    or embeddings; streamed or not; or a multi-turn :class:`~loadgen.net.openai_turns.ConversationSUT`)
    whose requests the core sends and whose answers it reads: a stream's histograms, counts
    and ``llm`` section are the core's figures; a completions or chat answer not streamed
    is counted in the core where its count is certain (:attr:`whole_answers`), and the
    other answers, every embeddings answer and each turn of a conversation are checked and
    counted by the inner client's own code on the checker thread (:meth:`verdicts`).
    Either way the asyncio client's keys and meaning.

    Args:
        inner: the prepared OpenAISUT (its requests serialized).
        io_threads: epoll threads the connections are spread over.
        cpus: the I/O threads' CPUs (empty: not pinned).
    """

    @property
    def follow_ups(self) -> bool:
        """Whether the engine takes follow-up queries from this SUT (``--turns``)."""
        return bool(getattr(self.inner, "follow_ups", False))

    @property
    def check_each(self) -> bool:
        """Every answer goes to :meth:`verdicts` (not streamed, or a conversation's turn),
        but those :attr:`whole_answers` lets the core count."""
        return not self.inner.stream_responses or self.follow_ups

    @property
    def whole_answers(self) -> bool:
        """Completions or chat answers not streamed, outside a conversation and without
        tools: the core counts an answer whose verdict is certain (a JSON object with
        choices and ``usage.completion_tokens``; ``read_whole_answer`` in ``csrc/sse.h``)
        itself. (Responses answers and those that may hold tool calls go to the check.)"""
        inner = self.inner
        return (not inner.stream_responses and not self.follow_ups and inner.target.endpoint in ("completions", "chat")
                and inner.tools is None)

    def client_settings(self) -> _core.NetClientSettings:
        h = super().client_settings()
        inner = self.inner
        h.sse = bool(inner.stream_responses)
        h.sse_check = bool(inner.check)
        h.sse_responses = bool(inner.responses)
        h.check_each = self.check_each
        h.whole_answers = self.whole_answers
        h.input_tokens = [int(n) for n in inner.input_lens]
        h.image_bytes = [int(n) for n in inner.image_bytes]
        h.images_per_request = inner.llm_options().images_per_request if inner.image_bytes else 0
        h.significant_figures = int(inner._itl.significant_figures)
        h.max_response_bytes = int(inner.max_event_bytes)
        if inner.model_figures:  # a model mix: each request's model is its group
            h.group_count = len(inner.model_figures)
            h.request_groups = [int(m) for m in inner.request_models]
        return h

    def start_checker(self, core: _core.Engine) -> Checker:
        """The checker; with :attr:`check_each`, the inner client's checks report to it."""
        if self.check_each:
            self._answers = _AnswerSink(core)
            self.inner.sink = self._answers
            if self.follow_ups:
                self.inner.add_request = core.net_add_request
                self.inner.engine_counts = core.counts
        return super().start_checker(core)

    def verdicts(self, batch: List[Tuple[Any, ...]]) -> List[Tuple[Any, ...]]:
        """The verdicts on a batch from the core: with :attr:`check_each` each answer is
        judged and counted by the inner client's code (:meth:`_answer`), and an ok
        verdict carries the answer's token counts; else as any native client's."""
        if not self.check_each:
            return super().verdicts(batch)
        return [self._answer(*item) for item in batch]

    def _answer(self, qid: int, t: int, status: int, body: bytes, problem: int, sample: int, scheduled: int,
                n_input: int, n_output: int) -> Tuple[Any, ...]:
        """One answer's verdict (see :meth:`verdicts`)."""
        from loadgen.net.openai_answers import WholeResponse

        inner, sink = self.inner, self._answers
        sink.outcome = ("check_error", "the answer's check reported no outcome", -1, -1)
        try:
            if self.follow_ups:
                inner.native_turn(qid, sample)
            if problem:
                inner.fail_query(qid, *self.stream_verdict(problem, status, body))
            elif inner.stream_responses:  # a conversation's good stream: its figures are the core's
                if self.follow_ups:
                    inner.native_stream(qid, body, n_output, t)
                sink.complete_tokens(qid, t, n_output, n_input)
            else:
                whole = WholeResponse(inner, qid, scheduled)
                whole.n_input = n_input
                if inner.model_figures:  # its model's figures (the asyncio client's count_model)
                    whole.model_id = inner.model_of(qid, sample)
                whole.on_response(None, status, body, t)
        except Exception as e:  # a bug in a check must not end the run
            self.check_errors += 1
            sink.outcome = ("check_error", f"the response check raised {type(e).__name__}: {e}", -1, -1)
        kind, message, n_tokens, n_in = sink.outcome
        if kind is not None:
            return qid, t, status, b"", kind, message
        return qid, t, status, b"", None, "", n_tokens, n_in

    def stream_verdict(self, problem: int, status: int, body: bytes) -> Tuple[str, str]:
        """The error (kind, message) of a stream the core failed, worded (and redacted) as
        the asyncio client words it: ``problem`` is the core's code, ``body`` its bytes."""
        from loadgen.net.openai_answers import NO_COMPLETED, NO_DONE, NO_TOKENS, loads_json, event_problem, too_large_text

        inner = self.inner
        responses = bool(getattr(inner, "responses", False))
        if problem == _HTTP_STATUS:
            kind, message = f"http_{status}", f"HTTP {status}: {inner.redactor.excerpt(body, 200)}"
        elif problem == _TOO_LARGE:
            kind, message = "response_too_large", too_large_text(inner.max_event_bytes, int(body))
        elif problem in (_NO_TOKENS, _NO_DONE):
            kind, message = "invalid_response", NO_TOKENS if problem == _NO_TOKENS else \
                NO_COMPLETED if responses else NO_DONE
        elif problem == _BAD_TOKEN_COUNT:  # body: the count's digits
            kind, message = "invalid_response", _bad_token_count_text(body, responses)
        else:
            try:
                doc: Any = loads_json(body.decode("utf-8", "replace"))
            except ValueError as e:
                doc = e
            kind, message = "invalid_response", event_problem(body, doc)
        return kind, inner.redactor.text(message)

    def _figures(self) -> None:
        """Puts the core's figures so far in the inner client, whose histograms(),
        report() and llm_section() then say what they say for the asyncio client."""
        if self.core is None:
            return
        f = self.core.sse_figures()
        inner = self.inner
        inner.input_tokens_sent = f["input_tokens_sent"]  # counted as each request is sent
        inner.images_sent, inner.image_bytes_sent = f["images_sent"], f["image_bytes_sent"]
        if inner.model_figures:
            self._model_figures(f["groups"])
        if self.whole_answers:
            self._whole_figures(f)
            return
        if not inner.stream_responses:  # the rest are the inner client's own (its checks counted them)
            return
        inner._itl = Histogram.from_core(f["itl_ns"])
        inner.tokens_per_s = Histogram.from_core(f["tokens_per_s_milli"])
        inner.input_lengths = Histogram.from_core(f["input_length_tokens"])
        inner.output_length_hist = Histogram.from_core(f["output_length_tokens"])
        inner.output_lengths = Counter(dict(f["output_lengths"]))
        for key in ("tokens_from_usage", "tokens_from_chunks", "output_tokens", "input_tokens_sent", "checked",
                    "reasoning_tokens", "reasoning_from_usage", "reasoning_from_chunks", "split_by_chunks",
                    "split_by_text", "cached_tokens", "cached_from_usage", "tool_calls", "tool_call_requests"):
            setattr(inner, key, f[key])
        for key, attr in _STREAM_HISTOGRAMS:
            setattr(inner, attr, Histogram.from_core(f[key]))

    def _whole_figures(self, f: Dict[str, Any]) -> None:
        """Answers not streamed: the figures of those the core counted added to those the
        inner client's check counted (taken once, when first asked after the run)."""
        inner = self.inner
        own = getattr(self, "_own", None)
        if own is None:
            own = {key: getattr(inner, key) for key in _WHOLE_COUNTS}
            own.update({attr: getattr(inner, attr).copy() for _, attr in _WHOLE_HISTOGRAMS})
            own["output_lengths"] = Counter(inner.output_lengths)
            self._own = own
        for key in _WHOLE_COUNTS:
            setattr(inner, key, own[key] + f[key])
        inner.output_lengths = own["output_lengths"] + Counter(dict(f["output_lengths"]))
        for key, attr in _WHOLE_HISTOGRAMS:
            setattr(inner, attr, Histogram.from_core(f[key]).add(own[attr]))

    def _model_figures(self, groups: List[Dict[str, Any]]) -> None:
        """A model mix: each model's figures are the core's (its request group's: requests
        sent, answers it counted) added to those the inner client's check recorded for the
        answers it counted (taken once, when first asked after the run)."""
        from loadgen.net.openai_stream import ModelFigures

        inner = self.inner
        own = getattr(self, "_own_models", None)
        if own is None:
            own = self._own_models = list(inner.model_figures)
        merged = []
        for mine, core in zip(own, groups):
            m = ModelFigures(inner._itl.significant_figures)
            m.sent = mine.sent + core["sent"]
            m.answered = mine.answered + core["answered"]
            m.output_tokens = mine.output_tokens + core["output_tokens"]
            m.latency = Histogram.from_core(core["latency_ns"]).add(mine.latency)
            m.ttft = Histogram.from_core(core["ttft_ns"]).add(mine.ttft)
            merged.append(m)
        inner.model_figures = merged

    def live_histograms(self) -> Dict[str, NamedHistogram]:
        """The token histograms in ns so far (live metrics); any thread."""
        if self.core is None:
            return self.inner.live_histograms()
        f = self.core.sse_figures()
        return {key: NamedHistogram(Histogram.from_core(f[key]), "ns")
                for key in ("itl_ns", "itl_per_token_ns", "ttfrt_ns", "ttfat_ns")}

    def histograms(self) -> Dict[str, NamedHistogram]:
        self._figures()
        return super().histograms()

    def report(self) -> Dict[str, Any]:
        self._figures()
        return super().report()


def native_sut(inner: Any, io_threads: int = 1, cpus: Sequence[int] = ()) -> NativeHttpSUT:
    """The native SUT for a prepared HTTP client: :class:`NativeOpenAISUT` for an OpenAI
    target, else :class:`NativeHttpSUT`."""
    cls = NativeOpenAISUT if inner.target.kind == "openai" else NativeHttpSUT
    return cls(inner, io_threads, cpus)


class NativeGrpcSUT(NativeClientSUT):
    """A prepared KServe gRPC client (``inner``), its calls made by the core's client over
    gRPC (HTTP/2 on nghttp2, no gRPC library per call).

    Args:
        inner: the prepared :class:`~loadgen.net.kserve_grpc.KServeGrpcSUT`.
        io_threads: epoll threads the connections are spread over.
        cpus: the I/O threads' CPUs (empty: not pinned).
        max_calls: calls in flight at most (default: the inner client's ``in_flight``).
    """

    net_protocol = _core.NetProtocol.grpc
    engine_key = "grpc_engine"

    def __init__(self, inner: Any, io_threads: int = 1, cpus: Sequence[int] = (),
                 max_calls: Optional[int] = None) -> None:
        why = grpc_refusal(inner.target)
        if why is not None:
            raise ValueError(f"--grpc-engine native: {why}")
        import grpc

        self.take_client(inner, io_threads, cpus)
        self.max_calls = int(max_calls if max_calls is not None else inner.in_flight)
        self._codes = {c.value[0]: c for c in grpc.StatusCode}
        self._unknown = grpc.StatusCode.UNKNOWN

    def client_settings(self) -> _core.NetClientSettings:
        """The client's settings: every call invokes ``ModelInfer``, with the inner
        client's metadata; every connection is opened before the run."""
        from loadgen.net.kserve_grpc import RPC

        h = super().client_settings()
        h.grpc_method = RPC["ModelInfer"]
        h.metadata = list(self.inner.metadata_md or ())
        h.max_in_flight = self.max_calls
        h.warm_connections = h.connections
        if self.inner.target.tls:  # the name the certificate is for, as grpcio sends it
            from loadgen.net.targets import host_port

            h.authority = host_port(self.inner.target) or ""
        return h

    def verdict(self, status: int, body: bytes) -> Optional[Tuple[str, str]]:
        """The verdict on a call's end: ``status`` its gRPC status code, ``body`` the
        response message (status 0) or the status message. As the grpcio clients judge it."""
        inner = self.inner
        try:
            if status == 0:
                if not inner.check:
                    return None
                problem = inner.check_body(body, inner.check_pb)
                return None if problem is None else ("invalid_response", problem)
            code = self._codes.get(status, self._unknown)
            failure = inner.failure_of(code, body.decode("utf-8", "replace"))
            # No deadline goes to the server (the core resets a call at its timeout), so a
            # DEADLINE_EXCEEDED is the server's own and fails the query as such.
            return failure if failure is not None else (f"grpc_{code.name}", inner.redactor.excerpt(body, 500))
        except Exception as e:  # a bug in a check must not end the run
            self.check_errors += 1
            return "check_error", f"the response check raised {type(e).__name__}: {e}"

    def report(self) -> Dict[str, Any]:
        out = super().report()
        out.pop("grpc_calls", None)  # grpcio's, which makes no call here
        out["grpc_experiments"] = None  # grpcio makes no call
        out["nghttp2"] = _core.grpc_client_nghttp2_version()
        return out
