"""Python SUTs that misbehave: raising SystemExit or KeyboardInterrupt, failing with huge
messages and kinds full of control characters, and sync functions under a closed loop.

Integration tests start the CLI as a subprocess (``python -m loadgen``), bounded in time,
and read what it wrote; the rest drive :class:`loadgen.engine.Engine` in process. Runs are
short: the test machine has two noisy cores.

The tests that start processes or servers are in tests/integration/test_hardening_sut.py.
"""

from __future__ import annotations

import signal
import threading
import time

import numpy as np

from loadgen.engine import EngineSettings
from loadgen.engine.engine import Engine
from loadgen.sut.forms import Batch

# ------------------------------------------------------------------ row 12: SystemExit


# ------------------------------------------------------------- row 12: KeyboardInterrupt


def _interrupting_function(at: int):
    n = {"i": 0}

    def f(sample: int) -> None:
        n["i"] += 1
        if n["i"] == at:
            raise KeyboardInterrupt

    return f


def test_sut_keyboard_interrupt_reaches_the_main_threads_sigint_handler_once():
    calls = []
    engine = Engine(EngineSettings(mode="constant", target_qps=500, duration_s=30, spin_us=0),
                    _interrupting_function(10))

    def handler(signum, frame):
        calls.append(signum)
        engine.stop()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        with engine:
            engine.start()
            assert engine.wait(10.0)  # stopped by the handler, not after 30 s
            result = engine.result()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert calls == [signal.SIGINT]
    assert result.interrupted is True
    assert result.errors == {"KeyboardInterrupt": 1}
    assert result.counts["completed"] >= 9


def test_sut_keyboard_interrupt_stops_the_run_where_ctrl_c_is_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with Engine(EngineSettings(mode="constant", target_qps=500, duration_s=30, spin_us=0),
                    _interrupting_function(10)) as engine:
            engine.start()
            assert engine.wait(10.0)
            result = engine.result()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.interrupted is True
    assert result.errors == {"KeyboardInterrupt": 1}
    assert result.counts["issued"] < 100


# ------------------------------------------------ row 13: huge messages, control characters


def _failing_batched_run(kind: str, message: str, count: int = 40):
    class Failing:
        def issue(self, batch: Batch) -> None:
            for qid in batch.ids.tolist():
                batch.fail([qid], kind=kind, message=message)

    settings = EngineSettings(mode="constant", target_qps=4000, query_count=count, spin_us=0)
    with Engine(settings, Failing()) as engine:
        return engine.run()


def test_engine_cleans_error_kinds_to_short_printable_identifiers():
    cases = {
        "ValueError": "ValueError",
        "http_500": "http_500",
        "grpc_UNAVAILABLE": "grpc_UNAVAILABLE",
        "a b\x00c\n": "a_b_c",
        "_private.Kind-1:x": "_private.Kind-1:x",
        "\x00" * 10: "error",
        "": "error",
        "k" * 500: "k" * 64,
        "caf\u00e9 au lait": "caf_au_lait",
    }
    for given, want in cases.items():
        result = _failing_batched_run(given, "m", count=2)
        assert result.errors == {want: 2}, (given, result.errors)


def test_engine_cuts_long_messages_on_a_character_boundary_and_says_how_much():
    result = _failing_batched_run("Big", "\u00e9" * 100_000, count=3)
    for m in result.error_messages:
        assert m.startswith("Big: \u00e9\u00e9")
        assert m.endswith(" ... (199500 more bytes cut)"), m[-60:]
        assert len(m.encode()) < 600


def test_engine_replaces_control_characters_in_messages_but_keeps_text():
    result = _failing_batched_run("E", "line one\nline\ttwo\x00\x1b[31mred\x7f", count=1)
    assert result.error_messages == ["E: line one line two  [31mred "]


def test_engine_keeps_messages_that_are_not_valid_utf8_readable():
    # A lone surrogate cannot be encoded as UTF-8; the query fails all the same.
    result = _failing_batched_run("E", "bad \ud800 half", count=2)
    assert result.counts["failed"] == 2 and result.errors == {"E": 2}
    assert result.error_messages[0].startswith("E: bad ")


def test_engine_keeps_the_first_message_of_every_kind_beyond_the_overall_cap():
    n = {"i": 0}

    class Mixed:
        def issue(self, batch: Batch) -> None:
            for qid in batch.ids.tolist():
                n["i"] += 1
                kind = "Common" if n["i"] <= 30 else f"Rare{n['i'] - 30}"
                batch.fail([qid], kind=kind, message=str(n["i"]))

    settings = EngineSettings(mode="constant", target_qps=4000, query_count=36, spin_us=0, batch_max=1)
    with Engine(settings, Mixed()) as engine:
        result = engine.run()
    assert result.error_messages[:10] == [f"Common: {i}" for i in range(1, 11)]
    assert result.error_messages[10:] == [f"Rare{i}: {30 + i}" for i in range(1, 7)]


def test_exception_whose_str_raises_still_fails_only_its_query():
    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    def f(sample: int) -> None:
        raise Nasty()

    settings = EngineSettings(mode="constant", target_qps=2000, query_count=20, spin_us=0)
    with Engine(settings, f) as engine:
        result = engine.run()
    assert result.counts["failed"] == 20 and result.errors == {"Nasty": 20}


# --------------------------------------------- row 15: sync functions in a closed loop


def _overlap_probe(service_s: float):
    lock = threading.Lock()
    state = {"now": 0, "max": 0}

    def f(sample: int) -> None:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(service_s)
        with lock:
            state["now"] -= 1

    return f, state


def test_sync_function_sut_runs_concurrency_queries_at_once_in_a_closed_loop():
    f, state = _overlap_probe(0.2)
    settings = EngineSettings(mode="closed", concurrency=4, query_count=8, spin_us=0)
    started = time.monotonic()
    with Engine(settings, f) as engine:
        result = engine.run()
    elapsed_s = time.monotonic() - started
    assert state["max"] == 4
    assert result.counts["completed"] == 8
    assert elapsed_s < 1.2  # two rounds of 0.2 s, not eight
    # Each query is due when a slot frees up and runs at once: its latency is its own
    # service time, never the wait behind the other three.
    assert result.latency.min >= 0.19e9
    assert result.latency.max < 0.35e9
    assert result.issue_delay.max < 0.05e9


def test_sync_function_pool_keeps_exactly_once_accounting_with_failures_and_timeouts():
    n = {"i": 0}
    lock = threading.Lock()

    def f(sample: int) -> None:
        with lock:
            n["i"] += 1
            i = n["i"]
        if i % 5 == 0:
            raise ValueError(f"query {i}")
        time.sleep(0.08 if i % 7 == 0 else 0.002)

    settings = EngineSettings(mode="closed", concurrency=6, query_count=300, spin_us=0, timeout_ms=50)
    with Engine(settings, f) as engine:
        result = engine.run()
    c = result.counts
    assert c["issued"] == 300
    assert c["issued"] == c["completed"] + c["failed"] + c["timed_out"] + c["cancelled"]
    assert c["failed"] == 60 and result.errors == {"ValueError": 60}
    assert c["timed_out"] > 0


def test_sync_function_pool_with_several_samples_per_query():
    seen = []
    lock = threading.Lock()

    def f(samples: np.ndarray) -> None:
        with lock:
            seen.append(len(samples))
        time.sleep(0.01)

    settings = EngineSettings(mode="closed", concurrency=4, query_count=40, samples_per_query=3, spin_us=0)
    with Engine(settings, f) as engine:
        result = engine.run()
    assert result.counts["completed"] == 40 and set(seen) == {3}


