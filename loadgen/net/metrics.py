"""``--server-metrics-url``: the server's own Prometheus metrics, scraped before, during
(each interval) and after a run, so that the server's request counts and its gauges (GPU
utilization, memory, queue lengths) sit beside the client's figures in the result.

Pages are parsed with ``prometheus_client`` (a dependency, imported only here): its
Prometheus text parser, or its OpenMetrics parser when the server says
``application/openmetrics-text``.
A series is keyed by its name and its labels sorted by name, written as the exposition
format writes them (``name{a="1",b="x\\"y"}``), so the order a server writes labels in
does not matter. Counters (and the ``_bucket``/``_sum``/``_count`` of histograms and
summaries) are reported as deltas, everything else as a gauge (first, last, min, max,
mean). A page that does not parse is a failed scrape; the run goes on.

Credentials in the URL (``http://user:password@host/metrics``) are sent as HTTP basic
auth, and the password is shown as ``***`` in the URL and redacted from every error."""

from __future__ import annotations

import base64
import math
import threading
import time
import urllib.parse
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from loadgen import defaults
from loadgen.net.blocking_get import blocking_get
from loadgen.net.options import Redactor
from loadgen.net.targets import host_problem, redact_url

__all__ = ["COUNTER", "GAUGE", "MetricsScraper", "parse_prometheus", "series_key", "split_credentials"]

COUNTER = "counter"
GAUGE = "gauge"
INSTALL_HINT = "pip install 'prometheus-client>=0.17'"  # a dependency of loadgen: an older install lacks it
_CUMULATIVE = ("counter", "histogram", "summary")
_MAX_ERROR_CHARS = 300


def _parsers() -> Tuple[Any, Any]:
    """prometheus_client's Prometheus text and OpenMetrics parsers; ValueError naming
    --server-metrics-url and the install command when the package is missing."""
    try:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
        from prometheus_client.parser import text_string_to_metric_families as prometheus
    except ImportError:
        raise ValueError(f"--server-metrics-url needs the prometheus-client package: {INSTALL_HINT}") from None
    return prometheus, openmetrics


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def series_key(name: str, labels: Mapping[str, str]) -> str:
    """The key of a series: ``name`` alone, or ``name{a="1",b="2"}`` with the labels
    sorted by name and their values escaped as the exposition format escapes them."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{_escape(labels[k])}"' for k in sorted(labels)) + "}"


def _strip_exemplar(line: str) -> str:
    """A sample line without its OpenMetrics exemplar (`` # {trace_id="abc"} 1.0``): the
    text from the first ``#`` outside a quoted label value on."""
    in_quotes = escaped = False
    for i, c in enumerate(line):
        if escaped:
            escaped = False
        elif in_quotes:
            escaped = c == "\\"
            in_quotes = c != '"'
        elif c == '"':
            in_quotes = True
        elif c == "#":
            return line[:i].rstrip()
    return line


def _without_exemplars(text: str) -> str:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "#" in line and not line.lstrip().startswith("#"):
            lines[i] = _strip_exemplar(line)
    return "\n".join(lines) + "\n"


def _declared_types(text: str) -> Dict[str, str]:
    """Metric name -> type, from the page's ``# TYPE`` lines."""
    types: Dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0] == "#" and parts[1] == "TYPE":
            types[parts[2].strip('"')] = parts[3].strip()
    return types


def _kind(family_type: str, family: str, sample: str, declared: Dict[str, str]) -> Optional[str]:
    """COUNTER, GAUGE, or None for a sample that is neither (a ``_created`` time stamp)."""
    if sample.endswith("_created"):
        base = sample[: -len("_created")]
        if family_type in _CUMULATIVE or declared.get(base) in _CUMULATIVE or declared.get(base + "_total") == COUNTER:
            return None
    if family_type == COUNTER:
        return COUNTER
    if family_type in ("histogram", "summary"):  # a summary's quantiles are gauges
        return COUNTER if sample in (family + "_bucket", family + "_sum", family + "_count") else GAUGE
    if family_type in ("untyped", "unknown"):
        return COUNTER if sample.endswith("_total") else GAUGE
    return GAUGE


def _samples(text: str, openmetrics: bool) -> Iterable[Tuple[Optional[str], Any]]:
    """(COUNTER, GAUGE or None, sample) of each sample of a page; ValueError (or whatever
    the parser raises) for a page that does not parse."""
    prometheus, om_parser = _parsers()
    if openmetrics:
        for f in om_parser(text):
            for s in f.samples:
                yield _kind(f.type, f.name, s.name, {}), s
        return
    declared = _declared_types(text)
    for f in prometheus(_without_exemplars(text)):
        # The parser renames the samples of a counter declared without ``_total``
        # (``# TYPE x counter``, ``x 3``) to ``x_total``: a series keeps the server's name.
        renamed = f.type == COUNTER and declared.get(f.name) == COUNTER and declared.get(f.name + "_total") != COUNTER
        for s in f.samples:
            if renamed and s.name == f.name + "_total":
                s = s._replace(name=f.name)
            yield _kind(f.type, f.name, s.name, declared), s


def parse_prometheus(text: str, content_type: str = "") -> Tuple[Dict[str, float], Dict[str, str]]:
    """(series key -> value, series key -> COUNTER or GAUGE) of a metrics page: the
    Prometheus text format (exemplars ignored), or OpenMetrics when ``content_type`` is
    ``application/openmetrics-text``. Values may be NaN or infinite; samples without a
    value and ``_created`` time stamps are left out. Keys: see :func:`series_key`.

    Raises:
        ValueError: the page does not parse (the message says why), or prometheus-client
            is not installed.
    """
    openmetrics = content_type.split(";", 1)[0].strip().lower() == "application/openmetrics-text"
    _parsers()  # a missing package is said as such, not as a page that does not parse
    values: Dict[str, float] = {}
    kinds: Dict[str, str] = {}
    try:
        for kind, s in _samples(text, openmetrics):
            if kind is None or not isinstance(s.value, (int, float)):
                continue
            key = series_key(s.name, s.labels)
            values[key] = float(s.value)
            kinds[key] = kind
    except Exception as e:  # outside input through a third-party parser: any failure is a bad page
        detail = str(e) or type(e).__name__
        if len(detail) > _MAX_ERROR_CHARS:
            detail = detail[:_MAX_ERROR_CHARS] + "..."
        raise ValueError(f"the page is not {'OpenMetrics' if openmetrics else 'Prometheus'} text ({detail})") from None
    return values, kinds


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


class _GaugeStats:
    """first, last, min, max and mean of one gauge's finite values."""

    __slots__ = ("first", "last", "min", "max", "total", "n")

    def __init__(self, v: float) -> None:
        self.first = self.last = self.min = self.max = self.total = v
        self.n = 1

    def add(self, v: float) -> None:
        self.last = v
        self.min = min(self.min, v)
        self.max = max(self.max, v)
        self.total += v
        self.n += 1

    def report(self) -> Dict[str, Any]:
        return {"first": self.first, "last": self.last, "min": self.min, "max": self.max,
                "mean": self.total / self.n, "samples": self.n}


class _Tally:
    """What the scrapes add up to, kept as they come (the scrapes themselves are not
    kept): counters' values at the first and the latest scrape, gauges' statistics,
    and an interval entry per scrape after the first. At most ``max_series`` series are
    kept, the first seen; the others are counted (the most in one scrape)."""

    def __init__(self, max_series: int) -> None:
        self.max_series = max_series
        self.scrapes = 0
        self.kinds: Dict[str, str] = {}
        self.first: Dict[str, float] = {}  # counters at the first scrape
        self.last: Dict[str, float] = {}  # counters at the latest scrape
        self.gauges: Dict[str, _GaugeStats] = {}
        self.intervals: List[Dict[str, Any]] = []
        self.dropped = 0
        self.non_finite = 0

    def _kept(self, values: Dict[str, float], kinds: Dict[str, str]) -> Dict[str, float]:
        kept: Dict[str, float] = {}
        dropped = 0
        for key, v in values.items():
            if key not in self.kinds:
                if len(self.kinds) >= self.max_series:
                    dropped += 1
                    continue
                self.kinds[key] = kinds[key]
            if math.isfinite(v):
                kept[key] = v
            else:
                self.non_finite += 1
        self.dropped = max(self.dropped, dropped)
        return kept

    def add(self, t: float, values: Dict[str, float], kinds: Dict[str, str]) -> None:
        """One successful scrape, taken t seconds after the first."""
        kept = self._kept(values, kinds)
        counters = {k: v for k, v in kept.items() if self.kinds[k] == COUNTER}
        gauges = {k: v for k, v in kept.items() if self.kinds[k] != COUNTER}
        for k, v in gauges.items():
            stats = self.gauges.get(k)
            if stats is None:
                self.gauges[k] = _GaugeStats(v)
            else:
                stats.add(v)
        if self.scrapes == 0:
            self.first = counters
        else:
            self.intervals.append({"t_s": round(t, 3), "deltas": _deltas(self.last, counters), "gauges": gauges})
        self.last = {**self.last, **counters}
        self.scrapes += 1

    def report(self) -> Dict[str, Any]:
        """The keys :meth:`MetricsScraper.report` adds to url, scrapes and errors."""
        out: Dict[str, Any] = {
            "deltas": _deltas(self.first, self.last) if self.scrapes >= 2 else {},
            "intervals": self.intervals,
            "gauges": {k: self.gauges[k].report() for k in sorted(self.gauges)},
            "series": len(self.kinds), "dropped_series": self.dropped, "non_finite_values": self.non_finite,
        }
        if self.scrapes >= 2:
            out["before"] = {k: self.first.get(k, 0.0) for k in sorted(self.last)}
        if self.dropped:
            out["notes"] = [f"the page had more than {self.max_series} series: the first {self.max_series} seen "
                            f"are kept, and up to {self.dropped} more in one scrape were dropped"]
        return out


def _deltas(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    """after - before of each counter in ``after`` that changed. A labelled counter
    first appears with its first event: absent before means 0."""
    d = {}
    for k in sorted(after):
        v = after[k] - before.get(k, 0.0)
        if v and math.isfinite(v):
            d[k] = v
    return d


class MetricsScraper:
    """Scrapes one Prometheus endpoint on a background thread.

    Args:
        url: the metrics URL; a user and password in it are sent as basic auth (and the
            password never shown).
        interval_s: seconds between scrapes during the run (0 = only before and after).
        headers: request headers (credentials are the caller's to redact).
        timeout_s: bound on each scrape, in all (however slowly a server answers).
        max_bytes: most bytes of a scrape's body; a larger one is a failed scrape.
        max_series: most series kept (the first seen); the others are counted.

    Raises:
        ValueError: the URL is not an http(s) URL, or prometheus-client is not installed;
            the message names --server-metrics-url.
    """

    def __init__(self, url: str, interval_s: float, headers: Sequence[Tuple[str, str]] = (),
                 timeout_s: float = 5.0, ssl_context=None,
                 max_bytes: int = defaults.MAX_RESPONSE_BYTES, max_series: int = defaults.MAX_SERVER_SERIES) -> None:
        bare, user, password = split_credentials(url)
        _parsers()
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
        self._tally = _Tally(max_series)
        self._lock = threading.Lock()  # a late interval scrape may overlap the last one
        self._errors: List[str] = []
        self._failures = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._t0 = 0.0

    def _fetch(self) -> Tuple[str, str]:
        """(the page's text, its Content-Type); ValueError (a GetError when nothing usable
        answered) within ``timeout_s`` in all, however slowly the server sends."""
        r = blocking_get(self._request_url, list(self.headers.items()), timeout_s=self.timeout_s,
                         ssl_context=self.ssl_context, max_bytes=self.max_bytes)
        if not 200 <= r.status < 300:
            raise ValueError(f"HTTP {r.status} {r.reason}".rstrip())
        return r.body.decode("utf-8", "replace"), r.headers.get("content-type", "")

    def _scrape(self) -> None:
        t = time.monotonic() - self._t0
        try:
            text, content_type = self._fetch()
            values, kinds = parse_prometheus(text, content_type)
        except Exception as e:  # a failed scrape, whatever failed, is counted, not raised
            # (ValueError: the GET's failure, or a page that does not parse; anything else
            # would otherwise end the scraping thread with a traceback)
            reason = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
            with self._lock:
                self._failures += 1
                if len(self._errors) < 5:
                    self._errors.append(self._redactor.text(f"{t:.1f} s: {reason}"))
            return
        with self._lock:
            self._tally.add(t, values, kinds)

    def check(self) -> None:
        """One scrape now; ValueError when the endpoint does not answer with a page that
        parses (before a run)."""
        self._t0 = time.monotonic()
        self._scrape()
        if not self._tally.scrapes:
            raise ValueError(self._redactor.text(
                f"--server-metrics-url {self.url}: {self._errors[-1] if self._errors else 'no answer'}"))

    def start(self) -> None:
        """The scrape before the run (taken now), then one per interval."""
        if not self._tally.scrapes:
            self._t0 = time.monotonic()
            self._scrape()
        if self.interval_s > 0:
            self._thread = threading.Thread(target=self._loop, name="loadgen-scrape", daemon=True)
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
        """What the scrapes say: ``deltas`` (each counter's change over the run, first to
        last scrape), ``before`` (the counters at the first scrape), ``gauges`` (each
        gauge's first, last, min, max and mean over the run, and how many values),
        ``intervals`` (per scrape after the first: its time, the counters' deltas since
        the scrape before and the gauges' values), and the counts of ``series`` kept,
        ``dropped_series`` (over the limit, the most in one scrape) and
        ``non_finite_values`` (NaN and infinities, left out of everything)."""
        with self._lock:
            out: Dict[str, Any] = {"url": self.url, "scrapes": self._tally.scrapes,
                                   "failed_scrapes": self._failures, "errors": list(self._errors)}
            out.update(self._tally.report())
        return out
