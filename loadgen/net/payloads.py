"""Request data from files: JSON-lines bodies, the kind of a ``--payload`` file, and how
many distinct synthetic samples a client prepares. (Tensor samples from ``.npy``/``.npz``
are :func:`loadgen.net.tensors.load_samples`.)"""

from __future__ import annotations

import json
from typing import Any, List

from loadgen.files import PAYLOAD_LIMIT_BYTES, open_bounded, read_text

__all__ = ["SYNTHETIC_MAX", "payload_kind", "raw_lines", "read_jsonl"]

SYNTHETIC_MAX = 256  # distinct synthetic samples prepared (indices wrap around them)


def read_jsonl(path: str) -> List[Any]:
    """The JSON values of a JSON-lines file; ValueError naming the bad line."""
    values = []
    text = read_text(path, what="--payload", limit_bytes=PAYLOAD_LIMIT_BYTES)
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except ValueError as e:
            raise ValueError(f"--payload: {path} line {number} is not JSON: {e}") from None
    if not values:
        raise ValueError(f"--payload: {path} has no lines")
    return values


def payload_kind(path: str) -> str:
    """"npy", "npz" or "jsonl" for a ``--payload`` path; ValueError for anything else."""
    for ext in (".npy", ".npz", ".jsonl", ".ndjson"):
        if path.endswith(ext):
            return "jsonl" if ext == ".ndjson" else ext[1:]
    raise ValueError(f"--payload: {path}: use a .npy or .npz file of samples, or a .jsonl file of request bodies")


def raw_lines(path: str, count: int) -> List[bytes]:
    """The first ``count`` non-blank lines of a file, as bytes without the newline (the
    bodies are sent exactly as written)."""
    out: List[bytes] = []
    with open_bounded(path, what="--payload", limit_bytes=PAYLOAD_LIMIT_BYTES) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(line)
                if len(out) == count:
                    break
    return out
