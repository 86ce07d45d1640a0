"""The command line, run as a real subprocess."""

import json
import subprocess
import sys

import numpy as np
import pytest

import loadgen
from tests.helpers import run_cli

pytestmark = pytest.mark.integration



@pytest.fixture()
def two_tag_log(tmp_path):
    rng = np.random.default_rng(7)
    path = tmp_path / "run.hlog"
    expected = {"latency": loadgen.Histogram(), "": loadgen.Histogram()}
    with open(path, "w") as f:
        w = loadgen.HistogramLogWriter(f)
        w.write_header(1_700_000_000.0)
        for i in range(3):
            for tag in expected:
                h = loadgen.Histogram()
                h.record_array(rng.integers(1_000, 50_000_000, size=5_000))
                w.write_interval(h, start_s=float(i), interval_s=1.0, tag=tag or None)
                expected[tag] += h
    return path, expected


def test_hlog_json_matches_merged_histograms(two_tag_log):
    path, expected = two_tag_log
    proc = run_cli("hlog", str(path), "--json", "--unit", "ns")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["unit"] == "ns"
    assert set(doc["tags"]) == {"latency", "(untagged)"}
    for tag, key in (("latency", "latency"), ("", "(untagged)")):
        row, h = doc["tags"][key], expected[tag]
        assert row["intervals"] == 3
        assert row["count"] == h.total_count == 15_000
        assert row["p99"] == h.value_at_percentile(99)
        assert row["max"] == h.max and row["min"] == h.min


def test_hlog_tag_filter_and_unit_scaling(two_tag_log):
    path, expected = two_tag_log
    proc = run_cli("hlog", str(path), "--json", "--tag", "latency", "--unit", "ms")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["tags"]
    assert list(rows) == ["latency"]
    assert rows["latency"]["p50"] == pytest.approx(expected["latency"].value_at_percentile(50) / 1e6)


def test_hlog_table_output_lists_each_tag(two_tag_log):
    path, _ = two_tag_log
    proc = run_cli("hlog", str(path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("tag") and "p99.9" in lines[0]
    assert any(line.startswith("latency") for line in lines[1:])
    assert any(line.startswith("(untagged)") for line in lines[1:])


def test_hlog_missing_file_is_usage_error_without_traceback(tmp_path):
    proc = run_cli("hlog", str(tmp_path / "absent.hlog"))
    assert proc.returncode == 2
    assert "cannot read" in proc.stderr and "absent.hlog" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_hlog_corrupt_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.hlog"
    path.write_text("#[StartTime: 1.0 (seconds since epoch)]\n0.0,1.0,2.0,HISTFnotbase64!!\n")
    proc = run_cli("hlog", str(path))
    assert proc.returncode == 2
    assert "bad.hlog" in proc.stderr and "line 2" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_hlog_unknown_tag_finds_nothing_exit_1(two_tag_log):
    path, _ = two_tag_log
    proc = run_cli("hlog", str(path), "--tag", "nope")
    assert proc.returncode == 1
    assert "no intervals" in proc.stderr


def test_unknown_command_and_bad_unit_are_usage_errors():
    for args in (("hlgo",), ("hlog", "x.hlog", "--unit", "min")):
        proc = run_cli(*args)
        assert proc.returncode == 2, args
        assert "invalid choice" in proc.stderr and "Traceback" not in proc.stderr


def test_no_command_prints_help_and_exit_2():
    proc = run_cli()
    assert proc.returncode == 2
    assert "hlog" in proc.stdout


def test_version_flag():
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"loadgen {loadgen.__version__}"


def test_example_script_round_trips_its_log(tmp_path):
    import pathlib
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "latency_histogram.py"
    out = tmp_path / "ex.hlog"
    proc = subprocess.run(
        [sys.executable, str(example), "--output", str(out), "--intervals", "2", "--qps", "10000"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "recorded 20,000 latencies" in proc.stdout
    entries = loadgen.read_log(out)
    assert len(entries) == 2 and sum(e.histogram.total_count for e in entries) == 20_000


def test_every_command_prints_its_help(capsys):
    # In process, every command the CLI registers: a '%' in any option's text (argparse
    # formats help with %) or a bad default would make --help raise.
    from loadgen.cli import main

    parser_commands = ["run", "sweep", "find-peak", "report", "hlog", "merge", "compare", "env"]
    for command in parser_commands:
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0, command
        out = capsys.readouterr().out
        assert out.startswith("usage: ") and f" {command}" in out.splitlines()[0], command
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "group i % G's prefix" in " ".join(capsys.readouterr().out.split())  # shown as written
