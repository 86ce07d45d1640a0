"""``loadgen run`` against hostile input (issue 12): values that would overflow the core's
64-bit nanoseconds and counts, durations that round to nothing, rates and sizes the
engine cannot give, contradicting options, an --output that cannot be written, files
that are not what they should be, SIGTERM while a server's readiness is awaited, and
errors after the run (the measured result is saved first).

Each bad input must end in exit 2 with a message that names the option or file and
what is allowed, before anything runs and without a traceback. Every subprocess is
bounded in time, and only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from loadgen import cli
from loadgen.engine import EngineSettings
from loadgen.options import OptionError, resolve, unknown_environment
from tests.helpers import RELAXED, clean_env, run_cli

pytestmark = pytest.mark.integration


def assert_usage_error(proc, *fragments):
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr)
    assert proc.stdout == ""


# A long run: a bad value must be refused before it starts (the subprocess timeout is
# far shorter than the run would be).
LONG = ["--sut", "null", "--duration-s", "60", "--quiet"]


# ------------------------------------------------------------ row 4: 64-bit overflow

OVERFLOWS = [
    ("grace", ["--scenario", "constant", "--grace-s", "1e10"], ["--grace-s", "0..1e+08 s"]),
    ("timeout", ["--scenario", "constant", "--timeout-ms", "1e13"], ["--timeout-ms", "1e+11 ms"]),
    ("interval", ["--scenario", "constant", "--interval-s", "1e10"], ["--interval-s", "1e+08 s"]),
    ("duration", ["--scenario", "constant", "--duration-s", "1e10"], ["--duration-s", "1e+08 s"]),
    ("min-duration", ["--scenario", "server", "--min-duration-s", "1e300"], ["--min-duration-s", "1e+08 s"]),
    ("max-in-flight", ["--scenario", "constant", "--max-in-flight", "9223372036854775808"],
     ["--max-in-flight", "16777216"]),
    ("query-count", ["--scenario", "constant", "--query-count", "9223372036854775808"],
     ["--query-count", "1000000000000"]),
    ("min-query-count", ["--scenario", "server", "--min-query-count", "9223372036854775808"],
     ["--min-query-count", "1000000000000"]),
    ("samples-per-query", ["--scenario", "constant", "--samples-per-query", "9223372036854775808"],
     ["--samples-per-query", "8388608"]),
    ("sample-count", ["--scenario", "constant", "--sample-count", "9223372036854775808"],
     ["--sample-count", "9223372036854775807"]),
    ("latency-bound", ["--scenario", "constant", "--latency-bound-ms", "1e13"], ["--latency-bound-ms", "1e+11 ms"]),
    ("stage-duration", ["--scenario", "ramp", "--stages", "1e309s:100"], ["--stages", "1e309s:100", "1e+08 s"]),
]


@pytest.mark.parametrize("args, fragments", [c[1:] for c in OVERFLOWS], ids=[c[0] for c in OVERFLOWS])
def test_values_past_64_bits_are_exit_2_naming_the_option_and_its_range(args, fragments):
    proc = run_cli("run", *args, "--sut", "null", "--quiet", timeout=20)
    assert_usage_error(proc, *fragments)


BAD_SUTS = [
    ("sleep:inf", ["--sut sleep:inf", "0..3.6e+09 microseconds"]),
    ("sleep:1e30", ["--sut sleep:1e30", "0..3.6e+09 microseconds"]),
    ("demo:service_us=inf", ["--sut demo:service_us=inf", "service_us must be in 0..3.6e+09"]),
    ("demo:per_item_us=1e30", ["per_item_us must be in 0..3.6e+09"]),
    ("demo:max_batch=99999999999999999999", ["max_batch must be an integer in 1..1048576"]),
]


@pytest.mark.parametrize("sut, fragments", BAD_SUTS, ids=[s for s, _ in BAD_SUTS])
def test_native_sut_times_past_the_histogram_range_are_exit_2(sut, fragments):
    proc = run_cli("run", "--scenario", "constant", "--duration-s", "0.1", "--sut", sut, "--quiet", timeout=20)
    assert_usage_error(proc, *fragments)


@pytest.mark.parametrize("source", ["env", "config"])
def test_overflowing_counts_from_the_environment_or_a_config_file_are_exit_2(source, tmp_path):
    if source == "env":
        proc = run_cli("run", "--scenario", "constant", *LONG, timeout=20,
                       env=clean_env(LOADGEN_MAX_IN_FLIGHT="9223372036854775808"))
        assert_usage_error(proc, "--max-in-flight (environment LOADGEN_MAX_IN_FLIGHT)", "16777216")
    else:
        config = tmp_path / "c.toml"
        config.write_text("query-count = 9223372036854775808\n")
        proc = run_cli("run", "--scenario", "constant", "--config", config, *LONG, timeout=20)
        assert_usage_error(proc, "--query-count (config", "1000000000000")


@pytest.mark.parametrize("field, value", [
    ("grace_s", 1e10), ("interval_s", 1e10), ("duration_s", 1e10), ("min_duration_s", 1e300),
    ("timeout_ms", 1e13), ("max_in_flight", 2**63), ("query_count", 2**63), ("min_query_count", 2**63),
    ("samples_per_query", 2**63), ("sample_count", 2**63), ("latency_bounds_ns", (10**19,)),
])
def test_engine_settings_check_the_same_ranges_from_python(field, value):
    s = EngineSettings(mode="constant", target_qps=100.0, duration_s=1.0)
    setattr(s, field, value)
    with pytest.raises(ValueError, match=field):
        s.validate()


# ------------------------------------------------------- row 5: rounding to nothing

@pytest.mark.parametrize("args, fragments", [
    (["--scenario", "constant", "--duration-s", "1e-12"], ["--duration-s", "must be >= 1e-06 s"]),
    (["--scenario", "ramp", "--stages", "1e-12s:100"], ["--stages", "1e-12s:100", "between 1 us and"]),
    (["--scenario", "constant", "--duration-s", "1", "--interval-s", "1e-9"], ["--interval-s", "0 (none) or >= 0.001"]),
], ids=["duration", "stage", "interval"])
def test_durations_that_round_to_zero_ns_are_exit_2_with_the_minimum(args, fragments):
    proc = run_cli("run", *args, "--sut", "null", "--quiet", timeout=20)
    assert_usage_error(proc, *fragments)


# ------------------------------------------- row 6: bound past 64 bits; errors after

def test_a_latency_bound_past_64_bits_is_exit_2_before_the_run():
    start = time.monotonic()
    proc = run_cli("run", "--scenario", "server", "--latency-bound-ms", "1e13", "--sut", "null",
                   "--min-duration-s", "30", "--quiet", timeout=25)
    assert_usage_error(proc, "--latency-bound-ms", "1e+11 ms")
    assert time.monotonic() - start < 20  # refused, not run for 30 s


def _run_in_process(capsys, *args):
    status = cli.main(["run", "--scenario", "constant", "--sut", "null", "--target-qps", "200",
                       "--duration-s", "0.2", *RELAXED, *map(str, args)])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_an_error_building_the_document_after_the_run_still_saves_the_measured_result(
        tmp_path, capsys, monkeypatch):
    import loadgen.runner

    def broken(*a, **kw):
        raise TypeError("a bug in a validity rule")

    monkeypatch.setattr(loadgen.runner, "build_document", broken)
    out = tmp_path / "out"
    status, stdout, stderr = _run_in_process(capsys, "--output", out, "--quiet")
    assert status == 1
    assert "a bug in a validity rule" in stderr and str(out / "result.json") in stderr
    doc = json.loads((out / "result.json").read_text())
    assert doc["partial"] is True and doc["valid"] is False
    assert doc["counts"]["issued"] > 0 and doc["latency_ns"]["count"] == doc["counts"]["completed"]
    assert "a bug in a validity rule" in doc["invalid_reasons"][-1]


def test_an_error_building_the_document_without_output_prints_the_measured_result(capsys, monkeypatch):
    import loadgen.runner

    monkeypatch.setattr(loadgen.runner, "build_document", lambda *a, **kw: 1 / 0)
    status, stdout, stderr = _run_in_process(capsys, "--json")
    assert status == 1 and "ZeroDivisionError" in stderr
    assert json.loads(stdout)["counts"]["issued"] > 0  # --json: the partial document on stdout


def test_a_renderer_failing_after_the_run_leaves_result_json_written(tmp_path, capsys, monkeypatch):
    import loadgen.results.files

    def broken(doc):
        raise KeyError("no such figure")

    monkeypatch.setattr(loadgen.results.files, "render_summary", broken)
    monkeypatch.setattr(cli.run, "render_summary", broken)
    out = tmp_path / "out"
    status, stdout, stderr = _run_in_process(capsys, "--output", out)
    assert status == 1 and "no such figure" in stderr
    doc = json.loads((out / "result.json").read_text())
    assert doc["valid"] is True and doc["counts"]["completed"] > 0  # the whole document


# ---------------------------------------------------- row 7: rates and sizes too big

@pytest.mark.parametrize("args, fragments", [
    (["--scenario", "constant", "--target-qps", "1e30"], ["--target-qps", "1e+08 queries/s"]),
    (["--scenario", "ramp", "--stages", "1s:1e30"], ["--stages", "tens of millions of queries per second"]),
    (["--scenario", "constant", "--samples-per-query", "1000000000"], ["--samples-per-query", "8388608"]),
    (["--scenario", "concurrency", "--concurrency", "1000", "--samples-per-query", "1000000"],
     ["samples_per_query 1000000", "GiB of sample indices"]),
    (["--scenario", "constant", "--pin-cpus", "0-99999999"], ["--pin-cpus", "99999999", "8191"]),
    (["--scenario", "offline", "--target-qps", "1e8", "--min-duration-s", "1e8"], ["offline queries"]),
], ids=["target-qps", "stage-rate", "samples-per-query", "in-flight-table", "pin-cpus", "offline-count"])
def test_rates_and_sizes_the_engine_cannot_give_are_exit_2_at_once(args, fragments):
    start = time.monotonic()
    proc = run_cli("run", *args, "--sut", "null", "--quiet", timeout=20)
    assert_usage_error(proc, *fragments)
    assert time.monotonic() - start < 15  # nothing allocated or run first


# -------------------------------------------------- row 11: SIGTERM before the run

def _catches(pid, sig, timeout_s):
    """Waits until process `pid` has a handler for `sig` (its SigCgt mask in /proc)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
        except (OSError, StopIteration, ValueError):
            return False
        if caught >> (int(sig) - 1) & 1:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("listener", ["silent", "none"])
def test_sigterm_during_the_readiness_wait_is_exit_130_interrupted(listener):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    accepted = threading.Event()
    held = []
    if listener == "silent":
        sock.listen(8)

        def accept():
            try:
                conn, _ = sock.accept()  # and never answers
                held.append(conn)
                accepted.set()
            except OSError:
                pass

        threading.Thread(target=accept, daemon=True).start()
    else:
        sock.close()  # nothing listens: every probe is refused
    cmd = [sys.executable, "-m", "loadgen", "run", "--scenario", "constant", "--duration-s", "1",
           "--sut", f"http://127.0.0.1:{port}/v2/models/m/infer", "--ready-timeout-s", "120", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        if listener == "silent":
            assert accepted.wait(20), "the readiness probe never connected"
        else:
            # Past the imports (seconds on a busy machine): once the CLI catches SIGTERM.
            assert _catches(proc.pid, signal.SIGTERM, 60), "the CLI never set up its SIGTERM handler"
            time.sleep(0.5)  # into the probes
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for conn in held:
            conn.close()
        sock.close()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err


# ------------------------------------------------------ row 14: options that clash

CLASHES = [
    (["--scenario", "constant", "--concurrency", "4"], "--concurrency does not apply to the constant scenario"),
    (["--scenario", "constant", "--trace", "t.txt"], "--trace does not apply to the constant scenario"),
    (["--scenario", "concurrency", "--max-in-flight", "4"], "--max-in-flight does not apply to the concurrency"),
    (["--scenario", "concurrency", "--target-qps", "50"], "--target-qps does not apply to the concurrency"),
    (["--scenario", "poisson", "--stages", "1s:10"], "--stages does not apply to the poisson scenario"),
    (["--scenario", "constant", "--min-duration-s", "1"], "--min-duration-s does not apply to the constant"),
]


@pytest.mark.parametrize("args, fragment", CLASHES, ids=[a[3].lstrip("-") + "-" + a[1] for a, _ in CLASHES])
def test_a_flag_the_scenario_does_not_read_is_exit_2_naming_it(args, fragment):
    proc = run_cli("run", *args, *LONG, timeout=20)
    assert_usage_error(proc, fragment)


def test_a_config_file_or_environment_setting_another_scenarios_option_only_warns(tmp_path):
    config = tmp_path / "shared.toml"
    config.write_text("concurrency = 8\ntrace = 'never-read.txt'\n")
    proc = run_cli("run", "--config", config, "--scenario", "constant", "--sut", "null",
                   "--target-qps", "100", "--duration-s", "0.1", "--quiet", *RELAXED,
                   env=clean_env(LOADGEN_STAGES="1s:10"))
    assert proc.returncode == 0, proc.stderr
    for name in ("--concurrency", "--trace", "--stages"):
        assert f"warning: {name} does not apply to the constant scenario" in proc.stderr, proc.stderr


# ----------------------------------------------------- row 16: --output unwritable

def test_an_output_in_the_way_is_exit_2_before_the_run(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x\n")
    a_dir = tmp_path / "dir"
    (a_dir / "result.json").mkdir(parents=True)
    for output, fragment in ((a_file, "is not a folder"), (a_file / "sub", "is a file, not a folder"),
                             (a_dir, "result.json is a folder")):
        start = time.monotonic()
        proc = run_cli("run", "--scenario", "constant", *LONG, "--output", output, timeout=20)
        assert_usage_error(proc, "--output: ", fragment)
        assert time.monotonic() - start < 15


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only folders")
def test_a_read_only_output_folder_is_exit_2_before_the_run(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        proc = run_cli("run", "--scenario", "constant", *LONG, "--output", ro / "out", timeout=20)
    finally:
        ro.chmod(0o755)
    assert_usage_error(proc, "--output: cannot write to")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_an_output_on_a_filesystem_that_takes_no_files_is_exit_2_before_the_run():
    # /proc takes no new files, not even from root: as a read-only mount would.
    proc = run_cli("run", "--scenario", "constant", *LONG, "--output", "/proc/loadgen-results", timeout=20)
    assert_usage_error(proc, "--output: cannot write to /proc/loadgen-results")


def test_reusing_an_output_folder_replaces_the_result_adds_a_csv_row_and_says_so(tmp_path):
    out = tmp_path / "out"
    args = ["run", "--scenario", "constant", "--sut", "null", "--target-qps", "100", "--duration-s", "0.1",
            "--quiet", "--output", out, *RELAXED]
    first = run_cli(*args)
    assert first.returncode == 0 and first.stderr == ""
    second = run_cli(*args)
    assert second.returncode == 0
    assert "holds an earlier run's result.json: this run replaces it" in second.stderr
    assert len((out / "results.csv").read_text().splitlines()) == 3  # header, one row per run


# ------------------------------------------- row 17: messages that name the option

def test_a_bad_npy_trace_names_the_option_and_the_file(tmp_path):
    cases = {
        "garbage.npy": b"not numpy at all",
        "objects.npy": None,
        "words.npy": None,
    }
    (tmp_path / "garbage.npy").write_bytes(cases["garbage.npy"])
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "words.npy", np.array(["a", "b"]))
    for name in cases:
        proc = run_cli("run", "--scenario", "trace", "--trace", tmp_path / name, "--sut", "null", "--quiet")
        assert_usage_error(proc, "--trace: ", name)


def test_a_text_trace_that_is_not_utf8_names_the_file_and_line(tmp_path):
    trace = tmp_path / "t.txt"
    trace.write_bytes(b"0\n\xff\xfe\n")
    proc = run_cli("run", "--scenario", "trace", "--trace", trace, "--sut", "null", "--quiet")
    assert_usage_error(proc, "--trace: ", "t.txt line 2: not UTF-8")


def test_a_config_file_that_is_not_utf8_names_the_option_and_the_file(tmp_path):
    config = tmp_path / "latin1.toml"
    config.write_bytes(b"sut = \"caf\xe9\"\n")
    proc = run_cli("run", "--config", config, "--quiet")
    assert_usage_error(proc, "--config: ", "latin1.toml is not UTF-8")


@pytest.mark.parametrize("flag", ["--fail-if", "--require"])
def test_threshold_parse_errors_name_the_option(flag):
    proc = run_cli("run", "--scenario", "constant", *LONG, flag, "p99<<5ms")
    assert_usage_error(proc, f"{flag}: 'p99<<5ms' is not METRIC OP VALUE")


def test_the_config_key_config_is_refused_without_suggesting_itself(tmp_path):
    config = tmp_path / "nested.toml"
    config.write_text('config = "other.toml"\n')
    with pytest.raises(OptionError) as e:
        resolve({"config": str(config)}, environ={})
    assert "did you mean" not in str(e.value)
    assert "cannot be set in a config file" in str(e.value) and "--config or LOADGEN_CONFIG" in str(e.value)


# ---------------------------------------------------- misspelled LOADGEN_ variables

def test_a_misspelled_environment_variable_warns_with_did_you_mean():
    assert unknown_environment({"LOADGEN_TARGET_QPS": "1", "LOADGEN_REQUIRE_SERVERS": "1",
                                "LOADGEN_TEST_NO_INSTALL": "1"}) == []
    proc = run_cli("run", "--scenario", "constant", "--sut", "null", "--duration-s", "0.1", "--quiet", *RELAXED,
                   env=clean_env(LOADGEN_TARGT_QPS="50"))
    assert proc.returncode == 0, proc.stderr
    assert "LOADGEN_TARGT_QPS" in proc.stderr and "did you mean LOADGEN_TARGET_QPS" in proc.stderr


def test_the_limits_are_stated_in_the_manual():
    page = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    assert "## Limits" in page and "1e8 s" in page
