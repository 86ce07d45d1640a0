"""Live Prometheus metrics during a run (``--metrics-port``).

:class:`LiveMetrics` serves the Prometheus text exposition on ``/metrics`` from its own
``prometheus_client`` registry (never the process-wide one), on a daemon thread. Its
collector reads the engine at scrape time: the counts, the failures by kind, the newest
interval of the time series (:func:`newest_interval`), the run's own histograms, the
target rate, and the GPU sampler's newest readings. Every sample carries the constant
labels: the run's ``--label`` pairs, ``worker`` (the worker index) and ``run`` (one id per
server: ``--label run=...``, else the ``--start-at`` shared by a job's workers, else a
random one), plus ``point`` in a sweep.

The runner attaches each run (:meth:`LiveMetrics.attach`) before its first query and
freezes its final values when it ends (:meth:`LiveMetrics.finish`); they are served
until the next run is attached or the server is closed (after ``--metrics-linger-s``).
docs/results.md, "Live metrics", lists every metric.
"""

from __future__ import annotations

import re
import secrets
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import socketserver
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import make_wsgi_app
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric

from loadgen.options import RunOptions, parse_labels
from loadgen.units import NS_PER

__all__ = ["LiveMetrics", "METRICS_PATH", "label_names", "newest_interval", "target_qps_at"]

METRICS_PATH = "/metrics"
#: Labels loadgen sets itself; a ``--label`` of one of these names (but ``run``) is
#: exposed as ``label_<name>``.
RESERVED_LABELS = ("worker", "point", "quantile", "kind", "gpu", "uuid", "scenario", "sut", "mode")
_COUNTS = (  # engine count -> counter name (without _total) and help
    ("issued", "loadgen_queries_issued", "queries issued (after the warm-up)"),
    ("completed", "loadgen_queries_completed", "queries completed"),
    ("failed", "loadgen_queries_failed", "queries the SUT failed"),
    ("timed_out", "loadgen_queries_timed_out", "queries past --timeout-ms"),
    ("cancelled", "loadgen_queries_cancelled", "queries cancelled at the end of the run"),
    ("warmup_issued", "loadgen_warmup_queries_issued", "queries issued during the warm-up"),
    ("warmup_completed", "loadgen_warmup_queries_completed", "warm-up queries completed"),
    ("warmup_failed", "loadgen_warmup_queries_failed", "warm-up queries that failed"),
    ("tokens", "loadgen_output_tokens", "output tokens of completed streaming queries"),
)
_GPU_GAUGES = (  # latest() key -> gauge name, help, factor to base units
    ("utilization_pct", "loadgen_gpu_utilization_ratio", "GPU utilization, 0..1", 0.01),
    ("power_w", "loadgen_gpu_power_watts", "GPU board power", 1.0),
    ("memory_used_bytes", "loadgen_gpu_memory_used_bytes", "device memory used", 1.0),
    ("temperature_c", "loadgen_gpu_temperature_celsius", "GPU temperature", 1.0),
    ("sm_clock_mhz", "loadgen_gpu_sm_clock_hertz", "SM clock", 1e6),
)
_INTERVAL_QUANTILES = (("0.5", "p50_ns"), ("0.9", "p90_ns"), ("0.99", "p99_ns"), ("1", "max_ns"))
_RUN_QUANTILES = (("0.5", 50.0), ("0.9", 90.0), ("0.99", 99.0), ("1", 100.0))
_NAME_BAD = re.compile(r"[^A-Za-z0-9_]")


def label_names(labels: Dict[str, str]) -> Dict[str, str]:
    """``--label`` pairs as Prometheus labels: characters other than letters, digits and
    '_' become '_', and a name loadgen sets itself (:data:`RESERVED_LABELS`) or one
    starting with '__' (reserved by Prometheus) gets the prefix ``label_``."""
    out: Dict[str, str] = {}
    for key, value in labels.items():
        name = _NAME_BAD.sub("_", key)
        if name in RESERVED_LABELS or name.startswith("__"):
            name = "label_" + name
        out[name] = value
    return out


def newest_interval(engine: Any) -> Optional[Dict[str, Any]]:
    """The newest interval of ``engine``'s time series as the result document holds it
    (``t_s``, ``length_s``, ``issued``, ``completed``, ``qps``, ``p50_ns``, ...); None
    before the first has ended."""
    from loadgen.results.document import timeseries_point

    point = engine.last_interval()
    return timeseries_point(point) if point is not None else None


def target_qps_at(settings: Any, elapsed_s: float) -> Optional[float]:
    """The rate the schedule asks for ``elapsed_s`` after the start: ``target_qps`` for
    constant and Poisson arrivals, the stage's (ramped) rate for stages (0 after the
    last); None for closed loop, offline and traces, which have no target rate."""
    if settings.mode in ("constant", "poisson"):
        return float(settings.target_qps)
    if settings.mode != "stages":
        return None
    t0 = 0.0
    for duration_s, start_qps, end_qps in settings.stages:
        if elapsed_s < t0 + duration_s:
            return float(start_qps + (end_qps - start_qps) * (elapsed_s - t0) / duration_s)
        t0 += duration_s
    return 0.0


class _Run:
    """What the collector reads of one attached run."""

    def __init__(self, engine: Any, settings: Any, sut: Any, gpu: Any, labels: Dict[str, str],
                 info: Dict[str, str]) -> None:
        self.engine, self.settings, self.sut, self.gpu = engine, settings, sut, gpu
        self.labels, self.info = labels, info
        self.final: Optional[List[Metric]] = None  # the values frozen when the run ended


class LiveMetrics:
    """The ``/metrics`` server of one ``loadgen run`` (or a whole sweep).

    Use :meth:`serve` to bind it; :meth:`close` stops it (idempotent).

    Attributes:
        addr, port: where it listens (``port`` is the chosen one for port 0).
        run_id: the ``run`` label.
    """

    def __init__(self, addr: str, port: int, server: Any, thread: threading.Thread, run_id: str) -> None:
        self.addr, self.port, self.run_id = addr, port, run_id
        self._server, self._thread = server, thread
        self._lock = threading.Lock()
        self._run: Optional[_Run] = None
        self._closed = False
        self.registry: Optional[CollectorRegistry] = None
        #: The ``point`` label of the runs attached from now on (a sweep's point key).
        self.point: Optional[str] = None

    @classmethod
    def serve(cls, o: RunOptions) -> LiveMetrics:
        """Binds ``--metrics-addr``:``--metrics-port`` and serves until :meth:`close`.

        Raises:
            ValueError: the address cannot be bound (in use, not an address of this
                machine, not an address); the message names it.
        """
        if o.metrics_port is None:
            raise ValueError("--metrics-port is not set")
        addr, port = o.metrics_addr, o.metrics_port
        registry = CollectorRegistry(auto_describe=False)
        where = f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
        try:
            server, thread = _start_server(addr, port, registry)
        except (OSError, UnicodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            hint = " (the port is in use: choose another, or 0 for a free one)" if _in_use(e) else ""
            raise ValueError(f"--metrics-port: cannot serve live metrics on {where}: {why}{hint}") from None
        run_id = _run_id(o)
        live = cls(addr, int(server.server_port), server, thread, run_id)
        live.registry = registry
        registry.register(_Collector(live))
        return live

    @property
    def url(self) -> str:
        """The metrics page's URL (0.0.0.0 and :: shown as themselves)."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}{METRICS_PATH}"

    def where(self) -> Dict[str, Any]:
        """The result document's ``live_metrics`` section: ``addr``, ``port``, ``run``
        (and ``point`` in a sweep or a peak search)."""
        return {"addr": self.addr, "port": self.port, "run": self.run_id,
                **({"point": self.point} if self.point is not None else {})}

    def attach(self, engine: Any, o: RunOptions, settings: Any, sut: Any, gpu: Any = None) -> None:
        """Serves ``engine``'s figures from now on (the run's effective options ``o``,
        engine ``settings``, ``sut``, the GPU sampler ``gpu``), with a ``point`` label
        when :attr:`point` is set."""
        from loadgen.net.options import options_redactor
        from loadgen.net.targets import redact_url

        # Every label value is redacted as the result document is: the SUT's URL (its
        # password, secret query values), and any credential a --label repeats.
        redactor = options_redactor(o)
        labels = label_names(parse_labels(o.label))
        labels.setdefault("run", self.run_id)
        labels["worker"] = str(o.worker_index or 0)
        if self.point is not None:
            labels["point"] = self.point
        labels = {k: redactor.text(v) for k, v in labels.items()}
        info = {"scenario": o.scenario, "sut": redactor.text(redact_url(o.sut)), "mode": settings.mode}
        with self._lock:
            self._run = _Run(engine, settings, sut, gpu, labels, info)

    def finish(self) -> None:
        """Freezes the attached run's values as they are now (call once it has ended):
        they are served, with ``loadgen_running`` 0, until the next run or :meth:`close`."""
        with self._lock:
            run = self._run
        if run is not None and run.final is None:
            final = list(_families(run, running=False))
            with self._lock:
                run.final = final
                run.engine = run.sut = run.gpu = None

    def linger(self, seconds: float, stop_requested: Optional[Callable[[], bool]] = None) -> bool:
        """Keeps serving for ``seconds`` (the final values, for a scraper that comes
        between two scrapes); ends early when ``stop_requested()`` says so. Returns
        whether it lingered the whole time."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if stop_requested is not None and stop_requested():
                return False
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        return True

    def close(self) -> None:
        """Stops the server and frees its port; idempotent, raises nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self._server.shutdown()
            self._server.server_close()
        except OSError:
            pass
        self._thread.join(2.0)

    def collect(self) -> Iterator[Metric]:
        """The metric families now (what a scrape gets): the attached run's live or
        frozen values; nothing before a run is attached."""
        with self._lock:
            run = self._run
            final = run.final if run is not None else None
        if run is None:
            return iter(())
        return iter(final) if final is not None else _families(run, running=True)

    def __enter__(self) -> LiveMetrics:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Collector:
    """The registry's collector: whatever :meth:`LiveMetrics.collect` gives."""

    def __init__(self, live: LiveMetrics) -> None:
        self._live = live

    def collect(self) -> Iterator[Metric]:
        return self._live.collect()


class _Quiet(WSGIRequestHandler):
    """A request handler that logs nothing (scrapes would fill the progress output)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """A WSGI server answering each scrape on a daemon thread of its own."""

    daemon_threads = True

    def server_bind(self) -> None:
        """Binds without the reverse lookup of the address that HTTPServer makes (a
        resolver that does not answer would hold the run's start)."""
        socketserver.TCPServer.server_bind(self)
        self.server_name = "loadgen"
        self.server_port = self.server_address[1]
        self.setup_environ()


def _start_server(addr: str, port: int, registry: CollectorRegistry) -> Tuple[WSGIServer, threading.Thread]:
    """Binds ``addr``:``port`` (IPv4 or IPv6, as the address resolves) and serves
    ``registry`` on a daemon thread. OSError when it cannot bind."""
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class = type("_Server", (_ThreadingServer,), {"address_family": family})
    server: WSGIServer = server_class((addr, port), _Quiet)
    server.set_app(make_wsgi_app(registry))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              name="loadgen-live", daemon=True)
    thread.start()
    return server, thread


def _in_use(e: BaseException) -> bool:
    import errno

    return isinstance(e, OSError) and e.errno == errno.EADDRINUSE


def _run_id(o: RunOptions) -> str:
    """The ``run`` label: ``--label run=...``, else the ``--start-at`` the workers of one
    job share, else a random id."""
    given = parse_labels(o.label).get("run")
    if given:
        return given
    if o.start_at is not None:
        return f"start-{o.start_at:.3f}".rstrip("0").rstrip(".")
    return secrets.token_hex(6)


def _families(run: _Run, running: bool) -> Iterator[Metric]:
    """Every metric family of ``run`` as it is now."""
    names, values = list(run.labels), list(run.labels.values())
    info = GaugeMetricFamily("loadgen_run_info", "the run: scenario, SUT and arrival mode (value 1)",
                             labels=names + list(run.info))
    info.add_metric(values + list(run.info.values()), 1.0)
    yield info
    yield _gauge("loadgen_running", "1 while the run goes on, 0 once it has ended", names, values,
                 1.0 if running else 0.0)
    engine, sut, gpu = run.engine, run.sut, run.gpu  # finish() may let go of them meanwhile
    if engine is None:
        return
    counts = engine.counts()
    for key, name, text in _COUNTS:
        if key in counts:
            family = CounterMetricFamily(name, text, labels=names)
            family.add_metric(values, float(counts[key]))
            yield family
    errors = CounterMetricFamily("loadgen_errors", "queries the SUT failed, by kind", labels=names + ["kind"])
    for kind, n in sorted(engine.error_counts().items()):
        errors.add_metric(values + [kind], float(n))
    yield errors
    yield _gauge("loadgen_queries_in_flight", "queries issued and not yet resolved", names, values,
                 float(counts.get("outstanding", 0)))
    yield _gauge("loadgen_elapsed_seconds", "time since the run started", names, values, engine.elapsed_s())
    target = target_qps_at(run.settings, engine.elapsed_s())
    if target is not None:
        yield _gauge("loadgen_target_queries_per_second", "the arrival rate the schedule asks for now",
                     names, values, target)
    yield from _interval_families(newest_interval(engine), names, values)
    yield from _run_quantiles(engine, sut, names, values)
    if gpu is not None:
        yield from _gpu_families(gpu.latest(), names, values)


def _gauge(name: str, text: str, names: List[str], values: List[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, text, labels=names)
    family.add_metric(values, value)
    return family


def _quantiles(name: str, text: str, names: List[str], values: List[str],
               pairs: Iterable[Tuple[str, Optional[float]]]) -> Optional[GaugeMetricFamily]:
    """A gauge family with a ``quantile`` label (ns values given, seconds exposed); None
    when no quantile has a value."""
    family = GaugeMetricFamily(name, text, labels=names + ["quantile"])
    for q, ns in pairs:
        if ns is not None:
            family.add_metric(values + [q], ns / NS_PER["s"])
    return family if family.samples else None


def _interval_families(point: Optional[Dict[str, Any]], names: List[str], values: List[str]) -> Iterator[Metric]:
    """The newest interval's figures: achieved rate and latency, issue-delay and TTFT
    quantiles (TTFT only when the interval recorded first tokens)."""
    if point is None:
        return
    yield _gauge("loadgen_achieved_queries_per_second", "completions per second over the newest interval",
                 names, values, float(point["qps"]))
    yield _gauge("loadgen_interval_seconds", "length of the newest interval", names, values,
                 float(point["length_s"]))
    for name, prefix, what in (("loadgen_latency_seconds", "", "latency (from the scheduled time)"),
                               ("loadgen_issue_delay_seconds", "issue_delay_", "issue delay"),
                               ("loadgen_ttft_seconds", "ttft_", "time to first token")):
        if prefix == "ttft_" and not point.get("ttft_max_ns", point.get("ttft_p99_ns")):
            continue  # no first token in the interval (or none in the run)
        family = _quantiles(name, f"{what} over the newest interval (quantile 1: the maximum)", names, values,
                            ((q, point.get(prefix + key)) for q, key in _INTERVAL_QUANTILES))
        if family is not None:
            yield family


# A streaming SUT's live histograms (its live_histograms() keys) as run quantiles.
_LIVE_TOKEN_HISTOGRAMS = (
    ("itl_ns", "loadgen_run_itl_seconds", "gap between token chunks"),
    ("itl_per_token_ns", "loadgen_run_itl_per_token_seconds", "inter-token latency per token"),
    ("ttfrt_ns", "loadgen_run_ttfrt_seconds", "time to first reasoning token"),
    ("ttfat_ns", "loadgen_run_ttfat_seconds", "time to first answer token"),
)


def _run_quantiles(engine: Any, sut: Any, names: List[str], values: List[str]) -> Iterator[Metric]:
    """Quantiles over the run so far of the engine's histograms (and the SUT's live
    inter-token gaps); a histogram without values is left out."""
    hists: List[Tuple[str, str, Any]] = [
        ("loadgen_run_latency_seconds", "latency", engine.histogram("latency")),
        ("loadgen_run_issue_delay_seconds", "issue delay", engine.histogram("issue_delay")),
        ("loadgen_run_ttft_seconds", "time to first token", engine.histogram("ttft")),
        ("loadgen_run_tpot_seconds", "time per output token", engine.histogram("tpot")),
    ]
    live_histograms = getattr(sut, "live_histograms", None)
    if callable(live_histograms):
        live = live_histograms()
        for key, name, what in _LIVE_TOKEN_HISTOGRAMS:
            if key in live:
                hists.append((name, what, live[key].histogram))
    for name, what, h in hists:
        if h.total_count:
            family = _quantiles(name, f"{what} over the run so far (quantile 1: the maximum)", names, values,
                                ((q, float(h.value_at_percentile(p))) for q, p in _RUN_QUANTILES))
            if family is not None:
                yield family


def _gpu_families(devices: Sequence[Dict[str, Any]], names: List[str], values: List[str]) -> Iterator[Metric]:
    """The GPU sampler's newest readings, a sample per device (labels ``gpu``: index,
    ``uuid``)."""
    for key, name, text, factor in _GPU_GAUGES:
        family = GaugeMetricFamily(name, text, labels=names + ["gpu", "uuid"])
        for d in devices:
            if d.get(key) is not None:
                family.add_metric(values + [str(d["index"]), str(d["uuid"])], float(d[key]) * factor)
        if family.samples:
            yield family

