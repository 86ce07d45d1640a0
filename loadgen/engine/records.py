"""Per-request records (``--record-requests FILE``): one row per query the engine resolved.

The engine captures a fixed-size record on the thread that resolves each query (native
code, no lock per query; see ``csrc/request_log.h``), and its own thread (``lg-records``)
writes them: formatted as JSON lines, or, for a Parquet file (``.parquet``, with pyarrow
installed), as they are to a spool file beside it (``FILE.spool``). Once the run is over
:class:`ParquetConversion` turns the spool into the Parquet file, a row group at a time
(a memory map over the spool: large runs never need it all in memory), and removes it.
The result document's ``requests`` section says where the file is and how to put its
times on the wall clock (:func:`requests_section`).
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional

from loadgen import _core
from loadgen.units import ns_to_s

__all__ = ["FIELDS", "ParquetConversion", "check_record_path", "record_format", "requests_section", "spool_path"]

#: The columns of a record, in file order (docs/results.md, "Per-request records", explains each).
FIELDS = ("query", "scheduled_ns", "issued_ns", "completed_ns", "first_token_ns", "latency_ns", "status", "error",
          "sample_index", "samples", "input_tokens", "output_tokens", "worker_index", "warmup")
#: RecordStatus values, by number.
STATUSES = ("ok", "failed", "timed_out", "cancelled")
#: Records per Parquet row group (16 of the engine's chunks; 4 MiB of spool).
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


def check_record_path(path: str, output: Optional[str] = None) -> None:
    """Raises ValueError naming the problem when ``path`` cannot be written: its folder is
    missing or not writable, or it is a folder itself. A missing folder that is the run's
    ``output`` folder, or inside it, is created (as the run's other files will be);
    nothing else is."""
    where = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"--record-requests {path}: it is a folder; give a file name (like {path}/requests.jsonl)")
    if not os.path.isdir(where) and output and _within(where, os.path.abspath(output)):
        try:
            os.makedirs(where, exist_ok=True)
        except OSError as e:
            raise ValueError(f"--record-requests {path}: cannot create the folder {where}: {e.strerror}") from None
    if not os.path.isdir(where):
        raise ValueError(f"--record-requests {path}: the folder {where} does not exist (create it first)")
    if not os.access(where, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"--record-requests {path}: cannot write there (permission denied)")


def _within(folder: str, top: str) -> bool:
    return folder == top or folder.startswith(top.rstrip(os.sep) + os.sep)


def sink(path: Optional[str]) -> Any:
    """The engine's records sink for ``path`` (None: no records)."""
    if not path:
        return _core.RecordSink.none
    return _core.RecordSink.spool if record_format(path) == "parquet" else _core.RecordSink.jsonl


def spool_path(path: str) -> str:
    """The spool file the engine writes a Parquet file's raw records to: ``path.spool``."""
    return path + ".spool"


def engine_path(path: str) -> str:
    """The file the engine itself writes for ``path``: the spool for Parquet, else ``path``."""
    return spool_path(path) if record_format(path) == "parquet" else path


def _schema() -> Any:
    import pyarrow as pa

    i64, i32 = pa.int64(), pa.int32()
    types = {"status": pa.string(), "error": pa.string(), "samples": i32, "input_tokens": i32, "output_tokens": i32,
             "worker_index": i32, "warmup": pa.bool_()}
    return pa.schema([(name, types.get(name, i64)) for name in FIELDS])


def records_table(chunk: Any, kinds: List[str], worker_index: int) -> Any:
    """The engine's records (a structured array of ``_core.record_dtype``) as a pyarrow
    Table with :data:`FIELDS` as columns: absent times and counts null, latency only for
    completed queries, the error kind (or ``timed_out``, ``cancelled``) for the rest."""
    import numpy as np
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


class ParquetConversion:
    """Converts a run's spool (``spool_path(path)``) to the Parquet file ``path`` once
    the engine has written it all: a row group per :data:`ROW_GROUP_RECORDS` records,
    each read through a memory map of the spool, so memory stays at one row group.

    :meth:`run` never raises. On success the spool is removed; on a failure (the spool's
    own write failed, pyarrow failed, or a KeyboardInterrupt came while converting) the
    spool is kept, any partial Parquet file removed, and :attr:`error` says why and where
    the records are."""

    def __init__(self, path: str, worker_index: int) -> None:
        self.path = path
        self.spool = os.path.abspath(spool_path(path))  # absolute: errors say where it is
        self.worker_index = worker_index
        self.error = ""
        self.written = 0
        #: Seconds the conversion took (None until it ran).
        self.convert_s: Optional[float] = None
        self._begun = False  # the Parquet file was opened (so a failure removes it)

    def run(self, kinds: List[str], spool_error: str) -> None:
        """Converts (once); ``kinds`` are the error kinds by index, ``spool_error`` the
        engine's error writing the spool ("" when none)."""
        if self.convert_s is not None:
            return
        started = time.monotonic()
        if spool_error:
            self.error = f"{spool_error}; no Parquet file was written, the records so far are in {self.spool}"
        else:
            try:
                self._convert(kinds)
                os.unlink(self.spool)
            except (Exception, KeyboardInterrupt) as e:
                # Interrupted or failed: the spool holds every record; the Parquet file, if
                # begun, has no footer and cannot be read, so it goes.
                self.written = 0
                why = "interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}"
                self.error = (f"converting the records to {os.path.abspath(self.path)} failed ({why}); they are kept in "
                              f"{self.spool} ({_core.record_dtype.itemsize} bytes each, as "
                              "loadgen._core.record_dtype)")
                if self._begun and os.path.exists(self.path):
                    os.unlink(self.path)
        self.convert_s = time.monotonic() - started

    def _convert(self, kinds: List[str]) -> None:
        import numpy as np

        import pyarrow.parquet as pq

        dtype = _core.record_dtype
        count = os.path.getsize(self.spool) // dtype.itemsize  # whole records only
        # Dictionary encoding only where it pays (the two string columns): on the integer
        # columns it costs more time than it saves space.
        with pq.ParquetWriter(self.path, _schema(), use_dictionary=["status", "error"]) as writer:
            self._begun = True
            if count == 0:
                return
            spool = np.memmap(self.spool, dtype=dtype, mode="r", shape=(count,))
            try:
                for begin in range(0, count, ROW_GROUP_RECORDS):
                    table = records_table(spool[begin:begin + ROW_GROUP_RECORDS], kinds, self.worker_index)
                    writer.write_table(table, row_group_size=len(table))
                    self.written += len(table)
            finally:
                del spool  # unmapped (the file can go)


def requests_section(core: Any, path: str, parquet: Optional[ParquetConversion], start_ns: int,
                     clock_offset_s: float) -> Dict[str, Any]:
    """The result document's ``requests`` section: the file, its format, how many
    records it holds, the engine's measure start on the records' clock (``start_ns``) and
    on the wall clock (``start_epoch_s``: add ``(t_ns - start_ns) / 1e9`` to it), the most
    records waiting for the writer at once, for Parquet the seconds the conversion from
    the spool took (``convert_s``), and (only when it failed) the write error. ``parquet``
    has run already."""
    stats = core.records_stats()
    written = parquet.written if parquet is not None else stats["written"]
    error = parquet.error if parquet is not None else stats["error"]
    if stats["lost"] and not error:
        error = f"{stats['lost']} records could not be kept (out of memory)"
    section: Dict[str, Any] = {
        "file": os.path.abspath(path),
        "format": "parquet" if parquet is not None else "jsonl",
        "records": int(written),
        "start_ns": int(start_ns),
        "start_epoch_s": clock_offset_s + ns_to_s(start_ns) if start_ns else None,
        "peak_buffered": int(stats["peak_buffered"]),
    }
    if parquet is not None:
        section["convert_s"] = round(parquet.convert_s or 0.0, 6)
    if error:
        section["error"] = error
    return section
