"""Completion paths under many threads at once: small, fast stress runs that the TSan
build of `scripts/sanitize.sh tsan` runs (they also run in the normal suite, where they
check that nothing is lost or resolved twice).

Each run has completions, failures, first tokens, duplicate completions, timeouts and
readers of counts and histograms racing each other, from several threads, while the
engine's own issue, monitor and completion threads run.
"""

from __future__ import annotations

import json
import queue
import random
import threading

import numpy as np
import pytest

import loadgen
from loadgen import _core

MS = 1_000_000
THREADS = 4


def assert_counts_add_up(c):
    assert c["outstanding"] == 0, c
    assert c["issued"] == c["completed"] + c["failed"] + c["timed_out"] + c["cancelled"], c


def queue_engine(n_queries, *, timeout_ns=0, interval_ns=2 * MS, records=None):
    """An engine on the queue SUT; ``records``: (RecordSink name, path) to record to."""
    s = _core.EngineSettings()
    s.load_mode = _core.LoadMode.open_loop
    s.arrival = _core.ArrivalKind.constant
    s.target_qps = 20_000.0
    s.max_query_count = n_queries
    s.sut = _core.NativeSutSettings(kind=_core.SutKind.queue)
    s.latency_bounds_ns = [MS, 10 * MS]
    s.ttft_bounds_ns = [MS]
    s.interval_ns = interval_ns
    s.timeout_ns = timeout_ns
    s.grace_ns = 2_000_000_000
    if records is not None:
        s.records_sink = getattr(_core.RecordSink, records[0])
        s.records_path = str(records[1])
    return _core.Engine(s)


def run_with_completer_threads(engine, n_threads=THREADS, seed=0):
    """One thread takes batches and deals the ids round-robin to `n_threads` completers;
    each marks a first token, then completes, fails or completes twice. A reader thread
    polls counts and histograms throughout. Returns the completers' call results."""
    queues = [queue.SimpleQueue() for _ in range(n_threads)]
    outcomes = [{"completed": 0, "failed": 0, "again": 0} for _ in range(n_threads)]
    done = threading.Event()
    errors = []

    def completer(k):
        rng = random.Random(seed + k)
        try:
            while True:
                qid = queues[k].get()
                if qid is None:
                    return
                engine.first_token(qid)
                r = rng.random()
                if r < 0.1:
                    engine.fail(qid, "stress", "failed on purpose")
                    outcomes[k]["failed"] += 1
                elif r < 0.2:
                    engine.complete(qid, 0, 3)
                    # A second completion of a resolved query: refused, counted as unknown.
                    outcomes[k]["again"] += engine.complete(qid)
                    outcomes[k]["completed"] += 1
                else:
                    engine.complete_many(np.array([qid], dtype=np.int64))
                    outcomes[k]["completed"] += 1
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    def reader():
        while not done.is_set():
            engine.counts()
            engine.recorder.over_bound()
            assert engine.recorder.latency().total_count >= 0
            engine.recorder.ttft().encode_compressed()
            engine.timeseries()
            engine.last_interval()
            engine.error_counts()

    threads = [threading.Thread(target=completer, args=(k,)) for k in range(n_threads)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    engine.start()
    dealt = 0
    try:
        while True:
            got = engine.take_batch(32, 5.0)
            if got is None:
                break
            for qid in got[0].tolist():
                queues[dealt % n_threads].put(qid)
                dealt += 1
    finally:
        for q in queues:
            q.put(None)
        for t in threads[:-1]:
            t.join(30)
        done.set()
        threads[-1].join(30)
    assert engine.wait(30.0), "the run did not end"
    assert not errors, errors
    return outcomes


def test_completions_from_many_threads_each_resolve_exactly_once():
    e = queue_engine(2000)
    outcomes = run_with_completer_threads(e)
    c = e.counts()
    assert_counts_add_up(c)
    assert c["issued"] == 2000
    assert c["completed"] == sum(o["completed"] for o in outcomes)
    assert c["failed"] == sum(o["failed"] for o in outcomes)
    assert sum(o["again"] for o in outcomes) == 0
    assert c["duplicate_completions"] > 0 and c["unknown_completions"] == 0
    assert e.recorder.latency().total_count == c["completed"]


def test_completions_racing_timeouts_resolve_each_query_once():
    # A 1 ms timeout on a loaded machine: some queries time out while a completer thread
    # completes them; each must end exactly one way.
    e = queue_engine(1500, timeout_ns=MS)
    run_with_completer_threads(e, seed=10)
    c = e.counts()
    assert_counts_add_up(c)
    assert c["issued"] == 1500


def test_stop_from_another_thread_while_completers_run():
    e = queue_engine(10**9)
    timer = threading.Timer(0.3, e.stop)
    timer.start()
    try:
        run_with_completer_threads(e, seed=20)
    finally:
        timer.cancel()
    c = e.counts()
    assert_counts_add_up(c)
    assert c["issued"] > 0


def test_native_completion_threads_with_readers():
    s = loadgen.EngineSettings(mode="poisson", target_qps=20_000, query_count=3000, grace_s=2.0, interval_s=0.002,
                               latency_bounds_ns=[MS])
    stop = threading.Event()
    with loadgen.Engine(s, loadgen.DemoSUT(workers=3, service_us=50)) as eng:
        def read():
            while not stop.is_set():
                eng.counts()
                assert eng.latency().total_count >= 0
        readers = [threading.Thread(target=read) for _ in range(2)]
        for t in readers:
            t.start()
        try:
            eng.start()
            assert eng.wait(30.0), "the run did not end"
        finally:
            stop.set()
            for t in readers:
                t.join(10)
        r = eng.result()
    assert_counts_add_up(r.counts)
    assert r.counts["completed"] == 3000


def test_histogram_records_from_many_threads_lose_nothing():
    h = loadgen.Histogram()
    per_thread = 20_000
    values = np.arange(1, per_thread + 1, dtype=np.int64) * 1000
    errors = []

    def write():
        try:
            for chunk in np.array_split(values, 20):
                h.record_array(chunk)
            for v in values[:500].tolist():
                h.record(v)
        except BaseException as exc:
            errors.append(exc)

    def read():
        try:
            for _ in range(20):
                loadgen.Histogram.decode(h.encode())
                h.value_at_percentile(99.0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(THREADS)] + [threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert h.total_count == THREADS * (per_thread + 500)


@pytest.mark.parametrize("sink", ["jsonl", "spool"])
def test_records_from_many_completing_threads_while_the_writer_drains(tmp_path, sink):
    # Three completers resolve 5000 queries each (more than a 4096-record chunk: every
    # shard hands a full chunk to lg-records during the run), failing some under several
    # kinds, while another thread reads the log's stats and kinds.
    n = 15_000
    path = tmp_path / f"r.{sink}"
    e = queue_engine(n, interval_ns=20 * MS, records=(sink, path))
    stop = threading.Event()
    seen = []

    def read_stats():
        while not stop.is_set():
            seen.append(e.records_stats()["appended"])
            e.record_kinds()

    reader = threading.Thread(target=read_stats)
    reader.start()
    try:
        run_with_completer_threads(e, n_threads=3, seed=30)
    finally:
        stop.set()
        reader.join(30)
    c = e.counts()
    assert_counts_add_up(c)
    stats = e.records_stats()
    assert stats["written"] == stats["appended"] == c["issued"] == n and stats["error"] == "", stats
    assert stats["peak_buffered"] >= 4096 and seen == sorted(seen)
    if sink == "spool":
        records = np.fromfile(path, dtype=_core.record_dtype)
        queries = records["query"]
        assert (records["status"] == 1).sum() == c["failed"]
        assert set(records["error_kind"][records["status"] == 1].tolist()) == {1}
        assert e.record_kinds() == ["", "stress"]
    else:
        queries = np.array([json.loads(line)["query"] for line in path.read_text().splitlines()])
    assert sorted(queries.tolist()) == list(range(1, n + 1))
