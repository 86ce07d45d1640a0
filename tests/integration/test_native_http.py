"""The native HTTP/1.1 client (``--http-engine native``, csrc/http_client.cc) against the
scripted server: counts equal the server's own, responses judged by the same check as
the asyncio client (with the verdict cache in front), waiting queries when connections
are fewer than queries in flight, several I/O threads, a server that dies mid-run, and
the targets it refuses. The HTTP tests of tests/integration/test_net_servers.py run on both clients."""

from __future__ import annotations

import json

import pytest

from tests.servers.scripted_proc import start_scripted
from tests.helpers import run_cli
from tests.integration.test_net_servers import _kill_mid_run

NATIVE = ("--http-engine", "native")
RELAXED = ("--interval-s", "0.5", "--max-issue-delay-ms", "50")


def _run(*args, expect=0, timeout=90):
    proc = run_cli("run", "--json", *RELAXED, *args, timeout=timeout)
    assert proc.returncode == expect, (proc.returncode, proc.stderr[-2000:])
    return json.loads(proc.stdout) if expect in (0, 1) else proc


@pytest.mark.parametrize("load", [("--scenario", "concurrency", "--concurrency", "8", "--query-count", "3000"),
                                  ("--scenario", "poisson", "--target-qps", "2000", "--duration-s", "1.5"),
                                  ("--scenario", "constant", "--target-qps", "3000", "--duration-s", "1",
                                   "--connections", "2")],
                         ids=["closed", "poisson", "two-connections"])
def test_counts_equal_the_servers_and_every_response_is_checked(tmp_path, load):
    with start_scripted(tmp_path) as srv:
        doc = _run("--sut", f"{srv.url}/v2/models/m/infer", *NATIVE, *load)
        stats = srv.stats()
    c, net = doc["counts"], doc["network"]
    assert c["failed"] == c["timed_out"] == c["cancelled"] == 0 and c["completed"] > 1000
    assert stats["infer_requests"] == stats["infer_ok"] == c["completed"] == c["issued"]
    assert net["http_engine"] == "native" and net["protocol"] == "kserve_v2_http"
    native = net["native"]
    assert native["responses"] == c["completed"] == net["responses_checked"]
    # The answers repeat (the server answers the same prepared requests alike): most are
    # judged by the verdict cache, each distinct one once by the client's own check.
    assert native["checked_in_python"] <= doc["settings"]["effective"]["sample_count"]
    assert native["verdict_cache_hits"] + native["checked_in_python"] == c["completed"]
    assert net["bytes_sent"] > 0 and net["connects"] >= 1
    if "concurrency" in load:  # one connection per query in flight: none waits for one
        assert native["queued_in_client"] == 0


def test_queries_that_wait_for_a_connection_are_counted_and_their_wait_is_latency(tmp_path):
    # 2 connections, 20 ms an answer: 100 answers/s at most, for 200 arrivals/s.
    with start_scripted(tmp_path, "--delay-ms", "20") as srv:
        doc = _run("--sut", f"{srv.url}/v2/models/m/infer", *NATIVE, "--scenario", "constant", "--target-qps",
                   "200", "--duration-s", "0.5", "--connections", "2")
    c, native = doc["counts"], doc["network"]["native"]
    assert c["completed"] == c["issued"] == 100 and c["failed"] == 0
    assert 40 <= native["queued_in_client"] < 100
    # Measured from the scheduled time: the last answers waited about 250 ms.
    assert doc["latency_ns"]["max"] > 150e6


def test_auto_picks_the_native_client_where_it_runs_the_target(tmp_path):
    tpl = tmp_path / "get.json"
    tpl.write_text(json.dumps({"method": "GET", "path": "/v2/health/ready"}))
    with start_scripted(tmp_path, "--ttft-ms", "1", "--itl-ms", "0.1", "--tokens", "4") as srv:
        load = ("--scenario", "concurrency", "--concurrency", "4", "--query-count", "200")
        kserve = _run("--sut", f"{srv.url}/v2/models/m/infer", *load)
        template = _run("--sut", srv.url, "--request-template", str(tpl), *load)
        stream = _run("--sut", f"openai+{srv.url}/v1/completions", "--model", "m", *load)
        whole = _run("--sut", f"openai+{srv.url}/v1/completions", "--model", "m", "--no-stream", *load)
        embeddings = _run("--sut", f"openai+{srv.url}/v1/embeddings", "--model", "m", *load)
        turns = _run("--sut", f"openai+{srv.url}/v1/chat/completions", "--model", "m", "--turns", "2", *load)
        asked = _run("--sut", f"{srv.url}/v2/models/m/infer", *load, "--http-engine", "asyncio")
        asked_whole = _run("--sut", f"openai+{srv.url}/v1/completions", "--model", "m", "--no-stream", *load,
                           "--http-engine", "asyncio")
    assert kserve["network"]["http_engine"] == template["network"]["http_engine"] == "native"
    assert stream["network"]["http_engine"] == whole["network"]["http_engine"] == "native"
    assert embeddings["network"]["http_engine"] == turns["network"]["http_engine"] == "native"
    assert asked["network"]["http_engine"] == asked_whole["network"]["http_engine"] == "asyncio"
    for doc in (kserve, template, stream, whole, embeddings, turns, asked, asked_whole):
        assert doc["counts"]["completed"] == 200 and doc["counts"]["failed"] == 0


def test_io_threads_spread_the_connections(tmp_path):
    with start_scripted(tmp_path) as srv:
        doc = _run("--sut", f"{srv.url}/v2/models/m/infer", *NATIVE, "--io-threads", "2", "--scenario",
                   "concurrency", "--concurrency", "6", "--query-count", "1500")
        stats = srv.stats()
    assert doc["counts"]["completed"] == stats["infer_ok"] == 1500
    assert doc["network"]["io_threads"] == 2


def test_a_server_killed_mid_run_gives_counted_errors(tmp_path):
    srv = start_scripted(tmp_path)
    try:
        doc = _kill_mid_run(srv, f"{srv.url}/v2/models/m/infer", tmp_path, extra=NATIVE)
    finally:
        srv.stop()
    assert doc["network"]["http_engine"] == "native"
    assert set(doc["errors"]["counts"]) <= {"connect_refused", "connection_reset"}
    assert doc["errors"]["counts"].get("connect_refused", 0) > 0
    assert any("connecting to 127.0.0.1:" in m for m in doc["errors"]["messages"])


def test_a_response_too_large_fails_and_closes_its_connection(tmp_path):
    with start_scripted(tmp_path) as srv:
        doc = _run("--sut", f"{srv.url}/v2/models/m/infer", *NATIVE, "--scenario", "concurrency",
                   "--query-count", "20", "--max-response-bytes", "64", "--max-error-rate", "1",
                   "--input", "INPUT0:FP32:1x16")
    assert doc["errors"]["counts"] == {"response_too_large": 20}
    assert "over --max-response-bytes (64 bytes)" in doc["errors"]["messages"][0]
    assert doc["network"]["connects"] >= 20  # each failure closed its connection


@pytest.mark.parametrize("url, says", [("grpc://127.0.0.1:{port}/m", "not grpc")])
def test_targets_the_native_client_does_not_run_are_exit_2(tmp_path, url, says):
    with start_scripted(tmp_path) as srv:
        proc = _run("--sut", url.format(port=srv.port), *NATIVE, "--query-count", "5", "--ready-timeout-s", "2",
                    expect=2)
    assert "--http-engine native" in proc.stderr and says.lower() in proc.stderr.lower(), proc.stderr


@pytest.mark.parametrize("mode", ["closed", "poisson", "poisson-spin"])
def test_in_process_runs_through_the_python_api(tmp_path, mode):
    """The native client in this process (as the sanitizer runs drive it): the engine
    API, with a check that fails some responses, and the counts against the server's."""
    from loadgen.engine import Engine, EngineSettings
    from loadgen.net import open_target
    from loadgen.net.native import NativeHttpSUT
    from loadgen.net.options import NetOptions

    with start_scripted(tmp_path, "--wrong-output-every", "9") as srv:
        sut = open_target(f"{srv.url}/v2/models/m/infer", NetOptions(http_engine="native", connections=4),
                          pool_size=4)
        assert isinstance(sut, NativeHttpSUT)
        # poisson-spin: the timing I/O thread polls the last 200 us before each arrival.
        settings = (EngineSettings(mode="closed", concurrency=4, query_count=900) if mode == "closed" else
                    EngineSettings(mode="poisson", target_qps=3000, query_count=900, max_in_flight=4,
                                   spin_us=200 if mode == "poisson-spin" else 0))
        result = Engine(settings, sut).run()
        stats = srv.stats()
    c = result.counts
    assert c["issued"] == 900 == stats["infer_requests"]
    assert c["failed"] == 100 and c["completed"] == 800 == stats["infer_ok"]
    assert result.errors == {"invalid_response": 100}
    report = sut.report()
    assert report["native"]["responses"] == 900 and report["responses_checked"] == 900
