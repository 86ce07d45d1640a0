"""The native HTTP/1.1 path (``--http-engine native``): a prepared KServe REST or template
client whose requests go out, and whose responses are read and parsed, in the core
(``csrc/http_client.cc``), with no Python per query.

The Python client prepares everything as for the asyncio path (readiness, metadata, the
serialized requests), then hands the bytes to the engine as a native SUT. Each response is
judged by the client's own :meth:`verdict` (status and body, a function of the bytes): the
core caches verdicts by the response's bytes, and the responses it has not seen come to
the Python side in batches on a checker thread (:class:`Checker`), so that every response
is checked and the usual model answering the same prepared requests costs one lookup.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from loadgen import _core
from loadgen.sut.report import NamedHistogram

__all__ = ["Checker", "NativeHttpSUT", "native_refusal"]

_TAKE_MAX = 256


def native_refusal(target: Any) -> Optional[str]:
    """None when a ``--sut`` target (:class:`~loadgen.net.targets.Target`) can run on the
    native path, else why not (``--http-engine native``'s error; ``auto`` then takes the
    asyncio client)."""
    what = {"kserve_grpc": "gRPC", "openai": "OpenAI"}.get(target.kind)
    if what is None and target.tls:
        what = "TLS (https://)"
    if what is None:
        return None
    return f"the native HTTP client runs KServe REST and --request-template targets over plain http://, not {what}"


def _numeric_host(host: str, port: int) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise ValueError(f"cannot resolve {host!r}: {e.strerror or e}") from None
    return str(infos[0][4][0])


class NativeHttpSUT:
    """A prepared HTTP client (``inner``), run by the core's HTTP client.

    Args:
        inner: the prepared :class:`~loadgen.net.base.HttpSUT` (its requests serialized).
        io_threads: epoll threads the connections are spread over.
        cpus: the I/O threads' CPUs (empty: not pinned).
    """

    native_http = True

    def __init__(self, inner: Any, io_threads: int = 1, cpus: Sequence[int] = ()) -> None:
        why = native_refusal(inner.target)
        if why is not None:
            raise ValueError(f"--http-engine native: {why}")
        self.inner = inner
        self.io_threads = io_threads
        self.cpus = list(cpus)
        self.protocol = inner.protocol
        self.core: Optional[_core.Engine] = None
        self.host = _numeric_host(inner.target.host, inner.target.port)
        self.check_errors = 0

    def native_settings(self) -> _core.NativeSutSettings:
        """The engine's settings: kind ``http`` with the prepared requests."""
        h = _core.HttpClientSettings()
        h.host = self.host
        h.port = int(self.inner.target.port)
        h.connections = int(self.inner.connections)
        h.warm_connections = min(4096, h.connections)  # all before the run: a connect mid-run costs the timer thread
        h.io_threads = int(self.io_threads)
        h.requests = list(self.inner.requests)
        h.head_only = bool(getattr(self.inner, "_head_only", False))
        h.max_response_bytes = int(self.inner.net.max_response_bytes)
        h.timeout_ns = int(self.inner.timeout_ns or 0)
        h.cpus = self.cpus
        s = _core.NativeSutSettings(kind=_core.SutKind.http)
        s.http = h
        return s

    def verdict(self, status: int, body: bytes) -> Optional[Tuple[str, str]]:
        """The inner client's verdict; a check that raises fails its query as check_error."""
        try:
            out: Optional[Tuple[str, str]] = self.inner.verdict(status, body)
            return out
        except Exception as e:  # a bug in a check must not end the run
            self.check_errors += 1
            return "check_error", f"the response check raised {type(e).__name__}: {e}"

    # -- what goes in the result document (the ReportingSUT protocol)
    def histograms(self) -> Dict[str, NamedHistogram]:
        out: Dict[str, NamedHistogram] = self.inner.histograms()
        return out

    def report(self) -> Dict[str, Any]:
        out: Dict[str, Any] = self.inner.report()
        stats = dict(self.core.http_stats()) if self.core is not None else {}
        out["http_engine"] = "native"
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
                         "closed_by_timeout": stats.get("closed_by_timeout", 0), "check_errors": self.check_errors}
        return out


class Checker:
    """The thread that judges the responses the core has no verdict for yet: it takes
    them in batches, asks the SUT's :meth:`NativeHttpSUT.verdict`, and hands the verdicts
    back (the core completes or fails the queries and caches the verdicts). It ends when
    the client has closed and nothing is left."""

    def __init__(self, core: _core.Engine, sut: NativeHttpSUT) -> None:
        self.core = core
        self.sut = sut
        sut.core = core
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="loadgen-http-check", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)

    def _run(self) -> None:
        core, verdict = self.core, self.sut.verdict
        try:
            while True:
                batch = core.http_take_unchecked(_TAKE_MAX, 0.05)
                if batch is None:
                    return
                if not batch:
                    continue
                out: List[Tuple[int, int, int, bytes, Optional[str], str]] = []
                for qid, t, status, body in batch:
                    bad = verdict(status, body)
                    out.append((qid, t, status, body, bad[0], bad[1]) if bad else (qid, t, status, body, None, ""))
                core.http_resolve(out)
        except BaseException as e:  # reported by the engine's wait()
            self.error = e
