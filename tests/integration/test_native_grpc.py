"""The native gRPC client (csrc/grpc_client.cc) against answers no gRPC server library
gives (tests/servers/h2_scripted.py, HTTP/2 scripted with the ``h2`` package): every
third ModelInfer call answered with a non-200 HTTP status, no grpc-status, a trailers-only
status, a reset stream, a compressed, truncated, doubled or missing message, a GOAWAY or
a dropped connection. The native client and the grpcio client give the same
counts and error classes on the same script, where grpcio's answer is sound; where it is
not (a truncated message it calls missing, two messages it waits on until the timeout,
calls it sends on a connection the server said GOAWAY on), the native client's own answer
is checked. Every run is bounded in count and time."""

import time

import pytest

from loadgen.engine import Engine, EngineSettings
from loadgen.net import open_target
from loadgen.net.options import NetOptions
from tests.servers.h2_scripted import H2Scripted
from tests.servers.procs import native_grpc_or_skip

#: mode -> the error class of each scripted failure (grpcio's and the native client's).
SAME = {"ok": None, "http_503": "grpc_UNAVAILABLE", "http_404": "grpc_UNIMPLEMENTED", "no_status": "grpc_UNKNOWN",
        "trailers_only": "grpc_NOT_FOUND", "reset_refused": "grpc_UNAVAILABLE", "reset_internal": "grpc_INTERNAL",
        "compressed": "grpc_INTERNAL", "empty_ok": "invalid_response", "drop": "grpc_UNAVAILABLE"}
#: One call at a time where which calls a lost connection takes with it is a race; the
#: native client loses only the call in progress.
ONE_AT_A_TIME = ("drop",)


def _run(mode, engine, n=30, concurrency=2):
    with H2Scripted(mode, every=3) as srv:
        sut = open_target(srv.url(), NetOptions(grpc_engine=engine, ready_timeout_s=5, timeout_ms=3000),
                          pool_size=concurrency)
        start = time.monotonic()
        res = Engine(EngineSettings(mode="closed", concurrency=concurrency, query_count=n, interval_s=0, grace_s=3,
                                    timeout_ms=3000), sut).run()
        assert time.monotonic() - start < 20
        c = res.counts
        assert c["issued"] == n == c["completed"] + c["failed"] + c["timed_out"] + c["cancelled"]
        assert c["unknown_completions"] == 0
        return res, sut.report(), srv


@pytest.mark.parametrize("mode", sorted(SAME))
def test_the_native_client_classes_failures_as_grpcio_does(mode):
    native_grpc_or_skip()
    got = {}
    concurrency = 1 if mode in ONE_AT_A_TIME else 2
    for engine in ("native", "grpcio"):
        res, report, _ = _run(mode, engine, concurrency=concurrency)
        assert report["grpc_engine"] == engine
        got[engine] = (res.counts["completed"], res.counts["failed"], res.counts["timed_out"], dict(res.errors))
    completed, failed, timed_out, errors = got["native"]
    if mode in ONE_AT_A_TIME:  # grpcio also sends the next call on the dropped connection, and fails it
        assert set(got["grpcio"][3]) == set(errors)
    else:
        assert got["native"] == got["grpcio"]
    if SAME[mode] is None:
        assert (completed, failed, errors) == (30, 0, {})
    else:
        assert errors == {SAME[mode]: 10} and failed == 10 and timed_out == 0


def test_status_messages_are_percent_decoded_and_http_statuses_named():
    native_grpc_or_skip()
    res, _, _ = _run("trailers_only", "native")
    assert res.error_messages[0] == "grpc_NOT_FOUND: no such model"
    res, _, _ = _run("http_503", "native")
    assert res.error_messages[0] == "grpc_UNAVAILABLE: Received http2 header with status: 503"


def test_a_truncated_or_doubled_message_fails_at_once():
    # grpcio calls a truncated message missing and waits on a second message until the
    # timeout; the native client says what it got, without waiting.
    native_grpc_or_skip()
    res, _, _ = _run("truncated", "native")
    assert res.errors == {"grpc_INTERNAL": 10} and "truncated" in res.error_messages[0]
    res, _, _ = _run("two_messages", "native")
    assert res.errors == {"grpc_UNIMPLEMENTED": 10} and res.counts["timed_out"] == 0
    assert "more than one response message" in res.error_messages[0]


def test_after_a_goaway_or_a_dropped_connection_the_client_reconnects():
    # A GOAWAY fails no call: the one it came with is answered, and the next goes out on a
    # new connection (grpcio, retries off, sends some on the old one and fails them).
    native_grpc_or_skip()
    for mode in ("goaway", "drop"):
        res, report, srv = _run(mode, "native", n=60, concurrency=1)
        # The core's unary calls before the run (ServerReady, ModelReady, ModelMetadata), each
        # on a connection of its own, and one per GOAWAY or drop.
        assert srv.connections == 3 + 20
        assert report["connects"] == 20  # the first before the run; each GOAWAY or drop then a new one
        assert res.counts["completed"] == (60 if mode == "goaway" else 40)


@pytest.mark.parametrize("mode", ["closed", "poisson"])
def test_in_process_calls_with_no_grpcio_thread(mode):
    """The native client with nothing of grpcio running (as the sanitizer runs drive it):
    the requests prepared from --input, no readiness calls; calls answered, dropped every
    seventh and timed out, the connection reopened, the counts adding up."""
    native_grpc_or_skip()
    from loadgen.net.kserve_grpc import KServeGrpcSUT
    from loadgen.net.native import NativeGrpcSUT
    from loadgen.net.targets import parse_target
    from loadgen.net.tensors import parse_input_spec

    with H2Scripted("drop", every=7) as srv:
        net = NetOptions(grpc_engine="native", inputs=(parse_input_spec("INPUT0:FP32:1x16"),), timeout_ms=1000)
        inner = KServeGrpcSUT(parse_target(srv.url()), net, pool_size=4)
        inner.prepare_requests()
        sut = NativeGrpcSUT(inner, io_threads=2)
        load = (dict(mode="closed", concurrency=4, query_count=300) if mode == "closed" else
                dict(mode="poisson", target_qps=1500, duration_s=0.3, max_in_flight=4))
        res = Engine(EngineSettings(interval_s=0, grace_s=2, timeout_ms=1000, **load), sut).run()
        c = res.counts
        assert c["issued"] == c["completed"] + c["failed"] + c["timed_out"] + c["cancelled"] > 200
        assert set(res.errors) <= {"grpc_UNAVAILABLE"} and c["failed"] >= c["issued"] // 7 - 1
        assert c["completed"] >= c["issued"] // 2
        assert sut.report()["native"]["responses"] >= c["completed"]
