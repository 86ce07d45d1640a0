"""A sweep's files in its ``--output`` folder, written and read back:

- ``sweep.json``: the manifest: the base options, what is swept, the planned points;
- ``sweep.jsonl``: one line per point run, in point order: the point's result document
  with a ``"sweep"`` section (index, values, key, repeat, seed, schedule_seed,
  sample_seed, status, folder, hooks);
- ``sweep.csv``: the swept values, labels and headline figures, one row per line of
  sweep.jsonl;
- ``points/NNN-<values>/``: each point's own run files (result.json, summary.txt, ...).

:func:`load_sweep` reads a sweep folder into a pandas DataFrame, one row per point.
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from loadgen.files import SWEEP_LIMIT_BYTES, read_text
from loadgen.results.cost import cost_figures
from loadgen.results.files import RESULT_FILE, atomic_write
from loadgen.results.render import flatten
from loadgen.results.schema import SchemaError, check_result
from loadgen.units import ns_to_ms
from loadgen.sweep.grid import LABEL_PREFIX

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MANIFEST_FILE", "MANIFEST_SCHEMA", "POINTS_DIR", "STATUSES", "SWEEP_CSV", "SWEEP_JSONL",
           "column_name", "csv_table", "frame_rows", "is_sweep_folder", "load_sweep", "read_manifest",
           "read_records", "write_manifest", "write_records"]

MANIFEST_FILE = "sweep.json"
SWEEP_JSONL = "sweep.jsonl"
SWEEP_CSV = "sweep.csv"
POINTS_DIR = "points"
MANIFEST_SCHEMA = "loadgen.sweep/1"
#: A point's status: it ran (valid or not), it failed (a hook, the server's readiness,
#: the run itself), or it was interrupted (its partial result kept, not finished).
STATUSES = ("done", "failed", "interrupted")

PathLike = Union[str, "os.PathLike[str]"]


def is_sweep_folder(path: PathLike) -> bool:
    """Whether ``path`` is a folder a sweep wrote (it holds sweep.json or sweep.jsonl)."""
    p = os.fspath(path)
    return os.path.isdir(p) and any(os.path.isfile(os.path.join(p, n)) for n in (MANIFEST_FILE, SWEEP_JSONL))


def _read_json_text(path: str) -> str:
    return read_text(path, what="sweep folder", limit_bytes=SWEEP_LIMIT_BYTES)


def read_manifest(directory: PathLike) -> Optional[Dict[str, Any]]:
    """The manifest of the sweep in ``directory``; None when there is none. ValueError
    naming the file when it is not a sweep manifest."""
    path = os.path.join(os.fspath(directory), MANIFEST_FILE)
    if not os.path.exists(path):
        return None
    text = _read_json_text(path)  # InputFileError (a ValueError) names the file and what is wrong
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path} is not a sweep manifest: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        raise ValueError(f"{path} is not a sweep manifest (no 'schema': '{MANIFEST_SCHEMA}')")
    if not isinstance(manifest.get("base"), dict) or not isinstance(manifest.get("swept"), list):
        raise ValueError(f"{path} is not a sweep manifest: it has no 'base' options or 'swept' names")
    return manifest


def write_manifest(directory: PathLike, manifest: Dict[str, Any]) -> None:
    """Writes the manifest (atomically)."""
    atomic_write(os.path.join(os.fspath(directory), MANIFEST_FILE), json.dumps(manifest, indent=2, default=str) + "\n")


def _check_record(record: Any, where: str) -> Dict[str, Any]:
    if not isinstance(record, dict) or not isinstance(record.get("sweep"), dict):
        raise ValueError(f"{where}: not a sweep record (an object with a 'sweep' section)")
    sweep = record["sweep"]
    for key, kind in (("index", int), ("repeat", int), ("key", str), ("status", str), ("values", dict)):
        if not isinstance(sweep.get(key), kind) or isinstance(sweep.get(key), bool):
            raise ValueError(f"{where}: 'sweep.{key}' is missing or not {kind.__name__}")
    if sweep["status"] not in STATUSES:
        raise ValueError(f"{where}: 'sweep.status' is {sweep['status']!r}, not one of {', '.join(STATUSES)}")
    if "schema" in record:
        try:
            check_result(record)
        except SchemaError as e:
            raise ValueError(f"{where}: not a valid result document: {e}") from None
    return record


def read_records(directory: PathLike) -> List[Dict[str, Any]]:
    """The lines of sweep.jsonl (none when it does not exist), each checked: a sweep
    section, and a result document that follows the result schema where there is one.
    ValueError naming the file and line otherwise."""
    path = os.path.join(os.fspath(directory), SWEEP_JSONL)
    if not os.path.exists(path):
        return []
    records = []
    for number, line in enumerate(_read_json_text(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"{where} is not JSON: {e}") from None
        records.append(_check_record(record, where))
    return records


def column_name(name: str) -> str:
    """The column of a swept option: its name (``concurrency``), or ``labels.KEY`` for a
    swept label (the label's own column)."""
    return "labels." + name[len(LABEL_PREFIX):] if name.startswith(LABEL_PREFIX) else name


def _cell(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return value


def _ms(summary: Any, key: str) -> Any:
    if isinstance(summary, dict) and summary.get("count") and key in summary:
        return ns_to_ms(summary[key])
    return None


def _figures(record: Dict[str, Any]) -> Dict[str, Any]:
    """The headline figures of a result document (none for a point that did not run)."""
    if "schema" not in record:
        return {"valid": bool(record.get("valid"))}
    counts = record["counts"]
    row: Dict[str, Any] = {"valid": record["valid"], "completed_qps": record["throughput"]["completed_qps"]}
    for p in ("p50", "p90", "p99", "p99.9"):
        row[f"latency_{p}_ms"] = _ms(record.get("latency_ns"), p)
    row["error_rate"] = (counts["failed"] + counts["timed_out"]) / counts["issued"] if counts["issued"] else 0.0
    return row


def _token_figures(record: Dict[str, Any]) -> Dict[str, Any]:
    """TTFT and TPOT p50/p90/p99, the gap between token chunks (itl), the per-token
    inter-token latency (itl_per_token) and time to first answer token (ttfat) p50/p99
    (ms) where the document has them."""
    row: Dict[str, Any] = {}
    for key in ("ttft_ns", "tpot_ns", "itl_ns", "itl_per_token_ns", "ttfat_ns"):
        for p in ("p50", "p90", "p99") if key in ("ttft_ns", "tpot_ns") else ("p50", "p99"):
            value = _ms(record.get(key), p)
            if value is not None:
                row[f"{key[:-3]}_{p}_ms"] = value
    return row


def _llm_figures(record: Dict[str, Any]) -> Dict[str, Any]:
    """An LLM run's rates where the document has them: ``output_tokens_per_s``
    (``throughput.output_tokens_per_s``), ``input_tokens_per_s`` (the prompt tokens sent,
    ``llm.requests.input_tokens_sent``, over ``duration_s``), ``goodput_requests_per_s``
    and ``goodput_fraction`` (``goodput``, with ``--slo``) and ``reasoning_tokens``
    (``network.tokens.reasoning_tokens``, when the model reasoned)."""
    row: Dict[str, Any] = {}
    output = (record.get("throughput") or {}).get("output_tokens_per_s")
    if output is not None:
        row["output_tokens_per_s"] = output
    sent = ((record.get("llm") or {}).get("requests") or {}).get("input_tokens_sent")
    duration = record.get("duration_s") or 0.0
    if sent and duration > 0:
        row["input_tokens_per_s"] = sent / duration
    goodput = record.get("goodput")
    if isinstance(goodput, dict):
        row["goodput_requests_per_s"] = goodput.get("requests_per_s")
        row["goodput_fraction"] = goodput.get("fraction")
    reasoning = ((record.get("network") or {}).get("tokens") or {}).get("reasoning_tokens")
    if reasoning:
        row["reasoning_tokens"] = reasoning
    return row


def _gpu_figures(record: Dict[str, Any]) -> Dict[str, Any]:
    """Energy per query, queries per joule and, per GPU (by index), mean utilization and
    power and peak memory, where the document has GPU figures (none when unavailable)."""
    gpu = record.get("gpu")
    if not isinstance(gpu, dict) or gpu.get("status") not in ("ok", "partial"):
        return {}
    row: Dict[str, Any] = {f"gpu.{k}": gpu.get(k) for k in ("energy_j_total", "energy_per_query_j",
                                                           "queries_per_joule")}
    for k, d in enumerate(gpu.get("devices") or []):
        name = f"gpu{d.get('index', k)}" + (f".mig{d['mig_index']}" if d.get("mig_index") is not None else "")
        for key, stat, col in (("utilization_pct", "mean", "util_mean_pct"), ("power_w", "mean", "power_mean_w"),
                               ("memory_used_bytes", "max", "memory_max_bytes")):
            value = (d.get(key) or {}).get(stat)
            if value is not None:
                row[f"{name}.{col}"] = value
    return row


def _csv_groups(record: Dict[str, Any]) -> List[Dict[str, Any]]:
    sweep = record["sweep"]
    hooks = sweep.get("hooks", {})
    return [
        {"point": sweep["index"], "repeat": sweep["repeat"], "status": sweep["status"]},
        {column_name(n): _cell(v) for n, v in sweep["values"].items() if not n.startswith(LABEL_PREFIX)},
        {f"labels.{k}": v for k, v in (record.get("labels") or {}).items()},
        _figures(record),
        _llm_figures(record),
        _token_figures(record),
        _gpu_figures(record),
        cost_figures(record),
        {"invalid_reasons": " | ".join(map(str, record.get("invalid_reasons", []))),
         "error": sweep.get("error", ""),
         "hook_exit_code": next((h.get("exit_code") for h in hooks.values() if not h.get("ok", True)), ""),
         "schedule_seed": sweep.get("schedule_seed", ""), "sample_seed": sweep.get("sample_seed", ""),
         "started_at": sweep.get("started_at", ""), "dir": sweep.get("dir", "")},
    ]


def csv_table(records: List[Dict[str, Any]]) -> Tuple[List[str], List[Dict[str, Any]]]:
    """The columns and rows of sweep.csv: point, repeat, status, the swept values, the
    labels, the headline figures (validity, throughput, latency percentiles in ms, error
    rate; an LLM run's token rates, goodput and reasoning tokens, TTFT/TPOT p50/p90/p99 and
    ITL/TTFAT p50 and p99, a ``gpu`` section's figures and the ``cost`` when present), then
    the reasons, the error and the point's folder. A column appears when a row has it, so
    a sweep without LLM points has no LLM columns."""
    grouped = [_csv_groups(r) for r in records]
    columns: List[str] = []
    for g in range(len(grouped[0]) if grouped else 0):
        for groups in grouped:
            columns.extend(k for k in groups[g] if k not in columns)
    rows = []
    for groups in grouped:
        row: Dict[str, Any] = {}
        for part in groups:
            row.update(part)
        rows.append({c: ("" if row.get(c) is None else row.get(c, "")) for c in columns})
    return columns, rows


def write_records(directory: PathLike, records: List[Dict[str, Any]]) -> List[str]:
    """Writes sweep.jsonl (one record a line) and sweep.csv, each atomically; returns
    their paths."""
    directory = os.fspath(directory)
    jsonl = os.path.join(directory, SWEEP_JSONL)
    atomic_write(jsonl, "".join(json.dumps(r, default=str, separators=(",", ":")) + "\n" for r in records))
    columns, rows = csv_table(records)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    path = os.path.join(directory, SWEEP_CSV)
    atomic_write(path, buf.getvalue())
    return [jsonl, path]


def frame_rows(directory: PathLike) -> List[Dict[str, Any]]:
    """The DataFrame rows of a sweep folder: each point's flattened result document
    (the columns of :func:`loadgen.load_results`, labels as ``labels.KEY``), with
    ``point``, ``repeat``, ``status``, ``key``, ``error``, ``path`` (the point's
    result.json), a column per swept option named as the option (``concurrency``) and,
    for an LLM point, sweep.csv's rate columns (``output_tokens_per_s``,
    ``input_tokens_per_s``, ``goodput_requests_per_s``, ``goodput_fraction``,
    ``reasoning_tokens``).
    A result key with a swept option's name (``duration_s``) moves to ``result.NAME``."""
    directory = os.fspath(directory)
    rows = []
    for record in read_records(directory):
        sweep = record["sweep"]
        row = flatten({k: v for k, v in record.items() if k != "sweep"})
        row.update(_llm_figures(record))
        for name, value in sweep["values"].items():
            column = column_name(name)
            if column in row and not column.startswith("labels."):
                row["result." + column] = row.pop(column)
            row[column] = _cell(value)
        result = os.path.join(directory, str(sweep.get("dir", "")), RESULT_FILE)
        row.update(point=sweep["index"], repeat=sweep["repeat"], status=sweep["status"], key=sweep["key"],
                   error=sweep.get("error", ""), path=result if sweep.get("dir") and os.path.isfile(result) else "")
        rows.append(row)
    return rows


def load_sweep(directory: PathLike) -> pd.DataFrame:
    """A sweep folder as a pandas DataFrame, one row per point run (the lines of
    sweep.jsonl, in point order); see :func:`frame_rows` for the columns.

    ``directory`` may be the URL of an uploaded sweep (``s3://bucket/prefix``, see
    :mod:`loadgen.storage`): it is read from a local copy, and ``path`` names the URLs.

    Raises:
        ImportError: pandas is not installed.
        ValueError: the folder holds no sweep, or a line of sweep.jsonl is not a record.
        loadgen.storage.StorageError: the URL holds no complete upload, or cannot be read.
    """
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("load_sweep needs pandas: pip install pandas") from None
    from loadgen.storage import local_copies

    with local_copies([os.fspath(directory)], "load_sweep") as copies:
        local = copies.paths[0]
        if not is_sweep_folder(local):
            raise ValueError(f"{os.fspath(directory)} is not a sweep folder (it has no {MANIFEST_FILE} "
                             f"or {SWEEP_JSONL})")
        rows = [{**row, "path": copies.url_of(row["path"]) if row.get("path") else ""} for row in frame_rows(local)]
    return pd.DataFrame(rows)
