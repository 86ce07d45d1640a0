"""The command line as a process: a SUT that calls ``sys.exit()``, signals at every stage
of a run (SIGTERM, SIGINT, SIGHUP), sweep hooks that print without end, ``--json`` with a
closed or full stdout, and ``scripts/fuzz.sh`` when its target listing fails.

Each test starts the CLI (or the script) as a subprocess, bounded in time, ended by its
PID when it outlives the test, and reads what it wrote. Runs are short, and waits are
generous: the test machine has two noisy cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import List, Optional

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_FILES = {"result.json", "summary.txt", "latency.hlog", "results.csv", "report.html"}


def clean_env(**extra: str) -> dict:
    """The environment without any LOADGEN_* variable of the caller's, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOADGEN_")}
    env.update(extra)
    return env


def run_cli(*args: object, timeout: float = 90, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadgen", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=clean_env(), **kwargs)


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def one_line_error(stderr: str) -> str:
    """The one error line of ``stderr`` (warnings aside); fails on a traceback."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    return errors[0]


# ------------------------------------------------------- a SUT that calls sys.exit()

EXIT_AT_IMPORT = """
import sys
sys.exit({code})


def f(sample):
    pass
"""

EXIT_IN_CONSTRUCTOR = """
class B:
    def __init__(self):
        raise SystemExit({code})

    def issue(self, batch):
        batch.complete()
"""


@pytest.mark.parametrize("where, code, shown", [
    ("import", "0", "sys.exit(0)"),
    ("import", "3", "sys.exit(3)"),
    ("import", "'no GPU here'", "sys.exit('no GPU here')"),
    ("constructor", "0", "sys.exit(0)"),
])
@pytest.mark.parametrize("form", ["file", "module"])
def test_a_sut_calling_sys_exit_while_loading_is_exit_2_naming_it(tmp_path, where, code, shown, form):
    source = EXIT_AT_IMPORT if where == "import" else EXIT_IN_CONSTRUCTOR
    write(tmp_path / "exiting_sut.py", source.format(code=code))
    module = str(tmp_path / "exiting_sut.py") if form == "file" else "exiting_sut"
    sut = f"python:{module}:{'f' if where == 'import' else 'B'}"
    out = tmp_path / "out"
    proc = run_cli("run", "--sut", sut, "--duration-s", "1", "--output", out, "--quiet", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert one_line_error(proc.stderr) == f"error: SUT {sut!r} called {shown} while loading"
    assert not (out / "result.json").exists()


def test_a_sweep_point_whose_sut_calls_sys_exit_while_loading_fails_naming_it(tmp_path):
    write(tmp_path / "exiting_sut.py", EXIT_AT_IMPORT.format(code="0"))
    out = tmp_path / "out"
    proc = run_cli("sweep", "--sut", "python:exiting_sut:f", "--duration-s", "1", "--vary", "target-qps=100,200",
                   "--output", out, "--quiet", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # a sweep with failed points
    assert "Traceback" not in proc.stderr
    records = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines()]
    assert [r["sweep"]["status"] for r in records] == ["failed", "failed"]
    assert all("'python:exiting_sut:f' called sys.exit(0) while loading" in r["sweep"]["error"] for r in records)


EXIT_OPENING_OR_CLOSING = """
import asyncio
import time

from loadgen.sut import CallbackSUT, LoopSUT


class Callback(CallbackSUT):
    def __init__(self, exit_in):
        self.exit_in = exit_in

    def open(self, sink):
        if self.exit_in == "open":
            raise SystemExit(0)
        self.sink = sink

    def issue_query(self, query_id, sample_index, scheduled_ns):
        self.sink.complete(query_id, time.monotonic_ns())

    def close(self):
        if self.exit_in == "close":
            raise SystemExit(0)


class Loop(LoopSUT):
    async def open_on_loop(self, loop, sink):
        raise SystemExit(0)

    def issue_query(self, query_id, sample_index, scheduled_ns):
        pass

    async def close_on_loop(self):
        pass


opening = Callback("open")
closing = Callback("close")
loop_opening = Loop()
"""


@pytest.mark.parametrize("attr, message, completed", [
    ("opening", "the SUT called sys.exit(0) in open(): the run was ended", False),
    ("loop_opening", "the SUT called sys.exit(0) in open_on_loop(): the run was ended", False),
    ("closing", "the SUT called sys.exit(0) in close()", True),
])
def test_a_sut_calling_sys_exit_opening_or_closing_is_an_error_with_the_result_saved(tmp_path, attr, message,
                                                                                     completed):
    sut = write(tmp_path / "exiting_sut.py", EXIT_OPENING_OR_CLOSING)
    out = tmp_path / "out"
    proc = run_cli("run", "--sut", f"python:{sut}:{attr}", "--duration-s", "1", "--target-qps", "100",
                   "--output", out, "--quiet")
    assert proc.returncode == 1, proc.stderr
    assert one_line_error(proc.stderr) == f"error: {message} (the measured result is saved in {out}/result.json)"
    doc = json.loads((out / "result.json").read_text())
    assert doc["valid"] is False and message in doc["invalid_reasons"]
    assert (doc["counts"]["completed"] > 0) is completed
    assert doc["interrupted"] is not completed  # closing comes once the run has ended
