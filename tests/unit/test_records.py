"""Per-request records (``--record-requests FILE``): one row per query the engine
resolved, whatever resolved it and whichever SUT form ran it, with times that agree with
the result's histograms; Parquet with pyarrow; bad paths refused before the run; a file
complete after Ctrl-C and a write failure reported without losing result.json.

Runs are short (0.3-1.2 s); every subprocess is bounded by a timeout.

The tests that start processes or servers are in tests/integration/test_records.py.
"""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from loadgen import _core
from loadgen.engine import Engine, EngineSettings
from loadgen.engine import records as records_module
from loadgen.engine.records import check_record_path, record_format, side_paths, spool_path
from loadgen.sut.forms import Batch
from loadgen.sut.spec import load_sut

pd = pytest.importorskip("pandas")


def read_jsonl(path: Path) -> "pd.DataFrame":
    text = path.read_text()
    assert text.endswith("\n")  # complete lines only
    return pd.read_json(path, lines=True, dtype=False)


def read_records(path: Path) -> "pd.DataFrame":
    """A records file as a DataFrame; a Parquet one must have left no spool behind."""
    if path.suffix == ".parquet":
        assert not Path(spool_path(str(path))).exists(), "the spool was left behind"
        assert not any(Path(p).exists() for p in side_paths(str(path))), "the spool's side files were left behind"
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


def test_parquet_without_pyarrow_is_refused_naming_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match=r"pip install pyarrow.*\.jsonl"):
        record_format("out.parquet")
    assert record_format("out.jsonl") == "jsonl"


def test_check_record_path_accepts_a_writable_folder(tmp_path):
    check_record_path(str(tmp_path / "r.jsonl"))
    with pytest.raises(ValueError, match="does not exist"):
        check_record_path(str(tmp_path / "no" / "r.jsonl"))


def test_check_record_path_creates_the_output_folder_it_is_in_and_no_other(tmp_path):
    out = tmp_path / "out"
    check_record_path(str(out / "logs" / "r.jsonl"), output=str(out))
    assert (out / "logs").is_dir()
    with pytest.raises(ValueError, match="does not exist"):
        check_record_path(str(tmp_path / "elsewhere" / "r.jsonl"), output=str(out))
    with pytest.raises(ValueError, match="does not exist"):
        check_record_path(str(tmp_path / "outside" / "r.jsonl"), output=str(tmp_path / "outs"))
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "outside").exists()


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


def test_parquet_lists_each_records_token_events_across_row_groups(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    # Five records in row groups of two: no events, one event, three (one of 0 tokens),
    # none, two; their gaps and tokens record after record, as lg-records spools them.
    monkeypatch.setattr(records_module, "ROW_GROUP_RECORDS", 2)
    path = str(tmp_path / "r.parquet")
    spool = np.zeros(5, dtype=_core.record_dtype)
    spool["query"] = np.arange(1, 6)
    spool.tofile(spool_path(path))
    events, gaps, tokens = side_paths(path)
    np.asarray([0, 1, 3, 0, 2], dtype=np.uint32).tofile(events)
    np.asarray([5, 7, 9], dtype=np.int64).tofile(gaps)
    np.asarray([2, 1, 0, 4, 3, 3], dtype=np.int32).tofile(tokens)
    conversion = records_module.ParquetConversion(path, 0)
    conversion.run([""], "")
    assert conversion.error == "" and conversion.written == 5
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    table = pq.read_table(path)
    assert table.column("itl_ns").to_pylist() == [None, [], [5, 7], None, [9]]
    assert table.column("tokens_per_event").to_pylist() == [None, [2], [1, 0, 4], None, [3, 3]]
    assert not any(Path(p).exists() for p in (spool_path(path), events, gaps, tokens))


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


