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
import time
from pathlib import Path
from typing import Optional

import pytest
from tests.helpers import clean_env, run_cli, write

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OUTPUT_FILES = {"result.json", "summary.txt", "latency.hlog", "results.csv", "report.html"}


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


@pytest.mark.parametrize("command", [["run"], ["find-peak", "--latency-bound-ms", "10"]], ids=["run", "find-peak"])
def test_a_sut_raising_keyboard_interrupt_itself_while_loading_is_exit_2_not_an_interruption(tmp_path, command):
    sut = write(tmp_path / "raising_sut.py", "raise KeyboardInterrupt\n")
    proc = run_cli(*command, "--sut", f"python:{sut}:f", "--duration-s", "1", "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert one_line_error(proc.stderr) == f"error: SUT 'python:{sut}:f' raised KeyboardInterrupt while loading"


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


# ------------------------------------------------------------------------- signals

MARKER_SUT = """
import time

MARK = {mark!r}


def f(sample):
    open(MARK, "w").close()
    time.sleep(0.0005)
"""

SLOW_IMPORT_SUT = """
import time

open({mark!r}, "w").close()
time.sleep(60)


def f(sample):
    pass
"""

CODES = {signal.SIGTERM: 130, signal.SIGINT: 130, signal.SIGHUP: 129}


def start_cli(*args: object, cwd: Optional[Path] = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "loadgen", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=cwd)


def signal_when(proc: subprocess.Popen, mark: Path, sig: int, after_s: float = 0.5,
                timeout_s: float = 60) -> subprocess.CompletedProcess:
    """Sends ``sig`` to ``proc`` ``after_s`` after ``mark`` appears; waits for its end."""
    try:
        deadline = time.monotonic() + timeout_s
        while not mark.exists():
            if proc.poll() is not None:
                pytest.fail(f"exited early with {proc.returncode}: {proc.communicate()[1]}")
            assert time.monotonic() < deadline, f"{mark.name} did not appear within {timeout_s} s"
            time.sleep(0.05)
        time.sleep(after_s)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()  # only the process this test started
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_during_the_warm_up_writes_every_file_of_an_interrupted_run(tmp_path, sig):
    mark = tmp_path / "started"
    sut = write(tmp_path / "marker.py", MARKER_SUT.format(mark=str(mark)))
    out = tmp_path / "out"
    proc = signal_when(start_cli("run", "--sut", f"python:{sut}:f", "--target-qps", "200", "--warmup-s", "30",
                                 "--duration-s", "5", "--output", out, "--quiet"), mark, sig)
    assert proc.returncode == CODES[sig], proc.stderr
    assert "Traceback" not in proc.stderr and "error" not in proc.stderr, proc.stderr
    assert set(os.listdir(out)) == OUTPUT_FILES
    doc = json.loads((out / "result.json").read_text())
    assert doc["interrupted"] is True and doc["valid"] is False
    assert doc["counts"]["issued"] == 0 and doc["warmup"]["issued"] > 0  # stopped before measuring began
    assert all(p["length_s"] >= 0 for p in doc["timeseries"])
    assert (out / "summary.txt").read_text().startswith("INVALID")
    assert (out / "latency.hlog").read_text().startswith("#")


def test_sighup_during_the_run_stops_it_and_writes_an_interrupted_result_exit_129(tmp_path):
    mark = tmp_path / "started"
    sut = write(tmp_path / "marker.py", MARKER_SUT.format(mark=str(mark)))
    out = tmp_path / "out"
    proc = signal_when(start_cli("run", "--sut", f"python:{sut}:f", "--target-qps", "200", "--duration-s", "30",
                                 "--output", out, "--quiet"), mark, signal.SIGHUP)
    assert proc.returncode == 129, proc.stderr
    assert "Traceback" not in proc.stderr
    assert set(os.listdir(out)) == OUTPUT_FILES
    doc = json.loads((out / "result.json").read_text())
    assert doc["interrupted"] is True and 0 < doc["counts"]["issued"] < 3000


@pytest.mark.parametrize("sig", list(CODES), ids=[s.name for s in CODES])
def test_a_signal_while_the_sut_loads_is_one_line_and_the_signals_exit_code(tmp_path, sig):
    mark = tmp_path / "loading"
    sut = write(tmp_path / "slow_sut.py", SLOW_IMPORT_SUT.format(mark=str(mark)))
    out = tmp_path / "out"
    started = time.monotonic()
    proc = signal_when(start_cli("run", "--sut", f"python:{sut}:f", "--duration-s", "1", "--output", out),
                       mark, sig, after_s=0.2)
    assert proc.returncode == CODES[sig], proc.stderr
    assert time.monotonic() - started < 45  # not the 60 s the import sleeps
    expected = "interrupted" if sig == signal.SIGINT else f"interrupted by {sig.name}"
    assert proc.stderr.strip().splitlines() == [expected]
    assert not out.exists()


def test_sighup_during_a_sweep_ends_it_as_interrupted_exit_129(tmp_path):
    mark = tmp_path / "started"
    sut = write(tmp_path / "marker.py", MARKER_SUT.format(mark=str(mark)))
    out = tmp_path / "out"
    proc = signal_when(start_cli("sweep", "--sut", f"python:{sut}:f", "--duration-s", "30",
                                 "--vary", "target-qps=100,200", "--output", out, "--quiet"), mark, signal.SIGHUP)
    assert proc.returncode == 129, proc.stderr
    assert "Traceback" not in proc.stderr
    records = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines()]
    assert records[0]["sweep"]["status"] == "interrupted" and records[0]["interrupted"] is True


# -------------------------------------------------------- --json into a closed or full stdout

def _run_json(tmp_path: Path, stdout: str, *args: object) -> subprocess.CompletedProcess:
    """``loadgen ARGS --json`` in ``tmp_path`` with stdout ``closed`` (>&-), ``full``
    (/dev/full) or ``gone`` (a pipe whose reader has already closed it)."""
    cmd = [sys.executable, "-m", "loadgen", *map(str, args), "--json"]
    kw = dict(stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=tmp_path, timeout=90)
    if stdout == "closed":
        return subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *cmd], **kw)
    if stdout == "full":
        with open("/dev/full", "w") as full:
            return subprocess.run(cmd, stdout=full, **kw)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(cmd, stdout=write_end, **kw)
    finally:
        os.close(write_end)


def _saved_in(line: str) -> Path:
    return Path(line.rsplit("; it is saved in ", 1)[1])


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("stdout, reason", [("closed", "stdout is closed"),
                                            ("full", "stdout: No space left on device")])
@pytest.mark.parametrize("output", [False, True], ids=["no-output", "output"])
def test_json_into_a_closed_or_full_stdout_is_one_line_and_the_result_is_on_disk(tmp_path, stdout, reason, output):
    out = tmp_path / "out"
    args = ["run", "--sut", "null", "--scenario", "constant", "--target-qps", "200", "--duration-s", "0.5"]
    proc = _run_json(tmp_path, stdout, *args, *(["--output", out] if output else []))
    assert proc.returncode == 1, proc.stderr
    line = one_line_error(proc.stderr)
    assert line.startswith(f"error: --json: cannot write the result on stdout ({reason}); it is saved in "), line
    saved = _saved_in(line)
    if output:
        assert saved == out / "result.json"
    else:
        assert saved.parent == tmp_path and saved.name.startswith("loadgen-result-")
    doc = json.loads((tmp_path / saved).read_text())
    assert doc["scenario"] == "constant" and doc["counts"]["issued"] > 0


def test_json_into_a_pipe_already_closed_ends_quietly_with_the_result_saved(tmp_path):
    proc = _run_json(tmp_path, "gone", "run", "--sut", "null", "--duration-s", "0.5")
    assert proc.returncode == 141, proc.stderr  # a closed pipe, as before
    line = one_line_error(proc.stderr)
    assert line.startswith("error: --json: stdout closed before the result was written; it is saved in ")
    assert json.loads(_saved_in(line).read_text())["counts"]["issued"] > 0


@pytest.mark.parametrize("stdout", ["closed", "full"])
def test_sweep_json_lines_into_a_closed_or_full_stdout_name_the_file_that_has_them(tmp_path, stdout):
    out = tmp_path / "out"
    proc = _run_json(tmp_path, stdout, "sweep", "--sut", "null", "--duration-s", "0.5",
                     "--vary", "target-qps=100,200", "--output", out)
    assert proc.returncode == 1, proc.stderr
    line = one_line_error(proc.stderr)
    assert line.startswith("error: --json: cannot write the points' records on stdout (") and \
        line.endswith(f"they are saved in {out / 'sweep.jsonl'}"), line
    assert len((out / "sweep.jsonl").read_text().splitlines()) == 2


# ------------------------------------------------------ sweep hooks that print without end

KEEP = 64 * 1024


def _sweep_with_hook(tmp_path: Path, hook: str, *extra: object) -> dict:
    out = tmp_path / "out"
    proc = run_cli("sweep", "--sut", "null", "--duration-s", "0.2", "--vary", "target-qps=100", "--output", out,
                   "--before-point", hook, "--quiet", *extra)
    assert "Traceback" not in proc.stderr, proc.stderr
    (record,) = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines()]
    record["_dir"] = out / record["sweep"]["dir"]
    return record


def test_a_hook_printing_a_lot_keeps_its_first_and_last_64_kib_and_counts_the_rest(tmp_path):
    lines = 100_000  # 10-byte lines: 1,000,000 bytes
    hook = f"{sys.executable} -c \"import sys; sys.stdout.write(''.join(f'{{i:09d}}\\n' for i in range({lines})))\""
    record = _sweep_with_hook(tmp_path, hook)
    section = record["sweep"]["hooks"]["before-point"]
    assert section["ok"] is True and record["sweep"]["status"] == "done"
    assert section["dropped_bytes"] == {"stdout": 1_000_000 - 2 * KEEP}
    log = (record["_dir"] / section["logs"]["stdout"]).read_bytes()
    whole = "".join(f"{i:09d}\n" for i in range(lines)).encode()
    assert log.startswith(whole[:KEEP]) and log.endswith(whole[-KEEP:])
    assert f"{1_000_000 - 2 * KEEP} bytes of this output were dropped".encode() in log[KEEP:-KEEP]
    assert len(log) < 2 * KEEP + 200


def test_a_hook_printing_without_end_is_still_killed_at_its_timeout_with_bounded_logs(tmp_path):
    started = time.monotonic()
    record = _sweep_with_hook(tmp_path, "yes out & exec yes err >&2", "--hook-timeout-s", "2")
    assert time.monotonic() - started < 60
    section = record["sweep"]["hooks"]["before-point"]
    assert section["timed_out"] is True and record["sweep"]["status"] == "failed"
    assert section["dropped_bytes"]["stdout"] > 0 and section["dropped_bytes"]["stderr"] > 0
    for stream in ("stdout", "stderr"):
        assert (record["_dir"] / section["logs"][stream]).stat().st_size < 2 * KEEP + 200
    assert section["stderr_tail"].endswith("err\n") and len(section["stderr_tail"]) == 2000


# ------------------------------------------------------- scripts/fuzz.sh's target listing

FAKE_PYTHON = """#!/bin/sh
# Stands in for Python: 'import atheris' works; the target listing {does}.
case "$*" in
  *--list*) {listing} ;;
esac
exit 0
"""


@pytest.mark.parametrize("does, listing", [
    ("fails", 'echo "ImportError: no module named atheris" >&2; exit 1'),
    ("names nothing", "exit 0"),
])
def test_fuzz_sh_fails_when_the_python_targets_cannot_be_listed(tmp_path, does, listing):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.format(does=does, listing=listing))
    fake.chmod(0o755)
    # No C++ compiler: the native targets are skipped, so a listing failure that went
    # unseen would end the script at once with exit 0.
    env = clean_env(PYTHON=str(fake), CLANGXX=str(tmp_path / "no-such-clang++"))
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "fuzz.sh"), "1"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "fuzz.sh: " in proc.stderr and "tests/fuzz/fuzz_run.py --list" in proc.stderr, proc.stderr
    assert "clean" not in proc.stdout and "skipped" not in proc.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_while_waiting_for_start_at_is_the_signals_exit_code(tmp_path, sig):
    proc = start_cli("run", "--sut", "null", "--duration-s", "1", "--start-at", f"{time.time() + 120:.3f}",
                     "--output", tmp_path / "out")
    try:
        assert proc.stdout.readline().startswith("waiting ")  # prepared, waiting for the start
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()  # only the process this test started
            proc.communicate()
    assert proc.returncode == CODES[sig], err
    assert err.strip().splitlines()[-1] == f"interrupted by {sig.name}"
    assert not (tmp_path / "out" / "result.json").exists()  # nothing was measured
