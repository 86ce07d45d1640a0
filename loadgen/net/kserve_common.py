"""KServe v2 / Open Inference Protocol, what REST and gRPC share: model metadata, the
checks a response's outputs must pass, where a client's input specs and samples come from,
and the JSON tensor codec (request bodies, and samples back from them). The gRPC forms are
in :mod:`loadgen.net.kserve_grpc`."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from loadgen.net.options import NetOptions, clip
from loadgen.net.payloads import SYNTHETIC_MAX, payload_kind
from loadgen.net.targets import Target
from loadgen.net.tensors import (InputSpec, datatype_of, load_samples, numpy_dtype, synthetic_samples,
                                 synthetic_source)

if TYPE_CHECKING:  # numpy is imported where it is used
    import numpy as np

__all__ = ["KServeInputs", "ModelMetadata", "check_json_response", "check_outputs", "json_request_body",
           "parse_metadata", "samples_from_json_body"]


class ModelMetadata:
    """What ``GET /v2/models/NAME`` (or gRPC ModelMetadata) said about a model.

    Attributes:
        name, versions, platform: as the server gave them.
        inputs, outputs: the tensors, as :class:`InputSpec` (empty when not given).
    """

    def __init__(self, name: str, versions: List[str], platform: str,
                 inputs: List[InputSpec], outputs: List[InputSpec]) -> None:
        self.name, self.versions, self.platform = name, versions, platform
        self.inputs, self.outputs = inputs, outputs

    def as_dict(self) -> dict:
        return {"name": self.name, "versions": self.versions, "platform": self.platform,
                "inputs": [s.as_dict() for s in self.inputs], "outputs": [s.as_dict() for s in self.outputs]}


def _tensors(items: Any, where: str) -> List[InputSpec]:
    out = []
    for i, t in enumerate(items or []):
        try:
            out.append(InputSpec(str(t["name"]), str(t["datatype"]).upper(), tuple(int(d) for d in t["shape"])))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"model metadata: {where}[{i}] is not a tensor with name, datatype and shape: "
                             f"{clip(json.dumps(t), 200)}") from None
    return out


def parse_metadata(doc: Any) -> ModelMetadata:
    """Model metadata from its JSON form; ValueError when it is not one."""
    if not isinstance(doc, dict) or "name" not in doc:
        raise ValueError(f"model metadata is not a JSON object with a name: {clip(str(doc), 200)}")
    return ModelMetadata(str(doc["name"]), [str(v) for v in doc.get("versions") or []],
                         str(doc.get("platform", "")), _tensors(doc.get("inputs"), "inputs"),
                         _tensors(doc.get("outputs"), "outputs"))


def _json_data(arr: np.ndarray, datatype: str) -> list:
    import numpy as np

    if datatype == "BYTES":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in arr.reshape(-1)]
    return np.ascontiguousarray(arr, dtype=numpy_dtype(datatype)).reshape(-1).tolist()


def json_request_body(sample: Dict[str, np.ndarray], specs: Sequence[InputSpec],
                      outputs: Sequence[str] = (), request_id: Optional[str] = None) -> bytes:
    """The JSON body of one infer request: every input with its shape and flat data."""
    import numpy as np

    inputs = []
    for spec in specs:
        arr = np.asarray(sample[spec.name])
        inputs.append({"name": spec.name, "datatype": spec.datatype, "shape": list(arr.shape),
                       "data": _json_data(arr, spec.datatype)})
    body: Dict[str, Any] = {"inputs": inputs}
    if request_id is not None:
        body["id"] = request_id
    if outputs:
        body["outputs"] = [{"name": n} for n in outputs]
    return json.dumps(body, separators=(",", ":")).encode()


def _shape_fits(expected: Sequence[int], got: Sequence[int]) -> bool:
    return len(expected) == len(got) and all(e < 0 or e == g for e, g in zip(expected, got))


def check_outputs(outputs: Sequence[tuple], expected: Sequence[InputSpec]) -> Optional[str]:
    """Checks (name, datatype, shape, element count) of each output against the expected
    outputs (all of them when the request named none). None when it passes, else what is
    wrong. An element count of -1 means "not known" and is not checked."""
    if not outputs:
        return "the response has no outputs"
    by_name = {o[0]: o for o in outputs}
    for spec in expected:
        got = by_name.get(spec.name)
        if got is None:
            return (f"output {spec.name} is missing (got {', '.join(sorted(by_name))})")
        _, datatype, shape, count = got
        if datatype != spec.datatype:
            return f"output {spec.name} is {datatype}, expected {spec.datatype}"
        if not _shape_fits(spec.shape, shape):
            return f"output {spec.name} has shape {list(shape)}, expected {list(spec.shape)}"
    for name, _datatype, shape, count in outputs:
        if any(d < 0 for d in shape):
            return f"output {name} has a negative dimension in shape {list(shape)}"
        if count >= 0 and count != math.prod(shape):
            return f"output {name} has {count} values for shape {list(shape)}"
    return None


def check_json_response(body: bytes, expected: Sequence[InputSpec]) -> Optional[str]:
    """Checks a REST infer response: JSON, with outputs that match ``expected``. None when
    it passes, else a short description of what is wrong."""
    try:
        doc = _loads_json(body)
    except (ValueError, UnicodeDecodeError):
        return f"the response is not JSON: {clip(body, 80)!r}"
    if not isinstance(doc, dict):
        return f"the response is not a JSON object: {clip(body, 80)!r}"
    outs = doc.get("outputs")
    if not isinstance(outs, list):
        return "the response has no outputs list"
    seen = []
    for i, o in enumerate(outs):
        if not isinstance(o, dict) or "name" not in o or "shape" not in o:
            return f"outputs[{i}] has no name or shape"
        data = o.get("data")
        count = _flat_len(data) if data is not None else (-1 if _is_binary(o) else 0)
        try:
            shape = tuple(int(d) for d in o["shape"])
        except (TypeError, ValueError, OverflowError):
            return f"output {o.get('name')} has shape {o['shape']!r}"
        seen.append((str(o["name"]), str(o.get("datatype", "")).upper(), shape, count))
    return check_outputs(seen, expected)


def _loads_json(body: bytes) -> Any:
    """json.loads, with nesting too deep to parse (RecursionError) a ValueError too."""
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _is_binary(o: dict) -> bool:
    params = o.get("parameters") or {}
    return isinstance(params, dict) and "binary_data_size" in params


def _flat_len(data: Any) -> int:
    if not isinstance(data, list):
        return 1
    if data and isinstance(data[0], list):
        return sum(_flat_len(d) for d in data)
    return len(data)


def samples_from_json_body(body: Any, where: str) -> Dict[str, np.ndarray]:
    """The sample a KServe v2 JSON request body holds (the inverse of
    :func:`json_request_body`); ValueError naming ``where`` when it is not one."""
    import numpy as np

    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
        raise ValueError(f"{where}: not a KServe v2 request (an object with an inputs list)")
    sample = {}
    for t in body["inputs"]:
        try:
            dtype = numpy_dtype(str(t["datatype"]))
            data = t["data"] if dtype.kind != "O" else [str(v).encode() for v in np.ravel(t["data"])]
            sample[t["name"]] = np.asarray(data, dtype=dtype).reshape([int(d) for d in t["shape"]])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: input {t.get('name') if isinstance(t, dict) else t!r}: {e}") from None
    return sample


class KServeInputs:
    """How a KServe client (REST or gRPC) finds its input specs and samples: ``--input``,
    else the model's metadata; ``--payload`` samples, else synthetic ones."""

    net: NetOptions
    metadata: Optional[ModelMetadata]
    target: Target

    def input_specs(self) -> List[InputSpec]:
        if self.net.inputs:
            return list(self.net.inputs)
        if self.metadata is not None and self.metadata.inputs:
            return list(self.metadata.inputs)
        raise ValueError(
            f"the server gave no input metadata for model {self.target.model!r} (MLServer omits it for some "
            "runtimes); give --input NAME:DTYPE:SHAPE for each input, or --payload FILE")

    def samples(self) -> Tuple[List[Dict[str, np.ndarray]], List[InputSpec], str]:
        import numpy as np

        limit = self.net.sample_count
        path = self.net.payload
        if path and payload_kind(path) in ("npy", "npz"):
            specs = None
            if self.net.inputs or (self.metadata is not None and self.metadata.inputs):
                specs = self.input_specs()
            samples = load_samples(path, specs, limit)
            if specs is None:
                first = samples[0]
                specs = [InputSpec(k, datatype_of(v), tuple(np.shape(v))) for k, v in first.items()]
            return samples, specs, path
        specs = self.input_specs()
        count = min(limit, SYNTHETIC_MAX)
        samples = synthetic_samples(specs, count, self.net.seed)
        return samples, specs, synthetic_source(len(samples), count, self.net.seed)

    def expected_outputs(self) -> List[InputSpec]:
        return list(self.metadata.outputs) if self.metadata is not None else []
