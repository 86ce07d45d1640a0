"""``--server-metrics-url``: the server's own Prometheus counters, scraped before, during
(each interval) and after a run, so that the server's request counts sit beside the
client's in the result.

Credentials in the URL (``http://user:password@host/metrics``) are sent as HTTP basic
auth, and the password is shown as ``***`` in the URL and redacted from every error."""

from __future__ import annotations

import base64
import math
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional, Sequence, Tuple

from loadgen import defaults
from loadgen.net.http1 import read_limited
from loadgen.net.options import Redactor
from loadgen.net.targets import host_problem, redact_url

__all__ = ["MetricsScraper", "parse_prometheus", "split_credentials"]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")


def parse_prometheus(text: str) -> Tuple[Dict[str, float], Dict[str, str]]:
    """Series (``name{labels}`` as written) -> value, and metric name -> TYPE, from the
    Prometheus text format. Lines that do not parse are skipped."""
    values: Dict[str, float] = {}
    types: Dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        values[m.group(1) + (m.group(2) or "")] = value
    return values, types


def _is_counter(series: str, types: Dict[str, str]) -> bool:
    name = series.split("{", 1)[0]
    for suffix in ("", "_total", "_count", "_sum", "_created"):
        base = name[: -len(suffix)] if suffix and name.endswith(suffix) else name
        kind = types.get(base)
        if kind is not None:
            return kind in ("counter", "histogram", "summary") and not name.endswith("_created")
    return name.endswith("_total")


def split_credentials(url: str) -> Tuple[str, Optional[str], Optional[str]]:
    """(the URL without its user part, user, password) of an http(s) URL; ValueError
    naming ``--server-metrics-url`` (with the password hidden) when it is not one."""
    try:
        parts = urllib.parse.urlsplit(url)
        shown = redact_url(url)
        host = parts.hostname
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as e:
        raise ValueError(f"--server-metrics-url: not a valid URL ({e})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"--server-metrics-url {shown}: use an http:// or https:// URL")
    problem = host_problem(host)
    if problem:
        raise ValueError(f"--server-metrics-url {shown}: {problem}")
    if parts.username is None and parts.password is None:
        return url, None, None
    netloc = parts.netloc.rsplit("@", 1)[1]
    bare = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return (bare, urllib.parse.unquote(parts.username or ""),
            None if parts.password is None else urllib.parse.unquote(parts.password))


class MetricsScraper:
    """Scrapes one Prometheus endpoint on a background thread.

    Args:
        url: the metrics URL; a user and password in it are sent as basic auth (and the
            password never shown).
        interval_s: seconds between scrapes during the run (0 = only before and after).
        headers: request headers (credentials are the caller's to redact).
        timeout_s: bound on each scrape.
        max_bytes: most bytes of a scrape's body; a larger one is a failed scrape.

    Raises:
        ValueError: the URL is not an http(s) URL; the message names --server-metrics-url.
    """

    def __init__(self, url: str, interval_s: float, headers: Sequence[Tuple[str, str]] = (),
                 timeout_s: float = 5.0, ssl_context=None,
                 max_bytes: int = defaults.MAX_RESPONSE_BYTES) -> None:
        bare, user, password = split_credentials(url)
        self.url = redact_url(url)
        self._request_url = bare
        self.interval_s = interval_s
        self.headers = {k: v for k, v in headers if not (user is not None and k.lower() == "authorization")}
        secrets = []
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode("ascii")
            self.headers["Authorization"] = f"Basic {token}"
            raw = urllib.parse.urlsplit(url).password  # as written, before unquoting
            secrets = [token] + [p for p in (password, raw) if p]
        self._redactor = Redactor(list(headers), secret_values=secrets)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context
        self._scrapes: List[Tuple[float, Dict[str, float]]] = []
        self._types: Dict[str, str] = {}
        self._errors: List[str] = []
        self._failures = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._t0 = 0.0

    def _scrape(self) -> None:
        t = time.monotonic() - self._t0
        req = urllib.request.Request(self._request_url, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self.ssl_context) as r:
                data = read_limited(r, self.max_bytes)
            if data is None:
                raise ValueError(f"the response is over --max-response-bytes ({self.max_bytes} bytes)")
            text = data.decode("utf-8", "replace")
        except (urllib.error.URLError, OSError, ValueError) as e:
            self._failures += 1
            if len(self._errors) < 5:
                reason = getattr(e, "reason", None) or e
                if isinstance(e, urllib.error.HTTPError):
                    reason = f"HTTP {e.code} {reason}"
                self._errors.append(self._redactor.text(f"{t:.1f} s: {reason}"))
            return
        values, types = parse_prometheus(text)
        self._types.update(types)
        self._scrapes.append((t, values))

    def check(self) -> None:
        """One scrape now; ValueError when the endpoint does not answer (before a run)."""
        self._t0 = time.monotonic()
        self._scrape()
        if not self._scrapes:
            raise ValueError(self._redactor.text(
                f"--server-metrics-url {self.url}: {self._errors[-1] if self._errors else 'no answer'}"))

    def start(self) -> None:
        """The scrape before the run (taken now), then one per interval."""
        if not self._scrapes:
            self._t0 = time.monotonic()
            self._scrape()
        if self.interval_s > 0:
            self._thread = threading.Thread(target=self._loop, name="loadgen-metrics", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._scrape()

    def finish(self) -> None:
        """Stops the interval scrapes and takes the one after the run."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1)
        self._scrape()

    def report(self) -> Dict[str, Any]:
        """The counters' deltas over the run (first to last scrape) and per interval."""
        out: Dict[str, Any] = {"url": self.url, "scrapes": len(self._scrapes), "failed_scrapes": self._failures,
                               "errors": self._errors}
        if len(self._scrapes) < 2:
            out["deltas"] = {}
            out["intervals"] = []
            return out
        seen = {s for _, values in self._scrapes for s in values}
        counters = sorted(s for s in seen if _is_counter(s, self._types))

        def deltas(a: Dict[str, float], b: Dict[str, float]) -> Dict[str, float]:
            # A labelled counter first appears with its first event: absent means 0.
            d = {}
            for s in counters:
                if s in b:
                    v = b[s] - a.get(s, 0.0)
                    if v and math.isfinite(v):
                        d[s] = v
            return d

        out["deltas"] = deltas(self._scrapes[0][1], self._scrapes[-1][1])
        out["intervals"] = [{"t_s": round(t1, 3), "deltas": deltas(a, b)}
                            for (_, a), (t1, b) in zip(self._scrapes, self._scrapes[1:])]
        out["before"] = {s: self._scrapes[0][1].get(s, 0.0) for s in counters}
        return out
