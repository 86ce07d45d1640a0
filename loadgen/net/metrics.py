"""``--server-metrics-url``: the server's own Prometheus counters, scraped before, during
(each interval) and after a run, so that the server's request counts sit beside the
client's in the result."""

from __future__ import annotations

import math
import re
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["MetricsScraper", "parse_prometheus"]

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


class MetricsScraper:
    """Scrapes one Prometheus endpoint on a background thread.

    Args:
        url: the metrics URL.
        interval_s: seconds between scrapes during the run (0 = only before and after).
        headers: request headers (credentials are the caller's to redact).
        timeout_s: bound on each scrape.
    """

    def __init__(self, url: str, interval_s: float, headers: Sequence[Tuple[str, str]] = (),
                 timeout_s: float = 5.0, ssl_context=None) -> None:
        self.url = url
        self.interval_s = interval_s
        self.headers = dict(headers)
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
        req = urllib.request.Request(self.url, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self.ssl_context) as r:
                text = r.read().decode("utf-8", "replace")
        except (urllib.error.URLError, OSError, ValueError) as e:
            self._failures += 1
            if len(self._errors) < 5:
                reason = getattr(e, "reason", None) or e
                self._errors.append(f"{t:.1f} s: {reason}")
            return
        values, types = parse_prometheus(text)
        self._types.update(types)
        self._scrapes.append((t, values))

    def check(self) -> None:
        """One scrape now; ValueError when the endpoint does not answer (before a run)."""
        self._t0 = time.monotonic()
        self._scrape()
        if not self._scrapes:
            raise ValueError(f"--server-metrics-url {self.url}: {self._errors[-1] if self._errors else 'no answer'}")

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
