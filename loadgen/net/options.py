"""The options of network targets, gathered from ``loadgen run``'s options, and the
redaction of secrets (credentials in headers) from everything a run writes or prints."""

from __future__ import annotations

import dataclasses
import ssl
from typing import Any, List, Optional, Sequence, Tuple

from loadgen import defaults

__all__ = ["CUT_MARK", "NetOptions", "Redactor", "clip", "parse_header", "ssl_context"]

#: Headers whose values are always redacted (compared case-insensitively).
SENSITIVE_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie",
                               "x-api-key", "api-key"})
REDACTED = "[REDACTED]"
#: What :func:`clip` puts where it cut a text; the redactor treats what precedes it as
#: possibly the start of a secret the cut went through.
CUT_MARK = "..."
_CLIP_WINDOW_CHARS = 64 * 1024  # Redactor.excerpt redacts this much of a body before cutting


def clip(data: Any, limit: int) -> str:
    """``data`` (bytes are decoded as UTF-8, bad bytes replaced) cut to ``limit``
    characters, with :data:`CUT_MARK` after the cut when there was one. Only the first
    ``4 * limit + 4`` bytes are decoded, so a large body costs no more than a small one."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        head = bytes(data[: 4 * limit + 4])
        text = head.decode("utf-8", "replace")
        cut = len(head) < len(data)
    else:
        text, cut = str(data), False
    if len(text) > limit:
        return text[:limit] + CUT_MARK
    return text + CUT_MARK if cut else text


def parse_header(text: str) -> Tuple[str, str]:
    """``'Name: value'`` -> (name, value); ValueError when it is not a header."""
    name, sep, value = str(text).partition(":")
    name = name.strip()
    if not sep or not name or any(c in name for c in " \t\r\n") or "\r" in value or "\n" in value:
        raise ValueError(f"{text!r} is not a header like 'Name: value'")
    try:
        (name + value).encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"header {name!r}: HTTP/1.1 headers must be Latin-1 text") from None
    return name, value.strip()


@dataclasses.dataclass
class NetOptions:
    """What a network client needs to know beyond the target URL.

    Attributes:
        headers: extra request headers, (name, value).
        secret_headers: names of further headers whose values are redacted.
        ca_file: CA bundle that verifies the server's certificate (TLS).
        insecure: skip certificate verification (TLS).
        timeout_ms: per-request timeout, from the scheduled time (None = none).
        connections: connections (HTTP) or channels (gRPC) to open; 0 = sized from the
            load (the concurrency or the in-flight cap; 64 for an uncapped open loop).
        ready_timeout_s: how long to wait for the server to be ready before the run.
        check_responses: check every response (status, outputs); on by default.
        payload: .npy, .npz or .jsonl file of samples or request bodies.
        inputs: explicit input specs (``NAME:DTYPE:SHAPE``) instead of the metadata.
        request_template: JSON file describing requests for a generic HTTP API.
        grpc_contents: "raw" or "typed" request tensors over gRPC.
        model: OpenAI model name (default: the first the server lists).
        max_tokens: OpenAI ``max_tokens`` of synthetic requests.
        prompt_words: words in each synthetic OpenAI prompt.
        sample_count: samples the run draws indices from.
        seed: seed of synthetic payloads.
        secret_values: further strings to redact (a password in the URL).
        max_response_bytes: most bytes of a response body (of a stream: of each event);
            a request whose response is larger fails as ``response_too_large``.
        http_engine: "native", "asyncio" or "auto" (see ``--http-engine``).
        io_threads: the native HTTP client's epoll threads.
        grpc_engine: the gRPC client: "callback" (grpcio's synchronous channel, calls
            completed on its own thread, no event loop), "asyncio" (grpcio's asyncio
            API), or "auto" (callback).
        llm: the OpenAI workload options (a :class:`loadgen.llm.LlmOptions`; None: the
            defaults from ``max_tokens``, ``prompt_words``, ``sample_count`` and ``seed``).
    """

    headers: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    secret_headers: Sequence[str] = ()
    ca_file: Optional[str] = None
    insecure: bool = False
    timeout_ms: Optional[float] = None
    connections: int = 0
    ready_timeout_s: float = 30.0
    check_responses: bool = True
    payload: Optional[str] = None
    inputs: Sequence[Any] = ()
    request_template: Optional[str] = None
    grpc_contents: str = "raw"
    model: Optional[str] = None
    max_tokens: int = 128
    prompt_words: int = 64
    sample_count: int = 1024
    seed: int = 0
    secret_values: Sequence[str] = ()
    max_response_bytes: int = defaults.MAX_RESPONSE_BYTES
    llm: Any = None
    http_engine: str = "auto"
    io_threads: int = 1
    grpc_engine: str = "auto"

    def redactor(self) -> "Redactor":
        return Redactor(self.headers, self.secret_headers, self.secret_values)


class Redactor:
    """Replaces the values of sensitive headers with ``[REDACTED]`` in text and documents.

    Args:
        headers: the headers a run sends.
        secret_headers: more header names to treat as sensitive.
    """

    def __init__(self, headers: Sequence[Tuple[str, str]], secret_headers: Sequence[str] = (),
                 secret_values: Sequence[str] = ()) -> None:
        names = SENSITIVE_HEADERS | {h.strip().lower() for h in secret_headers}
        values = {v for k, v in headers if k.lower() in names and v} | {v for v in secret_values if v}
        # A scheme word such as "Bearer" stays readable while the credential after it
        # goes; longest first, so that a value containing another is replaced whole.
        secrets = set()
        for v in values:
            scheme, _, credential = v.partition(" ")
            if credential.strip() and scheme.lower() in ("bearer", "basic", "token", "digest"):
                secrets.add(credential.strip())
            else:
                secrets.add(v)
        self._values = sorted(secrets, key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._values)

    def text(self, s: str) -> str:
        """``s`` with every secret value replaced, and, where ``s`` was cut (before each
        :data:`CUT_MARK`), any start of a secret that the cut left."""
        for v in self._values:
            if v in s:
                s = s.replace(v, REDACTED)
        if CUT_MARK in s and self._values:
            s = self._cut_starts(s)
        return s

    def _cut_starts(self, s: str) -> str:
        parts = s.split(CUT_MARK)
        for i, head in enumerate(parts[:-1]):
            longest = 0
            for v in self._values:
                for k in range(min(len(v) - 1, len(head)), longest, -1):
                    if head.endswith(v[:k]):
                        longest = k
                        break
            if longest:
                parts[i] = head[:-longest] + REDACTED
        return CUT_MARK.join(parts)

    def excerpt(self, data: Any, limit: int) -> str:
        """The first ``limit`` characters of ``data`` (a response body: bytes or text)
        for a message, redacted before the cut (so that the cut cannot split a secret
        and leave part of it), and then at the cut (for a secret ``data`` itself ends in
        part of)."""
        return self.text(clip(self.text(clip(data, max(limit, _CLIP_WINDOW_CHARS))), limit))

    def doc(self, obj: Any) -> Any:
        """A copy of a JSON-like document with every secret value replaced in its strings."""
        if not self._values:
            return obj
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self.doc(k) if isinstance(k, str) else k: self.doc(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.doc(v) for v in obj]
        return obj


def ssl_context(ca_file: Optional[str], insecure: bool) -> ssl.SSLContext:
    """A client TLS context: verified against ``ca_file`` (or the system store), or with
    verification off when ``insecure``."""
    if insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"--ca-file: cannot load {ca_file}: {e}") from None
