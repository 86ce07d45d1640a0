"""OpenAI-compatible streaming against the scripted server (tests/servers/scripted.py),
whose record of each stream (the kernel's receive time of the request, the time of each
token's write) is the truth that loadgen's time to first token and inter-token gaps are
checked against. The CLI runs as a subprocess; every server is ended by its PID.

Kept apart from the MLServer and Triton tests so that no idle server of theirs shares the
two cores while timing is checked.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.servers.scripted_proc import start_scripted
from tests.helpers import clean_env
from tests.integration.test_net_servers import run_doc

pytestmark = pytest.mark.integration


def _percentile(values, p):
    return float(np.percentile(np.asarray(values, dtype=np.float64), p))


def _stream_errors_ms(tmp_path, endpoint):
    """One 64-stream run of 5 s (about 870 streams, 27,000 gaps): (reported - truth) for
    TTFT and ITL at p50, p90 and the mean, in ms, and the run's document."""
    with start_scripted(tmp_path, "--ttft-ms", "50", "--itl-ms", "10", "--tokens", "32") as srv:
        doc = run_doc("--sut", f"openai+{srv.url}/v1/{endpoint}", "--model", "m", "--scenario", "concurrency",
                      "--concurrency", "64", "--duration-s", "5", "--grace-s", "5")
        stats = srv.stats()
    # The streams of loadgen's ramp (--ramp-up-s auto: 64 ms at 64 streams) are counted
    # apart like a warm-up: the truth leaves out as many, the first the server received.
    skip = (doc.get("warmup") or {}).get("issued", 0)
    streams = sorted(stats["streams"], key=lambda s: s["recv_ns"])[skip:]
    streams = [s for s in streams if len(s["token_write_ns"]) == 32]
    truth_ttft = [s["token_write_ns"][0] - s["recv_ns"] for s in streams]
    truth_itl = [b - a for s in streams for a, b in zip(s["token_write_ns"], s["token_write_ns"][1:])]
    errors = {}
    for p, key in ((50, "p50"), (90, "p90")):
        errors[f"ttft_{key}"] = (doc["ttft_ns"][key] - _percentile(truth_ttft, p)) / 1e6
        errors[f"itl_{key}"] = (doc["itl_ns"][key] - _percentile(truth_itl, p)) / 1e6
    errors["ttft_mean"] = (doc["ttft_ns"]["mean"] - float(np.mean(truth_ttft))) / 1e6
    errors["itl_mean"] = (doc["itl_ns"]["mean"] - float(np.mean(truth_itl))) / 1e6
    return errors, doc


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_streaming_ttft_and_itl_agree_with_the_servers_truth_at_64_streams(tmp_path, endpoint):
    # The server's record is the truth: the kernel's receive time of each request and the
    # time each event was written. Medians, p90 and means must agree within 2 ms. The p99
    # is measured by bench/bench_stream.py instead: on two shared cores one stall of a few
    # milliseconds moves it from run to run (0.6 to 3 ms here), which would make this test
    # depend on the machine's neighbours. Two tries, for the same reason.
    attempts = []
    for _ in range(2):
        errors, doc = _stream_errors_ms(tmp_path, endpoint)
        attempts.append(errors)
        if all(abs(e) < 2.0 for e in errors.values()):
            break
    assert all(abs(e) < 2.0 for e in errors.values()), attempts
    c = doc["counts"]
    assert c["failed"] == 0 and c["completed"] > 64 * 9  # 64 * 5 s / 0.36 s = 890 at most
    assert doc["network"]["tokens"]["source"] == "usage"
    # The client counts every stream it read, its ramp's too; the engine's counts only
    # the measured ones.
    ramp = (doc.get("warmup") or {}).get("completed", 0)
    assert doc["network"]["tokens"]["output_tokens"] == 32 * (c["completed"] + ramp)
    assert c["tokens"] == 32 * c["completed"]
    assert 9e6 < doc["tpot_ns"]["p50"] < 11e6
    tps = doc["output_tokens_per_s"]["p50"]
    # 32 tokens over at least 50 + 31 * 10 ms; the histogram's precision is 0.1%.
    assert 32 / 0.37 < tps < 32 / 0.36 * 1.002


def test_tokens_are_counted_from_chunks_without_usage(tmp_path):
    with start_scripted(tmp_path, "--ttft-ms", "5", "--itl-ms", "1", "--tokens", "8", "--no-usage",
                        "--tokens-per-chunk", "2") as srv:
        body = {"model": "m", "prompt": "hi", "max_tokens": 8}  # no stream_options: no usage chunk
        (tmp_path / "p.jsonl").write_text(json.dumps(body) + "\n")
        doc = run_doc("--sut", f"openai+{srv.url}/v1/completions", "--payload", str(tmp_path / "p.jsonl"),
                      "--scenario", "concurrency", "--query-count", "20")
    # loadgen asks for usage (stream_options.include_usage) unless the body says otherwise.
    assert doc["network"]["tokens"]["source"] == "usage"
    assert doc["counts"]["tokens"] == 8 * 20
    body["stream_options"] = {"include_usage": False}
    (tmp_path / "p.jsonl").write_text(json.dumps(body) + "\n")
    with start_scripted(tmp_path, "--ttft-ms", "5", "--itl-ms", "1", "--tokens", "8", "--no-usage",
                        "--tokens-per-chunk", "2") as srv:
        doc = run_doc("--sut", f"openai+{srv.url}/v1/completions", "--payload", str(tmp_path / "p.jsonl"),
                      "--scenario", "concurrency", "--query-count", "20")
    assert doc["network"]["tokens"]["source"] == "chunks"
    assert doc["counts"]["tokens"] == 4 * 20  # 4 chunks of 2 tokens: chunks undercount, and the result says so


@pytest.mark.parametrize("engine", ["asyncio", "native"])
def test_stream_server_killed_mid_run_counts_errors(tmp_path, engine):
    srv = start_scripted(tmp_path, "--ttft-ms", "20", "--itl-ms", "5", "--tokens", "20")
    try:
        out = tmp_path / "out"
        cmd = [sys.executable, "-m", "loadgen", "run", "--sut", f"openai+{srv.url}/v1/completions", "--model", "m",
               "--scenario", "concurrency", "--concurrency", "16", "--duration-s", "3", "--output", str(out),
               "--quiet", "--http-engine", engine]
        proc = subprocess.Popen(cmd, env=clean_env(), stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        os.kill(srv.pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        srv.stop()
    assert proc.returncode == 1, stderr
    doc = json.loads((out / "result.json").read_text())
    assert doc["counts"]["completed"] > 16 and doc["counts"]["failed"] >= 16
    # connect_error: a reconnect that failed otherwise than refused (both clients name it so)
    assert set(doc["errors"]["counts"]) <= {"connection_reset", "connect_refused", "connect_error"}, \
        doc["errors"]["messages"]
    assert doc["network"]["tokens"]["output_tokens"] == 20 * doc["counts"]["completed"]
    assert doc["network"].get("http_engine", "asyncio") == engine


