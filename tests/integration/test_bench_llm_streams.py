"""bench/bench_llm_streams.py without its peers: the server-record figures and the
request-by-request truth on hand-made records, and one tiny level of the ladder with
loadgen alone against the scripted server (a few seconds)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench_modules import load_bench

pytestmark = pytest.mark.integration

BENCH_PY = Path(__file__).resolve().parents[2] / "bench" / "bench_llm_streams.py"
MS = 1_000_000


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_llm_streams")


def record(recv_ms: int, writes_ms: list[float], tokens: int = 10, k: int = 4, first: int = 1) -> dict:
    return {"recv_ns": recv_ms * MS, "tokens": tokens, "tokens_per_event": k, "first_event_tokens": first,
            "token_write_ns": [round(w * MS) for w in writes_ms], "usage_sent": True}


def test_server_figures(bench):
    # ttft 20 ms, itl 5 ms, 10 tokens (0..9) as 1 + 4 + 4 + 1: an event is due with its last
    # token, 20, 40, 60 and 65 ms after receipt.
    done = record(0, [20, 40, 62, 65])  # the third event 2 ms late
    cut = record(100, [121, 140])  # 1 ms late, then on time; ended after 5 tokens
    fig = bench.server_figures({"streams": [done, cut, record(200, [])]}, ttft_ms=20, itl_ms=5)
    assert (fig["streams"], fig["finished"], fig["events"], fig["tokens"]) == (3, 1, 6, 15)
    assert fig["span_s"] == pytest.approx(0.140)  # first receipt 0, last write 140 ms
    assert fig["tokens_per_s"] == pytest.approx(15 / 0.140)
    assert fig["late_p50_ms"] == 0 and fig["late_p99_ms"] == 2
    warm = bench.server_figures({"streams": [cut, done]}, ttft_ms=20, itl_ms=5, skip=1)  # the first received
    assert (warm["streams"], warm["finished"], warm["events"]) == (1, 0, 6)


def test_server_figures_take_the_native_servers_own_lateness(bench):
    # The native server records each write's lateness itself (write_late_ns): those figures
    # are the ones reported, here unlike the write times' (all on time).
    done = {**record(0, [20, 40, 60, 65]), "write_late_ns": [0, 3 * MS, 1 * MS, 7 * MS]}
    fig = bench.server_figures({"streams": [done]}, ttft_ms=20, itl_ms=5)
    assert fig["late_p50_ms"] == 1 and fig["late_p99_ms"] == 7 and fig["late_max_ms"] == 7
    assert (fig["finished"], fig["events"], fig["tokens"]) == (1, 4, 10)


def test_matched_truth_pairs_requests_by_the_servers_id(bench):
    stats = {"streams": [record(1000, [1050]), record(2000, [2060]), record(3000, [])]}
    reported = {"chatcmpl-1000000000": 51.5, "chatcmpl-2000000000": 60.25, "chatcmpl-3000000000": 9.0,
                "chatcmpl-7": 1.0}  # no first token written, and unknown: not matched
    m = bench.matched_truth(stats, reported)
    assert (m["streams"], m["unmatched"]) == (2, 2)
    assert (m["reported_p50"], m["ttft_p50"]) == (51.5, 50.0)
    assert (m["reported_p99"], m["ttft_p99"]) == (60.25, 60.0)


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("LOADGEN_")}


def test_bad_tools_are_named(tmp_path):
    p = subprocess.run([sys.executable, str(BENCH_PY), "--tools", "loadgen,wrk"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path, env=_env())
    assert p.returncode == 2 and "--tools: 'loadgen,wrk'" in p.stderr


@pytest.mark.parametrize("flag", ["--server-rt-priority", "--client-rt-priority"])
def test_a_bad_priority_is_named(tmp_path, flag):
    p = subprocess.run([sys.executable, str(BENCH_PY), "--tools", "loadgen", flag, "100"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path, env=_env())
    assert p.returncode == 2 and f"{flag} 100: give 0" in p.stderr


def test_one_level_with_loadgen_alone(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("the bench pins the client and the server to two different cores")
    out = tmp_path / "streams.json"
    p = subprocess.run([sys.executable, str(BENCH_PY), "--tools", "loadgen", "--levels", "16", "--duration-s", "2", "--rounds", "1",
                        "--tokens", "32", "--tokens-per-chunk", "4", "--client-cpu", str(cpus[0]),
                        "--server-cpu", str(cpus[1]), "--nice", "0", "--json", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_env())
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads(out.read_text())
    (run,) = doc["runs"]
    assert run["tool"] == "loadgen" and run["level"] == 16 and "error" not in run
    # 32 tokens as 1 + 7 x 4 + 3: 9 events per stream; every stream loadgen completed the server finished.
    srv, rep = run["server"], run["reported"]
    assert rep["completed"] >= 16 and rep["failed"] == 0 and srv["finished"] >= rep["completed"]
    assert srv["events"] >= 9 * srv["finished"] and srv["tokens"] >= 32 * srv["finished"]
    assert rep["tokens"] == 32 * rep["completed"]
    assert run["truth"]["streams"] >= rep["completed"] and run["truth"]["ttft_p99"] >= 50
    assert run["ttft_p99_error_ms"] == pytest.approx(rep["ttft_p99"] - run["truth"]["ttft_p99"])
    assert run["sustained"] is (abs(run["ttft_p99_error_ms"]) <= 2.0)
    assert doc["summary"]["sustained"]["loadgen"] == (16 if run["sustained"] else None)
    assert doc["fixed_cpu_s"]["loadgen"] > 0 and run["cpu_s"] > 0
    assert "| 16      | loadgen |" in p.stdout
    # the native truth server where g++ builds it, else the Python one, saying why
    assert ("server native" if shutil.which("g++") else "the native server did not build") in p.stdout.splitlines()[0]
    assert run["server"]["late_max_ms"] >= run["server"]["late_p99_ms"] >= 0
