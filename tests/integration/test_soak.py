"""Soak, small enough for CI: ``run_benchmark`` called 50 times in one process against
real servers on 127.0.0.1 leaves file descriptors and threads where they were and RSS
flat, and the null SUT's peak RSS does not grow with the query count. The full soaks
(1000 runs; 1e8 queries) are ``python bench/soak.py [--server]``, figures in
bench/RESULTS.md; this runs the same code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench_modules import load_bench

pytestmark = pytest.mark.integration

SOAK_PY = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


@pytest.fixture(scope="module")
def soak():
    return load_bench("soak")


def test_fifty_runs_against_servers_leave_fds_threads_and_rss_flat(tmp_path):
    # 50 runs of 0.05 s (about 0.1 s each with readiness and the document), four kinds in
    # turn: KServe REST with a Prometheus scrape, OpenAI streaming, a server that closes
    # connections and answers 500s, and a target nobody listens on. The first 10 warm up.
    # In a process of its own: the test runner's RSS also moves with what earlier tests
    # left (their threads' allocator arenas), which is not this process's growth.
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, str(SOAK_PY), "--server", "--runs", "50", "--run-s", "0.05", "--warmup",
                           "10", "--max-rss-growth-mb", "16", "--workdir", str(tmp_path), "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["passed"] and proc.returncode == 0, (res["problems"], proc.stdout[-2000:])
    base, last = res["baseline"], res["last"]
    assert (last["fds"], last["py_threads"], last["os_threads"]) == (base["fds"], base["py_threads"],
                                                                     base["os_threads"])
    # 16 MB, the tool's own default: in about one run in three the allocator takes one
    # step of about 8 MB (a new malloc arena for a thread, once, then flat), which is not a
    # leak; a leak of 400 KiB a run still passes the limit in these 40 runs.
    assert res["rss_growth_mb"] < 16.0
    kinds = res["kinds"]
    assert set(kinds) == {"kserve+metrics", "openai-stream", "kserve-faults", "not-listening"}
    assert all(k["runs"] >= 12 for k in kinds.values())
    assert kinds["kserve-faults"]["last_outcome"].endswith("failed") and " 0 failed" not in \
        kinds["kserve-faults"]["last_outcome"]
    assert kinds["not-listening"]["last_outcome"].startswith("refused")


def test_judge_catches_a_leaked_fd_and_a_leftover_thread(soak):
    rows = [{"run": i, "kind": "k", "s": 0.1, "outcome": "ok", "fds": 9, "py_threads": 1, "os_threads": 2,
             "rss_kb": 70_000} for i in range(20)]
    assert soak.judge(rows, 5, 8.0, 1.0)["passed"]
    leaky = [{**r, "fds": 9 + max(0, r["run"] - 4)} for r in rows]
    assert any(p.startswith("fds") for p in soak.judge(leaky, 5, 8.0, 1.0)["problems"])
    thread = [{**r, "os_threads": 3 if r["run"] == 19 else 2} for r in rows]
    assert any(p.startswith("os_threads") for p in soak.judge(thread, 5, 8.0, 1.0)["problems"])
    growing = [{**r, "rss_kb": 70_000 + 1024 * r["run"]} for r in rows]
    assert "RSS grew" in soak.judge(growing, 5, 8.0, 1.0)["problems"][0]


def test_null_sut_peak_rss_is_flat_from_1e5_to_1e6_queries(soak):
    res = soak.null_soak([10**5, 10**6], ["closed"], concurrency=8, max_ratio=1.10, timeout_s=120)
    assert res["passed"], res["ratios"]
    assert all(r["completed"] == r["n"] for r in res["runs"])
