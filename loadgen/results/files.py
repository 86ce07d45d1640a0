"""Result files: writing a run's outputs to a folder, and reading result documents back
(one, or many into a pandas DataFrame)."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Union

from loadgen.files import RESULT_LIMIT_BYTES, InputFileError, read_bytes, read_text
from loadgen.results.document import SCHEMA
from loadgen.results.render import CSV_COLUMNS, csv_row, flatten, hlog_text, render_summary, timeseries_rows
from loadgen.results.schema import SchemaError, check_result

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CSV_FILE", "HLOG_FILE", "RESULT_FILE", "SUMMARY_FILE", "atomic_write", "load_result", "load_results",
           "load_timeseries", "result_files", "write_outputs"]

#: The names of the files :func:`write_outputs` writes.
RESULT_FILE = "result.json"
SUMMARY_FILE = "summary.txt"
HLOG_FILE = "latency.hlog"
CSV_FILE = "results.csv"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str, data: Union[str, bytes]) -> None:
    """Writes ``data`` to ``path`` through a temporary file in the same folder and a
    rename: a reader sees the old file or the new one, never a part."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; results are for sharing
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_outputs(doc: Dict[str, Any], directory: str) -> List[str]:
    """Writes result.json, summary.txt, latency.hlog and appends to results.csv in
    ``directory`` (created if needed), each atomically. Returns the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for name, data in (
        (RESULT_FILE, json.dumps(doc, indent=2, sort_keys=False) + "\n"),
        (SUMMARY_FILE, render_summary(doc)),
        (HLOG_FILE, hlog_text(doc)),
    ):
        path = os.path.join(directory, name)
        atomic_write(path, data)
        paths.append(path)
    csv_path = os.path.join(directory, CSV_FILE)
    existing = ""
    if os.path.exists(csv_path):
        try:
            existing = read_text(csv_path, what="--output results.csv", limit_bytes=RESULT_LIMIT_BYTES)
        except InputFileError as e:  # the callers report a folder they cannot write to
            raise OSError(str(e)) from None
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS))
    if not existing:
        writer.writeheader()
    writer.writerow(csv_row(doc))
    atomic_write(csv_path, existing + buf.getvalue())
    paths.append(csv_path)
    return paths


def result_files(paths: Iterable[Union[str, os.PathLike[str]]]) -> List[str]:
    """The result documents among ``paths``: files as given, folders searched recursively
    for :data:`RESULT_FILE`."""
    files: List[str] = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            for root, _, names in sorted(os.walk(p)):
                files.extend(os.path.join(root, n) for n in sorted(names) if n == RESULT_FILE)
        else:
            files.append(p)
    return files


def load_result(path: Union[str, os.PathLike[str]], *, what: str = "result") -> Dict[str, Any]:
    """Reads one result document and checks it against the ``loadgen.result/1`` schema
    (:mod:`loadgen.results.schema`) and its accounting (:func:`~loadgen.results.schema.check_accounting`).

    Args:
        path: the result.json file.
        what: how the file was given, for messages (a command's argument or flag).

    Raises:
        ValueError: naming the file (and the key when one is wrong): it cannot be read,
            is over :data:`loadgen.files.RESULT_LIMIT_BYTES`, or is not a valid result.
    """
    name = os.fspath(path)
    data = read_bytes(name, what=what, limit_bytes=RESULT_LIMIT_BYTES)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{name} is not a loadgen result: not UTF-8 text (byte {e.start})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is not JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{name} is not a loadgen result: its JSON is nested too deeply to read") from None
    except ValueError as e:  # such as an integer of more digits than Python converts
        raise ValueError(f"{name} is not a loadgen result: {e}") from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("loadgen.result/"):
        raise ValueError(f"{name} is not a loadgen result (no 'schema': '{SCHEMA}')")
    try:
        check_result(doc)
    except SchemaError as e:
        raise ValueError(f"{name} is not a valid {SCHEMA} document: {e}") from None
    return doc


def _pandas(caller: str) -> Any:
    """The pandas module; ImportError saying that ``caller`` needs it when it is missing."""
    try:
        import pandas
    except ImportError:
        raise ImportError(f"{caller} needs pandas: pip install pandas") from None
    return pandas


def _path_list(
    paths: Union[str, os.PathLike[str], Iterable[Union[str, os.PathLike[str]]]],
) -> List[Union[str, os.PathLike[str]]]:
    """One path, or many, as a list."""
    return [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)


def load_results(
    paths: Union[str, os.PathLike[str], Iterable[Union[str, os.PathLike[str]]]],
) -> pd.DataFrame:
    """A pandas DataFrame with one row per result file and flattened keys as columns.

    A sweep's folder (``loadgen sweep --output DIR``) gives one row per point, from its
    sweep.jsonl, with the swept values and labels as columns (see
    :func:`loadgen.sweep.load_sweep`), not a row per result.json under it.

    Args:
        paths: result.json files and/or folders (searched recursively for result.json),
            and/or sweep folders; each may be a URL of an upload (``s3://bucket/prefix``,
            see :mod:`loadgen.storage`), read from a local copy.

    Raises:
        ImportError: pandas is not installed (``pip install pandas``).
        ValueError: a file is not a loadgen result, or does not follow its schema.
    """
    pd = _pandas("load_results")
    from loadgen.storage import local_copies
    from loadgen.sweep.files import frame_rows, is_sweep_folder  # a sweep's folder is read by its own format

    rows: List[Dict[str, Any]] = []
    with local_copies([os.fspath(p) for p in _path_list(paths)], "load_results") as copies:
        for p in copies.paths:
            if is_sweep_folder(p):
                rows.extend({**row, "path": copies.url_of(row["path"]) if row.get("path") else ""}
                            for row in frame_rows(p))
                continue
            for path in result_files([p]):
                row = flatten(load_result(path))
                row["path"] = copies.url_of(path)
                rows.append(row)
    return pd.DataFrame(rows)


def load_timeseries(
    paths: Union[str, os.PathLike[str], Iterable[Union[str, os.PathLike[str]]]],
) -> pd.DataFrame:
    """A pandas DataFrame of the result files' time series: one row per interval, with
    ``path`` and the point's figures as columns (``t_s``, ``qps``, ``p50_ns`` ... ``tokens``,
    ``errors.<kind>`` (0 where a kind had none), ``gpu.<uuid>.<figure>``; see
    :func:`loadgen.results.render.timeseries_rows`).

    Args:
        paths: result.json files and/or folders (searched recursively for result.json).

    Raises:
        ImportError: pandas is not installed (``pip install pandas``).
        ValueError: a file is not a loadgen result, or does not follow its schema.
    """
    from loadgen.storage import local_copies

    pd = _pandas("load_timeseries")
    rows: List[Dict[str, Any]] = []
    with local_copies([os.fspath(p) for p in _path_list(paths)], "load_timeseries") as copies:
        for path in result_files(copies.paths):
            rows.extend({"path": copies.url_of(path), **row} for row in timeseries_rows(load_result(path)))
    frame = pd.DataFrame(rows)
    kinds = [c for c in frame.columns if str(c).startswith("errors.")]
    if kinds:
        frame[kinds] = frame[kinds].fillna(0).astype("int64")
    return frame
