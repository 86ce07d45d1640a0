"""Arrival traces: the offsets a ``trace`` run replays, from an array or a file."""

from __future__ import annotations

import array
import io
import os
from typing import IO, TYPE_CHECKING, Any, Optional

from loadgen.defaults import MAX_TIME_S
from loadgen.files import TRACE_LIMIT_BYTES, InputFileError, open_bounded
from loadgen.units import NS_PER, TIME_UNITS

if TYPE_CHECKING:  # numpy is imported where a trace is read
    import numpy as np

__all__ = ["load_trace"]


def load_trace(source: Any, unit: Optional[str] = None) -> np.ndarray:
    """Arrival offsets in ns from an array, a ``.npy`` file, or a text file.

    A file is read up to :data:`loadgen.files.TRACE_LIMIT_BYTES`. A text file holds one
    offset per line; a ``# unit: ms`` (or ``us``, ``s``, ``ns``)
    line sets the unit, else ``unit``, else a file named ``*.ms.txt`` is in ms, otherwise
    ns. Blank lines and other ``#`` lines are skipped. Arrays and ``.npy`` files are ns.

    Args:
        source: offsets (a sequence or array), or the path of a ``.npy`` or text file.
        unit: the unit of a text file without a ``# unit:`` line (one of ns, us, ms, s).

    Raises:
        ValueError: the file cannot be read, or the offsets are not numbers, negative,
            or decreasing (with the line).
    """
    import numpy as np

    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            with open_bounded(path, what="--trace", limit_bytes=TRACE_LIMIT_BYTES) as f:
                arr = _read_npy(f, path) if path.endswith(".npy") else np.frombuffer(_read_text(f, path, unit))
        except InputFileError as e:  # the caller names the flag
            raise ValueError(e.problem) from None
        try:
            return _checked_offsets(arr)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    return _checked_offsets(np.asarray(source))


def _read_npy(f: IO[bytes], path: str) -> np.ndarray:
    """A ``.npy`` file's array; ValueError naming the file when it is not a numeric array."""
    import numpy as np

    if not f.seekable():  # a pipe: numpy reads the header twice
        f = io.BytesIO(f.read())
    magic = f.read(6)
    if magic != b"\x93NUMPY":
        raise ValueError(f"{path} is not a .npy file (it does not start with numpy's header); "
                         "a text trace must not be named *.npy")
    f.seek(0)
    try:
        arr = np.load(f, allow_pickle=False)
    except InputFileError:
        raise
    except Exception as e:  # numpy raises ValueError, EOFError, UnpicklingError, ...
        raise ValueError(f"{path} is not a .npy array of offsets in ns ({type(e).__name__}: {e})") from None
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{path} is not a .npy array of offsets in ns")
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{path} holds {arr.dtype} values; a trace holds numbers (offsets in ns)")
    return arr


#: The longest line of a text trace: a number, or a comment.
_MAX_LINE_BYTES = 4096


def _read_text(f: IO[bytes], path: str, unit: Optional[str]) -> "array.array[float]":
    """The offsets of a text trace in ns, as doubles (8 bytes each, not a Python float's 32)."""
    scale = NS_PER[unit or ("ms" if path.endswith(".ms.txt") else "ns")]
    values = array.array("d")
    for number, raw in enumerate(iter(lambda: f.readline(_MAX_LINE_BYTES + 1), b""), start=1):
        if len(raw) > _MAX_LINE_BYTES:
            raise ValueError(f"{path} line {number}: longer than {_MAX_LINE_BYTES} bytes (a trace holds one "
                             "number per line; a .npy trace must be named *.npy)")
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ValueError(f"{path} line {number}: not UTF-8 text (a trace holds one number per "
                             "line; a .npy trace must be named *.npy)") from None
        if text.startswith("# unit:"):
            name = text.split(":", 1)[1].strip()
            if name not in NS_PER:
                raise ValueError(f"{path} line {number}: unknown unit {name!r} ({', '.join(TIME_UNITS)})")
            scale = NS_PER[name]
            continue
        if not text or text.startswith("#"):
            continue
        try:
            values.append(float(text) * scale)
        except ValueError:
            raise ValueError(f"{path} line {number}: not a number: {text[:40]!r} "
                             "(a trace holds one number per line)") from None
    return values


#: The largest offset a trace may hold: the longest run, in ns.
_MAX_OFFSET_NS = int(MAX_TIME_S * NS_PER["s"])


def _checked_offsets(arr: np.ndarray) -> np.ndarray:
    import numpy as np

    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("trace_offsets_ns must be a non-empty 1-D sequence of offsets"
                         + (f" (got an array of shape {arr.shape})" if arr.ndim != 1 else ""))
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"trace_offsets_ns must be numbers, got {arr.dtype} values")
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise ValueError("trace_offsets_ns must be finite")
        arr = np.rint(arr)
    if (arr < 0).any():
        raise ValueError(f"trace_offsets_ns must be >= 0 (offset {int(np.argmax(arr < 0))} is not)")
    if (arr > _MAX_OFFSET_NS).any():
        raise ValueError(f"trace_offsets_ns must be <= {_MAX_OFFSET_NS} ns ({MAX_TIME_S:g} s, about 3 years; "
                         f"offset {int(np.argmax(arr > _MAX_OFFSET_NS))} is not)")
    arr = arr.astype(np.int64)
    bad = np.flatnonzero(np.diff(arr) < 0)
    if bad.size:
        raise ValueError(f"trace_offsets_ns must be non-decreasing (offset {int(bad[0]) + 1} goes back)")
    return arr
