"""Tensors for inference requests: KServe v2 datatypes, input specs, and the samples a run
sends (from ``.npy``/``.npz`` files or synthetic, seeded).

A sample is a dict from input name to a numpy array of that input's shape. Files hold
samples along their first axis: an ``.npy`` array of shape ``(n, *shape)`` feeds the one
input, an ``.npz`` has one such array per input name. Synthetic samples are drawn from the
``payload_seed`` stream, so the same options send the same bytes.

Synthetic samples are sized before they are made: one sample (all its inputs) is at
most :data:`MAX_SAMPLE_BYTES` (64 MiB), and a client prepares fewer distinct synthetic
samples when that many would take more than :data:`MAX_SYNTHETIC_BYTES` (256 MiB).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from loadgen.files import PAYLOAD_LIMIT_BYTES, InputFileError, open_bounded

if TYPE_CHECKING:  # numpy is imported where it is used
    import numpy as np

__all__ = ["DATATYPES", "MAX_SAMPLE_BYTES", "MAX_SYNTHETIC_BYTES", "InputSpec", "datatype_of", "load_samples",
           "numpy_dtype", "parse_input_spec", "sample_nbytes", "synthetic_count", "synthetic_samples",
           "synthetic_source"]

#: Most bytes of one synthetic sample (all its inputs; a BYTES element counts 8).
MAX_SAMPLE_BYTES = 64 * 1024 * 1024
#: Most bytes of all the distinct synthetic samples a client prepares.
MAX_SYNTHETIC_BYTES = 256 * 1024 * 1024

#: KServe v2 datatype -> the name of its numpy dtype (BYTES holds byte strings); numpy is
#: imported where a tensor is made or read, not by a run without tensors.
DATATYPES: Dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
    "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64",
    "BYTES": "object",
}


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a KServe datatype; ValueError naming the known ones."""
    import numpy as np

    try:
        return np.dtype(DATATYPES[datatype.upper()])
    except KeyError:
        raise ValueError(f"unknown tensor datatype {datatype!r}; known: {', '.join(DATATYPES)}") from None


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One model input: name, KServe datatype and shape (-1 for a variable dimension)."""

    name: str
    datatype: str
    shape: tuple

    def concrete_shape(self) -> tuple:
        """The shape with each variable dimension (-1) taken as 1."""
        return tuple(1 if d < 0 else d for d in self.shape)

    def as_dict(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def nbytes(self) -> int:
        """Bytes of one synthetic tensor of this input (a BYTES element counts 8)."""
        dtype = numpy_dtype(self.datatype)
        return math.prod(self.concrete_shape()) * (8 if dtype.kind == "O" else dtype.itemsize)


def sample_nbytes(specs: Sequence[InputSpec]) -> int:
    """Bytes of one synthetic sample of ``specs``."""
    return sum(spec.nbytes() for spec in specs)


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.6g} MiB"


_SPEC = re.compile(r"^([^:]+):([A-Za-z0-9]+):(.+)$")


def parse_input_spec(text: str) -> InputSpec:
    """``NAME:DTYPE:SHAPE`` (``INPUT0:FP32:1x16`` or ``INPUT0:FP32:1,16``) -> InputSpec.

    Raises:
        ValueError: the text is not of that form, the datatype is unknown, or a dimension
            is not an integer >= 1 or -1.
    """
    m = _SPEC.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not NAME:DTYPE:SHAPE (like INPUT0:FP32:1x16)")
    name, datatype, shape_text = m.group(1), m.group(2).upper(), m.group(3).strip("[] ")
    numpy_dtype(datatype)
    dims: List[int] = []
    for part in re.split(r"[x,]", shape_text):
        part = part.strip()
        try:
            d = int(part)
        except ValueError:
            raise ValueError(f"{text!r}: dimension {part!r} is not an integer") from None
        if d == 0 or d < -1:
            raise ValueError(f"{text!r}: dimension {d} must be >= 1 (or -1 for variable)")
        dims.append(d)
    spec = InputSpec(name, datatype, tuple(dims))
    if spec.nbytes() > MAX_SAMPLE_BYTES:  # checked before anything is allocated
        raise ValueError(f"{text!r}: one tensor of that shape is {_mib(spec.nbytes())}; a sample is at most "
                         f"{_mib(MAX_SAMPLE_BYTES)} ({MAX_SAMPLE_BYTES} bytes)")
    return spec


def synthetic_samples(specs: Sequence[InputSpec], count: int, seed: int) -> List[Dict[str, np.ndarray]]:
    """``count`` samples of random data for ``specs`` (variable dimensions taken as 1),
    from a generator seeded with ``seed``: floats uniform in [0, 1), integers in [0, 100)
    (within the type's range), booleans fair, BYTES 8 random lowercase letters.

    Fewer than ``count`` (at least one) when ``count`` samples would take more than
    :data:`MAX_SYNTHETIC_BYTES`.

    Raises:
        ValueError: one sample would take more than :data:`MAX_SAMPLE_BYTES` (the shapes
            may come from a server's metadata); nothing is allocated then.
    """
    import numpy as np

    per_sample = sample_nbytes(specs)
    if per_sample > MAX_SAMPLE_BYTES:
        shapes = ", ".join(f"{s.name}:{s.datatype}:{'x'.join(map(str, s.shape))}" for s in specs)
        raise ValueError(f"synthetic samples of {shapes} would be {_mib(per_sample)} each; a sample is at most "
                         f"{_mib(MAX_SAMPLE_BYTES)}: give smaller shapes with --input, or --payload FILE")
    count = synthetic_count(specs, count)
    rng = np.random.default_rng(seed)
    out: List[Dict[str, np.ndarray]] = []
    for _ in range(count):
        sample = {}
        for spec in specs:
            dtype, shape = numpy_dtype(spec.datatype), spec.concrete_shape()
            if dtype.kind == "f":
                arr = rng.random(shape).astype(dtype)
            elif dtype.kind in "iu":
                hi = min(100, int(np.iinfo(dtype).max) + 1)
                arr = rng.integers(0, hi, size=shape).astype(dtype)
            elif dtype.kind == "b":
                arr = rng.random(shape) < 0.5
            else:
                letters = rng.integers(97, 123, size=(*shape, 8), dtype=np.uint8)
                arr = np.empty(shape, dtype=object)
                flat = arr.reshape(-1)
                for i, row in enumerate(letters.reshape(-1, 8)):
                    flat[i] = row.tobytes()
            sample[spec.name] = arr
        out.append(sample)
    return out


def synthetic_count(specs: Sequence[InputSpec], count: int) -> int:
    """How many of ``count`` synthetic samples of ``specs`` fit in :data:`MAX_SYNTHETIC_BYTES`
    (at least one)."""
    return max(1, min(count, MAX_SYNTHETIC_BYTES // max(1, sample_nbytes(specs))))


def synthetic_source(made: int, asked: int, seed: int) -> str:
    """The payload source of synthetic samples, saying when fewer were made than asked."""
    if made < asked:
        return (f"synthetic ({made} samples, seed {seed}; not {asked}: the distinct synthetic samples "
                f"are at most {_mib(MAX_SYNTHETIC_BYTES)})")
    return f"synthetic ({made} samples, seed {seed})"


def load_samples(path: str, specs: Optional[Sequence[InputSpec]], limit: int) -> List[Dict[str, np.ndarray]]:
    """Samples from an ``.npy`` or ``.npz`` file, at most ``limit`` of them.

    An ``.npy`` feeds the model's one input (``specs`` must name exactly one, or be None
    and the input is called ``INPUT0``); an ``.npz`` holds one array per input name. The
    first axis indexes samples; each sample is checked against ``specs`` (datatype kind
    and every fixed dimension) when they are known.

    Raises:
        ValueError: the file cannot be read, has no samples, or does not fit the inputs.
    """
    import numpy as np

    try:
        with open_bounded(path, what="--payload", limit_bytes=PAYLOAD_LIMIT_BYTES) as f:
            loaded = np.load(f, allow_pickle=False)
            if not isinstance(loaded, np.ndarray):  # an .npz reads its members lazily: now, while open
                with loaded:
                    loaded = {k: loaded[k] for k in loaded.files}
    except InputFileError:
        raise
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"--payload: cannot read {path}: {e}") from None
    if isinstance(loaded, np.ndarray):
        if specs is not None and len(specs) != 1:
            names = ", ".join(s.name for s in specs)
            raise ValueError(f"--payload: {path} is one array but the model has {len(specs)} inputs "
                             f"({names}); use an .npz with one array per input")
        arrays = {specs[0].name if specs else "INPUT0": loaded}
    else:
        arrays = loaded
        if specs is not None:
            missing = [s.name for s in specs if s.name not in arrays]
            if missing:
                raise ValueError(f"--payload: {path} has no array for input(s) {', '.join(missing)} "
                                 f"(it has {', '.join(arrays) or 'none'})")
            arrays = {s.name: arrays[s.name] for s in specs}
    n = min(len(a) if a.ndim else 0 for a in arrays.values())
    if n == 0:
        raise ValueError(f"--payload: {path} holds no samples (the first axis indexes samples)")
    if len({len(a) for a in arrays.values()}) > 1:
        raise ValueError(f"--payload: {path}: the arrays have different sample counts "
                         f"({', '.join(f'{k}: {len(a)}' for k, a in arrays.items())})")
    for spec in specs or ():
        arr = arrays[spec.name]
        want = numpy_dtype(spec.datatype)
        if want.kind != "O" and arr.dtype.kind != want.kind:
            raise ValueError(f"--payload: {path}: input {spec.name} is {spec.datatype} but the file holds "
                             f"{arr.dtype} values")
        shape = arr.shape[1:]
        fits = len(shape) == len(spec.shape) and all(d < 0 or d == s for d, s in zip(spec.shape, shape))
        if not fits:
            raise ValueError(f"--payload: {path}: input {spec.name} has shape {list(spec.shape)} but each "
                             f"sample in the file has shape {list(shape)}")
    return [{k: a[i] for k, a in arrays.items()} for i in range(min(n, limit))]


def datatype_of(arr: np.ndarray) -> str:
    """The KServe datatype of an array (BYTES for anything not numeric or bool)."""
    import numpy as np

    dtype = np.asarray(arr).dtype
    return next((name for name, d in DATATYPES.items() if np.dtype(d) == dtype and name != "BYTES"), "BYTES")
