"""Inputs a hostile user gives: files that never end or are huge, synthetic prompts too
large to build, numbers out of range, result documents whose counts do not add up, and
MLPerf durations that contradict each other.

loadgen runs as a subprocess, bounded in time and in address space (so that a read that
is not bounded fails fast with MemoryError instead of taking the machine's memory), and
its peak RSS is read from /proc while it runs. The LLM server is the scripted test server,
a process on 127.0.0.1 ended by PID.
"""

from __future__ import annotations

import ast
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from loadgen.files import (CONFIG_LIMIT_BYTES, FileTooLargeError, InputFileError, open_bounded, read_bytes,
                           read_text)
from loadgen.llm.dataset import read_dataset
from loadgen.results.schema import SchemaError, check_result
from tests.helpers import run_cli_peak
from tests.servers.scripted_proc import start_scripted

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
#: The child's address space: room for Python, numpy and the extension, not for a file
#: read whole (the sparse file below is 1.5 GB).
CHILD_AS_BYTES = 2 << 30
#: What a bounded read may leave resident: the interpreter and its libraries, and at
#: most one limit's worth (64 MiB) of a file.
RSS_BOUND_KIB = 400 * 1024


# ---------------------------------------------------------------------------- the CLI

def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_AS_BYTES, CHILD_AS_BYTES))


def run_cli_limited(tmp_path: Path, *args: object, timeout: float = 90) -> Tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak RSS in KiB) of ``python -m loadgen ARGS``, its
    address space limited to :data:`CHILD_AS_BYTES` (from the test's own folder, so that
    the installed package is the one run)."""
    return run_cli_peak(tmp_path, *args, timeout=timeout, preexec_fn=_limit_address_space)


def assert_usage_error(rc: int, err: str, *fragments: str) -> None:
    assert rc == 2, f"exit {rc}\n{err[-3000:]}"
    assert "Traceback" not in err and "MemoryError" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture(scope="module")
def sparse(tmp_path_factory) -> Path:
    """A 1.5 GB file that takes no disk: a hole."""
    path = tmp_path_factory.mktemp("sparse") / "huge.json"
    with open(path, "wb") as f:
        f.truncate(1500 * 1000 * 1000)
    return path


@pytest.fixture(scope="module")
def result_file(tmp_path_factory) -> Path:
    """A real, valid result.json of a short null-SUT run."""
    out = tmp_path_factory.mktemp("run")
    proc = subprocess.run([sys.executable, "-m", "loadgen", "run", "--sut", "null", "--duration-s", "0.3",
                           "--output", str(out), "--no-html", "--quiet"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return out / "result.json"


# ----------------------------------------------------- every read of a named file is bounded

def _commands(path: str, tmp_path: Path, result: Path) -> Dict[str, Tuple[List[object], List[str]]]:
    """command -> (arguments reading ``path``, what the one-line error names)."""
    return {
        "report": (["report", path], ["report RESULT_OR_DIR", path]),
        "merge": (["merge", path], ["merge RESULT_OR_DIR", path]),
        "compare": (["compare", result, path], ["compare NEW", path]),
        "hlog": (["hlog", path], ["hlog FILE", path]),
        "config": (["run", "--config", path, "--sut", "null", "--duration-s", "0.2"], ["--config", path]),
        "trace": (["run", "--scenario", "trace", "--sut", "null", "--trace", path], ["--trace", path]),
        "points": (["sweep", "--points", path, "--output", tmp_path / "sweep"], ["--points", path]),
        "request_template": (["run", "--sut", "http://127.0.0.1:9/predict", "--request-template", path,
                              "--duration-s", "0.2"], ["--request-template", path]),
    }


COMMANDS = ["report", "merge", "compare", "hlog", "config", "trace", "points", "request_template"]


@pytest.mark.integration
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("source", ["dev_zero", "sparse"])
def test_an_endless_or_huge_input_is_refused_in_one_line_with_bounded_memory(tmp_path, sparse, result_file,
                                                                            command, source):
    path = "/dev/zero" if source == "dev_zero" else str(sparse)
    args, names = _commands(path, tmp_path, result_file)[command]
    rc, _, err, rss_kib = run_cli_limited(tmp_path, *args)
    # The limit is named: the file's kind's (in MiB), or for line-read logs, a line's.
    assert_usage_error(rc, err, *names)
    assert re.search(r"\d+ (MiB|bytes)", err), err
    assert 0 < rss_kib < RSS_BOUND_KIB, f"peak RSS {rss_kib} KiB"


def test_a_huge_dataset_is_refused_before_it_is_read(tmp_path, sparse):
    with start_scripted(tmp_path) as srv:
        rc, _, err, rss_kib = run_cli_limited(tmp_path, "run", "--sut", f"openai+{srv.url}/v1/completions",
                                      "--dataset", sparse, "--duration-s", "0.5")
    assert_usage_error(rc, err, "--dataset", str(sparse), "1.4 GiB, over the 1 GiB limit")
    assert 0 < rss_kib < RSS_BOUND_KIB


def test_the_reader_bounds_streams_and_files_and_names_what_is_wrong(tmp_path):
    small = tmp_path / "small.txt"
    small.write_bytes(b"\xef\xbb\xbfhello")
    assert read_text(small, what="--x", limit_bytes=8) == "hello"  # exactly the limit: read
    with pytest.raises(FileTooLargeError, match=r"^--x: .*small.txt is 8 bytes, over the 7 bytes limit for --x$"):
        read_bytes(small, what="--x", limit_bytes=7)
    with pytest.raises(FileTooLargeError, match=r"^--x: /dev/zero holds more than 1 MiB, the limit for --x$"):
        read_bytes("/dev/zero", what="--x", limit_bytes=MIB)
    with open_bounded("/dev/zero", what="--x", limit_bytes=MIB) as f:  # a line that never ends, too
        with pytest.raises(FileTooLargeError):
            f.readline()
    r, w = os.pipe()
    os.write(w, b"a\nb\n")
    os.close(w)
    try:
        assert read_bytes(f"/proc/self/fd/{r}", what="--x", limit_bytes=4) == b"a\nb\n"  # a pipe is fine
    finally:
        os.close(r)
    for path, problem in ((tmp_path / "absent", "cannot read .*absent: No such file"),
                          (tmp_path, "is a folder, not a file")):
        with pytest.raises(InputFileError, match=f"^--x: .*{problem}"):
            read_bytes(path, what="--x", limit_bytes=CONFIG_LIMIT_BYTES)
    (tmp_path / "latin1").write_bytes(b"caf\xe9")
    with pytest.raises(InputFileError, match=r"latin1 is not UTF-8 text \(byte 3\)"):
        read_text(tmp_path / "latin1", what="--x", limit_bytes=10)


# Reads of files that no user names: the kernel's, the package's own, loadgen's own
# outputs. Each is (file, the line as written).
NOT_USER_FILES = {
    ("loadgen/telemetry/host.py", 'with open(os.path.join(base, tid, name), encoding="utf-8", errors="replace") as f:'),
    ("loadgen/telemetry/host.py", 'with open(os.path.join(proc, "stat"), encoding="utf-8") as f:'),
    ("loadgen/telemetry/host.py", 'with open(os.path.join(proc, "self", "statm"), encoding="utf-8") as f:'),
    ("loadgen/placement.py", 'with open(os.path.join(root, path.lstrip("/")), encoding="utf-8", errors="replace") as f:'),
    ("loadgen/results/document.py", 'with open("/proc/cpuinfo", encoding="utf-8") as f:'),
    ("loadgen/results/schema.py", 'return files("loadgen.results").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")'),
    ("loadgen/results/html.py", 'with open(path, encoding="utf-8") as f:'),  # the package's report.css/js, bokeh's
    ("loadgen/mlperf/detail_log.py", 'with open(path, "rb") as f:'),  # the package's own files, for their digests
    ("loadgen/engine/trace.py", "arr = np.load(f, allow_pickle=False)"),  # f: a stream from open_bounded
    ("loadgen/net/tensors.py", "loaded = np.load(f, allow_pickle=False)"),  # f: a stream from open_bounded
}
# Reads of files a user names that do not go through loadgen.files yet.
NOT_YET_BOUNDED: Set[Tuple[str, str]] = set()
#: Calls that read a file: open() for reading, and these methods and functions.
_READ_METHODS = {"read_text", "read_bytes", "from_file"}
_READ_FUNCTIONS = {("np", "load"), ("np", "fromfile"), ("np", "loadtxt"), ("numpy", "load"), ("tomllib", "load"),
                   ("json", "load"), ("io", "open"), ("io", "FileIO"), ("pd", "read_csv"), ("pd", "read_json")}


def _opens_for_reading(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return not (isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"))


def _is_read(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id == "open" and _opens_for_reading(call)
    if isinstance(f, ast.Attribute):
        if f.attr in _READ_METHODS:
            return True
        return isinstance(f.value, ast.Name) and (f.value.id, f.attr) in _READ_FUNCTIONS
    return False


def read_calls(package: Path) -> Set[Tuple[str, str]]:
    """(file relative to the package's parent, the call's line) of every file read in
    ``package`` outside loadgen/files.py."""
    found = set()
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        if rel == "loadgen/files.py" or rel.endswith("_pb2.py"):
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and _is_read(node):
                found.add((rel, lines[node.lineno - 1].split("  #", 1)[0].strip()))
    return found


def test_files_users_name_are_read_only_through_the_bounded_reader():
    calls = read_calls(ROOT / "loadgen")
    unlisted = calls - NOT_USER_FILES - NOT_YET_BOUNDED
    assert not unlisted, ("read these through loadgen.files (read_bytes, read_text, open_bounded), or list a "
                          f"file no user names in NOT_USER_FILES: {sorted(unlisted)}")
    stale = (NOT_USER_FILES | NOT_YET_BOUNDED) - calls
    assert not stale, f"these reads are gone; take them off the lists: {sorted(stale)}"


def test_the_source_scan_finds_raw_reads_and_leaves_writes(tmp_path):
    package = tmp_path / "loadgen"
    package.mkdir()
    (package / "files.py").write_text("raw = open(path, 'rb')\n")  # the reader itself may
    (package / "m.py").write_text(
        "import json, numpy as np\n"
        "with open(user_path) as f:\n"
        "    doc = json.load(f)\n"
        "text = Path(p).read_text()\n"
        "arr = np.load(p)\n"
        "with open(out, 'w') as f:\n"
        "    pass\n"
        "note = 'open(this) is text'  # open(that) too\n"
        "fd = os.open(p, os.O_RDONLY)\n")
    assert read_calls(package) == {("loadgen/m.py", "with open(user_path) as f:"), ("loadgen/m.py", "doc = json.load(f)"),
                                   ("loadgen/m.py", "text = Path(p).read_text()"), ("loadgen/m.py", "arr = np.load(p)")}


# ------------------------------------------------------- synthetic prompts too large to build

@pytest.mark.integration
@pytest.mark.parametrize("endpoint,extra", [("completions", []), ("chat/completions", ["--turns", "2"])],
                         ids=["prompts", "conversations"])
def test_synthetic_prompts_too_large_to_build_are_refused_within_seconds(tmp_path, endpoint, extra):
    with start_scripted(tmp_path) as srv:
        started = time.monotonic()
        rc, _, err, rss_kib = run_cli_limited(tmp_path, "run", "--sut", f"openai+{srv.url}/v1/{endpoint}",
                                      "--input-tokens", "131072", "--sample-count", "4096", "--duration-s", "1",
                                      *extra, timeout=60)
        elapsed = time.monotonic() - started
    assert_usage_error(rc, err, "--input-tokens 131072", "--sample-count 4096", "GiB to build",
                       "over the 512 MiB")
    assert elapsed < 30 and rss_kib < RSS_BOUND_KIB, (elapsed, rss_kib)


# ----------------------------------------------------------------- numbers out of range

@pytest.mark.parametrize("slo,problem", [
    ("latency<=1e400ms", "must be a finite number"),
    ("latency<=nanms", "must be a finite number"),
    ("ttft<=inf s", "must be a finite number"),
    ("latency<=-5ms", "out of range"),
    ("tpot<=0.2ns", "out of range"),
    ("latency<=2e8s", "out of range"),
])
def test_slo_bounds_that_are_not_finite_or_out_of_range_exit_2_with_the_range(tmp_path, slo, problem):
    rc, _, err, _ = run_cli_limited(tmp_path, "run", "--sut", "null", "--duration-s", "0.2", "--slo", slo)
    assert_usage_error(rc, err, "--slo", slo, problem, "allowed: 1 ns to 1e8 s")


@pytest.mark.parametrize("args,fragments", [
    (["--fail-if", "p99<1e400ms"], ["--fail-if", "p99<1e400ms", "out of range"]),
    (["--max-tokens", str(2**63)], ["--max-tokens", "1..2147483647"]),
])
def test_thresholds_and_token_counts_beyond_their_range_exit_2(tmp_path, args, fragments):
    rc, _, err, _ = run_cli_limited(tmp_path, "run", "--sut", "null", "--duration-s", "0.2", *args)
    assert_usage_error(rc, err, *fragments)


@pytest.mark.integration
def test_a_dataset_max_tokens_above_int64_exits_2_naming_the_field_and_range(tmp_path):
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text(json.dumps({"prompt": "hello there", "max_tokens": 7}) + "\n"
                       + '{"prompt": "hi", "max_tokens": 99999999999999999999999999}\n')
    with start_scripted(tmp_path) as srv:
        rc, _, err, _ = run_cli_limited(tmp_path, "run", "--sut", f"openai+{srv.url}/v1/completions",
                                "--dataset", dataset, "--duration-s", "0.5")
    assert_usage_error(rc, err, "--dataset", "line 2", "'max_tokens' must be an integer in 1..2147483647")


def test_a_dataset_max_tokens_is_kept_up_to_the_limit_and_refused_past_it(tmp_path):
    dataset = tmp_path / "p.jsonl"
    dataset.write_text(json.dumps({"prompt": "a b", "max_tokens": 2**31 - 1}) + "\n")
    prompts, _, _ = read_dataset(str(dataset), lambda s: len(s.split()), False)
    assert prompts[0].max_tokens == 2**31 - 1
    dataset.write_text(json.dumps({"prompt": "a b", "max_tokens": 2**31}) + "\n")
    with pytest.raises(ValueError, match="1..2147483647, got 2147483648"):
        read_dataset(str(dataset), lambda s: len(s.split()), False)


# ------------------------------------------------------------- the accounting identity

def _tampered(result_file: Path, tmp_path: Path, **counts: int) -> Path:
    doc = json.loads(result_file.read_text())
    doc["counts"].update(counts)
    out = tmp_path / "bad" / "result.json"
    out.parent.mkdir()
    out.write_text(json.dumps(doc))
    return out


def test_a_result_whose_counts_add_up_is_read(tmp_path, result_file):
    doc = json.loads(result_file.read_text())
    c = doc["counts"]
    assert c["issued"] == c["completed"] + c["failed"] + c["timed_out"] + c["cancelled"] + c["outstanding"]
    rc, out, err, _ = run_cli_limited(tmp_path, "report", result_file)
    assert rc in (0, 1) and "queries" in out, err


@pytest.mark.parametrize("command", ["report", "merge", "compare"])
def test_a_result_whose_counts_do_not_add_up_exits_2_naming_them(tmp_path, result_file, command):
    issued = json.loads(result_file.read_text())["counts"]["issued"]
    bad = _tampered(result_file, tmp_path, issued=issued + 5)
    args = [result_file, bad] if command == "compare" else [bad]
    rc, _, err, _ = run_cli_limited(tmp_path, command, *args)
    assert_usage_error(rc, err, str(bad), "'counts' do not add up", f"issued {issued + 5}", "completed",
                       "outstanding")


def test_counts_outside_the_identity_do_not_enter_it(result_file):
    doc = json.loads(result_file.read_text())
    doc["counts"].update(unknown_completions=3, duplicate_completions=2)
    check_result(doc)
    doc["counts"]["cancelled"] += 1
    with pytest.raises(SchemaError, match="do not add up"):
        check_result(doc)


# ------------------------------------------------------------------ MLPerf durations

MLPERF_SERVER = ("run", "--scenario", "server", "--sut", "null", "--target-qps", "500", "--min-query-count", "10",
                 "--json")


@pytest.mark.integration
@pytest.mark.parametrize("duration,minimum", [("1.5", "0.5"), ("0.5", "1.5"), ("1.5", "1.5")])
def test_mlperf_duration_and_minimum_make_a_run_of_at_least_the_longer(tmp_path, duration, minimum):
    rc, out, err, _ = run_cli_limited(tmp_path, *MLPERF_SERVER, "--duration-s", duration, "--min-duration-s", minimum)
    # A busy host can make the null SUT miss its latency bound; the duration never may.
    assert rc in (0, 1), f"exit {rc}\n{err[-2000:]}"
    doc = json.loads(out)
    assert not [r for r in doc["invalid_reasons"] if "too short" in r or "minimum" in r], doc["invalid_reasons"]
    assert doc["issue_duration_s"] >= 1.5 - 0.01
    assert doc["settings"]["effective"]["min_duration_s"] == 1.5
    assert doc["settings"]["effective"]["duration_s"] is None


def test_the_help_says_what_duration_means_on_an_mlperf_scenario():
    proc = subprocess.run([sys.executable, "-m", "loadgen", "run", "--help"], capture_output=True,
                          text=True, timeout=60)
    text = " ".join(proc.stdout.split())
    assert "on an MLPerf scenario, its minimum duration (with --min-duration-s, the longer of the two)" in text
    assert "with --duration-s, the longer of the two" in text


# ------------------------------------------------------------- --payload and --ca-file

@pytest.mark.parametrize("reader", ["jsonl", "raw_lines", "npy", "ca_file"])
def test_payload_and_ca_files_are_read_bounded(sparse, reader):
    """A 1.5 GB --payload or --ca-file is refused before it is read, and /dev/zero after
    the limit, each in one line naming the flag and the file."""
    from loadgen.files import InputFileError
    from loadgen.net.payloads import raw_lines, read_jsonl
    from loadgen.net.tensors import load_samples

    def read(path: str) -> None:
        if reader == "jsonl":
            read_jsonl(path)
        elif reader == "raw_lines":
            raw_lines(path, 1 << 40)
        elif reader == "npy":
            load_samples(path, None, 10)
        else:  # the gRPC client reads its CA bundle when it makes the channel's credentials
            from loadgen.net.kserve_grpc import KServeGrpcSUT
            from loadgen.net.options import NetOptions
            from loadgen.net.targets import parse_target
            KServeGrpcSUT(parse_target("grpcs://127.0.0.1:9/m"), NetOptions(ca_file=path), 1)._credentials()

    flag = "--ca-file" if reader == "ca_file" else "--payload"
    for path in (str(sparse), "/dev/zero"):
        # /dev/zero as .npy fails at its first bytes, a header that is no array's.
        expected = ValueError if (reader, path) == ("npy", "/dev/zero") else InputFileError
        with pytest.raises(expected) as info:
            read(path)
        if expected is ValueError:
            assert str(info.value).startswith(f"--payload: cannot read {path}")
            continue
        message = str(info.value)
        assert "\n" not in message and message.startswith(flag) and path in message and "MiB" in message


@pytest.fixture(scope="module")
def sweep_folder(tmp_path_factory) -> Path:
    """A real sweep folder of two short null-SUT points."""
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    proc = subprocess.run([sys.executable, "-m", "loadgen", "sweep", "--sut", "null", "--duration-s", "0.2",
                           "--vary", "target-qps=100,200", "--output", str(out), "--no-html", "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return out


@pytest.mark.parametrize("command, name", [
    ("report_html", "sweep.jsonl"), ("compare", "sweep.jsonl"), ("resume", "sweep.jsonl"), ("resume", "sweep.json")])
def test_a_sweep_folder_with_a_huge_manifest_or_record_file_is_refused_with_bounded_memory(
        tmp_path, sparse, sweep_folder, command, name):
    folder = tmp_path / "sweep"
    shutil.copytree(sweep_folder, folder)
    (folder / name).unlink()
    (folder / name).symlink_to(sparse)
    args = {"report_html": ["report", "--html", tmp_path / "r.html", folder],
            "compare": ["compare", sweep_folder, folder],
            "resume": ["sweep", "--sut", "null", "--duration-s", "0.2", "--vary", "target-qps=100,200",
                       "--output", folder, "--no-html", "--quiet"]}[command]
    rc, _, err, rss_kib = run_cli_limited(tmp_path, *args)
    assert_usage_error(rc, err, "sweep folder", str(folder / name), "over the 1 GiB limit")
    assert 0 < rss_kib < RSS_BOUND_KIB, f"peak RSS {rss_kib} KiB"
