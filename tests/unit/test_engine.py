"""The issue engine end to end: short runs against native, function, async and batched
SUTs, checking counts, bounds, caps, schedules, measurements and errors.

The test machine is small and noisy, so runs are short and every timing bound is
generous, with the reason for it next to it. Counts and scheduled times are exact.
"""

from __future__ import annotations

import asyncio
import importlib.util
import queue
import random
import threading
import time

import numpy as np
import pytest

import loadgen
from loadgen import EngineSettings, _core

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
MS = 1_000_000


# ------------------------------------------------------------------ helpers


def assert_counts_add_up(counts):
    """Every issued query ended exactly one way, and none is left."""
    c = counts
    assert c["outstanding"] == 0, c
    assert c["issued"] == c["completed"] + c["failed"] + c["timed_out"] + c["cancelled"], c


def settings(**kw) -> EngineSettings:
    # Short runs: a 0.5 s grace (tests that need the default set it) and no time series.
    kw.setdefault("grace_s", 0.5)
    kw.setdefault("interval_s", 0.0)
    return EngineSettings(**kw)


def run_engine(s, sut, wait_s=20.0):
    """Runs to the end and returns (result, engine); fails rather than hangs."""
    with loadgen.Engine(s, sut) as eng:
        eng.start()
        assert eng.wait(wait_s), "the run did not end"
        return eng.result(), eng


class Recorder:
    """Batched SUT: records every query (id, samples, scheduled, seen-at) and completes
    it at once, unless `drop(k)` says to leave the k-th query it received (1-based; query
    ids are opaque, so tests pick queries by their issue order)."""

    def __init__(self, drop=None):
        self.lock = threading.Lock()
        self.ids, self.samples, self.scheduled, self.seen = [], [], [], []
        self.batches = 0
        self.drop = drop

    def issue(self, batch):
        now = time.monotonic_ns()
        with self.lock:
            self.batches += 1
            self.ids.extend(batch.ids.tolist())
            self.samples.extend(np.asarray(batch.sample_indices).tolist())
            self.scheduled.extend(batch.scheduled_ns.tolist())
            self.seen.extend([now] * len(batch))
            first = len(self.ids) - len(batch) + 1
        if self.drop is None:
            batch.complete()
        else:
            keep = [i for k, i in enumerate(batch.ids.tolist(), start=first) if not self.drop(k)]
            if keep:
                batch.complete_many(keep)

    def by_id(self):
        order = np.argsort(self.ids)
        return (
            np.asarray(self.ids)[order],
            np.asarray(self.samples)[order],
            np.asarray(self.scheduled, dtype=np.int64)[order],
            np.asarray(self.seen, dtype=np.int64)[order],
        )


class WorkerSUT:
    """Batched SUT completing each query from helper threads after a random short
    sleep. Tracks how many queries it holds; the count drops *before* complete(), so
    the engine cannot issue the next one while the old one is still counted."""

    def __init__(self, workers=2, sleep_s=(0.0005, 0.002), seed=0):
        self.q = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.outstanding = 0
        self.max_outstanding = 0
        self.received = 0
        self.sleep_s = sleep_s
        self.rng = random.Random(seed)
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        for t in self.threads:
            t.start()

    def issue(self, batch):
        with self.lock:
            self.outstanding += len(batch)
            self.received += len(batch)
            self.max_outstanding = max(self.max_outstanding, self.outstanding)
        for qid in batch.ids.tolist():
            self.q.put((batch, qid))

    def _work(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            batch, qid = item
            with self.lock:
                delay = self.rng.uniform(*self.sleep_s)
            time.sleep(delay)
            with self.lock:
                self.outstanding -= 1
            batch.complete_many([qid])

    def close(self):
        for _ in self.threads:
            self.q.put(None)
        for t in self.threads:
            t.join(5)


class Hold:
    """Batched SUT that never completes anything."""

    def __init__(self):
        self.received = 0

    def issue(self, batch):
        self.received += len(batch)


# ------------------------------------------------------------- normal end


@pytest.mark.parametrize(
    "sut_factory",
    [
        lambda: loadgen.NullSUT(),
        lambda: loadgen.FixedDelaySUT(500),
        lambda: (lambda i: None),
        lambda: Recorder(),
    ],
    ids=["null", "fixed_delay", "function", "batched"],
)
def test_counts_add_up_after_a_normal_end(sut_factory):
    result, _ = run_engine(settings(mode="constant", target_qps=2000, query_count=300), sut_factory())
    c = result.counts
    assert_counts_add_up(c)
    assert c["issued"] == c["completed"] == 300
    assert c["failed"] == c["timed_out"] == c["cancelled"] == c["unknown_completions"] == 0
    assert result.latency.total_count == result.service_time.total_count == 300
    assert result.issue_delay.total_count == 300
    assert not result.interrupted
    # 300 queries at 2000 qps: the last is scheduled at 149.5 ms.
    assert result.duration_s >= 0.149


def test_run_function_defaults_to_null_sut_and_accepts_overrides():
    result = loadgen.run(settings(mode="poisson", target_qps=5000), query_count=100)
    assert result.counts["issued"] == result.counts["completed"] == 100
    assert result.completed_qps > 0
    with pytest.raises(ValueError, match="no_such_field"):
        loadgen.run(settings(mode="poisson", target_qps=5000), query_count=10, no_such_field=1)


# ---------------------------------------------------------- stop and abort


@pytest.mark.parametrize(
    "sut_factory",
    [
        lambda: loadgen.NullSUT(),
        lambda: loadgen.FixedDelaySUT(1000),
        lambda: (lambda i: None),
        lambda: WorkerSUT(workers=2),
    ],
    ids=["null", "fixed_delay", "function", "worker"],
)
def test_stop_from_another_thread_ends_a_long_run_with_counts_adding_up(sut_factory):
    sut = sut_factory()
    s = settings(mode="constant", target_qps=1000, duration_s=30, grace_s=10.0)
    with loadgen.Engine(s, sut) as eng:
        stopped_at = []
        timer = threading.Timer(0.2, lambda: (stopped_at.append(time.monotonic()), eng.stop()))
        eng.start()
        timer.start()
        try:
            assert eng.wait(10.0), "stop() did not end the run"
        finally:
            timer.cancel()
        ended = time.monotonic()
        result = eng.result()
    if isinstance(sut, WorkerSUT):
        sut.close()
    # Outstanding queries take <= ~2 ms and the Python dispatcher polls every 0.1 s, so
    # the run ends within ms of stop(); 2 s leaves room for a very busy machine.
    assert ended - stopped_at[0] < 2.0
    assert result.interrupted
    c = result.counts
    assert_counts_add_up(c)
    # Stopped at ~0.2 s of a 30 s run at 1000 qps: well under the 30_000 scheduled.
    assert 0 < c["issued"] < 5000
    # The grace period (10 s) was enough for the few in flight: none cancelled.
    assert c["cancelled"] == 0
    assert c["completed"] == c["issued"]


def test_stop_from_a_timer_interrupts_a_30s_run_promptly():
    s = settings(mode="poisson", target_qps=500, duration_s=30)
    with loadgen.Engine(s, lambda i: None) as eng:
        t0 = time.monotonic()
        eng.start()
        timer = threading.Timer(0.2, eng.stop)
        timer.start()
        try:
            finished = eng.wait(5.0)
        finally:
            timer.cancel()
        elapsed = time.monotonic() - t0
        result = eng.result()
    assert finished
    # 0.2 s until stop(), then at most a dispatcher poll (0.1 s) and scheduling noise.
    assert elapsed < 2.0
    assert result.interrupted
    assert_counts_add_up(result.counts)
    assert result.counts["issued"] > 0
    assert result.duration_s < 2.0


def test_keyboard_interrupt_during_run_aborts_and_reraises():
    # A real SIGINT sent to the main thread, as Ctrl-C is, under Python's own handler (set
    # here whatever an earlier test left). The signal reaches the C handler on the main
    # thread itself, so the interpreter looks at it at once; _thread.interrupt_main() from
    # another thread is only looked at when the main thread next takes the GIL, and once
    # went unseen for the whole 30-s run on a host with a load of 8.
    import signal

    s = settings(mode="constant", target_qps=500, duration_s=30)
    eng = loadgen.Engine(s, lambda i: None)
    main = threading.main_thread().ident
    assert threading.get_ident() == main
    timer = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            eng.run()  # its wait() loop runs in 0.2 s slices, so Ctrl-C lands promptly
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    elapsed = time.monotonic() - t0
    assert elapsed < 10.0  # 0.2 s, a wait slice and a busy host's delays: far from the 30 s
    result = eng.result()
    assert result.interrupted
    assert_counts_add_up(result.counts)
    assert 0 < result.counts["issued"] < 15000 * elapsed / 30 + 50


def test_abort_cancels_outstanding_queries_without_grace():
    sut = Hold()
    s = settings(mode="constant", target_qps=1000, duration_s=30, grace_s=60.0)
    with loadgen.Engine(s, sut) as eng:
        eng.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        eng.abort()
        # No grace: outstanding queries are cancelled at once (60 s grace ignored).
        assert eng.wait(5.0)
        elapsed = time.monotonic() - t0
        result = eng.result()
    assert elapsed < 2.0
    c = result.counts
    assert_counts_add_up(c)
    assert c["completed"] == 0
    assert c["cancelled"] == c["issued"] > 0
    assert result.interrupted


def test_stop_waits_the_grace_period_then_cancels():
    sut = Hold()
    s = settings(mode="constant", target_qps=1000, duration_s=30, grace_s=0.3)
    with loadgen.Engine(s, sut) as eng:
        eng.start()
        time.sleep(0.15)
        t0 = time.monotonic()
        eng.stop()
        assert eng.wait(5.0)
        elapsed = time.monotonic() - t0
        result = eng.result()
    # At least the 0.3 s grace (less 10 ms for clock and wake-up granularity); at most
    # the grace plus 2 s of noise.
    assert 0.29 <= elapsed < 2.3
    c = result.counts
    assert_counts_add_up(c)
    assert c["cancelled"] == c["issued"] > 0


def test_engine_context_manager_aborts_on_exit():
    sut = Hold()
    eng = loadgen.Engine(settings(mode="constant", target_qps=1000, duration_s=30, grace_s=60), sut)
    t0 = time.monotonic()
    with eng:
        eng.start()
        time.sleep(0.05)
    assert time.monotonic() - t0 < 3.0
    assert eng._core.finished
    assert_counts_add_up(eng.counts())


# ----------------------------------------------------------------- timeouts


def test_queries_never_completed_time_out_and_counts_add_up():
    # Odd queries are never completed; even ones are completed in issue(), right after the
    # engine stamped them issued. The timeout (200 ms) is far above the few us between
    # the two, so an even id would need a 200 ms stall of the dispatcher to time out.
    sut = Recorder(drop=lambda qid: qid % 2 == 1)
    s = settings(mode="constant", target_qps=500, query_count=100, timeout_ms=200, grace_s=10.0)
    t0 = time.monotonic()
    result, _ = run_engine(s, sut)
    elapsed = time.monotonic() - t0
    c = result.counts
    assert_counts_add_up(c)
    assert c["issued"] == 100
    assert c["timed_out"] == 50
    assert c["completed"] == 50
    assert c["cancelled"] == 0
    # The run ended by timing the stragglers out, not by the 10 s grace period:
    # 0.2 s of issuing + 0.2 s timeout + <= 10 ms reaping, plus noise.
    assert elapsed < 3.0
    # Latency is recorded only for completed queries.
    assert result.latency.total_count == 50


def test_timeout_applies_to_native_fixed_delay_sut():
    # Every query would complete after 50 ms; the timeout is 10 ms, so all time out.
    s = settings(mode="constant", target_qps=200, query_count=20, timeout_ms=10, grace_s=5.0)
    result, _ = run_engine(s, loadgen.FixedDelaySUT(50_000))
    c = result.counts
    assert_counts_add_up(c)
    assert c["timed_out"] == 20
    assert c["completed"] == 0


# ------------------------------------------------------------- SUT errors


def test_function_sut_exceptions_fail_those_queries_and_keep_first_messages():
    def f(i):
        if i % 3 == 0:
            raise ValueError(f"bad sample {i}")

    s = settings(mode="constant", target_qps=3000, query_count=90, sample_count=30,
                 sample_order="sequential")
    result, _ = run_engine(s, f)
    c = result.counts
    assert_counts_add_up(c)
    assert c["failed"] == 30
    assert c["completed"] == 60
    assert result.errors == {"ValueError": 30}
    # The first 10 messages are kept, in issue order: samples 0, 3, ..., 27.
    assert result.error_messages == [f"ValueError: bad sample {i}" for i in range(0, 30, 3)]
    assert result.latency.total_count == 60


def test_batched_sut_raising_in_issue_fails_the_batch_and_fail_is_counted():
    class Flaky:
        k = 0  # queries received so far: ids are opaque, issue order is what tests use

        def issue(self, batch):
            ids = batch.ids.tolist()
            ranks = list(range(self.k + 1, self.k + 1 + len(ids)))
            self.k += len(ids)
            if ranks[0] % 5 == 0:
                raise KeyError("boom")
            # Fail the odd queries explicitly with a kind, complete the rest.
            odd = [i for i, r in zip(ids, ranks) if r % 2]
            if odd:
                batch.fail(odd, kind="Overload", message="busy")
            even = [i for i, r in zip(ids, ranks) if not r % 2]
            if even:
                batch.complete_many(even)

    # batch_max=1: one query per batch, so which queries fail is deterministic.
    s = settings(mode="constant", target_qps=2000, query_count=100, batch_max=1)
    result, _ = run_engine(s, Flaky())
    c = result.counts
    assert_counts_add_up(c)
    raised = set(range(5, 101, 5))
    odd = {i for i in range(1, 101) if i % 2} - raised
    assert result.errors == {"KeyError": len(raised), "Overload": len(odd)}
    assert c["failed"] == len(raised) + len(odd)
    assert c["completed"] == 100 - c["failed"]
    assert any(m == "KeyError: 'boom'" for m in result.error_messages)
    assert any(m == "Overload: busy" for m in result.error_messages)


# ----------------------------------------------------- native fixed delay


def test_fixed_delay_sut_service_time_is_the_delay_and_latency_adds_up():
    # 300 qps: queries 3.3 ms apart, so the 2 ms delays never queue behind each other.
    s = settings(mode="constant", target_qps=300, query_count=150)
    result, _ = run_engine(s, loadgen.FixedDelaySUT(delay_us=2000))
    c = result.counts
    assert_counts_add_up(c)
    assert c["completed"] == 150
    svc, lat, delay = result.service_time, result.latency, result.issue_delay
    precision = svc.equivalent_value_range(2_000_000)  # 1024 ns at 3 significant figures
    # The completion thread waits until issued + 2 ms (spinning the last 100 us), so no
    # query completes early; the median is late only if over half the queries hit a
    # scheduling hiccup, hence 0.5 ms of slack for the noisy machine.
    assert svc.min >= 2_000_000 - precision
    assert 2_000_000 - precision <= svc.value_at_percentile(50) <= 2_500_000 + precision
    # latency = completed - scheduled = service time + issue delay, per query; only
    # histogram rounding (relative 2^-11 per value) separates the means.
    assert lat.total_count == svc.total_count == delay.total_count == 150
    assert abs(lat.mean - (svc.mean + delay.mean)) <= 0.01 * lat.mean + 2_000
    assert delay.min >= 0


def test_null_sut_completes_on_the_issue_thread_with_tiny_service_time():
    result, _ = run_engine(settings(mode="constant", target_qps=2000, query_count=200),
                           loadgen.NullSUT())
    assert result.counts["completed"] == 200
    # Completion happens right after issue on the same thread: microseconds. 5 ms for a
    # preemption of the issue thread between the two clock reads on the median query
    # would need half the queries to be preempted.
    assert result.service_time.value_at_percentile(50) < 5 * MS


# ------------------------------------------------------------------- trace


def test_trace_replay_schedules_at_the_recorded_offsets_exactly():
    offsets = np.array([0, 1, 1, 5, 20, 50, 51, 100, 150, 300], dtype=np.int64) * MS
    sut = Recorder()
    s = settings(mode="trace", trace_offsets_ns=offsets)
    result, eng = run_engine(s, sut)
    ids, _, scheduled, seen = sut.by_id()
    c = result.counts
    assert_counts_add_up(c)
    assert c["issued"] == c["completed"] == len(offsets)
    assert (np.diff(ids) > 0).all()  # ids are opaque but grow in issue order
    # Scheduled times are the run's start plus the offsets, to the ns.
    np.testing.assert_array_equal(scheduled - scheduled[0], offsets)
    np.testing.assert_array_equal(scheduled - eng._core.start_ns, offsets)
    # Nothing reaches the SUT before its time (on the same clock); lateness is allowed.
    assert (seen >= scheduled).all(), (seen - scheduled)
    assert result.issue_delay.min >= 0


def test_trace_from_text_file_in_ms(tmp_path):
    path = tmp_path / "arrivals.ms.txt"
    path.write_text("# a recorded trace\n0\n2.5\n\n10\n10\n40\n", encoding="utf-8")
    sut = Recorder()
    result, _ = run_engine(settings(mode="trace", trace_offsets_ns=str(path)), sut)
    _, _, scheduled, _ = sut.by_id()
    assert result.counts["issued"] == 5
    np.testing.assert_array_equal(scheduled - scheduled[0], [0, 2_500_000, 10 * MS, 10 * MS, 40 * MS])


def test_trace_with_query_count_stops_early():
    offsets = np.arange(100, dtype=np.int64) * MS
    result, _ = run_engine(settings(mode="trace", trace_offsets_ns=offsets, query_count=7),
                           loadgen.NullSUT())
    assert result.counts["issued"] == 7


# ------------------------------------------------------------- closed loop


@pytest.mark.parametrize("concurrency", [1, 4])
def test_closed_loop_never_exceeds_concurrency_in_flight(concurrency):
    sut = WorkerSUT(workers=concurrency, sleep_s=(0.0005, 0.002), seed=concurrency)
    s = settings(mode="closed", concurrency=concurrency, query_count=200)
    try:
        result, _ = run_engine(s, sut)
    finally:
        sut.close()
    c = result.counts
    assert_counts_add_up(c)
    assert c["issued"] == c["completed"] == sut.received == 200
    # The SUT's own count drops before complete(), so it bounds the true in-flight count.
    assert sut.max_outstanding <= concurrency
    # The engine keeps the SUT busy: it does reach N (the first N are issued together,
    # and each completion takes >= 0.5 ms, ample time to hand the next one over).
    assert sut.max_outstanding == concurrency


def test_closed_loop_latency_is_service_time_plus_the_dispatch_hop():
    # The control for the test below: without failures, each SingleStream query is due
    # when the previous one completed, so latency ~= service time (same 1 ms bound).
    s = settings(mode="closed", concurrency=1, query_count=60)
    result, _ = run_engine(s, lambda i: time.sleep(0.002))
    assert result.counts["completed"] == 60
    lat50 = result.latency.value_at_percentile(50)
    svc50 = result.service_time.value_at_percentile(50)
    assert svc50 <= lat50 < svc50 + 1 * MS, (lat50, svc50)


def test_closed_loop_query_after_a_failure_is_due_when_the_failure_freed_its_slot():
    # SingleStream: every query takes 2 ms; odd samples fail. Each completed query was
    # due when the failed one before it resolved, so its latency should be its own 2 ms
    # plus the dispatch hop (~0.1 ms), not 4 ms. The threshold (service p50 + 1 ms) sits
    # halfway; noise would have to delay over half the queries by 1 ms to cross it.
    def f(i):
        time.sleep(0.002)
        if i % 2 == 1:
            raise RuntimeError("odd sample")

    s = settings(mode="closed", concurrency=1, query_count=60, sample_count=10,
                 sample_order="sequential")
    result, _ = run_engine(s, f)
    assert_counts_add_up(result.counts)
    assert result.counts["completed"] == result.counts["failed"] == 30
    lat50 = result.latency.value_at_percentile(50)
    svc50 = result.service_time.value_at_percentile(50)
    assert lat50 < svc50 + 1 * MS, (lat50, svc50)


def test_single_stream_issues_the_next_query_only_after_a_completion():
    events = []
    lock = threading.Lock()
    busy = [0]

    def f(i):
        with lock:
            busy[0] += 1
            events.append(busy[0])
        time.sleep(0.0005)
        with lock:
            busy[0] -= 1

    result, _ = run_engine(settings(mode="closed", concurrency=1, query_count=100), f)
    assert result.counts["completed"] == 100
    assert max(events) == 1


@pytest.mark.parametrize(
    "mode_kw",
    [dict(mode="closed", concurrency=4), dict(mode="constant", target_qps=20_000, max_in_flight=4)],
    ids=["closed", "max_in_flight"],
)
def test_one_slow_query_does_not_stall_the_others(mode_kw):
    # Query 1 is held for 0.3 s; every other query completes at once. With 4 allowed in
    # flight, 3 keep cycling while query 1 is held. A Python round trip takes well under
    # 1 ms (thousands per second here), so by the time query 1 completes the other 199
    # are done; 100 leaves a 3 ms-per-query margin for a noisy machine.
    received = [0]
    at_release = []
    timers = []

    class OneSlow:
        def issue(self, batch):
            for qid in batch.ids.tolist():
                received[0] += 1
                if received[0] == 1:  # the first query is the slow one
                    def release(b=batch, slow_id=qid):
                        at_release.append(received[0])
                        b.complete_many([slow_id])

                    timers.append(threading.Timer(0.3, release))
                    timers[-1].start()
                else:
                    batch.complete_many([qid])

    s = settings(query_count=200, grace_s=5.0, **mode_kw)
    try:
        result, _ = run_engine(s, OneSlow())
    finally:
        for t in timers:
            t.join(5)
    assert_counts_add_up(result.counts)
    assert result.counts["completed"] == 200
    assert at_release and at_release[0] >= 100, at_release


# ----------------------------------------------------------- max_in_flight


def test_max_in_flight_cap_holds_and_waiting_counts_as_latency():
    # One worker, ~2 ms per query: ~500 qps at best, offered 2000 qps. The engine must
    # hold back queries at the cap; they wait, and latency (from the scheduled time)
    # grows while service time (from issue) stays bounded by cap * 2 ms.
    cap = 4
    sut = WorkerSUT(workers=1, sleep_s=(0.002, 0.002))
    s = settings(mode="constant", target_qps=2000, query_count=150, max_in_flight=cap, grace_s=10.0)
    try:
        result, _ = run_engine(s, sut)
    finally:
        sut.close()
    c = result.counts
    assert_counts_add_up(c)
    assert c["completed"] == 150
    assert sut.max_outstanding <= cap
    assert c["cap_waits"] > 0
    # Query k is scheduled at 0.5k ms but completes no sooner than 2(k+1) ms: latency
    # ~1.5k ms (median ~110 ms) versus service time <= ~4 x 2 ms (plus sleep overshoot,
    # which inflates both). A factor of 2 leaves a wide margin.
    lat50 = result.latency.value_at_percentile(50)
    svc50 = result.service_time.value_at_percentile(50)
    assert lat50 > 2 * svc50, (lat50, svc50)
    assert lat50 > 30 * MS


# ------------------------------------------------------------------ bounds


def test_query_count_bound_issues_exactly_that_many():
    result, _ = run_engine(settings(mode="poisson", target_qps=20_000, query_count=1234),
                           loadgen.NullSUT())
    assert result.counts["issued"] == result.counts["completed"] == 1234


def test_duration_bound_issues_about_rate_times_duration():
    result, _ = run_engine(settings(mode="constant", target_qps=1000, duration_s=0.5),
                           loadgen.NullSUT())
    # Arrivals at 0, 1, ..., 499 ms fall inside 0.5 s. The bound applies to scheduled
    # offsets, so this is exact up to the boundary arrival.
    assert abs(result.counts["issued"] - 500) <= 1
    assert_counts_add_up(result.counts)
    # The last arrival was at 499 ms (wall clock, never early).
    assert result.duration_s >= 0.499


def test_min_query_count_keeps_issuing_past_min_duration():
    result, _ = run_engine(
        settings(mode="constant", target_qps=2000, min_duration_s=0.05, min_query_count=400),
        loadgen.NullSUT())
    # 0.05 s would be 100 queries; the count minimum (400) is the one that binds.
    assert result.counts["issued"] == 400


def test_min_duration_keeps_issuing_past_min_query_count():
    result, _ = run_engine(
        settings(mode="constant", target_qps=1000, min_duration_s=0.25, min_query_count=10),
        loadgen.NullSUT())
    # Issues until the next arrival is at >= 0.25 s: arrivals 0..249 ms.
    assert abs(result.counts["issued"] - 250) <= 1
    assert result.duration_s >= 0.249


def test_duration_limit_still_stops_a_run_with_a_larger_minimum():
    result, _ = run_engine(
        settings(mode="constant", target_qps=1000, min_query_count=100_000, duration_s=0.2),
        loadgen.NullSUT())
    assert abs(result.counts["issued"] - 200) <= 1


def test_offline_issues_everything_at_once():
    sut = Recorder()
    result, eng = run_engine(settings(mode="offline", query_count=500), sut)
    _, _, scheduled, _ = sut.by_id()
    assert result.counts["issued"] == result.counts["completed"] == len(scheduled) == 500
    assert (scheduled == scheduled[0]).all()
    assert scheduled[0] == eng._core.start_ns


def test_offline_with_duration_bound_ends():
    s = settings(mode="offline", duration_s=0.2)
    with loadgen.Engine(s, loadgen.NullSUT()) as eng:  # aborts on exit if still running
        eng.start()
        # 0.2 s of issuing plus a NullSUT's instant completions: 2 s is ample.
        ended = eng.wait(2.0)
        counts = eng.counts()
    assert ended, f"still issuing after 2 s of a 0.2 s run ({counts['issued']} issued)"
    assert_counts_add_up(counts)


def test_stages_run_ends_by_itself_after_the_last_stage():
    result, _ = run_engine(settings(mode="stages", stages=[(0.2, 500, 500), (0.2, 0, 1000)]),
                           loadgen.NullSUT())
    # 0.2 s x 500 qps + the ramp's integral 0.2 x 500 = 200, within rounding at the edges.
    assert abs(result.counts["issued"] - 200) <= 2
    assert_counts_add_up(result.counts)


# --------------------------------------------------------- samples per query


@pytest.mark.parametrize("order", ["sequential", "shuffled", "random"])
def test_samples_per_query_gives_rows_that_follow_the_sample_order(order):
    spq, n, count, seed = 3, 40, 10, 17
    sut = Recorder()
    s = settings(mode="constant", target_qps=4000, query_count=n, samples_per_query=spq,
                 sample_count=count, sample_order=order, sample_seed=seed)
    result, _ = run_engine(s, sut)
    assert result.counts["completed"] == n
    _, samples, _, _ = sut.by_id()
    assert samples.shape == (n, spq)
    flat = samples.reshape(-1)
    if order == "sequential":
        np.testing.assert_array_equal(flat, np.arange(n * spq) % count)
    # Whatever the order, the engine draws from the same selector, spq per query.
    expected = _core.SampleSelector(count, getattr(_core.SampleOrder, order), seed).take(n * spq)
    np.testing.assert_array_equal(flat, expected)


def test_function_sut_gets_one_row_per_query_with_samples_per_query():
    rows = []
    s = settings(mode="constant", target_qps=4000, query_count=10, samples_per_query=4,
                 sample_count=100, sample_order="sequential")
    result, _ = run_engine(s, lambda row: rows.append(np.asarray(row).tolist()))
    assert result.counts["completed"] == 10
    assert rows == [[4 * k + j for j in range(4)] for k in range(10)]


def test_same_seeds_give_the_same_samples_and_schedule_in_two_runs():
    def once(sample_seed, schedule_seed):
        sut = Recorder()
        s = settings(mode="poisson", target_qps=4000, query_count=200, sample_count=1000,
                     sample_order="random", sample_seed=sample_seed, schedule_seed=schedule_seed)
        run_engine(s, sut)
        _, samples, scheduled, _ = sut.by_id()
        return samples, scheduled - scheduled[0]

    a_samples, a_sched = once(42, 7)
    b_samples, b_sched = once(42, 7)
    c_samples, c_sched = once(43, 8)
    np.testing.assert_array_equal(a_samples, b_samples)
    np.testing.assert_array_equal(a_sched, b_sched)
    # The schedule is the raw Poisson schedule with that seed.
    np.testing.assert_array_equal(a_sched, _core.ArrivalSchedule.poisson(4000.0, 7).take(200))
    assert np.mean(a_samples != c_samples) > 0.9
    assert not np.array_equal(a_sched, c_sched)


# --------------------------------------------------------- two engines at once


def test_two_engines_run_at_the_same_time_in_one_process():
    calls_a = []
    sut_b = Recorder()
    eng_a = loadgen.Engine(settings(mode="constant", target_qps=1000, query_count=300),
                           lambda i: calls_a.append(i))
    eng_b = loadgen.Engine(settings(mode="poisson", target_qps=600, query_count=150,
                                    schedule_seed=3), sut_b)
    eng_c = loadgen.Engine(settings(mode="constant", target_qps=800, query_count=200),
                           loadgen.FixedDelaySUT(1000))
    with eng_a, eng_b, eng_c:
        eng_a.start()
        eng_b.start()
        eng_c.start()
        assert eng_a.wait(20) and eng_b.wait(20) and eng_c.wait(20)
        ra, rb, rc = eng_a.result(), eng_b.result(), eng_c.result()
    for r, n in ((ra, 300), (rb, 150), (rc, 200)):
        assert_counts_add_up(r.counts)
        assert r.counts["issued"] == r.counts["completed"] == n
        assert r.counts["unknown_completions"] == 0
    # Each SUT saw exactly its own engine's queries.
    assert len(calls_a) == 300
    assert len(sut_b.ids) == len(set(sut_b.ids)) == 150
    # The runs overlapped: each took >= 0.25 s and they started together.
    assert ra.duration_s >= 0.29 and rb.duration_s > 0.1


# ------------------------------------------------------------------ asyncio


def test_async_sut_completes_everything_on_uvloop_when_installed():
    loops = set()

    async def f(i):
        loops.add(type(asyncio.get_running_loop()).__module__.split(".")[0])
        await asyncio.sleep(0.001)

    result, _ = run_engine(settings(mode="constant", target_qps=1000, query_count=200), f)
    c = result.counts
    assert_counts_add_up(c)
    assert c["completed"] == 200
    assert c["failed"] == 0
    assert loops == ({"uvloop"} if HAVE_UVLOOP else {"asyncio"})
    # (No lower bound on service time from the 1 ms sleep: uvloop's timers tick in
    # whole ms of a truncated clock, so sleep(0.001) may take well under 1 ms.)
    assert result.service_time.total_count == 200


def test_async_sut_exceptions_fail_those_queries():
    async def f(i):
        await asyncio.sleep(0.0005)
        if i % 4 == 1:
            raise RuntimeError(f"async failure on {i}")

    s = settings(mode="constant", target_qps=2000, query_count=80, sample_count=8,
                 sample_order="sequential")
    result, _ = run_engine(s, f)
    c = result.counts
    assert_counts_add_up(c)
    assert c["failed"] == 20
    assert c["completed"] == 60
    assert result.errors == {"RuntimeError": 20}
    assert all(m.startswith("RuntimeError: async failure on ") for m in result.error_messages)
    assert 1 <= len(result.error_messages) <= 10


def test_async_sut_many_concurrent_coroutines():
    # Offline: all 300 at once, each sleeping 20 ms concurrently on one loop.
    async def f(i):
        await asyncio.sleep(0.02)

    t0 = time.monotonic()
    result, _ = run_engine(settings(mode="offline", query_count=300), f)
    assert result.counts["completed"] == 300
    # Concurrent, not serial (serial would be 6 s); generous for a noisy machine.
    assert time.monotonic() - t0 < 3.0


# ------------------------------------------------------- unknown completions


def test_duplicate_and_bogus_completions_are_counted_never_fatal():
    returns = {"first": 0, "second": 0, "bogus": 0, "fail_after": 0}
    batches = [0]

    class Dup:
        def issue(self, batch):
            batches[0] += 1
            returns["first"] += batch.complete()
            returns["second"] += batch.complete()  # every id again: all duplicates
            returns["bogus"] += batch.complete_many([0, -1, 10**12, 123_456_789])
            returns["fail_after"] += batch.fail(kind="late", message="after completion")

    s = settings(mode="constant", target_qps=2000, query_count=100)
    result, eng = run_engine(s, Dup())
    c = result.counts
    assert_counts_add_up(c)
    assert c["completed"] == returns["first"] == 100
    assert returns["second"] == returns["bogus"] == returns["fail_after"] == 0
    # The second complete() of each id is a duplicate; fail() with no ids after the
    # batch is complete has nothing left to fail; the 4 ids never issued are unknown.
    assert c["duplicate_completions"] == 100
    assert c["unknown_completions"] == 4 * batches[0]
    assert c["failed"] == 0
    assert result.errors == {}
    # Completing after the run is over is also just counted.
    before = eng.counts()["unknown_completions"]
    assert eng._core.complete(1) is False
    assert eng.counts()["unknown_completions"] == before + 1


def test_bogus_huge_id_does_not_complete_a_real_query():
    alias_returns = []

    class Alias:
        def issue(self, batch):
            for qid in batch.ids.tolist():
                alias_returns.append(batch.complete_many([qid + 2**61]))
            batch.complete()

    result, _ = run_engine(settings(mode="constant", target_qps=2000, query_count=20), Alias())
    assert sum(alias_returns) == 0
    assert result.counts["completed"] == 20


# -------------------------------------------------------------------- tokens


def test_token_api_records_ttft_and_tpot_per_query_and_counts_tokens():
    class Streamer:
        engine = None
        tokens = 0

        k = 0

        def issue(self, batch):
            core = self.engine._core
            for qid in batch.ids.tolist():
                assert core.first_token(qid)
                assert not core.first_token(qid)  # once per query
                time.sleep(0.0002)
                self.k += 1
                n = 2 + self.k % 5
                self.tokens += n
                assert core.complete(qid, 0, n)

    sut = Streamer()
    s = settings(mode="constant", target_qps=1000, query_count=50)
    with loadgen.Engine(s, sut) as eng:
        sut.engine = eng
        eng.start()
        assert eng.wait(20)
        result = eng.result()
    c = result.counts
    assert_counts_add_up(c)
    assert c["completed"] == 50
    assert result.ttft.total_count == 50
    assert result.tpot.total_count == 50
    assert c["tokens"] == sut.tokens == sum(2 + q % 5 for q in range(1, 51))
    # First token comes before completion: ttft <= latency; tpot = (end - first) / (n - 1)
    # with >= 0.2 ms between first token and end and n <= 6, so tpot >= 40 us.
    assert result.ttft.max <= result.latency.max
    assert result.tpot.min >= 40_000 - result.tpot.equivalent_value_range(40_000)


def test_first_token_of_unknown_id_is_refused():
    class S:
        engine = None
        answers = []

        def issue(self, batch):
            core = self.engine._core
            self.answers.append(core.first_token(10**9))
            self.answers.append(core.first_token(0))
            batch.complete()

    sut = S()
    with loadgen.Engine(settings(mode="constant", target_qps=1000, query_count=5), sut) as eng:
        sut.engine = eng
        eng.start()
        assert eng.wait(20)
        result = eng.result()
    assert not any(sut.answers)
    assert result.ttft.total_count == 0
    assert result.counts["completed"] == 5


# ---------------------------------------------------------------- timeseries


def test_timeseries_intervals_cover_the_run_and_sum_to_the_counts():
    s = settings(mode="constant", target_qps=500, duration_s=1.0, interval_s=0.2)
    result, _ = run_engine(s, loadgen.NullSUT())
    ts = result.timeseries
    c = result.counts
    assert_counts_add_up(c)
    # 1 s / 0.2 s = 5 intervals, plus possibly a short final one at the end.
    assert 4 <= len(ts) <= 7, [p["length_ns"] for p in ts]
    assert sum(p["completed"] for p in ts) == c["completed"] == 500
    assert sum(p["issued"] for p in ts) == c["issued"]
    starts = [p["start_offset_ns"] for p in ts]
    assert starts[0] == 0
    # Intervals are contiguous: each starts where the previous ended.
    for prev, nxt in zip(ts, ts[1:]):
        assert nxt["start_offset_ns"] == prev["start_offset_ns"] + prev["length_ns"]
    # Full intervals carry their share: 0.2 s x 500 qps = 100, give or take a wake-up
    # delay of the monitor thread (50 ms of noise = 25 queries).
    for p in ts[:4]:
        assert abs(p["completed"] - 100) <= 40, [q["completed"] for q in ts]
        assert p["latency_p50_ns"] <= p["latency_p99_ns"] <= p["latency_max_ns"]
        h = loadgen.Histogram.decode_compressed(p["latency_hdr"])
        assert h.total_count == p["completed"]


def test_no_timeseries_when_interval_is_zero():
    result, _ = run_engine(settings(mode="constant", target_qps=1000, query_count=50, interval_s=0),
                           loadgen.NullSUT())
    assert result.timeseries == []


# ------------------------------------------------------------- bad settings


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(mode="constant", target_qps=-5, query_count=10), "target_qps"),
        (dict(mode="constant", target_qps=0, query_count=10), "target_qps"),
        (dict(mode="constant", target_qps=float("nan"), query_count=10), "target_qps"),
        (dict(mode="poisson", target_qps=None, query_count=10), "target_qps"),
        (dict(mode="poisson", target_qps=100), "duration_s"),
        (dict(mode="constant", target_qps=100), "query_count"),
        (dict(mode="closed", concurrency=0, query_count=10), "concurrency"),
        (dict(mode="closed", concurrency=-2, query_count=10), "concurrency"),
        (dict(mode="bogus", target_qps=100, query_count=10), "mode"),
        (dict(mode="constant", target_qps=100, query_count=10, sample_order="bogus"), "sample_order"),
        (dict(mode="stages", stages=[]), "stages"),
        (dict(mode="stages", stages=[(0, 10, 10)]), "stages"),
        (dict(mode="stages", stages=[(1.0, -5, 10)]), "stages"),
        (dict(mode="stages", stages=[(1.0, 0, 0)]), "stages"),
        (dict(mode="stages", stages=[(1.0, 10)]), "stages"),
        (dict(mode="trace", trace_offsets_ns=None), "trace_offsets_ns"),
        (dict(mode="trace", trace_offsets_ns=[0, 5, 3]), "trace_offsets_ns"),
        (dict(mode="trace", trace_offsets_ns=[-1, 5]), "trace_offsets_ns"),
        (dict(mode="constant", target_qps=100, query_count=0), "query_count"),
        (dict(mode="constant", target_qps=100, duration_s=-1), "duration_s"),
        (dict(mode="constant", target_qps=100, query_count=10, max_in_flight=-1), "max_in_flight"),
        (dict(mode="constant", target_qps=100, query_count=10, timeout_ms=0), "timeout_ms"),
        (dict(mode="constant", target_qps=100, query_count=10, samples_per_query=0), "samples_per_query"),
        (dict(mode="constant", target_qps=100, query_count=10, sample_count=0), "sample_count"),
        (dict(mode="constant", target_qps=100, query_count=10, significant_figures=6), "significant_figures"),
        (dict(mode="constant", target_qps=100, query_count=10, schedule_seed=-1), "schedule_seed"),
        (dict(mode="constant", target_qps=100, query_count=10, grace_s=-1), "grace_s"),
    ],
)
def test_bad_settings_raise_value_error_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        loadgen.Engine(EngineSettings(**kw), loadgen.NullSUT())
    with pytest.raises(ValueError, match=field):
        loadgen.run(EngineSettings(**kw))


@pytest.mark.parametrize("bad_sut", [42, "model", 3.5, None, [1, 2]])
def test_unknown_sut_type_raises_value_error_naming_sut(bad_sut):
    with pytest.raises(ValueError, match="sut"):
        loadgen.Engine(EngineSettings(mode="constant", target_qps=100, query_count=10), bad_sut)


def test_negative_fixed_delay_is_rejected():
    with pytest.raises(ValueError, match="delay_us"):
        loadgen.FixedDelaySUT(-1)


def test_pin_cpus_with_an_unusable_cpu_is_refused_before_and_during_the_run():
    assert 4096 not in _core.allowed_cpus()
    s = settings(mode="constant", target_qps=100, query_count=10, pin_cpus=[4096])
    # The Python layer refuses it up front, naming the field...
    with pytest.raises(ValueError, match="pin_cpus: CPU 4096"):
        loadgen.Engine(s, loadgen.NullSUT())
    with pytest.raises(ValueError, match="pin_cpus"):
        loadgen.run(s)
    # ...and the native engine, given it anyway, ends the run with the error recorded
    # and nothing issued.
    core_settings = settings(mode="constant", target_qps=100, query_count=10).to_core("null", None)
    core_settings.pin_cpus = [4096]
    eng = _core.Engine(core_settings)
    eng.start()
    assert eng.wait(10)
    assert "pin_cpus" in eng.run_error
    assert eng.counts()["issued"] == 0


def test_pin_cpus_to_an_allowed_cpu_runs():
    cpu = _core.allowed_cpus()[0]
    result, _ = run_engine(settings(mode="constant", target_qps=2000, query_count=50, pin_cpus=[cpu]),
                           loadgen.NullSUT())
    assert result.counts["completed"] == 50


def test_an_engine_runs_once():
    with loadgen.Engine(settings(mode="constant", target_qps=2000, query_count=5), loadgen.NullSUT()) as eng:
        eng.start()
        assert eng.wait(10)
        with pytest.raises(RuntimeError):
            eng._core.start()


# ------------------------------------------------------------ inline dispatch


def test_inline_dispatch_replays_a_trace_at_its_offsets_on_the_consumer_thread():
    offsets = np.array([0, 1, 1, 5, 20, 50, 51, 100], dtype=np.int64) * MS
    sut = Recorder()
    result, eng = run_engine(settings(mode="trace", trace_offsets_ns=offsets, inline_dispatch=True), sut)
    ids, _, scheduled, seen = sut.by_id()
    assert_counts_add_up(result.counts)
    assert result.counts["completed"] == len(offsets)
    np.testing.assert_array_equal(scheduled - eng._core.start_ns, offsets)
    assert (seen >= scheduled).all()  # never early; lateness allowed
    assert eng._core.inline_issue


def test_inline_dispatch_holds_the_in_flight_cap_and_counts_the_waits():
    class Slow:
        """Completes each query 5 ms later from a timer thread, tracking its in-flight."""

        def __init__(self):
            self.lock = threading.Lock()
            self.out = 0
            self.max_out = 0
            self.timers = []

        def issue(self, batch):
            with self.lock:
                self.out += len(batch)
                self.max_out = max(self.max_out, self.out)

            def done(b=batch):
                with self.lock:
                    self.out -= len(b)
                b.complete()

            t = threading.Timer(0.005, done)
            self.timers.append(t)
            t.start()

    sut = Slow()
    # 2000 qps into 3 slots of 5 ms each (at most ~600 qps): the cap must bind.
    s = settings(mode="constant", target_qps=2000, query_count=60, max_in_flight=3,
                 inline_dispatch=True, grace_s=5.0)
    result, _ = run_engine(s, sut)
    for t in sut.timers:
        t.join(5)
    assert_counts_add_up(result.counts)
    assert result.counts["completed"] == 60
    assert sut.max_out <= 3
    assert result.counts["cap_waits"] > 0
    # Waiting for the cap is latency: p50 latency is well above the 5 ms service time.
    assert result.latency.value_at_percentile(50) > 2 * result.service_time.value_at_percentile(50)


def test_inline_dispatch_function_sut_and_stop_end_cleanly():
    calls = []
    eng = loadgen.Engine(settings(mode="poisson", target_qps=5000, duration_s=30,
                                  inline_dispatch=True), calls.append)
    with eng:
        eng.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        eng.stop()
        assert eng.wait(10)
        assert time.monotonic() - t0 < 3.0  # stops promptly, not after 30 s
        result = eng.result()
    assert_counts_add_up(result.counts)
    assert result.counts["completed"] == len(calls) > 100


@pytest.mark.parametrize("sut", [loadgen.NullSUT(), loadgen.FixedDelaySUT(10)], ids=["null", "sleep"])
def test_inline_dispatch_needs_a_python_sut(sut):
    with pytest.raises(ValueError, match="inline_dispatch"):
        loadgen.Engine(settings(mode="constant", target_qps=100, query_count=5, inline_dispatch=True), sut)


def test_inline_dispatch_is_refused_for_async_suts():
    async def f(sample):
        return None

    with pytest.raises(ValueError, match="inline_dispatch"):
        loadgen.Engine(settings(mode="constant", target_qps=100, query_count=5, inline_dispatch=True), f)


# ------------------------------------------------- regressions from a code review


def test_closed_loop_async_sut_keeps_going_after_a_failure():
    # Inline closed loop is driven by completions; a failure frees a slot too, and the
    # async driver must hear of it (it waits on the engine's eventfd).
    calls = [0]

    async def f(sample):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("third call fails")

    s = settings(mode="closed", concurrency=1, duration_s=0.3)
    result, _ = run_engine(s, f, wait_s=10)
    c = result.counts
    assert_counts_add_up(c)
    assert c["failed"] == 1
    assert c["completed"] > 10  # the loop went on after the failure


def test_duration_limit_ends_a_run_stuck_waiting_for_the_cap():
    class Never:
        def issue(self, batch):
            pass  # never completes

    s = settings(mode="constant", target_qps=1000, duration_s=0.3, max_in_flight=2, grace_s=0.2)
    t0 = time.monotonic()
    result, _ = run_engine(s, Never(), wait_s=10)
    # Ends at ~0.3 s + 0.2 s grace; 3 s is far above that and far below a hang.
    assert time.monotonic() - t0 < 3.0
    c = result.counts
    assert_counts_add_up(c)
    assert c["issued"] == 2 and c["cancelled"] == 2


def test_wait_does_not_hang_on_a_sut_call_that_outlives_its_timeout():
    def slow(sample):
        time.sleep(3.0)

    s = settings(mode="constant", target_qps=1000, query_count=3, timeout_ms=50, grace_s=0.2)
    t0 = time.monotonic()
    with loadgen.Engine(s, slow) as eng:
        eng.start()
        assert eng.wait(10)
        elapsed = time.monotonic() - t0
        result = eng.result()
    # The native run ends after ~0.1 s (every query timed out); wait() gives the stuck
    # call a second, not its whole 3 s.
    assert elapsed < 2.5
    assert result.counts["timed_out"] >= 1
    assert_counts_add_up(result.counts)


def test_fixed_delay_sut_with_timeouts_still_completes_the_rest_on_time():
    # Timed-out queries free their slots; the completion thread must take due times
    # from its own queue, not from a slot that may have been reused.
    s = settings(mode="constant", target_qps=2000, query_count=400, timeout_ms=2, grace_s=1.0)
    result, _ = run_engine(s, loadgen.FixedDelaySUT(5000))
    c = result.counts
    assert_counts_add_up(c)
    assert c["timed_out"] == 400  # 5 ms service against a 2 ms timeout
    assert c["unknown_completions"] == 0


class StampedSUT:
    """Batched SUT that completes each query at once, stamped `after_ns` past its
    scheduled time (a time the clock may not have reached yet)."""

    def __init__(self, after_ns):
        self.after_ns = after_ns

    def issue(self, batch):
        batch.complete_many(batch.ids, batch.scheduled_ns + self.after_ns)


@pytest.mark.parametrize("after_ms,timed_out", [(60, True), (40, False)])
def test_an_answer_stamped_past_its_deadline_is_timed_out_before_the_reaper_looks(after_ms, timed_out):
    # The deadline is the scheduled time plus the timeout, whoever sees the answer first:
    # here the answer arrives before the monitor thread could reap it.
    s = settings(mode="constant", target_qps=1000, query_count=50, timeout_ms=50, grace_s=1.0)
    result, _ = run_engine(s, StampedSUT(after_ms * 1_000_000))
    c = result.counts
    assert_counts_add_up(c)
    assert (c["timed_out"], c["completed"]) == ((50, 0) if timed_out else (0, 50))
