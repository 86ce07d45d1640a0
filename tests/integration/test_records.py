"""Per-request records (``--record-requests FILE``): one row per query the engine
resolved, whatever resolved it and whichever SUT form ran it, with times that agree with
the result's histograms; Parquet with pyarrow; bad paths refused before the run; a file
complete after Ctrl-C and a write failure reported without losing result.json.

The tests that start processes; the in-process ones are in tests/unit/test_records.py."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from loadgen import _core
from loadgen.engine.records import FIELDS
from loadgen.results.schema import check_result
from tests.helpers import clean_env, run_cli, run_json, write
from tests.unit.test_records import read_jsonl, read_records

# An async SUT that fails every 10th query and takes too long on another of every 10
# (a 40 ms timeout), completing the rest in ~1 ms.
FLAKY_SRC = """
import asyncio, itertools

_n = itertools.count()


async def f(sample_index):
    k = next(_n) % 10
    if k == 3:
        raise ValueError("no such sample")
    await asyncio.sleep(0.3 if k == 7 else 0.001)
"""


MARKER_SRC = """
import os, time

MARK = {mark!r}


def f(sample_index):
    if not os.path.exists(MARK):
        open(MARK, "w").close()
    time.sleep(0.0005)
"""


def hdr_percentile(values: np.ndarray, pct: float) -> int:
    """The value at a percentile as HdrHistogram counts it (the smallest value with at
    least pct% of the values at or below it)."""
    ordered = np.sort(values)
    return int(ordered[max(math.ceil(pct / 100 * len(ordered)) - 1, 0)])


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_one_row_per_query_however_it_ended_and_times_agree_with_the_result(tmp_path, fmt):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    sut = write(tmp_path / "flaky.py", FLAKY_SRC)
    rec = tmp_path / f"requests.{fmt}"
    _, doc = run_json("--scenario", "poisson", "--target-qps", "400", "--duration-s", "1", "--warmup-s", "0.2",
                      "--timeout-ms", "40", "--sut", f"python:{sut}:f", "--max-error-rate", "1",
                      "--max-issue-delay-ms", "100", "--record-requests", rec.name, "--seed", "3", cwd=tmp_path)
    c, warmup = doc["counts"], doc["warmup"]
    df = read_records(rec)
    assert list(df.columns) == list(FIELDS)
    assert len(df) == c["issued"] + warmup["issued"]
    assert sorted(df["query"]) == list(range(1, len(df) + 1))
    warm = df[df["warmup"]]
    assert len(warm) == warmup["issued"] > 0
    assert (warm["scheduled_ns"] < doc["requests"]["start_ns"]).all()
    measured = df[~df["warmup"]]
    assert (measured["scheduled_ns"] >= doc["requests"]["start_ns"]).all()
    by_status = measured["status"].value_counts().to_dict()
    for status in ("completed", "failed", "timed_out"):
        assert c[status] > 0, c
    assert by_status.get("ok", 0) == c["completed"]
    assert by_status.get("failed", 0) == c["failed"]
    assert by_status.get("timed_out", 0) == c["timed_out"]
    assert by_status.get("cancelled", 0) == c["cancelled"]
    ok = df[df["status"] == "ok"]
    assert (ok["latency_ns"] == ok["completed_ns"] - ok["scheduled_ns"]).all()
    assert ok["error"].isna().all()
    assert df.loc[df["status"] != "ok", "latency_ns"].isna().all()
    assert set(df.loc[df["status"] == "failed", "error"]) == {"ValueError"}
    assert set(df.loc[df["status"] == "timed_out", "error"]) == {"timed_out"}
    timed_out = df[df["status"] == "timed_out"]
    assert ((timed_out["completed_ns"] - timed_out["scheduled_ns"]) >= 40_000_000).all()
    assert (df["issued_ns"] >= df["scheduled_ns"]).all()
    assert (df["worker_index"] == 0).all() and (df["samples"] == 1).all()
    assert df["input_tokens"].isna().all() and df["first_token_ns"].isna().all()
    # No stream: no token events.
    assert df["itl_ns"].isna().all() and df["tokens_per_event"].isna().all()
    # The measured completions' p99, from the records, is the document's within HDR precision.
    p99 = hdr_percentile(measured.loc[measured["status"] == "ok", "latency_ns"].to_numpy(), 99.0)
    assert doc["latency_ns"]["p99"] == pytest.approx(p99, rel=2e-3)
    section = doc["requests"]
    assert section["file"] == str(rec) and section["format"] == fmt and section["records"] == len(df)
    assert section["peak_buffered"] >= 1 and "error" not in section
    assert abs(section["start_epoch_s"] - time.time()) < 60
    assert ("convert_s" in section) == (fmt == "parquet")
    check_result(doc)


@pytest.mark.integration
def test_parquet_records_load_in_pandas(tmp_path):
    pytest.importorskip("pyarrow")
    rec = tmp_path / "requests.parquet"
    _, doc = run_json("--scenario", "constant", "--target-qps", "3000", "--duration-s", "0.5", "--warmup-s", "0.1",
                      "--sut", "demo", "--max-issue-delay-ms", "100", "--record-requests", str(rec), cwd=tmp_path)
    df = read_records(rec)
    c, warmup = doc["counts"], doc["warmup"]
    assert list(df.columns) == list(FIELDS)
    assert len(df) == c["issued"] + warmup["issued"] == doc["requests"]["records"]
    assert doc["requests"]["format"] == "parquet"
    assert 0 <= doc["requests"]["convert_s"] < 30
    check_result(doc)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["requests.parquet"]
    assert int(df["warmup"].sum()) == warmup["issued"]
    ok = df[df["status"] == "ok"]
    assert len(ok) == c["completed"] + warmup["completed"]
    assert (ok["latency_ns"] == ok["completed_ns"] - ok["scheduled_ns"]).all()
    assert df["error"].isna().all() and df["input_tokens"].isna().all()


@pytest.mark.integration
@pytest.mark.parametrize("where, fragment", [("missing/requests.jsonl", "does not exist"),
                                             (".", "is a folder")], ids=["missing-folder", "a-folder"])
def test_a_path_that_cannot_be_written_is_exit_2_before_the_run(tmp_path, where, fragment):
    proc = run_cli("run", "--sut", "null", "--scenario", "constant", "--target-qps", "100", "--duration-s", "5",
                   "--record-requests", where, "--output", "out", cwd=tmp_path, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert "--record-requests" in proc.stderr and fragment in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.integration
def test_a_failed_write_is_reported_and_the_result_is_kept(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    proc = run_cli("run", "--sut", "null", "--scenario", "constant", "--target-qps", "20000", "--duration-s", "0.3",
                   "--max-issue-delay-ms", "100", "--record-requests", "/dev/full", "--output", "out",
                   cwd=tmp_path, timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert "--record-requests" in proc.stderr and "No space left on device" in proc.stderr
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    assert "No space left on device" in doc["requests"]["error"]
    assert doc["counts"]["issued"] > 0


@pytest.mark.integration
@pytest.mark.parametrize("fmt, sig", [("jsonl", signal.SIGINT), ("parquet", signal.SIGTERM)],
                         ids=["jsonl-sigint", "parquet-sigterm"])
def test_ctrl_c_mid_run_leaves_a_complete_file_of_what_was_resolved(tmp_path, fmt, sig):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    mark = tmp_path / "started"
    sut = write(tmp_path / "marker.py", MARKER_SRC.format(mark=str(mark)))
    rec = tmp_path / f"requests.{fmt}"
    cmd = [sys.executable, "-m", "loadgen", "run", "--duration-s", "30", "--output", "out", "--quiet",
           "--sut", f"python:{sut}:f", "--scenario", "constant", "--target-qps", "300", "--record-requests", rec.name]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                            cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not mark.exists():
            if proc.poll() is not None:
                pytest.fail(f"exited early with {proc.returncode}: {proc.communicate()[1]}")
            assert time.monotonic() < deadline, "the run did not start within 30 s"
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()  # only the process this test started
            proc.wait()
    assert proc.returncode == 130, stderr
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    assert doc["interrupted"] is True
    df = read_records(rec)
    assert len(df) == doc["counts"]["issued"] == doc["requests"]["records"] > 0
    assert len(df) < 3000  # stopped: well short of 30 s at 300 queries/s


@pytest.mark.integration
def test_a_failed_conversion_is_exit_1_naming_the_spool_and_the_result_is_kept(tmp_path):
    pytest.importorskip("pyarrow")
    # The SUT puts a folder where the Parquet file is to go, once the run is under way.
    sut = write(tmp_path / "blocker.py", "import os\n\ndef f(i):\n    os.makedirs('r.parquet', exist_ok=True)\n")
    proc = run_cli("run", "--sut", f"python:{sut}:f", "--scenario", "constant", "--target-qps", "500",
                   "--duration-s", "0.3", "--max-issue-delay-ms", "100", "--record-requests", "r.parquet",
                   "--output", "out", cwd=tmp_path, timeout=60)
    assert proc.returncode == 1, proc.stderr
    spool = tmp_path / "r.parquet.spool"
    assert f"they are kept in {spool}" in proc.stderr and "which is incomplete" not in proc.stderr, proc.stderr
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    check_result(doc)
    assert str(spool) in doc["requests"]["error"] and doc["requests"]["records"] == 0
    kept = np.fromfile(spool, dtype=_core.record_dtype)
    assert len(kept) == doc["counts"]["issued"] > 0


@pytest.mark.integration
def test_sweep_writes_each_points_records_in_its_folder_and_find_peak_needs_output(tmp_path):
    proc = run_cli("sweep", "--scenario", "constant", "--sut", "null", "--duration-s", "0.2", "--vary",
                   "target_qps=500,1000", "--record-requests", "req.jsonl", "--output", "sw", "--quiet",
                   "--max-issue-delay-ms", "100",
                   cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for point in sorted((tmp_path / "sw" / "points").iterdir()):
        doc = json.loads((point / "result.json").read_text())
        assert doc["requests"]["file"] == str(point / "req.jsonl")
        assert len(read_jsonl(point / "req.jsonl")) == doc["counts"]["issued"] == doc["requests"]["records"]
    assert not (tmp_path / "req.jsonl").exists()
    proc = run_cli("find-peak", "--scenario", "poisson", "--sut", "null", "--latency-bound-ms", "5",
                   "--record-requests", "req.jsonl", cwd=tmp_path, timeout=30)
    assert proc.returncode == 2 and "needs --output" in proc.stderr, proc.stderr
