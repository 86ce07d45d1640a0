"""The ``loadgen.result/1`` schema, and the check of a document read back against it.

The schema is the JSON Schema shipped beside this module (``result.schema.json``); any
JSON Schema tool can use it. :func:`check_result` checks a document against it with a
small validator of the keywords that schema uses (so no extra dependency), and adds two
rules a JSON Schema cannot say for every value: each number is finite and fits in 64
bits, and nothing is nested more than :data:`MAX_DEPTH` levels deep. The renderers can
then read every key the schema names without a type error.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any, Dict, List, Optional, Tuple, Union

__all__ = ["ISSUED_OUTCOMES", "MAX_DEPTH", "SCHEMA_FILE", "SchemaError", "check_accounting", "check_result",
           "format_path", "result_schema"]

#: The shipped JSON Schema's file name, in the ``loadgen.results`` package.
SCHEMA_FILE = "result.schema.json"
#: How deep a result document may nest (loadgen's own go about 5 deep).
MAX_DEPTH = 64

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # int64 and uint64 both fit
_ANNOTATIONS = {"$schema", "$id", "$comment", "$defs", "title", "description"}
_KEYWORDS = {"type", "properties", "patternProperties", "additionalProperties", "required", "items",
             "pattern", "minimum", "const", "enum", "$ref", "if", "then", "else"} | _ANNOTATIONS
_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
               float: "a number", type(None): "null"}

Path = Tuple[Union[str, int], ...]


class SchemaError(ValueError):
    """A document does not follow the result schema; the message names the key path.

    Attributes:
        path: the key path, as a string (``latency_ns["p99.9"]``, ``timeseries[3].qps``);
            empty for the document itself.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        super().__init__(f"'{path}' {problem}" if path else f"the document {problem}")


@functools.lru_cache(maxsize=None)
def _schema_text() -> str:
    from importlib.resources import files

    return files("loadgen.results").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")


def result_schema() -> Dict[str, Any]:
    """The shipped JSON Schema of ``loadgen.result/1`` (a fresh copy)."""
    schema: Dict[str, Any] = json.loads(_schema_text())
    return schema


@functools.lru_cache(maxsize=None)
def _compiled() -> Dict[str, Any]:
    schema = result_schema()
    _check_keywords(schema, "#")
    return schema


def _check_keywords(node: Any, where: str) -> None:
    """Every keyword of the shipped schema is one this validator applies: a keyword it
    skipped would be a rule silently not checked."""
    if not isinstance(node, dict):
        return
    unknown = set(node) - _KEYWORDS
    if unknown:
        raise RuntimeError(f"{SCHEMA_FILE} at {where}: keywords {sorted(unknown)} are not supported")
    for key in ("properties", "patternProperties", "$defs"):
        for name, sub in node.get(key, {}).items():
            _check_keywords(sub, f"{where}/{key}/{name}")
    for key in ("additionalProperties", "items", "if", "then", "else"):
        if key in node:
            _check_keywords(node[key], f"{where}/{key}")


def format_path(path: Path) -> str:
    """``("latency_ns", "p99.9")`` -> ``latency_ns["p99.9"]``; ``("timeseries", 3, "qps")``
    -> ``timeseries[3].qps``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def check_result(doc: Any) -> None:
    """Checks a parsed result document; raises :class:`SchemaError` naming the first key
    that is wrong and how."""
    _check_values(doc)
    error = _first_error(doc, _compiled(), ())
    if error is not None:
        path, problem = error
        raise SchemaError(format_path(path), problem)
    check_accounting(doc)


#: The counts every measured query that was issued ends in exactly one of.
ISSUED_OUTCOMES = ("completed", "failed", "timed_out", "cancelled", "outstanding")


def check_accounting(doc: Dict[str, Any]) -> None:
    """Checks the identity the engine keeps for its counts: every measured query issued
    completed, failed, timed out, was cancelled, or is still outstanding, so ``issued ==
    completed + failed + timed_out + cancelled + outstanding`` (``outstanding`` 0 when
    absent). Counts outside the identity (``unknown_completions``, ``duplicate_completions``,
    tokens, warm-up counts) are not in it. Raises :class:`SchemaError` naming the counts."""
    counts = doc.get("counts")
    if not isinstance(counts, dict) or not isinstance(counts.get("issued"), int):
        return  # the schema requires them; a document checked without it has nothing to add up
    parts = [(k, counts.get(k, 0)) for k in ISSUED_OUTCOMES]
    if not all(isinstance(v, int) and not isinstance(v, bool) for _, v in parts):
        return
    total = sum(v for _, v in parts)
    if total != counts["issued"]:
        terms = " + ".join(f"{k} {v}" for k, v in parts)
        raise SchemaError("counts", f"do not add up: issued {counts['issued']} is not {terms} (= {total}); "
                                    "every query issued ends in exactly one of them")


def _check_values(doc: Any) -> None:
    """Depth and numbers everywhere, keys the schema names or not. Iterative: a deep
    document must not exhaust the interpreter's stack here."""
    stack: List[Tuple[Any, Path]] = [(doc, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, (dict, list)):
            if len(path) >= MAX_DEPTH:
                raise SchemaError(format_path(path), f"is nested more than {MAX_DEPTH} levels deep")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend((v, (*path, k)) for k, v in items)
        elif isinstance(value, float) and not math.isfinite(value):
            raise SchemaError(format_path(path), f"is {value}; numbers must be finite")
        elif isinstance(value, int) and not isinstance(value, bool) and not _INT_MIN <= value <= _INT_MAX:
            raise SchemaError(format_path(path), f"is a number of {len(str(abs(value)))} digits, "
                                                 "more than 64 bits hold")


def _resolve(ref: str) -> Dict[str, Any]:
    if not ref.startswith("#/"):
        raise RuntimeError(f"{SCHEMA_FILE}: only local references are supported, not {ref!r}")
    node: Any = _compiled()
    for part in ref[2:].split("/"):
        node = node[part]
    resolved: Dict[str, Any] = node
    return resolved


def _is_type(value: Any, name: str) -> bool:
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if isinstance(value, bool):
        return False
    if name == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, (int, float))
    raise RuntimeError(f"{SCHEMA_FILE}: unknown type {name!r}")


_ARTICLE = {"object": "an object", "array": "an array", "integer": "an integer", "null": "null"}


def _first_error(value: Any, schema: Dict[str, Any], path: Path) -> Optional[Tuple[Path, str]]:
    """The first place ``value`` breaks ``schema``: (path, what is wrong), or None."""
    if "$ref" in schema:
        error = _first_error(value, _resolve(schema["$ref"]), path)
        if error is not None:
            return error
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, n) for n in names):
            wanted = " or ".join(_ARTICLE.get(n, f"a {n}") for n in names)
            return path, f"must be {wanted}, not {_type_name(value)}"
    if "const" in schema and value != schema["const"]:
        return path, f"must be {json.dumps(schema['const'])}"
    if "enum" in schema and value not in schema["enum"]:
        return path, f"must be one of {', '.join(json.dumps(v) for v in schema['enum'])}"
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        return path, f"must match {schema['pattern']!r}"
    if "minimum" in schema and _is_type(value, "number") and value < schema["minimum"]:
        return path, f"must be >= {schema['minimum']}, not {value}"
    if isinstance(value, dict):
        error = _object_error(value, schema, path)
        if error is not None:
            return error
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            error = _first_error(item, schema["items"], (*path, i))
            if error is not None:
                return error
    if "if" in schema:
        branch = "then" if _first_error(value, schema["if"], path) is None else "else"
        if branch in schema:
            return _first_error(value, schema[branch], path)
    return None


def _object_error(value: Dict[str, Any], schema: Dict[str, Any], path: Path) -> Optional[Tuple[Path, str]]:
    for key in schema.get("required", []):
        if key not in value:
            return (*path, key), "is missing"
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        subs = [properties[key]] if key in properties else []
        subs += [sub for pattern, sub in patterns.items() if re.search(pattern, key)]
        if not subs and extra is not True:
            if extra is False:
                return (*path, key), "is not a key of this object"
            subs = [extra]
        for sub in subs:
            error = _first_error(item, sub, (*path, key))
            if error is not None:
                return error
    return None
