"""The server-side breakdown of Triton targets (``server_breakdown``, loadgen.net.triton_stats):
the statistics document (JSON) and message (gRPC's ModelStatisticsResponse) parsed and
differenced, a run against a scripted KServe server whose statistics follow the requests it
served (exact figures), the failures that are warnings, the bad options that are usage errors,
and runs against a real Triton over HTTP and gRPC whose breakdown, read over the target's own
protocol, counts the run's requests to the one.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading

import grpc
import pytest

from loadgen import _core
from loadgen.net import kserve_v2_pb2 as pb
from loadgen.net import triton_stats_pb2 as tpb
from loadgen.net.options import NetOptions
from loadgen.net.targets import parse_target
from loadgen.net.triton_stats import PHASES, TritonGrpcStats, breakdown, merge_breakdowns, parse_grpc_stats, parse_stats
from loadgen.results.html import render_html
from loadgen.results.render import render_summary
from loadgen.results.schema import check_result
from tests.servers.grpc_scripted import ScriptedGrpc
from tests.helpers import run_cli
from tests.helpers import GOOD, kserve_url, METADATA, _send
from tests.integration.test_net_servers import _targets, run_doc, triton  # noqa: F401 - triton: the real server's fixture


def _entry(version: str, served: int, *, name: str = "m", batch: int = 2) -> dict:
    """One version's statistics after ``served`` requests: per request 1, 2, 3 and 4 us
    of queue, compute input, infer and output and 15 us in all; ``batch`` inferences per
    execution (``served`` a multiple of it)."""
    per = {"success": 15_000, "fail": 0, "queue": 1_000, "compute_input": 2_000, "compute_infer": 3_000,
           "compute_output": 4_000, "cache_hit": 0, "cache_miss": 0}
    stats = {k: {"count": served if k not in ("fail", "cache_hit", "cache_miss") else 0, "ns": served * ns}
             for k, ns in per.items()}
    return {"name": name, "version": version, "last_inference": 0, "inference_count": served,
            "execution_count": served // batch, "inference_stats": stats, "batch_stats": [], "memory_usage": []}


def _doc(*entries: dict) -> str:
    return json.dumps({"model_stats": list(entries)})


# ------------------------------------------------------------------ parsing and deltas

def test_parse_sums_the_models_versions_and_leaves_other_models_out():
    snap = parse_stats(_doc(_entry("1", 10), _entry("2", 4), _entry("1", 1000, name="other")), "m")
    assert snap.counts["success"] == 14 and snap.ns["queue"] == 14_000 and snap.ns["success"] == 14 * 15_000
    assert snap.inference_count == 14 and snap.execution_count == 5 + 2
    assert snap.counts["fail"] == 0


@pytest.mark.parametrize("body, why", [
    (_doc(_entry("1", 3, name="other")), "no model 'm'"),
    ('{"error": "requested model \'m\' is not available"}', "no model_stats"),
    ("not json", "not JSON"),
    (json.dumps({"model_stats": [{"name": "m", "version": "1"}]}), "no inference_stats"),
    (json.dumps({"model_stats": [dict(_entry("1", 2), inference_count=-1)]}), "negative"),
    (json.dumps({"model_stats": [dict(_entry("1", 2), execution_count="many")]}), "not a count"),
])
def test_parse_refuses_a_missing_model_and_malformed_documents(body, why):
    with pytest.raises(ValueError, match=why):
        parse_stats(body, "m")


# Triton's own encoding of a ModelStatisticsResponse (its grpc_service.proto, serialized by
# tritonclient): model "m" version "1", 6 requests of 15 us (1, 2, 3 and 4 us of queue,
# compute input, infer and output), 3 executions, and the batch_stats this client's
# messages leave out (skipped when parsed).
_TRITON_WIRE = (b'\nG\n\x01m\x12\x011\x18\x80\xd0\x95\xff\xbc1 \x06(\x032(\n\x06\x08\x06\x10\x90\xbf\x05\x12\x00'
                b'\x1a\x05\x08\x06\x10\xf0."\x05\x08\x06\x10\xe0]*\x06\x08\x06\x10\xd0\x8c\x012\x06\x08\x06\x10\xc0\xbb\x01'
                b':\n\x08\x02\x1a\x06\x08\x03\x10\xd0\x8c\x01')


def _grpc_entry(version: str, served: int, *, name: str = "m", batch: int = 2) -> tpb.ModelStatistics:
    """:func:`_entry`'s statistics as the gRPC message."""
    e = _entry(version, served, name=name, batch=batch)
    msg = tpb.ModelStatistics(name=name, version=version, inference_count=e["inference_count"],
                              execution_count=e["execution_count"])
    for k, d in e["inference_stats"].items():
        getattr(msg.inference_stats, k).CopyFrom(tpb.StatisticDuration(count=d["count"], ns=d["ns"]))
    return msg


def test_grpc_statistics_parse_triton_field_numbers():
    snap = parse_grpc_stats(_TRITON_WIRE, "m")
    assert snap.counts == {"success": 6, "fail": 0, "queue": 6, "compute_input": 6, "compute_infer": 6,
                           "compute_output": 6}
    assert [snap.ns[p] for p in ("success",) + PHASES] == [90_000, 6_000, 12_000, 18_000, 24_000]
    assert (snap.inference_count, snap.execution_count) == (6, 3)
    zero = parse_grpc_stats(tpb.ModelStatisticsResponse(model_stats=[tpb.ModelStatistics(name="m")])
                            .SerializeToString(), "m")
    b = breakdown(zero, snap)
    assert (b["requests"], b["executions"], b["batch_size"]) == (6, 3, 2.0)
    assert [b[f"{p}_ns"] for p in PHASES] == [1000.0, 2000.0, 3000.0, 4000.0] and b["overhead_ns"] == 5000.0


def test_grpc_statistics_sum_the_models_versions_and_match_the_json_form():
    resp = tpb.ModelStatisticsResponse(model_stats=[_grpc_entry("1", 10), _grpc_entry("2", 4),
                                                    _grpc_entry("1", 1000, name="other")])
    snap = parse_grpc_stats(resp.SerializeToString(), "m")
    assert snap == parse_stats(_doc(_entry("1", 10), _entry("2", 4), _entry("1", 1000, name="other")), "m")
    assert snap.counts["success"] == 14 and snap.execution_count == 7
    with pytest.raises(ValueError, match="no model 'absent'"):
        parse_grpc_stats(resp.SerializeToString(), "absent")
    with pytest.raises(ValueError, match="not a ModelStatisticsResponse"):
        parse_grpc_stats(b"\x0a\xff\xff", "m")


def test_a_grpc_server_that_does_not_answer_is_not_triton_and_its_read_names_the_rpc():
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stats = TritonGrpcStats(parse_target(f"grpc://127.0.0.1:{port}/m"), NetOptions(), timeout_s=1.0)
    assert stats.url == f"grpc://127.0.0.1:{port}/inference.GRPCInferenceService/ModelStatistics"
    assert not stats.is_triton()
    with pytest.raises(ValueError, match="ModelStatistics: (UNAVAILABLE|DEADLINE_EXCEEDED)"):
        stats.read()


def test_breakdown_is_the_per_request_mean_of_the_window_between_the_reads():
    before, after = parse_stats(_doc(_entry("1", 40)), "m"), parse_stats(_doc(_entry("1", 140)), "m")
    b = breakdown(before, after)
    assert (b["requests"], b["failed"], b["inferences"], b["executions"]) == (100, 0, 100, 50)
    assert b["batch_size"] == 2.0
    assert [b[f"{p}_ns"] for p in PHASES] == [1000.0, 2000.0, 3000.0, 4000.0]
    assert b["request_ns"] == 15_000.0 and b["overhead_ns"] == 5_000.0
    # Nothing served in the window: zeros, not a division by zero.
    idle = breakdown(after, after)
    assert idle["requests"] == 0 and idle["request_ns"] == idle["queue_ns"] == idle["batch_size"] == 0.0
    with pytest.raises(ValueError, match="went back"):
        breakdown(after, before)


def test_merged_workers_count_each_server_once_and_sum_the_servers():
    def section(url: str, requests: int, queue_ns: float) -> dict:
        return {"source": "triton", "url": url, "model": "m", "version": "", "window": "run", "requests": requests,
                "failed": 0, "inferences": 2 * requests, "executions": requests, "batch_size": 2.0,
                "request_ns": 10_000.0, "queue_ns": queue_ns, "compute_input_ns": 1.0, "compute_infer_ns": 2.0,
                "compute_output_ns": 3.0, "overhead_ns": 0.0}
    # Two workers read server A (each window also counts the other's requests), one B.
    docs = [{"server_breakdown": section("http://a", 300, 100.0)}, {"server_breakdown": section("http://a", 310, 200.0)},
            {"server_breakdown": section("http://b", 90, 1000.0)}, {}]
    m = merge_breakdowns(docs)
    assert m["servers"] == 2 and m["url"] == "http://a, http://b"
    assert (m["requests"], m["inferences"], m["executions"], m["batch_size"]) == (400, 800, 400, 2.0)
    assert m["queue_ns"] == (310 * 200.0 + 90 * 1000.0) / 400 and m["request_ns"] == 10_000.0
    assert merge_breakdowns([{}, {"server_breakdown": None}]) is None


# --------------------------------------------- a scripted server: exact figures, failures

def _scripted_triton(server_name: str = "triton", stats_status: int = 200):
    """A KServe server for model ``m`` whose metadata says ``server_name`` and whose
    statistics (status ``stats_status``) follow the requests it has served."""
    served = [0]
    lock = threading.Lock()

    def route(method: str, path: str, head: bytes, sock: socket.socket) -> bool:
        if path in ("/v2/health/ready", "/v2/models/m/ready"):
            return _send(sock, 200, b"")
        if path == "/v2":
            return _send(sock, 200, json.dumps({"name": server_name, "version": "2.51.0"}).encode())
        if path == "/v2/models/m":
            return _send(sock, 200, json.dumps(METADATA).encode())
        if path == "/v2/models/m/stats":
            if stats_status != 200:
                return _send(sock, stats_status, b'{"error":"requested model \'m\' is not available"}')
            with lock:
                n = served[0]
            return _send(sock, 200, _doc(_entry("1", n, batch=1)).encode())
        if path == "/v2/models/m/infer" and method == "POST":
            with lock:
                served[0] += 1
            return _send(sock, 200, json.dumps(GOOD).encode())
        return _send(sock, 404, b"{}")
    return route


LOAD = ("--scenario", "concurrency", "--concurrency", "2", "--query-count", "60")


def test_a_scripted_triton_gives_the_exact_breakdown_of_the_run(serve):
    server = serve(_scripted_triton())
    doc = run_doc("--sut", kserve_url(server), *LOAD)
    b = doc["server_breakdown"]
    assert b["requests"] == doc["counts"]["completed"] == 60
    assert (b["queue_ns"], b["compute_input_ns"], b["compute_infer_ns"], b["compute_output_ns"]) == (1e3, 2e3, 3e3, 4e3)
    assert b["request_ns"] == 15e3 and b["overhead_ns"] == 5e3 and b["batch_size"] == 1.0
    assert b["url"] == f"http://127.0.0.1:{server.port}/v2/models/m/stats" and b["window"] == "run"
    assert not [w for w in doc["warnings"] if w["name"] == "server_stats_unread"]
    check_result(doc)
    text = render_summary(doc)
    assert "server time  15.0 us a request = queue 1.0 us + compute input 2.0 us + compute infer 3.0 us" in text
    assert "60 requests (0 failed), 60 executions, batch size 1.00" in text
    page = render_html([("run", doc)])
    assert "The server's time per request" in page and "<td>15</td><td>1</td><td>2</td><td>3</td>" in page


def test_an_unreadable_model_is_a_named_warning_and_the_run_stands(serve):
    server = serve(_scripted_triton(stats_status=400))
    doc = run_doc("--sut", kserve_url(server), *LOAD)
    assert doc["counts"]["completed"] == 60 and doc["valid"]
    assert "server_breakdown" not in doc
    (w,) = [w for w in doc["warnings"] if w["name"] == "server_stats_unread"]
    assert "HTTP 400" in w["message"] and "requested model 'm' is not available" in w["message"]


def test_a_server_that_is_not_triton_is_left_alone_unless_named(serve):
    server = serve(_scripted_triton(server_name="mlserver"))
    doc = run_doc("--sut", kserve_url(server), *LOAD)
    assert "server_breakdown" not in doc
    assert not [w for w in doc["warnings"] if w["name"] == "server_stats_unread"]
    # Named with --server-stats-url, its statistics are read whatever it calls itself.
    named = run_doc("--sut", kserve_url(server), *LOAD, "--server-stats-url", f"http://127.0.0.1:{server.port}")
    assert named["server_breakdown"]["requests"] == 60
    off = run_doc("--sut", kserve_url(server), *LOAD, "--server-stats-url", "none")
    assert "server_breakdown" not in off


class _ScriptedTritonGrpc(ScriptedGrpc):
    """The scripted gRPC server with Triton's ServerMetadata (naming ``server_name``) and
    ModelStatistics: statistics that follow the ModelInfer calls it answered (batch 1), or
    status ``stats_code`` when given; ``stats_metadata`` is the last statistics call's."""

    def __init__(self, server_name: str = "triton", stats_code=None, **kw) -> None:
        super().__init__(**kw)
        self.stats_code = stats_code
        self.stats_metadata: dict = {}
        meta = pb.ServerMetadataResponse(name=server_name, version="2.51.0").SerializeToString()
        handlers = {"ServerMetadata": grpc.unary_unary_rpc_method_handler(lambda req, ctx: meta),
                    "ModelStatistics": grpc.unary_unary_rpc_method_handler(self._stats)}
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers),))

    def _stats(self, req: bytes, ctx) -> bytes:
        self.stats_metadata = dict(ctx.invocation_metadata())
        name = tpb.ModelStatisticsRequest.FromString(req).name
        if self.stats_code is not None:
            ctx.abort(self.stats_code, f"requested model '{name}' is not available")
        with self._lock:
            served = self.answered
        return tpb.ModelStatisticsResponse(model_stats=[_grpc_entry("1", served, name=name, batch=1)]).SerializeToString()


def test_a_scripted_grpc_triton_is_read_over_grpc_with_the_runs_metadata():
    with _ScriptedTritonGrpc() as srv:
        doc = run_doc("--sut", srv.url(), *LOAD, "--header", "x-team: vision")
        b = doc["server_breakdown"]
        assert b["requests"] == doc["counts"]["completed"] == srv.answered == 60
        assert (b["queue_ns"], b["compute_input_ns"], b["compute_infer_ns"], b["compute_output_ns"]) == (1e3, 2e3, 3e3, 4e3)
        assert b["request_ns"] == 15e3 and b["overhead_ns"] == 5e3 and b["batch_size"] == 1.0
        assert b["url"] == f"grpc://{srv.target}/inference.GRPCInferenceService/ModelStatistics"
        assert srv.stats_metadata.get("x-team") == "vision"
        assert not [w for w in doc["warnings"] if w["name"] == "server_stats_unread"]
        check_result(doc)
        off = run_doc("--sut", srv.url(), *LOAD, "--server-stats-url", "none")
        assert "server_breakdown" not in off


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_grpcs_triton_is_read_with_the_runs_ca(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    with _ScriptedTritonGrpc(tls=(cert.read_bytes(), key.read_bytes())) as srv:
        doc = run_doc("--sut", srv.url(), *LOAD, "--ca-file", str(cert))
        assert doc["server_breakdown"]["requests"] == doc["counts"]["completed"] == 60
        assert doc["server_breakdown"]["url"].startswith(f"grpcs://{srv.target}/")


@pytest.mark.skipif(shutil.which("openssl") is None or not _core.tls_available() or not _core.grpc_client_available(),
                    reason="needs the openssl command and the native gRPC client with TLS")
def test_a_grpcs_triton_is_read_with_insecure_by_the_cores_calls(tmp_path):
    """With --insecure grpcio cannot read the statistics (it always verifies): the core's
    unary calls do, with verification off as the run's."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    with _ScriptedTritonGrpc(tls=(cert.read_bytes(), key.read_bytes())) as srv:
        doc = run_doc("--sut", srv.url(), *LOAD, "--insecure")
        assert doc["network"]["grpc_engine"] == "native" and doc["network"]["tls_verified"] is False
        assert doc["server_breakdown"]["requests"] == doc["counts"]["completed"] == 60
        assert not [w for w in doc["warnings"] if w["name"] == "server_stats_unread"]
        check_result(doc)


def test_grpc_statistics_that_fail_are_the_named_warning_and_other_servers_are_left_alone():
    with _ScriptedTritonGrpc(stats_code=grpc.StatusCode.NOT_FOUND) as srv:
        doc = run_doc("--sut", srv.url(), *LOAD)
        assert doc["counts"]["completed"] == 60 and doc["valid"] and "server_breakdown" not in doc
        (w,) = [w for w in doc["warnings"] if w["name"] == "server_stats_unread"]
        assert "ModelStatistics: NOT_FOUND: requested model 'm' is not available" in w["message"], w
    # A server whose ServerMetadata names another server, or that has none: no reads.
    for server in (_ScriptedTritonGrpc(server_name="mlserver"), ScriptedGrpc()):
        with server as srv:
            doc = run_doc("--sut", srv.url(), *LOAD)
            assert "server_breakdown" not in doc and doc["counts"]["completed"] == 60
            assert not [w for w in doc["warnings"] if w["name"] == "server_stats_unread"]


@pytest.mark.parametrize("args, said", [
    (("--sut", "http://127.0.0.1:9/v2/models/m/infer", "--server-stats-url", "ftp://127.0.0.1:8000"),
     "use Triton's HTTP endpoint"),
    (("--sut", "http://127.0.0.1:9/v2/models/m/infer", "--server-stats-url", "http://u:pw@127.0.0.1:8000"),
     "give credentials with --header"),
    (("--sut", "demo", "--server-stats-url", "http://127.0.0.1:8000"), "applies to network targets"),
    (("--sut", "openai+http://127.0.0.1:9/v1/completions", "--server-stats-url", "http://127.0.0.1:8000"),
     "names no KServe model"),
])
def test_a_bad_server_stats_url_is_a_usage_error_before_the_run(args, said):
    proc = run_cli("run", *args, "--query-count", "5")
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "pw" not in proc.stderr.replace("--sut", "")


# ------------------------------------------------------------------ a real Triton

def _check_against_the_run(doc: dict, in_flight: int = 0) -> dict:
    """``in_flight``: requests the server may have had in flight when its window began
    (a window after a warm-up): Triton counts a request's inference, execution and
    request apart, so a read while one runs may find one counted and not the others."""
    b = doc["server_breakdown"]
    c = doc["counts"]
    assert c["failed"] == c["timed_out"] == 0
    assert b["failed"] == 0 and b["source"] == "triton" and b["model"] == "add_one"
    for key in ("request_ns", "queue_ns", "compute_input_ns", "compute_infer_ns", "compute_output_ns"):
        assert b[key] > 0, (key, b)
    # The server's parts of a request fit in its time, and its time in the client's latency.
    parts = sum(b[f"{p}_ns"] for p in PHASES)
    assert parts <= b["request_ns"] + 1 <= doc["latency_ns"]["mean"], (b, doc["latency_ns"]["mean"])
    # No batching: an execution per inference and per request.
    assert abs(b["executions"] - b["requests"]) <= in_flight and abs(b["inferences"] - b["requests"]) <= in_flight, b
    assert b["batch_size"] == 1.0 if not in_flight else abs(b["batch_size"] - 1.0) <= in_flight / b["executions"], b
    check_result(doc)
    return b


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["http", "grpc", "grpc-grpcio", "grpc-stats-over-http"])
def test_triton_breakdown_counts_the_runs_requests(triton, protocol):  # noqa: F811 - the imported fixture
    # A grpc:// target's statistics are read over gRPC (ModelStatistics) by themselves;
    # --server-stats-url still sends the reads to Triton's HTTP port instead.
    url = _targets(triton)[protocol.split("-")[0]]
    extra = {"grpc-grpcio": ("--grpc-engine", "grpcio"),
             "grpc-stats-over-http": ("--server-stats-url", triton.http_url)}.get(protocol, ())
    doc = run_doc("--sut", url, *extra, "--scenario", "concurrency", "--concurrency", "4", "--query-count", "400")
    b = _check_against_the_run(doc)
    assert b["requests"] == doc["counts"]["completed"] == 400
    over_grpc = protocol in ("grpc", "grpc-grpcio")
    assert b["url"] == (f"grpc://{triton.grpc_target}/inference.GRPCInferenceService/ModelStatistics" if over_grpc
                        else f"{triton.http_url}/v2/models/add_one/stats")
    assert b["window"] == "run" and not [w for w in doc["warnings"] if w["name"] == "server_stats_unread"]
    if protocol == "grpc":
        off = run_doc("--sut", url, "--server-stats-url", "none", "--scenario", "concurrency", "--query-count", "20")
        assert "server_breakdown" not in off


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_breakdown_after_a_warm_up_is_the_measured_windows(triton, protocol):  # noqa: F811 - the fixture
    concurrency = 4
    doc = run_doc("--sut", _targets(triton)[protocol], "--scenario", "concurrency", "--concurrency", str(concurrency),
                  "--warmup-s", "0.5", "--duration-s", "1")
    b = _check_against_the_run(doc, in_flight=concurrency)
    assert b["window"] == "after warm-up"
    # The first read comes when measuring begins: only the queries then in flight (at
    # most one a stream) and those the server finished while the read itself took its
    # moment (2% of the window: 20 ms of a 1 s window, on a busy machine) may fall on the
    # other side of the client's count; a window that took in the warm-up would count
    # half as many again.
    completed = doc["counts"]["completed"]
    assert doc["warmup"]["completed"] > completed // 50 + concurrency
    assert abs(b["requests"] - completed) <= concurrency + completed // 50, (b, doc["counts"])
