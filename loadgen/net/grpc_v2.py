"""KServe v2 over gRPC: ModelInfer requests built from samples (raw or typed contents),
responses decoded from either form, and the protocol's RPC paths.

Messages are from ``kserve_v2.proto`` (generated into :mod:`loadgen.net.kserve_v2_pb2`).
"""

from __future__ import annotations

import struct
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from loadgen.net import kserve_v2_pb2 as pb
from loadgen.net.kserve import ModelMetadata, check_outputs
from loadgen.net.tensors import InputSpec, numpy_dtype

__all__ = ["RPC", "pb", "infer_request", "decode_outputs", "output_summary", "check_response",
           "metadata_from_pb"]

#: The protocol's method paths.
RPC = {name: f"/inference.GRPCInferenceService/{name}" for name in (
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")}

# datatype -> field of InferTensorContents (FP16/BF16 have none: raw only)
_TYPED_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
    "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
# Raw contents are little-endian.
_RAW_DTYPE = {k: v.newbyteorder("<") for k, v in
              ((k, numpy_dtype(k)) for k in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8",
                                             "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"))}


def _raw_bytes(arr: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        parts = []
        for v in arr.reshape(-1):
            b = v if isinstance(v, bytes) else str(v).encode()
            parts.append(struct.pack("<I", len(b)) + b)
        return b"".join(parts)
    return np.ascontiguousarray(arr, dtype=_RAW_DTYPE[datatype]).tobytes()


def infer_request(model: str, version: str, sample: Dict[str, np.ndarray], specs: Sequence[InputSpec],
                  contents: str = "raw", outputs: Sequence[str] = ()) -> pb.ModelInferRequest:
    """A ModelInferRequest for one sample.

    Args:
        contents: "raw" (``raw_input_contents``, the compact form) or "typed" (each input's
            ``contents`` field; FP16 inputs still go raw, as the protocol has no typed field
            for them, so they force raw for the whole request).
    """
    if contents not in ("raw", "typed"):
        raise ValueError(f"contents must be 'raw' or 'typed', got {contents!r}")
    req = pb.ModelInferRequest(model_name=model, model_version=version)
    use_raw = contents == "raw" or any(s.datatype not in _TYPED_FIELD for s in specs)
    for spec in specs:
        arr = np.asarray(sample[spec.name])
        t = req.inputs.add(name=spec.name, datatype=spec.datatype, shape=list(arr.shape))
        if use_raw:
            req.raw_input_contents.append(_raw_bytes(arr, spec.datatype))
        else:
            field = getattr(t.contents, _TYPED_FIELD[spec.datatype])
            flat = arr.reshape(-1)
            if spec.datatype == "BYTES":
                field.extend(v if isinstance(v, bytes) else str(v).encode() for v in flat)
            else:
                field.extend(flat.astype(numpy_dtype(spec.datatype)).tolist())
    for name in outputs:
        req.outputs.add(name=name)
    return req


def _count_bytes_elements(raw: bytes) -> int:
    n, i = 0, 0
    while i + 4 <= len(raw):
        (size,) = struct.unpack_from("<I", raw, i)
        i += 4 + size
        n += 1
    return n if i == len(raw) else -2  # -2: malformed length prefixes


def output_summary(resp: pb.ModelInferResponse) -> Tuple[List[tuple], Optional[str]]:
    """(name, datatype, shape, element count) per output, from raw or typed contents, and
    a problem with the contents' layout (None when there is none)."""
    raw = resp.raw_output_contents
    if raw and len(raw) != len(resp.outputs):
        return [], f"{len(raw)} raw output contents for {len(resp.outputs)} outputs"
    out = []
    for i, o in enumerate(resp.outputs):
        dt = o.datatype.upper()
        if raw:
            if dt == "BYTES":
                count = _count_bytes_elements(raw[i])
                if count == -2:
                    return [], f"output {o.name}: malformed BYTES raw contents"
            elif dt in _RAW_DTYPE:
                size = _RAW_DTYPE[dt].itemsize
                if len(raw[i]) % size:
                    return [], f"output {o.name}: {len(raw[i])} raw bytes is not a whole number of {dt}"
                count = len(raw[i]) // size
            else:
                count = -1
        else:
            field = _TYPED_FIELD.get(dt)
            count = len(getattr(o.contents, field)) if field else -1
        out.append((o.name, dt, tuple(o.shape), count))
    return out, None


def check_response(resp: pb.ModelInferResponse, expected: Sequence[InputSpec]) -> Optional[str]:
    """None when the response's outputs match ``expected``; else what is wrong."""
    summary, problem = output_summary(resp)
    if problem:
        return problem
    return check_outputs(summary, expected)


def decode_outputs(resp: pb.ModelInferResponse) -> Dict[str, np.ndarray]:
    """Each output as a numpy array of its shape, from raw or typed contents."""
    out: Dict[str, np.ndarray] = {}
    raw = resp.raw_output_contents
    for i, o in enumerate(resp.outputs):
        dt, shape = o.datatype.upper(), tuple(o.shape)
        if raw:
            if dt == "BYTES":
                items, data, j = [], raw[i], 0
                while j + 4 <= len(data):
                    (size,) = struct.unpack_from("<I", data, j)
                    items.append(data[j + 4:j + 4 + size])
                    j += 4 + size
                arr = np.array(items, dtype=object)
            else:
                arr = np.frombuffer(raw[i], dtype=_RAW_DTYPE[dt]).astype(numpy_dtype(dt))
        else:
            values = list(getattr(o.contents, _TYPED_FIELD[dt]))
            arr = np.array(values, dtype=numpy_dtype(dt))
        out[o.name] = arr.reshape(shape)
    return out


def metadata_from_pb(resp: pb.ModelMetadataResponse) -> ModelMetadata:
    """ModelMetadata from its gRPC form."""
    def tensors(items) -> List[InputSpec]:
        return [InputSpec(t.name, t.datatype.upper(), tuple(t.shape)) for t in items]
    return ModelMetadata(resp.name, list(resp.versions), resp.platform, tensors(resp.inputs), tensors(resp.outputs))
