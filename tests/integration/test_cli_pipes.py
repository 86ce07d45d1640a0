"""Output to a closed pipe, as in ``loadgen report RESULT | head -1``, ends the command
quietly: no traceback, exit code 141 (128 + SIGPIPE), and ``run`` writes its result files
before stdout can fail.

Each command's stdout is a pipe that the test closes after reading one line. For the
process to meet the closed pipe, it must still have output to write then: ``report`` and
``hlog`` are given enough to print that it cannot all fit in the pipe's buffer, and ``run``
lasts past its first progress line (printed after 5 s when stdout is not a terminal).
Both stdout modes are covered where it is cheap: block-buffered, and unbuffered as under
PYTHONUNBUFFERED=1.
"""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import loadgen

pytestmark = pytest.mark.integration

EXIT_BROKEN_PIPE = 141
TIMEOUT_S = 60
PIPE_FILLING_BYTES = 256 * 1024  # well past a pipe's buffer (64 KiB on Linux) and the reader's


def _env(unbuffered=None):
    """The environment for the CLI; ``unbuffered`` True/False sets or clears
    PYTHONUNBUFFERED, None keeps the caller's."""
    env = dict(os.environ)
    if unbuffered is not None:
        env.pop("PYTHONUNBUFFERED", None)
        if unbuffered:
            env["PYTHONUNBUFFERED"] = "1"
    return env


def _start(args, env, stdout):
    return subprocess.Popen([sys.executable, "-m", "loadgen", *args], stdout=stdout,
                            stderr=subprocess.PIPE, env=env)


def _watchdog(proc, timeout_s):
    """Kills ``proc`` if it is still running after ``timeout_s``, which also unblocks any
    read of its pipes."""
    timer = threading.Timer(timeout_s, proc.kill)
    timer.daemon = True
    timer.start()
    return timer


def _read_one_line_then_close(args, env=None, timeout_s=TIMEOUT_S):
    """Runs the CLI with stdout a pipe, reads one line of it, closes the pipe and waits.

    Returns:
        (the line read, the exit code, stderr as text).
    """
    proc = _start(args, env, subprocess.PIPE)
    timer = _watchdog(proc, timeout_s)
    try:
        line = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read().decode(errors="replace")
        code = proc.wait(timeout=timeout_s)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert code != -9, f"loadgen {' '.join(args)} did not end within {timeout_s} s; stderr: {err}"
    return line.decode(errors="replace"), code, err


def _run_into_closed_pipe(args, env=None, stderr_too=False, timeout_s=TIMEOUT_S):
    """Runs the CLI with stdout (and with ``stderr_too`` stderr) a pipe whose reader has
    already gone, for output too short to outlast a reader. Returns (exit code, stderr)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "loadgen", *args], stdout=write_end,
            stderr=write_end if stderr_too else subprocess.PIPE, env=env, timeout=timeout_s,
        )
    finally:
        os.close(write_end)
    return proc.returncode, (proc.stderr or b"").decode(errors="replace")


def _assert_quiet(code, err):
    assert "Traceback" not in err, err
    assert "BrokenPipeError" not in err, err
    assert code == EXIT_BROKEN_PIPE, (code, err)


@pytest.fixture(scope="module")
def result_json(tmp_path_factory):
    """A result.json made by a short run."""
    out = tmp_path_factory.mktemp("short-run")
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "run", "--scenario", "constant", "--target-qps", "200",
         "--duration-s", "0.5", "--sut", "null", "--quiet", "--output", str(out)],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    # Valid or not (a loaded machine can delay issues past the limit), it has a result.
    assert proc.returncode in (0, 1), proc.stderr
    return out / "result.json"


@pytest.fixture(scope="module")
def many_tag_log(tmp_path_factory):
    """An interval log with so many tags that ``loadgen hlog`` prints a long table."""
    path = tmp_path_factory.mktemp("hlog") / "tags.hlog"
    rng = np.random.default_rng(3)
    with open(path, "w") as f:
        w = loadgen.HistogramLogWriter(f)
        w.write_header(1_700_000_000.0)
        for i in range(PIPE_FILLING_BYTES // 150):  # a table row is about 170 characters
            h = loadgen.Histogram()
            h.record_array(rng.integers(1_000, 5_000_000, size=20))
            w.write_interval(h, start_s=0.0, interval_s=1.0, tag=f"t{i}")
    return path


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
def test_report_into_closed_pipe_ends_quietly(result_json, unbuffered):
    one = len(subprocess.run([sys.executable, "-m", "loadgen", "report", str(result_json)],
                             capture_output=True, timeout=TIMEOUT_S).stdout)
    copies = PIPE_FILLING_BYTES // max(one, 1) + 1
    line, code, err = _read_one_line_then_close(["report", *[str(result_json)] * copies], _env(unbuffered))
    assert line.startswith("== "), line  # several results: each headed by its path
    _assert_quiet(code, err)


def test_report_json_into_closed_pipe_ends_quietly(result_json):
    copies = PIPE_FILLING_BYTES // len(json.dumps(json.loads(result_json.read_text()), indent=2)) + 1
    line, code, err = _read_one_line_then_close(["report", "--json", *[str(result_json)] * copies])
    assert line.startswith("{"), line
    _assert_quiet(code, err)


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
def test_hlog_into_closed_pipe_ends_quietly(many_tag_log, unbuffered):
    line, code, err = _read_one_line_then_close(["hlog", str(many_tag_log)], _env(unbuffered))
    assert line.startswith("tag"), line
    _assert_quiet(code, err)


@pytest.mark.parametrize("duration_s", [
    pytest.param(6, id="closed-before-summary"),  # the summary meets the closed pipe
    pytest.param(11, id="closed-during-run"),     # the second progress line (10 s) meets it
])
def test_run_into_closed_pipe_keeps_result_and_ends_quietly(tmp_path, duration_s):
    out = tmp_path / "out"
    line, code, err = _read_one_line_then_close(
        ["run", "--scenario", "constant", "--target-qps", "200", "--duration-s", str(duration_s),
         "--sut", "null", "--output", str(out)],
        _env(False),
    )
    assert " issued " in line and " completed " in line, line  # the first progress line
    _assert_quiet(code, err)
    doc = json.loads((out / "result.json").read_text())
    assert doc["scenario"] == "constant" and not doc["interrupted"]
    assert doc["duration_s"] >= duration_s - 0.5  # the whole run, not one cut short
    assert (out / "summary.txt").exists()


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["run", "--help"], []],
                         ids=["help", "version", "run-help", "no-command"])
def test_help_and_version_into_closed_pipe_end_quietly(args):
    _assert_quiet(*_run_into_closed_pipe(args))


def test_usage_error_with_stdout_closed_is_still_a_usage_error(tmp_path):
    code, err = _run_into_closed_pipe(["report", str(tmp_path / "absent.json")])
    assert code == 2
    assert "cannot read" in err and "Traceback" not in err


def test_error_message_into_closed_pipe_ends_quietly(tmp_path):
    # As in `loadgen report absent.json 2>&1 | head -1`: the message itself meets the pipe.
    code, _ = _run_into_closed_pipe(["report", str(tmp_path / "absent.json")], stderr_too=True)
    assert code == EXIT_BROKEN_PIPE
