"""Per-request records (``--record-requests FILE``): one row per query the engine resolved.

The engine captures a fixed-size record on the thread that resolves each query (native
code, no lock per query; see ``csrc/request_log.h``). A JSON Lines file is formatted and
written by the engine's own thread (``lg-records``); a Parquet file (``.parquet``, with
pyarrow installed) is written from the chunks the engine hands out, by
:class:`ParquetRecords` on a Python thread. Either way the file is complete when the
run's ``wait`` returns, and the result document's ``requests`` section says where it is
and how to put its times on the wall clock (:func:`requests_section`).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np

from loadgen import _core

__all__ = ["FIELDS", "ParquetRecords", "check_record_path", "record_format", "requests_section"]

#: The columns of a record, in file order (the README's "Per-request records" explains each).
FIELDS = ("query", "scheduled_ns", "issued_ns", "completed_ns", "first_token_ns", "latency_ns", "status", "error",
          "sample_index", "samples", "input_tokens", "output_tokens", "worker_index", "warmup")
#: RecordStatus values, by number.
STATUSES = ("ok", "failed", "timed_out", "cancelled")
#: Records per Parquet row group (16 of the engine's chunks).
ROW_GROUP_RECORDS = 65536


def record_format(path: str) -> str:
    """``"parquet"`` for a ``.parquet`` path, else ``"jsonl"``. ValueError when Parquet
    is asked for and pyarrow is missing, saying how to get it."""
    if not path.lower().endswith(".parquet"):
        return "jsonl"
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ValueError(f"--record-requests {path}: writing Parquet needs pyarrow (pip install pyarrow); "
                         "or give a .jsonl path for JSON lines") from None
    return "parquet"


def check_record_path(path: str) -> None:
    """Raises ValueError naming the problem when ``path`` cannot be written: its folder is
    missing or not writable, or it is a folder itself. Checks, creates nothing."""
    where = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"--record-requests {path}: it is a folder; give a file name (like {path}/requests.jsonl)")
    if not os.path.isdir(where):
        raise ValueError(f"--record-requests {path}: the folder {where} does not exist (create it first)")
    if not os.access(where, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"--record-requests {path}: cannot write there (permission denied)")


def sink(path: Optional[str]) -> Any:
    """The engine's records sink for ``path`` (None: no records)."""
    if not path:
        return _core.RecordSink.none
    return _core.RecordSink.chunks if record_format(path) == "parquet" else _core.RecordSink.jsonl


def _schema() -> Any:
    import pyarrow as pa

    i64, i32 = pa.int64(), pa.int32()
    types = {"status": pa.string(), "error": pa.string(), "samples": i32, "input_tokens": i32, "output_tokens": i32,
             "worker_index": i32, "warmup": pa.bool_()}
    return pa.schema([(name, types.get(name, i64)) for name in FIELDS])


def records_table(chunk: Any, kinds: List[str], worker_index: int) -> Any:
    """The engine's records (a structured array from ``take_records``) as a pyarrow
    Table with :data:`FIELDS` as columns: absent times and counts null, latency only for
    completed queries, the error kind (or ``timed_out``, ``cancelled``) for the rest."""
    import pyarrow as pa

    # Each field as its own contiguous array: pyarrow converts strided views slowly.
    f = {name: np.ascontiguousarray(chunk[name]) for name in chunk.dtype.names}
    status = f["status"].astype(np.int32)
    ok = status == 0
    # One dictionary for the error column: the kinds (index 0, no kind, reads "error"),
    # then the two statuses that are their own error.
    dictionary = pa.array(["error", *kinds[1:], "timed_out", "cancelled"])
    error_index = np.where(status == 2, len(kinds), np.where(status == 3, len(kinds) + 1, f["error_kind"]))
    error = pa.DictionaryArray.from_arrays(pa.array(error_index.astype(np.int32), mask=ok), dictionary)
    columns = {
        "query": pa.array(f["query"]),
        "scheduled_ns": pa.array(f["scheduled_ns"]),
        "issued_ns": pa.array(f["issued_ns"], mask=f["issued_ns"] == 0),
        "completed_ns": pa.array(f["completed_ns"]),
        "first_token_ns": pa.array(f["first_token_ns"], mask=f["first_token_ns"] == 0),
        "latency_ns": pa.array(f["completed_ns"] - f["scheduled_ns"], mask=~ok),
        "status": pa.DictionaryArray.from_arrays(pa.array(status), pa.array(STATUSES)).dictionary_decode(),
        "error": error.dictionary_decode(),
        "sample_index": pa.array(f["sample_index"]),
        "samples": pa.array(f["samples"]),
        "input_tokens": pa.array(f["input_tokens"], mask=f["input_tokens"] < 0),
        "output_tokens": pa.array(f["output_tokens"], mask=f["output_tokens"] < 0),
        "worker_index": pa.array(np.full(len(status), worker_index, dtype=np.int32)),
        "warmup": pa.array(f["warmup"] != 0),
    }
    return pa.Table.from_pydict(columns, schema=_schema())


class ParquetRecords:
    """Writes an engine's records to a Parquet file from a background thread
    (``loadgen-records``): it takes the engine's chunks as they fill, and writes a row
    group per :data:`ROW_GROUP_RECORDS`. The file is opened here, so that a path that
    cannot be written fails before the run. A write that fails is kept in :attr:`error`;
    the chunks are still taken (their memory given back) until the run ends."""

    def __init__(self, core: Any, path: str, worker_index: int) -> None:
        import pyarrow.parquet as pq

        self.path = path
        self.error = ""
        self.written = 0
        #: CPU seconds the writer thread used, once it ended.
        self.cpu_s = 0.0
        self._core = core
        self._worker_index = worker_index
        try:
            # Dictionary encoding only where it pays (the two string columns): on the
            # integer columns it costs more time than it saves space.
            self._writer: Any = pq.ParquetWriter(path, _schema(), use_dictionary=["status", "error"])
        except OSError as e:
            raise ValueError(f"record_requests: cannot write {path}: {e.strerror or e}") from None
        self._thread: Optional[threading.Thread] = None
        self._abandoned = threading.Event()

    def start(self) -> None:
        """Starts the writer thread (after the engine started)."""
        self._thread = threading.Thread(target=self._drain, name="loadgen-records", daemon=True)
        self._thread.start()

    def join(self, timeout_s: Optional[float] = None) -> bool:
        """Waits until every record is written and the file closed (or the thread was
        never started: then closes the file); True when done."""
        if self._thread is None:
            self._close()
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def abandon(self) -> None:
        """The engine never ran: ends the thread (which closes the file, empty)."""
        self._abandoned.set()
        self.join()

    def _drain(self) -> None:
        pending: List[Any] = []
        count = 0
        while True:
            chunk = self._core.take_records(0.2)
            if chunk is None:
                break
            if len(chunk) == 0:
                if self._abandoned.is_set():
                    break
                continue
            pending.append(chunk)
            count += len(chunk)
            if count >= ROW_GROUP_RECORDS:
                self._write(pending)
                pending, count = [], 0
        self._write(pending)
        self._close()
        self.cpu_s = time.thread_time()

    def _write(self, chunks: List[Any]) -> None:
        if not chunks or self.error:
            return
        try:
            table = records_table(np.concatenate(chunks), self._core.record_kinds(), self._worker_index)
            self._writer.write_table(table, row_group_size=len(table))
            self.written += len(table)
        except Exception as e:  # disk full, a closed file: the run goes on, the error is reported
            self.error = f"writing {self.path} failed: {type(e).__name__}: {e}"

    def _close(self) -> None:
        try:
            self._writer.close()
        except Exception as e:
            self.error = self.error or f"writing {self.path} failed: {type(e).__name__}: {e}"


def requests_section(core: Any, path: str, parquet: Optional[ParquetRecords], start_ns: int,
                     clock_offset_s: float) -> Dict[str, Any]:
    """The result document's ``requests`` section: the file, its format, how many
    records it holds, the engine's measure start on the records' clock (``start_ns``) and
    on the wall clock (``start_epoch_s``: add ``(t_ns - start_ns) / 1e9`` to it), the most
    records waiting for the writer at once, and (only when it failed) the write error."""
    stats = core.records_stats()
    written = parquet.written if parquet is not None else stats["written"]
    error = (parquet.error if parquet is not None else "") or stats["error"]
    if stats["lost"] and not error:
        error = f"{stats['lost']} records could not be kept (out of memory)"
    section: Dict[str, Any] = {
        "file": os.path.abspath(path),
        "format": "parquet" if parquet is not None else "jsonl",
        "records": int(written),
        "start_ns": int(start_ns),
        "start_epoch_s": clock_offset_s + start_ns / 1e9 if start_ns else None,
        "peak_buffered": int(stats["peak_buffered"]),
    }
    if error:
        section["error"] = error
    return section
