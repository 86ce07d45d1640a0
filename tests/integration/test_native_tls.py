"""TLS in the native network client (csrc/tls.cc): https:// and grpcs:// run on it, with
a private CA made here (tests/servers/certs.py: a good leaf for 127.0.0.1 and localhost,
an expired one, one for another host, a self-signed one). Servers: the scripted HTTP
server with --tls-cert (KServe REST and OpenAI streams), the scripted gRPC server with
its TLS credentials, and nginx (when installed) as a real server for a template target.

Checked: runs complete natively with --ca-file and with --insecure on a self-signed
certificate; a certificate that does not verify is exit 2 with a reason naming which
check failed, and a connection opened mid-run fails its query as ``tls_error`` (as the
asyncio client classes it) with that reason; every connection after the first resumes
its session; the handshakes are as many as the connections."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from loadgen import _core
from tests.helpers import run_cli
from tests.servers.certs import Certs, make_certs
from tests.servers.h2_scripted import H2Scripted
from tests.servers.scripted_proc import start_scripted

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not _core.tls_available(), reason="a build without OpenSSL has no native TLS")]

RELAXED = ("--interval-s", "0.5", "--max-issue-delay-ms", "50")
CHECK_NS = 10_000_000_000
ANSWER = json.dumps({"predictions": [[1.0, 2.0]]})


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _tls_server(tmp_path, pair, *args):
    return start_scripted(tmp_path, "--tls-cert", pair[0], "--tls-key", pair[1], *args)


def _run(*args, expect=0):
    proc = run_cli("run", "--json", *RELAXED, *args, timeout=120)
    assert proc.returncode == expect, (proc.returncode, proc.stderr[-2000:])
    return json.loads(proc.stdout) if expect == 0 else proc


def _assert_handshakes(net, connections):
    """One handshake per connection, all but the first resumed."""
    native = net["native"]
    assert native["tls_handshakes"] == net["connects"] == connections, native
    assert native["tls_resumed"] == connections - 1, native


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_https_runs_natively_verified_against_the_ca_file(tmp_path, certs, host):
    with _tls_server(tmp_path, certs.good) as srv:
        doc = _run("--sut", f"https://{host}:{srv.port}/v2/models/m/infer", "--ca-file", certs.ca, "--scenario",
                   "concurrency", "--concurrency", "4", "--query-count", "400")
    c, net = doc["counts"], doc["network"]
    assert net["http_engine"] == "native"
    assert c["completed"] == 400 and c["failed"] == 0 and net["responses_checked"] == 400
    assert net["native"]["responses"] == 400
    _assert_handshakes(net, 4)
    assert net["connections_opened_before_run"] == 4  # handshakes made before the run, not in a latency
    assert net["native"]["receive_wait_ns"]["max"] >= net["native"]["receive_wait_ns"]["p50"] > 0  # stamped reads


def test_connections_reopened_mid_run_shake_hands_without_blocking_and_resume(tmp_path, certs):
    """The server closes every 25th request's connection unanswered: the client opens a
    new one during the run (its handshake on the I/O thread), which resumes the session."""
    with _tls_server(tmp_path, certs.good, "--close-every", "25") as srv:
        doc = _run("--sut", f"https://127.0.0.1:{srv.port}/v2/models/m/infer", "--ca-file", certs.ca, "--scenario",
                   "concurrency", "--concurrency", "4", "--query-count", "500", "--max-error-rate", "1")
    c, net = doc["counts"], doc["network"]
    assert net["http_engine"] == "native" and c["failed"] == 20 and c["completed"] == 480
    assert doc["errors"]["counts"] == {"connection_reset": 20}, doc["errors"]
    # A connection closed near the end need not be replaced: most are.
    assert 4 + 10 <= net["connects"] <= 4 + 20 and net["connect_failures"] == 0
    _assert_handshakes(net, net["connects"])


def test_streams_run_natively_over_https(tmp_path, certs):
    with _tls_server(tmp_path, certs.good, "--ttft-ms", "5", "--itl-ms", "1", "--tokens", "6") as srv:
        doc = _run("--sut", f"openai+https://127.0.0.1:{srv.port}/v1/chat/completions", "--model", "m", "--ca-file",
                   certs.ca, "--scenario", "concurrency", "--concurrency", "3", "--query-count", "60")
    c, net = doc["counts"], doc["network"]
    assert net["http_engine"] == "native" and net["protocol"] == "openai_stream"
    assert c["completed"] == 60 and c["tokens"] == 6 * 60 and net["native"]["checked_in_python"] == 0
    _assert_handshakes(net, 3)


def test_insecure_runs_natively_on_a_self_signed_certificate(tmp_path, certs):
    with _tls_server(tmp_path, certs.self_signed) as srv:
        doc = _run("--sut", f"https://127.0.0.1:{srv.port}/v2/models/m/infer", "--insecure", "--scenario",
                   "concurrency", "--concurrency", "2", "--query-count", "100")
    assert doc["network"]["http_engine"] == "native" and doc["counts"]["completed"] == 100
    assert doc["network"]["tls_verified"] is False
    _assert_handshakes(doc["network"], 2)


@pytest.mark.parametrize("leaf, reason", [("expired", "certificate has expired"),
                                          ("wrong_host", "IP address mismatch"),
                                          ("self_signed", "self-signed certificate")])
def test_a_certificate_that_does_not_verify_is_exit_2_naming_why(tmp_path, certs, leaf, reason):
    with _tls_server(tmp_path, getattr(certs, leaf)) as srv:
        proc = _run("--sut", f"https://127.0.0.1:{srv.port}/v2/models/m/infer", "--ca-file", certs.ca,
                    "--http-engine", "native", "--ready-timeout-s", "2", "--query-count", "5", expect=2)
    assert proc.stderr.startswith(f"error: TLS with 127.0.0.1:{srv.port}: certificate verify failed: {reason}")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_server_not_listening_yet_is_waited_for_then_named_by_the_readiness_check(tmp_path, certs):
    port = _free_port()
    started = time.monotonic()
    proc = _run("--sut", f"https://127.0.0.1:{port}/v2/models/m/infer", "--ca-file", certs.ca, "--http-engine",
                "native", "--ready-timeout-s", "1", "--query-count", "5", expect=2)
    assert time.monotonic() - started >= 1
    assert "not ready within 1 s" in proc.stderr and "TLS with" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_tls_server_that_comes_up_late_is_waited_for(tmp_path, certs):
    import threading

    port = _free_port()
    servers = []
    timer = threading.Timer(1.0, lambda: servers.append(_tls_server(tmp_path, certs.good, "--port", port)))
    timer.start()
    try:
        doc = _run("--sut", f"https://127.0.0.1:{port}/v2/models/m/infer", "--ca-file", certs.ca, "--ready-timeout-s",
                   "30", "--scenario", "concurrency", "--concurrency", "2", "--query-count", "50")
    finally:
        timer.join()
        for srv in servers:
            srv.stop()
    assert doc["network"]["http_engine"] == "native" and doc["counts"]["completed"] == 50


def test_a_server_that_refuses_the_handshake_is_exit_2_saying_so():
    """A server that closes each connection as it comes (no TLS spoken): one line, exit 2."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]

    def refuse():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    try:
        proc = _run("--sut", f"https://127.0.0.1:{port}/v2/models/m/infer", "--insecure", "--http-engine", "native",
                    "--query-count", "5", expect=2)
    finally:
        try:  # wakes the accept() in progress
            listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        listener.close()
        thread.join(5)
    # A close that finds the ClientHello unread is a reset (whether it came first is the
    # scheduler's): either way one line naming the handshake.
    assert proc.stderr in (f"error: TLS with 127.0.0.1:{port}: the server closed the connection during the TLS "
                           "handshake\n",
                           f"error: TLS with 127.0.0.1:{port}: handshake: Connection reset by peer\n"), proc.stderr


@pytest.mark.parametrize("leaf, name, reason", [
    ("expired", "127.0.0.1", "certificate verify failed: certificate has expired"),
    ("wrong_host", "127.0.0.1", "certificate verify failed: IP address mismatch (the certificate is not valid for "
                                "'127.0.0.1')"),
    ("wrong_host", "localhost", "certificate verify failed: hostname mismatch (the certificate is not valid for "
                                "'localhost')"),
    ("self_signed", "localhost", "certificate verify failed: self-signed certificate"),
    ("good", "localhost", "")])
def test_the_native_handshake_names_the_check_that_failed(tmp_path, certs, leaf, name, reason):
    with _tls_server(tmp_path, getattr(certs, leaf)) as srv:
        assert _core.tls_check("127.0.0.1", srv.port, name, certs.ca, False, "http/1.1", CHECK_NS) == reason
        assert _core.tls_check("127.0.0.1", srv.port, name, "", True, "http/1.1", CHECK_NS) == ""  # --insecure


def test_a_server_that_does_not_choose_h2_is_refused_for_grpc(tmp_path, certs):
    with _tls_server(tmp_path, certs.good) as srv:
        why = _core.tls_check("127.0.0.1", srv.port, "127.0.0.1", certs.ca, False, "h2", CHECK_NS)
    assert "ALPN h2" in why and "gRPC needs HTTP/2" in why


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_in_process_runs_over_tls_through_the_python_api(tmp_path, certs, protocol):
    """The native client over TLS in this process (as the sanitizer runs drive it): more
    queries than connections, through the engine API, counts against the server's."""
    from loadgen.engine import Engine, EngineSettings
    from loadgen.net import open_target
    from loadgen.net.native import NativeGrpcSUT, NativeHttpSUT
    from loadgen.net.options import NetOptions

    net = NetOptions(http_engine="auto" if protocol == "grpc" else "native", grpc_engine="native", connections=3,
                     ca_file=certs.ca)
    settings = EngineSettings(mode="closed", concurrency=6, query_count=600)
    if protocol == "grpc":
        pytest.importorskip("grpc")
        from tests.servers.grpc_scripted import ScriptedGrpc

        tls = (Path(certs.good[0]).read_bytes(), Path(certs.good[1]).read_bytes())
        with ScriptedGrpc(tls=tls) as srv:
            sut = open_target(srv.url(), net, pool_size=6)
            assert isinstance(sut, NativeGrpcSUT)
            result = Engine(settings, sut).run()
            served = srv.answered
    else:
        with _tls_server(tmp_path, certs.good) as srv:
            sut = open_target(f"https://localhost:{srv.port}/v2/models/m/infer", net, pool_size=6)
            assert isinstance(sut, NativeHttpSUT)
            result = Engine(settings, sut).run()
            served = sut.report()["native"]["responses"]
    assert result.counts["completed"] == 600 == served and result.errors == {}
    report = sut.report()
    assert report["native"]["tls_handshakes"] == report["connects"] == 3
    assert report["native"]["tls_resumed"] == 2


@pytest.mark.parametrize("engine", ["native", "asyncio"])
def test_connections_opened_mid_run_fail_as_tls_error_naming_why(tmp_path, certs, engine):
    """The server's certificate stops verifying after the readiness check (the options
    change under a prepared client): every connection the run opens fails its query as
    tls_error, the class the asyncio client gives, with the reason."""
    from loadgen.engine import Engine, EngineSettings
    from loadgen.net import open_target
    from loadgen.net.options import NetOptions

    with _tls_server(tmp_path, certs.expired) as srv:
        net = NetOptions(http_engine=engine, connections=2, insecure=True)
        sut = open_target(f"https://127.0.0.1:{srv.port}/v2/models/m/infer", net, pool_size=2)
        inner = getattr(sut, "inner", sut)
        inner.net = dataclasses.replace(net, insecure=False, ca_file=certs.ca)
        if engine == "asyncio":
            from loadgen.net.options import ssl_context

            inner.ssl = ssl_context(certs.ca, False)
        result = Engine(EngineSettings(mode="closed", concurrency=2, query_count=20), sut).run()
    assert result.errors == {"tls_error": 20}, result.errors
    assert result.counts["completed"] == 0
    assert any("certificate has expired" in m for m in result.error_messages), result.error_messages
    if engine == "native":
        assert sut.report()["native"]["tls_handshakes"] == 0


def test_grpcs_runs_natively_verified_against_the_ca_file(certs):
    pytest.importorskip("grpc")
    from tests.servers.grpc_scripted import ScriptedGrpc

    tls = (Path(certs.good[0]).read_bytes(), Path(certs.good[1]).read_bytes())
    with ScriptedGrpc(tls=tls) as srv:
        doc = _run("--sut", srv.url(), "--ca-file", certs.ca, "--connections", "3", "--scenario", "concurrency",
                   "--concurrency", "6", "--query-count", "300")
        answered = srv.answered
    c, net = doc["counts"], doc["network"]
    assert net["grpc_engine"] == "native"
    assert c["completed"] == 300 == answered and c["failed"] == 0
    _assert_handshakes(net, 3)
    assert net["native"]["receive_wait_ns"]["p50"] > 0  # the TLS layer's socket reads keep the kernel's stamp


@pytest.mark.parametrize("mode", ["goaway", "drop"])
def test_grpcs_reconnects_mid_run_shake_hands_without_blocking_and_resume(certs, mode):
    """Every third call ends its connection (GOAWAY, or dropped): the client opens a new one
    during the run, its handshake on the I/O thread, and resumes the session. Nothing of
    grpcio runs (the requests are prepared from --input, no readiness calls), so that the
    sanitizer runs can drive it."""
    pytest.importorskip("grpc")
    from loadgen.engine import Engine, EngineSettings
    from loadgen.net.kserve_grpc import KServeGrpcSUT
    from loadgen.net.native import NativeGrpcSUT, check_tls
    from loadgen.net.options import NetOptions
    from loadgen.net.targets import parse_target
    from loadgen.net.tensors import parse_input_spec

    with H2Scripted(mode, every=3, tls=certs.good) as srv:
        net = NetOptions(grpc_engine="native", ca_file=certs.ca, inputs=(parse_input_spec("INPUT0:FP32:1x16"),))
        target = parse_target(srv.url())
        check_tls(target, net, "grpc")
        inner = KServeGrpcSUT(target, net, pool_size=1)
        inner.prepare_requests()
        sut = NativeGrpcSUT(inner, io_threads=2)
        res = Engine(EngineSettings(mode="closed", concurrency=1, query_count=60, interval_s=0), sut).run()
    report = sut.report()
    assert res.counts["completed"] == (60 if mode == "goaway" else 40)
    assert report["connects"] == 20
    assert report["native"]["tls_handshakes"] == 20 and report["native"]["tls_resumed"] == 19


def test_grpcs_with_a_certificate_that_does_not_verify_is_exit_2(certs):
    pytest.importorskip("grpc")
    from tests.servers.grpc_scripted import ScriptedGrpc

    tls = (Path(certs.expired[0]).read_bytes(), Path(certs.expired[1]).read_bytes())
    with ScriptedGrpc(tls=tls) as srv:
        proc = _run("--sut", srv.url(), "--ca-file", certs.ca, "--grpc-engine", "native", "--ready-timeout-s", "2",
                    "--query-count", "5", expect=2)
    # Said by the native client's own handshake, before grpcio's readiness probe.
    assert proc.stderr.strip() == (f"error: TLS with 127.0.0.1:{srv.port}: certificate verify failed: certificate has "
                                   "expired (--ca-file names the CA that signed the server's certificate; --insecure "
                                   "skips the check)"), proc.stderr


@pytest.mark.parametrize("engine", ["auto", "native"])
def test_grpcs_insecure_runs_natively_on_a_self_signed_certificate(certs, engine):
    """--insecure for grpcs:// as for https://: the readiness and metadata calls are the
    core's (no grpcio channel, which would verify), and the run is native; the result and
    a warning line say verification was off."""
    pytest.importorskip("grpc")
    from tests.servers.grpc_scripted import ScriptedGrpc

    tls = (Path(certs.self_signed[0]).read_bytes(), Path(certs.self_signed[1]).read_bytes())
    with ScriptedGrpc(tls=tls) as srv:
        proc = run_cli("run", "--json", *RELAXED, "--sut", srv.url(), "--insecure", "--grpc-engine", engine,
                       "--scenario", "concurrency", "--concurrency", "4", "--query-count", "200", timeout=120)
        answered = srv.answered
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    c, net = doc["counts"], doc["network"]
    assert net["grpc_engine"] == "native"
    assert c["completed"] == 200 == answered and c["failed"] == 0
    assert net["model_metadata"]["name"] == "m"  # read by the core's unary call
    assert net["tls_verified"] is False
    assert "warning: --insecure: the TLS certificate of 127.0.0.1 is not verified" in proc.stderr, proc.stderr


def test_grpcs_self_signed_without_insecure_is_exit_2_from_the_native_handshake(certs):
    pytest.importorskip("grpc")
    from tests.servers.grpc_scripted import ScriptedGrpc

    tls = (Path(certs.self_signed[0]).read_bytes(), Path(certs.self_signed[1]).read_bytes())
    with ScriptedGrpc(tls=tls) as srv:
        proc = _run("--sut", srv.url(), "--ready-timeout-s", "2", "--query-count", "5", expect=2)
    assert proc.stderr.strip().startswith(f"error: TLS with 127.0.0.1:{srv.port}: certificate verify failed: "
                                          "self-signed certificate"), proc.stderr


def test_grpcs_insecure_on_grpcio_is_exit_2_saying_it_verifies(certs):
    pytest.importorskip("grpc")
    proc = _run("--sut", "grpcs://127.0.0.1:9/m", "--insecure", "--grpc-engine", "grpcio", "--query-count", "5",
                expect=2)
    assert "--insecure is not available for grpcs:// on grpcio" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_native_unary_call_reads_readiness_over_tls_and_names_failures(certs):
    """The core's unary call (prepare time): ServerReady over TLS with the CA file, a
    method the server does not have as UNIMPLEMENTED, a port with nothing on it as
    UNAVAILABLE."""
    pytest.importorskip("grpc")
    from loadgen.net.kserve_grpc import RPC, CallFailed, native_unary, pb
    from loadgen.net.options import NetOptions
    from loadgen.net.targets import parse_target
    from tests.servers.grpc_scripted import ScriptedGrpc

    tls = (Path(certs.good[0]).read_bytes(), Path(certs.good[1]).read_bytes())
    net = NetOptions(ca_file=certs.ca)
    with ScriptedGrpc(tls=tls) as srv:
        target = parse_target(srv.url())
        raw = native_unary(target, net, RPC["ServerReady"], pb.ServerReadyRequest().SerializeToString(), 10.0)
        assert pb.ServerReadyResponse.FromString(raw).ready is True
        with pytest.raises(CallFailed, match="^UNIMPLEMENTED"):
            native_unary(target, net, "/inference.GRPCInferenceService/NoSuchMethod", b"", 10.0)
    with pytest.raises(CallFailed, match="^UNAVAILABLE: failed to connect"):
        native_unary(parse_target(f"grpcs://127.0.0.1:{_free_port()}/m"), net, RPC["ServerReady"], b"", 5.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def nginx(tmp_path, certs):
    """nginx over TLS (its own config in tmp_path, a free port), answering /predict with
    a fixed JSON document; ended by its PID."""
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if exe is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    port = _free_port()
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"""
daemon off;
worker_processes 1;
pid {tmp_path}/nginx.pid;
error_log {tmp_path}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {tmp_path}/body;
    proxy_temp_path {tmp_path}/proxy;
    fastcgi_temp_path {tmp_path}/fastcgi;
    uwsgi_temp_path {tmp_path}/uwsgi;
    scgi_temp_path {tmp_path}/scgi;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {certs.good[0]};
        ssl_certificate_key {certs.good[1]};
        ssl_session_cache shared:tls:1m;
        location = /ready {{ return 200 'ok'; }}
        location = /predict {{ default_type application/json; return 200 '{ANSWER}'; }}
    }}
}}
""")
    proc = subprocess.Popen([exe, "-c", str(conf), "-p", str(tmp_path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"nginx did not start: {(tmp_path / 'error.log').read_text()[-1000:]}")
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_nginx_over_https_runs_natively(tmp_path, certs, nginx):
    tpl = {"method": "POST", "path": "/predict", "body": {"instances": ["{{sample}}"]}, "ready_path": "/ready",
           "check": {"status": [200], "json_keys": ["predictions"]}}
    (tmp_path / "tpl.json").write_text(json.dumps(tpl))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps([k, k + 1]) + "\n" for k in range(3)))
    doc = _run("--sut", f"https://localhost:{nginx}", "--request-template", str(tmp_path / "tpl.json"), "--payload",
               str(tmp_path / "rows.jsonl"), "--ca-file", certs.ca, "--scenario", "concurrency", "--concurrency", "4", "--query-count", "400")
    c, net = doc["counts"], doc["network"]
    assert net["http_engine"] == "native" and c["completed"] == 400 and c["failed"] == 0
    _assert_handshakes(net, 4)
