"""Per-request records (``--record-requests FILE``): one row per query the engine
resolved, whatever resolved it and whichever SUT form ran it, with times that agree with
the result's histograms; Parquet with pyarrow; bad paths refused before the run; a file
complete after Ctrl-C and a write failure reported without losing result.json.

Runs are short (0.3-1.2 s); every subprocess is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from loadgen import _core
from loadgen.engine import Engine, EngineSettings
from loadgen.engine import records as records_module
from loadgen.engine.records import FIELDS, check_record_path, record_format, spool_path
from loadgen.results.schema import check_result
from loadgen.sut.forms import Batch
from loadgen.sut.spec import load_sut
from tests.helpers import clean_env, run_cli, run_json, write

pd = pytest.importorskip("pandas")

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


def read_jsonl(path: Path) -> "pd.DataFrame":
    text = path.read_text()
    assert text.endswith("\n")  # complete lines only
    return pd.read_json(path, lines=True, dtype=False)


def read_records(path: Path) -> "pd.DataFrame":
    """A records file as a DataFrame; a Parquet one must have left no spool behind."""
    if path.suffix == ".parquet":
        assert not Path(spool_path(str(path))).exists(), "the spool was left behind"
        return pd.read_parquet(path)
    return read_jsonl(path)


def thread_names() -> set:
    """The names of this process's threads now (one that ends meanwhile is left out)."""
    names = set()
    for comm in Path("/proc/self/task").glob("*/comm"):
        try:
            names.add(comm.read_text().strip())
        except FileNotFoundError:  # the thread ended between the listing and the read
            pass
    return names


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


def test_parquet_without_pyarrow_is_refused_naming_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match=r"pip install pyarrow.*\.jsonl"):
        record_format("out.parquet")
    assert record_format("out.jsonl") == "jsonl"


@pytest.mark.integration
@pytest.mark.parametrize("where, fragment", [("missing/requests.jsonl", "does not exist"),
                                             (".", "is a folder")], ids=["missing-folder", "a-folder"])
def test_a_path_that_cannot_be_written_is_exit_2_before_the_run(tmp_path, where, fragment):
    proc = run_cli("run", "--sut", "null", "--scenario", "constant", "--target-qps", "100", "--duration-s", "5",
                   "--record-requests", where, "--output", "out", cwd=tmp_path, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert "--record-requests" in proc.stderr and fragment in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


def test_check_record_path_accepts_a_writable_folder(tmp_path):
    check_record_path(str(tmp_path / "r.jsonl"))
    with pytest.raises(ValueError, match="does not exist"):
        check_record_path(str(tmp_path / "no" / "r.jsonl"))


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


def _parquet_engine(tmp_path: Path, qps: float = 20000) -> Engine:
    settings = EngineSettings(mode="constant", target_qps=qps, duration_s=0.2,
                              record_requests=str(tmp_path / "r.parquet"))
    return Engine(settings, load_sut("null"))


def test_a_failed_conversion_keeps_the_spool_and_says_where(tmp_path):
    pytest.importorskip("pyarrow")
    with _parquet_engine(tmp_path) as engine:
        engine.start()
        (tmp_path / "r.parquet").mkdir()  # where the Parquet file should go: it cannot be written
        engine.wait()
        result = engine.result()
        section = engine.requests_section(0.0)
    spool = tmp_path / "r.parquet.spool"
    assert str(spool) in section["error"] and "converting the records" in section["error"], section
    assert section["records"] == 0 and section["convert_s"] >= 0
    kept = np.fromfile(spool, dtype=_core.record_dtype)
    assert len(kept) == result.counts["issued"] > 0
    assert sorted(kept["query"]) == list(range(1, len(kept) + 1))
    assert (kept["status"] == 0).all()


def test_an_interrupted_conversion_keeps_the_spool_and_the_result(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    real = records_module.records_table
    calls = []

    def interrupted_on_the_third_row_group(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as a second Ctrl-C during the conversion does
        return real(*args)

    monkeypatch.setattr(records_module, "ROW_GROUP_RECORDS", 500)
    monkeypatch.setattr(records_module, "records_table", interrupted_on_the_third_row_group)
    with _parquet_engine(tmp_path) as engine:
        result = engine.run()  # returns: the measured result is not lost
        section = engine.requests_section(0.0)
    assert result.counts["issued"] > 1000 and len(calls) == 3
    assert "interrupted" in section["error"] and str(tmp_path / "r.parquet.spool") in section["error"]
    assert not (tmp_path / "r.parquet").exists()  # the partial file (no footer) is removed
    assert len(np.fromfile(tmp_path / "r.parquet.spool", dtype=_core.record_dtype)) == result.counts["issued"]


def test_parquet_row_groups_cover_every_record_once(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    monkeypatch.setattr(records_module, "ROW_GROUP_RECORDS", 1000)
    with _parquet_engine(tmp_path) as engine:
        result = engine.run()
        section = engine.requests_section(0.0)
    meta = pq.ParquetFile(tmp_path / "r.parquet").metadata
    issued = result.counts["issued"]
    assert meta.num_rows == issued == section["records"] and "error" not in section
    assert meta.num_row_groups == math.ceil(issued / 1000)
    df = read_records(tmp_path / "r.parquet")
    assert sorted(df["query"]) == list(range(1, issued + 1))


class _Batched:
    """A batched SUT completing each batch at once."""

    def issue(self, batch: Batch) -> None:
        batch.complete()


async def _async_sut(sample_index: int) -> None:
    await asyncio.sleep(0)


@pytest.mark.parametrize("sut", ["null", "sleep:200", "demo", "function", "async", "batched"])
def test_every_sut_form_gets_one_row_per_query(tmp_path, sut):
    made = {"function": lambda i: None, "async": _async_sut, "batched": _Batched()}.get(sut) or load_sut(sut)
    rec = tmp_path / "r.jsonl"
    settings = EngineSettings(mode="constant", target_qps=2000, duration_s=0.3, record_requests=str(rec),
                              samples_per_query=2, sample_count=100, sample_order="sequential", record_worker_index=3)
    with Engine(settings, made) as engine:
        engine.start()
        names = set()
        while not engine.wait(0.05):
            names |= thread_names()
        result = engine.result()
        section = engine.requests_section(0.0)
    df = read_jsonl(rec)
    assert len(df) == result.counts["issued"] == section["records"] > 0
    assert (df["status"] == "ok").sum() == result.counts["completed"]
    assert (df["samples"] == 2).all() and (df["worker_index"] == 3).all()
    # Sequential samples, two per query: query k carries samples 2(k-1) and 2(k-1)+1.
    assert (df["sample_index"] == (2 * (df["query"] - 1)) % 100).all()
    assert "lg-records" in names


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
