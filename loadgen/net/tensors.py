"""Tensors for inference requests: KServe v2 datatypes, input specs, and the samples a run
sends (from ``.npy``/``.npz`` files or synthetic, seeded).

A sample is a dict from input name to a numpy array of that input's shape. Files hold
samples along their first axis: an ``.npy`` array of shape ``(n, *shape)`` feeds the one
input, an ``.npz`` has one such array per input name. Synthetic samples are drawn from the
``payload_seed`` stream, so the same options send the same bytes.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Sequence

import numpy as np

__all__ = ["DTYPES", "InputSpec", "datatype_of", "load_samples", "numpy_dtype", "parse_input_spec", "synthetic_samples"]

#: KServe v2 datatype -> numpy dtype (BYTES holds byte strings).
DTYPES: Dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8), "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a KServe datatype; ValueError naming the known ones."""
    try:
        return DTYPES[datatype.upper()]
    except KeyError:
        raise ValueError(f"unknown tensor datatype {datatype!r}; known: {', '.join(DTYPES)}") from None


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
    return InputSpec(name, datatype, tuple(dims))


def synthetic_samples(specs: Sequence[InputSpec], count: int, seed: int) -> List[Dict[str, np.ndarray]]:
    """``count`` samples of random data for ``specs`` (variable dimensions taken as 1),
    from a generator seeded with ``seed``: floats uniform in [0, 1), integers in [0, 100)
    (within the type's range), booleans fair, BYTES 8 random lowercase letters."""
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


def load_samples(path: str, specs: Optional[Sequence[InputSpec]], limit: int) -> List[Dict[str, np.ndarray]]:
    """Samples from an ``.npy`` or ``.npz`` file, at most ``limit`` of them.

    An ``.npy`` feeds the model's one input (``specs`` must name exactly one, or be None
    and the input is called ``INPUT0``); an ``.npz`` holds one array per input name. The
    first axis indexes samples; each sample is checked against ``specs`` (datatype kind
    and every fixed dimension) when they are known.

    Raises:
        ValueError: the file cannot be read, has no samples, or does not fit the inputs.
    """
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ValueError(f"--payload: cannot read {path}: {e}") from None
    if isinstance(loaded, np.ndarray):
        if specs is not None and len(specs) != 1:
            names = ", ".join(s.name for s in specs)
            raise ValueError(f"--payload: {path} is one array but the model has {len(specs)} inputs "
                             f"({names}); use an .npz with one array per input")
        arrays = {specs[0].name if specs else "INPUT0": loaded}
    else:
        with loaded:
            arrays = {k: loaded[k] for k in loaded.files}
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
    dtype = np.asarray(arr).dtype
    return next((name for name, d in DTYPES.items() if d == dtype and name != "BYTES"), "BYTES")
