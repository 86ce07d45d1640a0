"""Per-request records (``--record-requests FILE``): one row per query the engine resolved.

The engine captures a fixed-size record on the thread that resolves each query (native
code, no lock per query; see ``csrc/request_log.h``), and its own thread (``lg-records``)
writes them: formatted as JSON lines, or, for a Parquet file (``.parquet``, with pyarrow
installed), as they are to a spool file beside it (``FILE.spool``). Once the run is over
:class:`ParquetConversion` turns the spool into the Parquet file, a row group at a time
(a memory map over the spool: large runs never need it all in memory), and removes it.
A streamed request's token events (``itl_ns``: the gaps between its token events;
``tokens_per_event``) are kept in a side arena of each chunk and spooled beside the
records, in the same order, to ``FILE.spool.events`` (uint32 per record: its events),
``FILE.spool.itl`` (int64 gaps) and ``FILE.spool.tokens`` (int32 tokens per event).
The result document's ``requests`` section says where the file is and how to put its
times on the wall clock (:func:`requests_section`).
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Tuple

from loadgen import _core
from loadgen.units import ns_to_s

__all__ = ["FIELDS", "ParquetConversion", "check_record_path", "record_format", "requests_section", "side_paths",
           "spool_path"]

#: The columns of a record, in file order (docs/results.md, "Per-request records", explains each).
FIELDS = ("query", "scheduled_ns", "issued_ns", "completed_ns", "first_token_ns", "latency_ns", "status", "error",
          "sample_index", "samples", "input_tokens", "output_tokens", "worker_index", "warmup", "itl_ns",
          "tokens_per_event")
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


def side_paths(path: str) -> Tuple[str, str, str]:
    """The side files of a Parquet file's spool (the token events): events per record,
    gaps and tokens per event."""
    spool = spool_path(path)
    return spool + ".events", spool + ".itl", spool + ".tokens"


def engine_path(path: str) -> str:
    """The file the engine itself writes for ``path``: the spool for Parquet, else ``path``."""
    return spool_path(path) if record_format(path) == "parquet" else path


def _schema() -> Any:
    import pyarrow as pa

    i64, i32 = pa.int64(), pa.int32()
    types = {"status": pa.string(), "error": pa.string(), "samples": i32, "input_tokens": i32, "output_tokens": i32,
             "worker_index": i32, "warmup": pa.bool_(), "itl_ns": pa.list_(i64),
             "tokens_per_event": pa.list_(i32)}
    return pa.schema([(name, types.get(name, i64)) for name in FIELDS])


def _event_lists(events: Any, gaps: Any, tokens: Any) -> Tuple[Any, Any]:
    """The ``itl_ns`` and ``tokens_per_event`` columns of records with ``events`` token
    events each (0: null), their gaps and tokens given in record order."""
    import numpy as np
    import pyarrow as pa

    n = events.astype(np.int64)
    none = n == 0
    token_offsets = np.concatenate(([0], np.cumsum(n))).astype(np.int32)
    gap_offsets = np.concatenate(([0], np.cumsum(np.maximum(n - 1, 0)))).astype(np.int32)
    mask = pa.array(none)
    itl = pa.ListArray.from_arrays(pa.array(gap_offsets), pa.array(gaps, type=pa.int64()), mask=mask)
    per_event = pa.ListArray.from_arrays(pa.array(token_offsets), pa.array(tokens, type=pa.int32()), mask=mask)
    return itl, per_event


def records_table(chunk: Any, kinds: List[str], worker_index: int, events: Any = None, gaps: Any = None,
                  tokens: Any = None) -> Any:
    """The engine's records (a structured array of ``_core.record_dtype``) as a pyarrow
    Table with :data:`FIELDS` as columns: absent times and counts null, latency only for
    completed queries, the error kind (or ``timed_out``, ``cancelled``) for the rest.
    ``events`` (one count per record; None: none had any), ``gaps`` and ``tokens``: the
    records' token events, as the spool's side files hold them."""
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
    if events is None:
        events, gaps, tokens = (np.zeros(len(status), dtype=np.uint32), np.zeros(0, dtype=np.int64),
                                np.zeros(0, dtype=np.int32))
    columns["itl_ns"], columns["tokens_per_event"] = _event_lists(events, gaps, tokens)
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
                for side in side_paths(self.path):
                    if os.path.exists(side):
                        os.unlink(side)
            except (Exception, KeyboardInterrupt) as e:
                # Interrupted or failed: the spool holds every record; the Parquet file, if
                # begun, has no footer and cannot be read, so it goes.
                self.written = 0
                why = "interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}"
                self.error = (f"converting the records to {os.path.abspath(self.path)} failed ({why}); they are kept in "
                              f"{self.spool} ({_core.record_dtype.itemsize} bytes each, as "
                              "loadgen._core.record_dtype; their token events beside it)")
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
            events, gaps, tokens = (_map(p, t) for p, t in zip(side_paths(self.path), (np.uint32, np.int64, np.int32)))
            if len(events) < count:  # no side file (or a short one): no record has token events
                events = np.zeros(count, dtype=np.uint32)
            at_gap = at_token = 0
            try:
                for begin in range(0, count, ROW_GROUP_RECORDS):
                    n = events[begin:begin + ROW_GROUP_RECORDS].astype(np.int64)
                    n_tokens, n_gaps = int(n.sum()), int(np.maximum(n - 1, 0).sum())
                    table = records_table(spool[begin:begin + ROW_GROUP_RECORDS], kinds, self.worker_index, n,
                                          gaps[at_gap:at_gap + n_gaps], tokens[at_token:at_token + n_tokens])
                    at_gap, at_token = at_gap + n_gaps, at_token + n_tokens
                    writer.write_table(table, row_group_size=len(table))
                    self.written += len(table)
            finally:
                del spool, events, gaps, tokens  # unmapped (the files can go)


def _map(path: str, dtype: Any) -> Any:
    """The whole values of a side file as a read-only array (empty when it is missing or
    empty: a memory map cannot be empty)."""
    import numpy as np

    size = os.path.getsize(path) if os.path.exists(path) else 0
    n = size // np.dtype(dtype).itemsize
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype=dtype)


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
