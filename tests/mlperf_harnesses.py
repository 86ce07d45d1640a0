"""MLPerf-style harnesses for the agreement tests of :mod:`loadgen.mlperf`.

Each harness is written the way a benchmark harness for the MLPerf LoadGen is written:
it only uses the module it is handed (``lg``), so one harness runs unchanged against
``mlperf_loadgen`` and against ``loadgen.mlperf``. A harness builds a SUT and a QSL,
runs one test with its logs in ``outdir``, and returns an :class:`Observed`: what the
SUT and the QSL saw (sample indices per issue_query call, flush calls, load/unload
sets, response callbacks) and what the logs say (detail log entries, summary,
accuracy log).

Run one harness by hand to see what a module does::

    python tests/mlperf_harnesses.py loadgen.mlperf single_stream_inline
"""

from __future__ import annotations

import importlib
import json
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

MS = 1_000_000  # ns

# ------------------------------------------------------------------ observations


@dataclass(repr=False)
class Observed:
    """What one run showed to the SUT, the QSL and in the logs."""

    issued: list = field(default_factory=list)  # sample indices, one list per issue_query call
    response_ids: list = field(default_factory=list)  # QuerySample.id, in issue order
    id_epochs: list = field(default_factory=lambda: [[]])  # the ids, split at each flush
    flush_calls: int = 0
    timeline: list = field(default_factory=list)  # "load N", "issue" (runs collapsed), "flush", "unload N"
    qsl_events: list = field(default_factory=list)  # ("load" | "unload", [indices]) in call order
    callback_ids: list = field(default_factory=list)  # response.id seen by a response_cb
    callback_sizes: list = field(default_factory=list)  # response.size seen by a response_cb
    detail: dict = field(default_factory=dict)  # MLLOG key -> list of values, in log order
    summary: str = ""
    accuracy: list = field(default_factory=list)  # entries of mlperf_log_accuracy.json
    errors: list = field(default_factory=list)  # exceptions raised in SUT threads
    wall_s: float = 0.0

    def __repr__(self) -> str:
        return (
            f"Observed(validity={self.validity}, issue_calls={len(self.issued)}, samples={len(self.flat)}, "
            f"flush_calls={self.flush_calls}, accuracy_entries={len(self.accuracy)}, errors={self.errors}, "
            f"wall_s={self.wall_s:.3f})"
        )

    # -- derived views

    @property
    def flat(self) -> list:
        """All issued sample indices in issue order."""
        return [i for call in self.issued for i in call]

    def one(self, key: str) -> Any:
        """The value of a detail-log key that must appear exactly once."""
        values = self.detail.get(key, [])
        assert len(values) == 1, f"{key}: {values!r}"
        return values[0]

    def last(self, key: str, default: Any = None) -> Any:
        values = self.detail.get(key)
        return values[-1] if values else default

    @property
    def validity(self) -> str | None:
        """VALID / INVALID from the summary ('Result is : ...'), None if absent."""
        m = re.search(r"^Result is\s*:\s*(\w+)\s*$", self.summary, re.MULTILINE)
        return m.group(1) if m else None

    def keys_with_prefix(self, prefix: str) -> dict:
        return {k: v for k, v in self.detail.items() if k.startswith(prefix)}

    def accuracy_triples(self) -> list:
        """(seq_id, qsl_idx, data) of every accuracy-log entry, sorted."""
        return sorted((e["seq_id"], e["qsl_idx"], e["data"].upper()) for e in self.accuracy)


def read_detail(path: Path) -> dict:
    """The ':::MLLOG {json}' lines of a detail log: key -> list of values."""
    out: dict = {}
    for line in path.read_text().splitlines():
        if not line.startswith(":::MLLOG"):
            continue
        entry = json.loads(line[len(":::MLLOG") :].strip())
        out.setdefault(entry["key"], []).append(entry["value"])
    return out


def read_logs(obs: Observed, outdir: Path) -> None:
    obs.detail = read_detail(outdir / "mlperf_log_detail.txt")
    obs.summary = (outdir / "mlperf_log_summary.txt").read_text()
    acc = outdir / "mlperf_log_accuracy.json"
    text = acc.read_text().strip() if acc.exists() else ""
    obs.accuracy = json.loads(text) if text else []


# ------------------------------------------------------------------ settings


def make_settings(lg, scenario: str, mode: str = "PerformanceOnly", **attrs) -> Any:
    """A TestSettings with ``scenario`` / ``mode`` given by name and other fields set."""
    s = lg.TestSettings()
    s.scenario = getattr(lg.TestScenario, scenario)
    s.mode = getattr(lg.TestMode, mode)
    for name, value in attrs.items():
        setattr(s, name, value)
    return s


def seed_settings(seeds) -> dict:
    """(qsl, sample index, schedule) seeds as TestSettings fields."""
    q, s, sch = seeds
    return {"qsl_rng_seed": q, "sample_index_rng_seed": s, "schedule_rng_seed": sch}


# ------------------------------------------------------------------ SUTs


class BaseSUT:
    """Records every issue_query / flush_queries call; subclasses complete samples."""

    def __init__(self, lg, obs: Observed):
        self.lg = lg
        self.obs = obs
        self.lock = threading.Lock()

    # callbacks handed to ConstructSUT
    def issue_query(self, query_samples) -> None:
        samples = [(s.id, s.index) for s in query_samples]
        with self.lock:
            self.obs.issued.append([i for _, i in samples])
            self.obs.response_ids.extend(r for r, _ in samples)
            self.obs.id_epochs[-1].extend(r for r, _ in samples)
            if not self.obs.timeline or self.obs.timeline[-1] != "issue":
                self.obs.timeline.append("issue")
        try:
            self.handle(samples)
        except Exception as e:  # never let an exception cross into the library
            self.obs.errors.append(repr(e))
            self.complete(samples)

    def flush_queries(self) -> None:
        with self.lock:
            self.obs.flush_calls += 1
            self.obs.id_epochs.append([])
            self.obs.timeline.append("flush")

    # completion
    def complete(self, samples, response_cb=None) -> None:
        responses = [self.lg.QuerySampleResponse(r, 0, 0) for r, _ in samples]
        if response_cb is None:
            self.lg.QuerySamplesComplete(responses)
        else:
            self.lg.QuerySamplesComplete(responses, response_cb)

    def handle(self, samples) -> None:
        raise NotImplementedError

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class InlineSUT(BaseSUT):
    """Completes every query inside issue_query, after sleeping ``delay_s``."""

    def __init__(self, lg, obs, delay_s: float = 0.0):
        super().__init__(lg, obs)
        self.delay_s = delay_s

    def handle(self, samples) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        self.complete(samples)


class WorkerSUT(BaseSUT):
    """issue_query only enqueues; one worker thread completes the work items.

    ``mode="sleep"``: the worker sleeps ``delay_s`` per query, then completes it (a
    serial device). ``mode="deadline"``: the worker completes each query ``delay_s``
    after it was issued (a pipelined device: latency without a backlog).
    ``issue_delay_s`` makes issue_query itself take that long.
    ``mode="batches"``: the worker completes the samples of a query in chunks of
    ``chunk`` samples, one QuerySamplesComplete call per chunk, sleeping ``delay_s``
    before each chunk.
    """

    def __init__(self, lg, obs, delay_s: float, mode: str = "sleep", chunk: int = 64, issue_delay_s: float = 0.0):
        super().__init__(lg, obs)
        self.delay_s = delay_s
        self.mode = mode
        self.chunk = chunk
        self.issue_delay_s = issue_delay_s
        self.q: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="sut-worker", daemon=True)

    def handle(self, samples) -> None:
        t_issue = time.monotonic()
        if self.issue_delay_s:
            time.sleep(self.issue_delay_s)
        self.q.put((t_issue, samples))

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.q.put(None)
        self.thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            t_issue, samples = item
            try:
                if self.mode == "deadline":
                    wait = t_issue + self.delay_s - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    self.complete(samples)
                elif self.mode == "batches":
                    for k in range(0, len(samples), self.chunk):
                        if self.delay_s:
                            time.sleep(self.delay_s)
                        self.complete(samples[k : k + self.chunk])
                else:
                    time.sleep(self.delay_s)
                    self.complete(samples)
            except Exception as e:  # reported by the test
                self.obs.errors.append(repr(e))


def payload(index: int) -> np.ndarray:
    """The response bytes for sample ``index``: 0-6 int16 values (some responses empty)."""
    n = index % 7
    return (np.arange(n, dtype=np.int16) * 3 + index).astype(np.int16)


class ArraySUT(BaseSUT):
    """Returns ``payload(index)`` from numpy arrays via QuerySampleResponse(id, ptr, n).

    Without ``use_response_cb`` the arrays hold the data when QuerySamplesComplete is
    called. With it, the arrays are zero when QuerySamplesComplete is called and the
    response_cb fills the array of the response it is handed (the way a SUT copies a
    device buffer to the host only for responses the library logs). The arrays stay
    referenced until QuerySamplesComplete returns. ``worker`` completes from a thread,
    in chunks of ``chunk`` samples; otherwise issue_query sleeps ``delay_s`` and
    completes inline. The response_cb sleeps ``cb_delay_s`` before filling an array.
    """

    def __init__(
        self,
        lg,
        obs,
        use_response_cb: bool = False,
        worker: bool = False,
        chunk: int = 64,
        delay_s: float = 0.0,
        cb_delay_s: float = 0.0,
    ):
        super().__init__(lg, obs)
        self.use_response_cb = use_response_cb
        self.worker = worker
        self.chunk = chunk
        self.delay_s = delay_s
        self.cb_delay_s = cb_delay_s
        self.pending: dict = {}  # response id -> (array, sample index) while in flight
        self.q: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="sut-worker", daemon=True)

    def handle(self, samples) -> None:
        if self.worker:
            self.q.put(samples)
        else:
            if self.delay_s:
                time.sleep(self.delay_s)
            self._complete_arrays(samples)

    def start(self) -> None:
        if self.worker:
            self.thread.start()

    def stop(self) -> None:
        if self.worker:
            self.q.put(None)
            self.thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            samples = self.q.get()
            if samples is None:
                return
            try:
                for k in range(0, len(samples), self.chunk):
                    self._complete_arrays(samples[k : k + self.chunk])
            except Exception as e:  # reported by the test
                self.obs.errors.append(repr(e))

    def _response_cb(self, response) -> None:
        with self.lock:
            self.obs.callback_ids.append(response.id)
            self.obs.callback_sizes.append(response.size)
        arr, index = self.pending[response.id]
        if self.cb_delay_s:
            time.sleep(self.cb_delay_s)  # a slow copy from device memory
        arr[:] = payload(index)

    def _complete_arrays(self, samples) -> None:
        arrays = []
        responses = []
        for rid, index in samples:
            data = payload(index)
            arr = np.zeros_like(data) if self.use_response_cb else data
            arrays.append(arr)
            with self.lock:
                self.pending[rid] = (arr, index)
            responses.append(self.lg.QuerySampleResponse(rid, arr.ctypes.data, arr.nbytes))
        if self.use_response_cb:
            self.lg.QuerySamplesComplete(responses, self._response_cb)
        else:
            self.lg.QuerySamplesComplete(responses)
        with self.lock:
            for rid, _ in samples:
                del self.pending[rid]
        del arrays  # the arrays were referenced until QuerySamplesComplete returned


# ------------------------------------------------------------------ running


def run(
    lg,
    outdir,
    settings,
    make_sut: Callable[[Any, Observed], BaseSUT],
    total_count: int = 1024,
    perf_count: int = 128,
) -> Observed:
    """Run one test: ConstructSUT / ConstructQSL, StartTestWithLogSettings, Destroy*."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    obs = Observed()
    sut_obj = make_sut(lg, obs)

    def load(indices):
        obs.qsl_events.append(("load", [int(i) for i in indices]))
        obs.timeline.append(f"load {len(indices)}")

    def unload(indices):
        obs.qsl_events.append(("unload", [int(i) for i in indices]))
        obs.timeline.append(f"unload {len(indices)}")

    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(outdir)
    log_settings.enable_trace = False

    sut = lg.ConstructSUT(sut_obj.issue_query, sut_obj.flush_queries)
    qsl = lg.ConstructQSL(total_count, perf_count, load, unload)
    sut_obj.start()
    t0 = time.monotonic()
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
    finally:
        obs.wall_s = time.monotonic() - t0
        sut_obj.stop()
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    read_logs(obs, outdir)
    return obs


# ------------------------------------------------------------------ harnesses


def single_stream_inline(
    lg,
    outdir,
    seeds=(0, 0, 0),
    min_query_count: int = 64,
    max_query_count: int = 0,
    min_duration_ms: int = 100,
    delay_s: float = 0.002,
    expected_latency_ns: int = 2 * MS,
    **extra,
) -> Observed:
    """SingleStream; the SUT sleeps ``delay_s`` and completes inside issue_query.

    With 64 queries of at least 2 ms each, the run lasts more than 100 ms, so it ends
    exactly at min_query_count (or earlier at max_query_count).
    """
    s = make_settings(
        lg,
        "SingleStream",
        min_query_count=min_query_count,
        max_query_count=max_query_count,
        min_duration_ms=min_duration_ms,
        single_stream_expected_latency_ns=expected_latency_ns,
        **seed_settings(seeds),
        **extra,
    )
    return run(lg, outdir, s, lambda lg_, o: InlineSUT(lg_, o, delay_s))


def multi_stream_worker(
    lg,
    outdir,
    seeds=(0, 0, 0),
    samples_per_query: int = 8,
    min_query_count: int = 48,
    min_duration_ms: int = 80,
    delay_s: float = 0.002,
    **extra,
) -> Observed:
    """MultiStream, 8 samples per query, completed by a worker thread after ``delay_s``.

    48 queries of at least 2 ms last more than 80 ms: the run ends at min_query_count.
    """
    s = make_settings(
        lg,
        "MultiStream",
        multi_stream_samples_per_query=samples_per_query,
        min_query_count=min_query_count,
        min_duration_ms=min_duration_ms,
        multi_stream_expected_latency_ns=2 * MS,
        **seed_settings(seeds),
        **extra,
    )
    return run(lg, outdir, s, lambda lg_, o: WorkerSUT(lg_, o, delay_s, mode="sleep"))


def server_worker(
    lg,
    outdir,
    seeds=(0, 0, 0),
    target_qps: float = 3000.0,
    latency_ns: int = 100 * MS,
    min_duration_ms: int = 200,
    min_query_count: int = 100,
    delay_s: float = 0.001,
    coalesce: bool = False,
    issue_delay_s: float = 0.0,
    **extra,
) -> Observed:
    """Server (Poisson arrivals); a worker completes each query ``delay_s`` after issue."""
    s = make_settings(
        lg,
        "Server",
        server_target_qps=target_qps,
        server_target_latency_ns=latency_ns,
        server_coalesce_queries=coalesce,
        min_duration_ms=min_duration_ms,
        min_query_count=min_query_count,
        **seed_settings(seeds),
        **extra,
    )
    return run(
        lg, outdir, s, lambda lg_, o: WorkerSUT(lg_, o, delay_s, mode="deadline", issue_delay_s=issue_delay_s)
    )


def offline_batches(
    lg,
    outdir,
    seeds=(0, 0, 0),
    expected_qps: float = 5000.0,
    min_duration_ms: int = 100,
    chunk: int = 64,
    chunk_delay_s: float = 0.015,
    **extra,
) -> Observed:
    """Offline; a worker completes the one query in chunks of ``chunk`` responses.

    5000 QPS x 0.1 s x 1.1 = 550 samples: 9 chunks of at least 15 ms, more than 100 ms.
    """
    s = make_settings(
        lg,
        "Offline",
        offline_expected_qps=expected_qps,
        min_duration_ms=min_duration_ms,
        **seed_settings(seeds),
        **extra,
    )
    return run(lg, outdir, s, lambda lg_, o: WorkerSUT(lg_, o, chunk_delay_s, mode="batches", chunk=chunk))


def accuracy_arrays(
    lg,
    outdir,
    scenario: str = "SingleStream",
    seeds=(0, 0, 0),
    use_response_cb: bool = False,
    total_count: int = 300,
    perf_count: int = 128,
    cb_delay_s: float = 0.0,
    **extra,
) -> Observed:
    """AccuracyOnly: every sample of the QSL, set by set, with numpy response bytes.

    SingleStream and MultiStream complete inline; Offline and Server complete from a
    worker thread, in chunks of 64 samples.
    """
    s = make_settings(lg, scenario, "AccuracyOnly", **seed_settings(seeds), **extra)
    worker = scenario in ("Offline", "Server")
    return run(
        lg,
        outdir,
        s,
        lambda lg_, o: ArraySUT(lg_, o, use_response_cb=use_response_cb, worker=worker, cb_delay_s=cb_delay_s),
        total_count=total_count,
        perf_count=perf_count,
    )


def performance_log_sampling(
    lg,
    outdir,
    seeds=(0, 0, 0),
    probability: float = 0.25,
    accuracy_log_rng_seed: int = 7,
    use_response_cb: bool = True,
    **extra,
) -> Observed:
    """SingleStream PerformanceOnly, 64 queries, logging a random share of responses."""
    s = make_settings(
        lg,
        "SingleStream",
        min_query_count=64,
        min_duration_ms=100,
        single_stream_expected_latency_ns=2 * MS,
        accuracy_log_probability=probability,
        accuracy_log_rng_seed=accuracy_log_rng_seed,
        **seed_settings(seeds),
        **extra,
    )

    return run(
        lg,
        outdir,
        s,
        lambda lg_, o: ArraySUT(lg_, o, use_response_cb=use_response_cb, delay_s=0.002),
    )


def submission_run(
    lg,
    outdir,
    seeds=(0, 0, 0),
    total_count: int = 150,
    perf_count: int = 100,
    **extra,
) -> Observed:
    """SingleStream SubmissionRun: the accuracy pass over all 150 samples, then a
    performance run of 64 queries; the SUT sleeps 1 ms and returns numpy bytes."""
    s = make_settings(
        lg,
        "SingleStream",
        "SubmissionRun",
        min_query_count=64,
        min_duration_ms=50,
        single_stream_expected_latency_ns=1 * MS,
        **seed_settings(seeds),
        **extra,
    )
    return run(
        lg,
        outdir,
        s,
        lambda lg_, o: ArraySUT(lg_, o, delay_s=0.001),
        total_count=total_count,
        perf_count=perf_count,
    )


def performance_issue(
    lg,
    outdir,
    scenario: str = "SingleStream",
    unique: bool = False,
    same: bool = False,
    same_index: int = 0,
    seeds=(0, 0, 0),
    **extra,
) -> Observed:
    """performance_issue_unique / performance_issue_same in SingleStream, MultiStream or
    Offline, with a fast SUT (unique issues every loaded sample once and ends there)."""
    kw: dict = dict(
        performance_issue_unique=unique,
        performance_issue_same=same,
        performance_issue_same_index=same_index,
        **seed_settings(seeds),
    )
    if scenario == "SingleStream":
        kw.update(min_query_count=64, min_duration_ms=100, single_stream_expected_latency_ns=2 * MS)

        def make_sut(lg_, o):
            return InlineSUT(lg_, o, 0.002)

    elif scenario == "MultiStream":
        kw.update(
            min_query_count=48,
            min_duration_ms=80,
            multi_stream_samples_per_query=8,
            multi_stream_expected_latency_ns=2 * MS,
        )

        def make_sut(lg_, o):
            return WorkerSUT(lg_, o, 0.002)

    else:
        kw.update(offline_expected_qps=2000.0, min_duration_ms=100)

        def make_sut(lg_, o):
            return WorkerSUT(lg_, o, 0.0, mode="batches")

    kw.update(extra)
    s = make_settings(lg, scenario, **kw)
    return run(lg, outdir, s, make_sut)


HARNESSES = {
    "single_stream_inline": single_stream_inline,
    "multi_stream_worker": multi_stream_worker,
    "server_worker": server_worker,
    "offline_batches": offline_batches,
    "accuracy_arrays": accuracy_arrays,
    "performance_log_sampling": performance_log_sampling,
    "performance_issue": performance_issue,
    "submission_run": submission_run,
}


def _main(argv=None) -> None:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(description="Run one harness against a LoadGen module.")
    p.add_argument("module", help="mlperf_loadgen or loadgen.mlperf")
    p.add_argument("harness", choices=sorted(HARNESSES))
    p.add_argument("--kw", default="{}", help="harness keyword arguments as JSON")
    a = p.parse_args(argv)
    lg = importlib.import_module(a.module)
    with tempfile.TemporaryDirectory() as d:
        obs = HARNESSES[a.harness](lg, d, **json.loads(a.kw))
    print("validity:", obs.validity, f" wall_s: {obs.wall_s:.3f}")
    print("issue calls:", len(obs.issued), " samples:", len(obs.flat), " flush calls:", obs.flush_calls)
    print("first indices:", obs.issued[:8])
    print("qsl events:", [(k, len(v), v[:5]) for k, v in obs.qsl_events])
    for key in ("generated_query_count", "generated_samples_per_query", "generated_query_duration", "result_query_count"):
        print(key, obs.detail.get(key))
    print("accuracy entries:", len(obs.accuracy), " callbacks:", len(obs.callback_ids), " errors:", obs.errors)


if __name__ == "__main__":
    _main()
