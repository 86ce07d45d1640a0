"""Counts a hostile SUT or server cannot corrupt: token counts past any real answer's
(a streamed ``usage.completion_tokens`` of 2**63, ``complete_one(n_tokens=2**63 - 1)``)
fail their query instead of wrapping the run's totals; completions of queries already
resolved or never issued are counted apart and make the run invalid; a server that
streams blank lines forever loses its connection at the query's timeout.

The servers are threads in this process on 127.0.0.1 (tests/helpers.py's
``_Server``); loadgen runs as a subprocess bounded in time, or in process for the
Python API.
"""

from __future__ import annotations

import json
import socket
import textwrap
import threading
import time
from pathlib import Path
from typing import Dict, List

import pytest

from loadgen import _core
from loadgen.engine import EngineSettings
from loadgen.engine.engine import Engine
from loadgen.sut.forms import Batch
from tests.helpers import net_client_engine, run_cli, _send, _Server

MAX_TOKENS = 2**31 - 1



def _models(path: str, sock: socket.socket) -> bool:
    return _send(sock, 200, json.dumps({"data": [{"id": "m"}]}).encode())


# ------------------------------------------- a streamed usage.completion_tokens of 2**63

def _stream(events: List[bytes]) -> bytes:
    body = b"".join(b"data: %s\n\n" % e for e in events) + b"data: [DONE]\n\n"
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


def _usage_route(bad_count: int):
    """Streams of one token and a usage of 5 tokens, every other one with a usage of
    ``bad_count`` instead."""
    lock, served = threading.Lock(), [0]

    def route(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
        if path == "/v1/models":
            return _models(path, sock)
        with lock:
            served[0] += 1
            n = bad_count if served[0] % 2 else 5
        sock.sendall(_stream([b'{"choices":[{"index":0,"text":"hi"}]}',
                              b'{"choices":[],"usage":{"completion_tokens":%d}}' % n]))
        return True
    return route


@pytest.mark.integration
@pytest.mark.parametrize("bad_count", [2**63, 2**64 + 7, -5])
def test_a_streamed_token_count_out_of_range_fails_that_query_and_the_run_goes_on(tmp_path, bad_count):
    # Before: the native client clamped 2**63 to 2**63 - 1 and summed it; counts.tokens
    # wrapped negative, the run was VALID, and `loadgen report` rejected the result.
    server = _Server(_usage_route(bad_count))
    try:
        out = tmp_path / "out"
        proc = run_cli("run", "--sut", f"openai+http://127.0.0.1:{server.port}/v1/completions", "--model", "m",
                       "--http-engine", "native", "--scenario", "constant", "--target-qps", "20",
                       "--duration-s", "1", "--max-issue-delay-ms", "1000", "--max-error-rate", "1",
                       "--output", out, "--quiet")
    finally:
        server.stop()
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads((out / "result.json").read_text())
    c = doc["counts"]
    assert doc["network"]["http_engine"] == "native"
    assert c["completed"] >= 5 and c["failed"] >= 5 and c["completed"] + c["failed"] == c["issued"], c
    assert c["tokens"] == 5 * c["completed"], c  # only the good answers' counts
    assert doc["errors"]["counts"] == {"invalid_response": c["failed"]}
    assert f"usage.completion_tokens {bad_count} is out of range (0 to {MAX_TOKENS})" in doc["errors"]["messages"][0]
    report = run_cli("report", out / "result.json", timeout=60)
    assert report.returncode == 0, report.stderr


# ------------------------------------------------------ complete_one(n_tokens=2**63 - 1)

@pytest.mark.parametrize("bad", [2**63 - 1, 2**63, 2**64, MAX_TOKENS + 1, -2, -(2**63)])
def test_complete_one_with_a_token_count_out_of_range_fails_that_query_and_totals_never_wrap(bad):
    class Counting:
        def issue(self, batch: Batch) -> None:
            for qid in batch.ids.tolist():
                # Every other query with the bad count; the engine refuses it.
                assert batch.complete_one(qid, n_tokens=bad if qid % 2 else 3) is not bool(qid % 2)

    settings = EngineSettings(mode="constant", target_qps=2000, query_count=40, spin_us=0)
    with Engine(settings, Counting()) as engine:
        r = engine.run()
    c = r.counts
    assert c["completed"] + c["failed"] == c["issued"] == 40 and c["failed"] >= 1 and c["completed"] >= 1, c
    assert c["tokens"] == 3 * c["completed"], c
    assert r.errors == {"invalid_token_count": c["failed"]}
    assert r.error_messages[0] == (f"invalid_token_count: n_tokens {bad} is out of range (-1: not known, "
                                   f"or 0 to {MAX_TOKENS})")
    assert c["unknown_completions"] == c["duplicate_completions"] == 0


def test_the_largest_token_count_is_recorded():
    class Largest:
        def issue(self, batch: Batch) -> None:
            for qid in batch.ids.tolist():
                batch.complete_one(qid, n_tokens=MAX_TOKENS)

    with Engine(EngineSettings(mode="constant", target_qps=2000, query_count=10, spin_us=0), Largest()) as engine:
        r = engine.run()
    assert r.counts["completed"] == 10 and r.counts["tokens"] == 10 * MAX_TOKENS and not r.errors


# ------------------------------------------------------ endless blank lines in a stream

def _blank_lines_route(log: Dict[str, List[float]]):
    """Answers each stream with a head, then blank lines as fast as two threads can write
    them, until the client closes the connection (or 60 s pass); logs when each request
    came and when its connection was found closed."""
    def route(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
        if path == "/v1/models":
            return _models(path, sock)
        log["requests"].append(time.monotonic())
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        deadline = time.monotonic() + 60
        closed = threading.Event()

        def pour() -> None:
            try:
                while time.monotonic() < deadline and not closed.is_set():
                    sock.sendall(b"\n" * (4 << 20))
            except OSError:
                pass
            closed.set()

        helper = threading.Thread(target=pour, daemon=True)
        helper.start()
        pour()
        helper.join(70)
        log["closed"].append(time.monotonic())
        return False
    return route


@pytest.mark.integration
def test_endless_blank_lines_lose_their_connection_at_the_timeout(tmp_path):
    # Before: the I/O thread read the endless stream without a pause, its timeout scan
    # never ran; the timeout was counted, the connection never closed, and a 1-s run
    # exited after 28-49 s.
    log: Dict[str, List[float]] = {"requests": [], "closed": []}
    server = _Server(_blank_lines_route(log))
    try:
        start = time.monotonic()
        proc = run_cli("run", "--json", "--sut", f"openai+http://127.0.0.1:{server.port}/v1/completions",
                       "--model", "m", "--http-engine", "native", "--timeout-ms", "3000", "--scenario", "constant",
                       "--target-qps", "2", "--duration-s", "1", "--max-issue-delay-ms", "1000", timeout=120)
        took = time.monotonic() - start
        settle = time.monotonic() + 10
        while len(log["closed"]) < len(log["requests"]) and time.monotonic() < settle:
            time.sleep(0.05)
    finally:
        server.stop()
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    c = doc["counts"]
    assert c["issued"] >= 1 and c["timed_out"] == c["issued"], c
    assert doc["network"]["native"]["closed_by_timeout"] == c["issued"]
    # Each connection went at its 3-s timeout (generous bounds: two busy cores).
    assert len(log["closed"]) == len(log["requests"]) == c["issued"]
    for asked, closed in zip(sorted(log["requests"]), sorted(log["closed"])):
        assert closed - asked < 7.0, log
    assert took < 15.0, f"a 1-s run with a 3-s timeout took {took:.1f} s"


# ------------------------------------------- completions of queries not in flight

STRAY_SRC = """
import threading
import time

from loadgen.sut.forms import CallbackSUT


class Twice(CallbackSUT):
    '''Completes every query twice.'''

    def open(self, sink):
        self.sink = sink

    def issue_query(self, query_id, sample_index, scheduled_ns):
        t = time.monotonic_ns()
        self.sink.complete(query_id, t)
        self.sink.complete(query_id, t)


class Strangers(CallbackSUT):
    '''Completes every query, then 100 ids it was never given.'''

    def open(self, sink):
        self.sink = sink
        self.next = 1 << 58

    def issue_query(self, query_id, sample_index, scheduled_ns):
        self.sink.complete(query_id, time.monotonic_ns())
        for _ in range(100):
            self.next += 1
            self.sink.complete(self.next, time.monotonic_ns())


class Late(CallbackSUT):
    '''Completes every query 150 ms after it came: after a 100-ms timeout.'''

    def open(self, sink):
        self.sink = sink

    def issue_query(self, query_id, sample_index, scheduled_ns):
        threading.Timer(0.15, lambda: self.sink.complete(query_id, time.monotonic_ns())).start()


class CompletesThenRaises:
    '''Completes its batch, then raises: the engine fails what of it is still in flight.'''

    def issue(self, batch):
        batch.complete()
        raise RuntimeError("boom")


twice, strangers, late, raising = Twice(), Strangers(), Late(), CompletesThenRaises()
"""


def _stray_run(tmp_path: Path, attr: str, *args: object, qps: int = 100) -> dict:
    sut = tmp_path / "stray_sut.py"
    sut.write_text(textwrap.dedent(STRAY_SRC))
    out = tmp_path / attr
    proc = run_cli("run", "--scenario", "constant", "--target-qps", qps, "--query-count", "25",
                   "--sut", f"python:{sut}:{attr}", "--max-issue-delay-ms", "1000", "--output", out, "--quiet",
                   *args)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads((out / "result.json").read_text())
    doc["summary"] = (out / "summary.txt").read_text()
    return doc


@pytest.mark.integration
def test_a_sut_completing_every_query_twice_is_counted_and_the_run_invalid(tmp_path):
    doc = _stray_run(tmp_path, "twice")
    c = doc["counts"]
    assert c["issued"] == c["completed"] == 25 and c["failed"] == 0, c
    assert c["duplicate_completions"] == 25 and c["unknown_completions"] == 0, c
    assert doc["valid"] is False
    assert any("25 duplicate completions" in r for r in doc["invalid_reasons"]), doc["invalid_reasons"]
    assert "25 duplicate" in doc["summary"] and "INVALID" in doc["summary"]


@pytest.mark.integration
def test_a_sut_completing_ids_it_was_never_given_is_counted_and_the_run_invalid(tmp_path):
    doc = _stray_run(tmp_path, "strangers")
    c = doc["counts"]
    assert c["issued"] == c["completed"] == 25, c
    assert c["unknown_completions"] == 2500 and c["duplicate_completions"] == 0, c
    assert doc["valid"] is False
    assert any("2,500 unknown completions" in r for r in doc["invalid_reasons"]), doc["invalid_reasons"]
    assert "2,500 unknown" in doc["summary"]


@pytest.mark.integration
def test_completions_after_the_timeout_are_late_not_duplicates(tmp_path):
    doc = _stray_run(tmp_path, "late", "--timeout-ms", "100", "--max-error-rate", "1", qps=50)
    c = doc["counts"]
    assert c["issued"] == c["timed_out"] == 25, c
    assert c["duplicate_completions"] == c["unknown_completions"] == 0, c
    # Issuing takes 480 ms and the run ends at the last timeout, 100 ms later: the answers
    # of the queries of the first 330 ms or so came before the end, each 50 ms after its
    # query had timed out (late, not wrong).
    assert 10 <= c["late_completions"] <= 25, c
    assert doc["valid"] is True, doc["invalid_reasons"]


@pytest.mark.integration
def test_a_sut_raising_after_it_completed_its_batch_has_no_stray_completions(tmp_path):
    # The engine fails the queries of a raising batch that are still in flight: none here.
    doc = _stray_run(tmp_path, "raising")
    c = doc["counts"]
    assert c["completed"] == c["issued"] == 25 and c["failed"] == 0, c
    assert c["duplicate_completions"] == c["unknown_completions"] == 0, c
    assert doc["valid"] is True, doc["invalid_reasons"]


def test_a_duplicate_is_told_from_a_never_issued_id_in_process():
    """The engine's own split, through the batch API: a second completion of each query,
    and ids that no query had (past the last issued, beside a real one in another slot,
    not an id at all)."""
    seen: List[int] = []

    class Recorder:
        def issue(self, batch: Batch) -> None:
            for qid in batch.ids.tolist():
                assert batch.complete_one(qid)
                seen.append(qid)
                assert not batch.complete_one(qid)

    with Engine(EngineSettings(mode="constant", target_qps=2000, query_count=20, spin_us=0), Recorder()) as engine:
        r = engine.run()
        core = engine._core
        before = core.counts()
        assert not core.complete(max(seen) + (1 << 40))  # a sequence number never reached
        assert not core.complete(-3) and not core.complete(0)
        assert not core.fail(max(seen) + (1 << 40), "x", "y")
        after = core.counts()
    assert r.counts["duplicate_completions"] == 20 and r.counts["unknown_completions"] == 0
    assert after["unknown_completions"] - before["unknown_completions"] == 4
    assert after["duplicate_completions"] == before["duplicate_completions"] == 20


# ------------------------------------------- request lines the native client would send

def _http1_client_engine(request: bytes):
    h = _core.NetClientSettings()
    h.host, h.port = "127.0.0.1", 9  # nothing is connected before the run starts
    h.requests = [b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n", request]
    return net_client_engine(h)


@pytest.mark.parametrize("request_bytes,says", [
    (b"POST /v2/models/m y/infer HTTP/1.1\r\nHost: x\r\n\r\n",
     "net.requests[1]: the path '/v2/models/m y/infer' holds a raw space"),
    (b"POST /a\tb HTTP/1.1\r\nHost: x\r\n\r\n", "net.requests[1]: the path '/a\\x09b' holds a raw space"),
    (b"POST /a\nb HTTP/1.1\r\nHost: x\r\n\r\n", "net.requests[1]: the path '/a\\nb' holds a raw space"),
    (b"POST /a\r\nX-Injected: 1 HTTP/1.1\r\nHost: x\r\n\r\n",
     "net.requests[1]: the request line 'POST /a\\r\\nX-Injected: 1 HTTP/1.1' is not a method"),
])
def test_the_native_client_refuses_a_request_line_with_raw_spaces_or_line_breaks(request_bytes, says):
    # Before, the bytes went to the server as they were: the path cut at its space, or
    # headers of the path's making.
    with pytest.raises(ValueError) as e:
        _http1_client_engine(request_bytes)
    assert str(e.value).startswith(says), str(e.value)


def test_a_well_formed_request_line_is_taken():
    _http1_client_engine(b"POST /v2/models/m%20y/infer?a=b HTTP/1.1\r\nHost: x\r\n\r\n")
