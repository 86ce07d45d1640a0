"""The options of network targets, gathered from ``loadgen run``'s options, and the
redaction of secrets (credentials in headers) from everything a run writes or prints."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

from loadgen import defaults

if TYPE_CHECKING:  # ssl is imported where a TLS context is made: a start-up cost
    import ssl

__all__ = ["CUT_MARK", "NetOptions", "REDACTED", "Redactor", "SECRET_QUERY_NAMES", "SENSITIVE_HEADERS", "clip",
           "header_problem", "options_redactor", "parse_header", "redact_query", "ssl_context", "template_headers"]

#: Headers whose values are always redacted (compared case-insensitively).
SENSITIVE_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie",
                               "x-api-key", "api-key", "x-auth-token", "x-access-token", "private-token",
                               "x-goog-api-key", "x-amz-security-token", "ocp-apim-subscription-key"})
REDACTED = "[REDACTED]"
#: URL query parameters whose values are always redacted (compared case-insensitively,
#: '-' and '_' alike): ``?api_key=...`` in a --sut or --server-metrics-url URL is sent as
#: given and shown as ``?api_key=[REDACTED]``.
SECRET_QUERY_NAMES = frozenset({
    "access_token", "api_key", "apikey", "auth", "auth_token", "authorization", "client_secret",
    "credential", "credentials", "id_token", "jwt", "key", "passwd", "password", "pwd", "refresh_token",
    "secret", "session_token", "sessionid", "sig", "signature", "token", "x_amz_credential",
    "x_amz_security_token", "x_amz_signature", "x_goog_credential", "x_goog_signature",
})
# A query parameter of a secret name (after '?', '&' or ';') in any text: its value up to
# the next '&', '#', quote, bracket or whitespace (what ends a URL in a message or a
# document).
_SECRET_QUERY = re.compile(
    r"(?<=[?&;])((?:%s)=)([^&#;\s\"'<>\[\]()]+)" % "|".join(
        sorted((re.escape(n).replace("_", "[-_]") for n in SECRET_QUERY_NAMES), key=len, reverse=True)),
    re.IGNORECASE)
#: The characters of an HTTP header name (RFC 9110 token).
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
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


def header_problem(name: str, value: str) -> str:
    """What is wrong with a header ("" when nothing): a name that is not an HTTP token, a
    value holding CR, LF or NUL (which would end the header and start another). The
    message shows the name only where it is a token, and never the value: either may
    hold a credential."""
    if not name or not _TOKEN.match(name):
        return ("a header name must be a token (letters, digits and !#$%&'*+.^_`|~-), without spaces, "
                "':' or control characters")
    if any(c in value for c in "\r\n\0"):
        return f"header {name!r}: its value holds a CR, LF or NUL character (a header is one line)"
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return f"header {name!r}: HTTP/1.1 header values must be Latin-1 text"
    return ""


def parse_header(text: str) -> Tuple[str, str]:
    """``'Name: value'`` -> (name, value); ValueError when it is not a header. The
    message names the header (or says it has no ':'), never its value."""
    name, sep, value = str(text).partition(":")
    if not sep:
        raise ValueError("it is not a header like 'Name: value': it has no ':' (its text is not shown, as it "
                         "may hold a credential)")
    name = name.strip()
    problem = header_problem(name, value)
    if problem:
        raise ValueError(problem)
    return name, value.strip()


def template_headers(path: Optional[str]) -> List[Tuple[str, str]]:
    """The headers of a ``--request-template`` file as (name, value) text, so that the
    values of secret names are redacted like --header ones; none when the file cannot
    be read (its loader says why)."""
    if not path:
        return []
    from loadgen.files import TEMPLATE_LIMIT_BYTES, read_text

    try:
        tpl = json.loads(read_text(path, what="--request-template", limit_bytes=TEMPLATE_LIMIT_BYTES))
    except (ValueError, RecursionError):
        return []
    headers = tpl.get("headers") if isinstance(tpl, dict) else None
    if not isinstance(headers, dict):
        return []
    return [(str(k).strip(), str(v).strip()) for k, v in headers.items() if isinstance(v, (str, int, float))]


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
        seed: the run's base seed (``--seed``): it seeds synthetic tensors; an OpenAI
            target's prompts are drawn with the sample seed made from it (see ``llm``).
        secret_values: further strings to redact (a password in the URL).
        max_response_bytes: most bytes of a response body (of a stream: of each event);
            a request whose response is larger fails as ``response_too_large``.
        http_engine: "native", "asyncio" or "auto" (see ``--http-engine``).
        io_threads: the native HTTP client's epoll threads.
        grpc_engine: the gRPC client: "native" (HTTP/2 in the core; grpc:// and, with
            OpenSSL built in, grpcs://), "grpcio" (grpcio's public API: synchronous
            channels, calls completed on their completion threads, no event loop), or
            "auto" (native where it runs the target, else grpcio). "callback" and
            "asyncio" mean "grpcio".
        llm: the OpenAI workload options (a :class:`loadgen.llm.LlmOptions`; None: the
            defaults from ``max_tokens``, ``prompt_words``, ``sample_count`` and the sample
            seed of ``seed``, :func:`loadgen.defaults.sample_seed_of`, as a CLI run has it).

    Every default is :mod:`loadgen.defaults`', as ``loadgen run``'s options have it.
    """

    headers: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    secret_headers: Sequence[str] = ()
    ca_file: Optional[str] = None
    insecure: bool = False
    timeout_ms: Optional[float] = None
    connections: int = defaults.CONNECTIONS
    ready_timeout_s: float = defaults.READY_TIMEOUT_S
    check_responses: bool = True
    payload: Optional[str] = None
    inputs: Sequence[Any] = ()
    request_template: Optional[str] = None
    grpc_contents: str = defaults.GRPC_CONTENTS
    model: Optional[str] = None
    max_tokens: int = defaults.MAX_TOKENS
    prompt_words: int = defaults.PROMPT_WORDS
    sample_count: int = defaults.SAMPLE_COUNT
    seed: int = defaults.SEED
    secret_values: Sequence[str] = ()
    max_response_bytes: int = defaults.MAX_RESPONSE_BYTES
    llm: Any = None
    http_engine: str = defaults.HTTP_ENGINE
    io_threads: int = defaults.IO_THREADS
    grpc_engine: str = defaults.GRPC_ENGINE

    def redactor(self) -> "Redactor":
        """The redactor of everything a run with these options writes or prints: the
        values of secret-named headers (--header, and the request template's), the
        further secret values, and secret-named URL query parameters."""
        return Redactor([*self.headers, *template_headers(self.request_template)], self.secret_headers,
                        self.secret_values)


class Redactor:
    """Replaces the values of sensitive headers with ``[REDACTED]`` in text and documents,
    and the values of URL query parameters of secret names (:data:`SECRET_QUERY_NAMES`)
    wherever a text holds one.

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
        if "=" in s:
            s = redact_query(s)
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
        """A copy of a JSON-like document with every secret value replaced in its strings
        (``obj`` itself when it holds no secret)."""
        if not self._values and not _holds_secret_query(obj):
            return obj
        return self._doc(obj)

    def _doc(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self._doc(k) if isinstance(k, str) else k: self._doc(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self._doc(v) for v in obj]
        return obj


def options_redactor(*options: Any) -> Redactor:
    """The redactor of everything written or shown about runs of these run options
    (:class:`loadgen.options.RunOptions`, or anything with their fields): the values of
    secret-named headers (``header``, the ``request_template``'s, ``secret_header``
    names), the secrets of the ``sut`` and ``server_metrics_url`` URLs (a password,
    secret-named query values) and of secret-named ``storage_option`` keys. A sweep
    redacts with the secrets of all its points."""
    from loadgen.net.targets import url_secrets
    from loadgen.storage import storage_secrets

    headers: List[Tuple[str, str]] = []
    names: List[str] = []
    values: List[str] = []
    for o in options:
        for h in getattr(o, "header", None) or ():
            try:
                headers.append(parse_header(h))
            except ValueError:  # refused where it was given
                continue
        headers.extend(template_headers(getattr(o, "request_template", None)))
        names.extend(getattr(o, "secret_header", None) or ())
        for url in (getattr(o, "sut", None), getattr(o, "server_metrics_url", None)):
            values.extend(url_secrets(url if isinstance(url, str) else None))
        values.extend(storage_secrets(getattr(o, "storage_option", None) or ()))
    return Redactor(headers, names, values)


def redact_query(text: str) -> str:
    """``text`` with the value of every URL query parameter of a secret name
    (:data:`SECRET_QUERY_NAMES`: ``api_key=...``, ``token=...``) replaced by
    :data:`REDACTED`."""
    return _SECRET_QUERY.sub(lambda m: m.group(1) + REDACTED, text)


def _holds_secret_query(obj: Any) -> bool:
    try:
        text = json.dumps(obj, default=str)
    except (TypeError, ValueError, RecursionError):
        return True  # not JSON text (a key that is no string): walked
    return "=" in text and _SECRET_QUERY.search(text) is not None


def ssl_context(ca_file: Optional[str], insecure: bool) -> ssl.SSLContext:
    """A client TLS context: verified against ``ca_file`` (or the system store), or with
    verification off when ``insecure``."""
    import ssl

    if insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"--ca-file: cannot load {ca_file}: {e}") from None
