"""Every benchmark script in bench/ answers --help: its options are documented and its
help text formats (argparse expands % in help strings, so a stray one breaks --help)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# Modules and peer clients the benchmarks run or import: no options of their own.
PEERS = {"aiohttp_client.py", "mlperf_peer.py", "peak_sut.py", "triton_peers.py"}
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in PEERS)


def test_the_benchmarks_are_found():
    assert {"bench_http.py", "bench_grpc.py", "bench_engine.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_help(name):
    p = subprocess.run([sys.executable, str(BENCH / name), "--help"], capture_output=True, text=True,
                       timeout=60, cwd=BENCH.parent)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "usage:" in p.stdout and "--" in p.stdout
