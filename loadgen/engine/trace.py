"""Arrival traces: the offsets a ``trace`` run replays, from an array or a file."""

from __future__ import annotations

import os
from typing import Any, List, Optional

import numpy as np

from loadgen.units import NS_PER, TIME_UNITS

__all__ = ["load_trace"]


def load_trace(source: Any, unit: Optional[str] = None) -> np.ndarray:
    """Arrival offsets in ns from an array, a ``.npy`` file, or a text file.

    A text file holds one offset per line; a ``# unit: ms`` (or ``us``, ``s``, ``ns``)
    line sets the unit, else ``unit``, else a file named ``*.ms.txt`` is in ms, otherwise
    ns. Blank lines and other ``#`` lines are skipped. Arrays and ``.npy`` files are ns.

    Args:
        source: offsets (a sequence or array), or the path of a ``.npy`` or text file.
        unit: the unit of a text file without a ``# unit:`` line (one of ns, us, ms, s).

    Raises:
        ValueError: the file cannot be read, or the offsets are not numbers, negative,
            or decreasing (with the line).
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            arr = np.load(path) if path.endswith(".npy") else np.asarray(_read_text(path, unit))
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    else:
        arr = np.asarray(source)
    return _checked_offsets(arr)


def _read_text(path: str, unit: Optional[str]) -> List[float]:
    scale = NS_PER[unit or ("ms" if path.endswith(".ms.txt") else "ns")]
    values: List[float] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            text = line.strip()
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


def _checked_offsets(arr: np.ndarray) -> np.ndarray:
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("trace_offsets_ns must be a non-empty 1-D sequence of offsets")
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise ValueError("trace_offsets_ns must be finite")
        arr = np.rint(arr)
    arr = arr.astype(np.int64)
    if (arr < 0).any():
        raise ValueError(f"trace_offsets_ns must be >= 0 (offset {int(np.argmax(arr < 0))} is not)")
    bad = np.flatnonzero(np.diff(arr) < 0)
    if bad.size:
        raise ValueError(f"trace_offsets_ns must be non-decreasing (offset {int(bad[0]) + 1} goes back)")
    return arr
