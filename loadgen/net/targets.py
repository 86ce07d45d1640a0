"""``--sut URL``: which server and protocol a network target names.

- ``http[s]://HOST:PORT/v2/models/NAME[/versions/V]/infer``: KServe v2 REST;
- ``grpc[s]://HOST:PORT/NAME[/versions/V]``: KServe v2 gRPC;
- ``openai+http[s]://HOST:PORT/v1/completions``, ``.../v1/chat/completions``,
  ``.../v1/responses`` or ``.../v1/embeddings``: OpenAI-compatible (streamed completions by default);
- any ``http[s]://HOST:PORT[/PATH]`` with ``--request-template``: generic JSON over HTTP.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from typing import List, Optional

from loadgen.net.options import REDACTED, SECRET_QUERY_NAMES

__all__ = ["Target", "host_problem", "parse_target", "redact_url", "url_problem", "url_secrets"]

_KSERVE_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer/?$")
_GRPC_PATH = re.compile(r"^/([^/]+)(?:/versions/([^/]+))?/?$")
_OPENAI_PATH = re.compile(r"^(.*)/v1/(completions|chat/completions|embeddings|responses)/?$")
_FORMS = ("http://HOST:PORT/v2/models/NAME/infer, grpc://HOST:PORT/NAME, "
          "openai+http://HOST:PORT/v1/completions (or /v1/chat/completions, /v1/responses, /v1/embeddings), or any http URL "
          "with --request-template FILE")


@dataclasses.dataclass(frozen=True)
class Target:
    """A parsed network target.

    Attributes:
        kind: "kserve_http", "kserve_grpc", "openai" or "template".
        url: the URL as given, with any password removed.
        tls: whether the connection uses TLS.
        host, port: the server.
        path: the request path (HTTP kinds).
        model, version: the model (KServe kinds; version "" for the server's choice).
        endpoint: "completions", "chat", "responses" or "embeddings" (openai).
        base_path: what precedes /v1 in an OpenAI URL (usually "").
    """

    kind: str
    url: str
    tls: bool
    host: str
    port: int
    path: str = "/"
    model: str = ""
    version: str = ""
    endpoint: str = ""
    base_path: str = ""

    @property
    def http_base(self) -> str:
        """scheme://host:port of the HTTP server."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.tls else 80
        return host if self.port == default else f"{host}:{self.port}"


# What a host may hold: RFC 3986's reg-name characters, or an IP literal's (urlsplit has
# taken its brackets off; ":" and a "%" zone for IPv6).
_HOST = re.compile(r"^[A-Za-z0-9._~%!$&'()*+,;=:-]+$")


def host_problem(host: Optional[str]) -> str:
    """What is wrong with a URL's host ("" when nothing): missing, or characters that no
    host name has (spaces, control characters, ...)."""
    if not host:
        return "no host"
    if not _HOST.match(host):
        bad = next(c for c in host if not _HOST.match(c))
        return f"the host {host!r} has a character no host name may have ({bad!r})"
    return ""


_MIN_QUERY_SECRET_CHARS = 4


def _secret_name(name: str) -> bool:
    return name.strip().lower().replace("-", "_") in SECRET_QUERY_NAMES


def redact_url(url: str) -> str:
    """The URL as it may be shown: a password in its user part replaced by ``***``, and
    the value of each query parameter of a secret name (``api_key``, ``token``, ...:
    :data:`loadgen.net.options.SECRET_QUERY_NAMES`) by ``[REDACTED]``. The URL itself is
    what requests go to."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is not None:
        netloc = parts.netloc.rsplit("@", 1)
        user = netloc[0].split(":", 1)[0]
        parts = parts._replace(netloc=f"{user}:***@{netloc[1]}")
    if parts.query:
        pieces = []
        for piece in parts.query.split("&"):
            name, sep, value = piece.partition("=")
            secret = sep and value and _secret_name(urllib.parse.unquote_plus(name))
            pieces.append(f"{name}={REDACTED}" if secret else piece)
        parts = parts._replace(query="&".join(pieces))
    return urllib.parse.urlunsplit(parts) if password is not None or parts.query else url


def url_secrets(url: Optional[str]) -> List[str]:
    """The secrets a URL carries, to be redacted wherever they appear: the password of
    its user part (as written and unquoted) and the values of its query parameters of
    secret names (as written and unquoted) of at least :data:`_MIN_QUERY_SECRET_CHARS`
    characters (a shorter value, ``?key=1``, would redact every ``1`` of a document; it
    is still redacted wherever it appears as ``key=...`` in a URL)."""
    if not url:
        return []
    try:
        parts = urllib.parse.urlsplit(str(url))
        password = parts.password
    except ValueError:
        return []
    out = [password, urllib.parse.unquote(password)] if password else []
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=False):
        if _secret_name(name) and len(value) >= _MIN_QUERY_SECRET_CHARS:
            out.append(value)
    for piece in parts.query.split("&"):
        name, _, value = piece.partition("=")
        if len(value) >= _MIN_QUERY_SECRET_CHARS and _secret_name(urllib.parse.unquote_plus(name)):
            out.append(value)
    return list(dict.fromkeys(v for v in out if v))


def url_problem(url: str) -> str:
    """What makes ``url`` unfit to send ("" when nothing): a space or control character
    anywhere in it (urlsplit would drop a tab, CR or LF silently, and a space or CR/LF in
    the request line would split it). Spaces are refused, not encoded: write ``%20``."""
    for c in url:
        if c == " ":
            return "it holds a space; percent-encode it as %20"
        if ord(c) < 0x20 or ord(c) == 0x7F:
            return f"it holds a control character ({c!r}); percent-encode it"
    return ""


def parse_target(url: str, *, template: bool = False) -> Target:
    """The :class:`Target` a ``--sut`` URL names.

    Args:
        template: a ``--request-template`` was given (any http(s) URL is then a target).

    Raises:
        ValueError: the URL is malformed or names no supported protocol; the message
            lists the accepted forms.
    """
    try:
        shown = redact_url(url)
        parts = urllib.parse.urlsplit(url)
    except ValueError as e:  # urlsplit: "Invalid IPv6 URL", a bad port
        raise ValueError(f"--sut: not a valid URL ({e}); use {_FORMS}") from None
    scheme = parts.scheme.lower()
    forms = _FORMS
    if scheme not in ("http", "https", "grpc", "grpcs", "openai+http", "openai+https"):
        raise ValueError(f"--sut {shown}: unknown scheme {parts.scheme!r}; use {forms}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as e:
        raise ValueError(f"--sut {shown}: {e}") from None
    if not host:
        raise ValueError(f"--sut {shown}: no host; use {forms}")
    problem = host_problem(host)
    if problem:
        raise ValueError(f"--sut {shown}: {problem}")
    problem = url_problem(url)  # after the host's own check, which names the host
    if problem:
        raise ValueError(f"--sut {shown!r}: not a valid URL: {problem}")
    tls = scheme.endswith("s") and scheme != "grpc" or scheme == "grpcs"
    if port is None:
        port = 443 if tls else (8001 if scheme.startswith("grpc") else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    if scheme.startswith("grpc"):
        m = _GRPC_PATH.match(parts.path or "")
        if not m:
            raise ValueError(f"--sut {shown}: a gRPC target is grpc://HOST:PORT/MODEL[/versions/V]")
        return Target("kserve_grpc", shown, tls, host, port, model=urllib.parse.unquote(m.group(1)),
                      version=urllib.parse.unquote(m.group(2) or ""))
    if scheme.startswith("openai+"):
        m = _OPENAI_PATH.match(parts.path or "")
        if not m:
            raise ValueError(f"--sut {shown}: an OpenAI target ends in /v1/completions, /v1/chat/completions, "
                             "/v1/responses or /v1/embeddings")
        return Target("openai", shown, tls, host, port, path=path,
                      endpoint="chat" if m.group(2).startswith("chat") else m.group(2),
                      base_path=m.group(1))
    if template:
        return Target("template", shown, tls, host, port, path=path)
    m = _KSERVE_PATH.match(parts.path or "")
    if not m:
        raise ValueError(f"--sut {shown}: not a KServe v2 infer URL (/v2/models/NAME[/versions/V]/infer); "
                         "for another JSON API give --request-template FILE")
    return Target("kserve_http", shown, tls, host, port, path=path, model=urllib.parse.unquote(m.group(1)),
                  version=urllib.parse.unquote(m.group(2) or ""))


def model_path(target: Target) -> str:
    """``/v2/models/NAME[/versions/V]`` of a KServe target."""
    quoted = urllib.parse.quote(target.model, safe="")
    if target.version:
        return f"/v2/models/{quoted}/versions/{urllib.parse.quote(target.version, safe='')}"
    return f"/v2/models/{quoted}"


def host_port(target: Target) -> Optional[str]:
    """host:port for gRPC."""
    host = f"[{target.host}]" if ":" in target.host else target.host
    return f"{host}:{target.port}"
