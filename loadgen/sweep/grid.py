"""The points of a sweep: ``--vary NAME=VALUES`` flags, the config file's ``[sweep]``
table and ``--points FILE`` read into an ordered list of points, each a dict of option
values (``{"concurrency": 4, "label.config": "a"}``).

A dimension sweeps one option over values (a comma list, ``A:B:STEP`` an inclusive
numeric range); dimensions combine as a grid (the cartesian product, the first dimension
varying slowest). A list of points gives the values of each point; given with a grid,
each listed point is combined with every grid point. ``label.KEY`` sweeps the label KEY
(the run gets ``--label KEY=VALUE``). Every value is converted and checked by its
option's own converter, so an error names the option.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from loadgen.files import CONFIG_LIMIT_BYTES, InputFileError, read_text
from loadgen.options import OPTION_SPECS, OptionSpec

__all__ = ["LABEL_PREFIX", "MAX_POINTS", "Dimension", "SweepError", "combine", "convert_value", "env_name",
           "parse_values", "parse_vary", "point_slug", "points_from_list", "read_points_file", "sweep_name",
           "value_env", "vary_from_table"]

#: The prefix of a swept label: ``label.config`` sweeps the label ``config``.
LABEL_PREFIX = "label."
#: The most points a sweep may have (grid and repeats together), and the most values a
#: range may expand to.
MAX_POINTS = 100_000

_SPECS: Dict[str, OptionSpec] = {s.name: s for s in OPTION_SPECS}
# Options that say where and how a sweep writes, not what a point runs.
_NOT_SWEPT = {"output": "the sweep writes every point under its one --output folder",
              "json": "it applies to the whole sweep", "quiet": "it applies to the whole sweep",
              "no_html": "it applies to the whole sweep",
              "config": "the config file holds the base options; vary the options it sets instead"}
_LABEL_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_RANGE = re.compile(rf"\s*({_NUMBER})\s*:\s*({_NUMBER})\s*:\s*({_NUMBER})\s*")


class SweepError(ValueError):
    """A bad sweep definition; the message names the option or the file, and what is wrong."""


@dataclass(frozen=True)
class Dimension:
    """One swept option (``name`` as :func:`sweep_name` spells it) and its values."""

    name: str
    values: Tuple[Any, ...]


def sweep_name(text: str, where: str = "--vary") -> str:
    """The canonical name of a swept option: an option's name with underscores
    (``target-qps`` -> ``target_qps``), or ``label.KEY`` for a label."""
    text = text.strip()
    if text.startswith(LABEL_PREFIX):
        key = text[len(LABEL_PREFIX):]
        if not _LABEL_KEY.fullmatch(key):
            raise SweepError(f"{where} {text}: label name {key!r} must start with a letter or '_' and hold only "
                             "letters, digits, '_', '.', '-' (64 characters at most)")
        return LABEL_PREFIX + key
    name = text.replace("-", "_")
    if name == "label":
        raise SweepError(f"{where} label: sweep a label by its name, like label.config=a,b (each point gets "
                         "--label config=VALUE)")
    if name in _NOT_SWEPT:
        raise SweepError(f"{where} {text}: --{name.replace('_', '-')} cannot be swept: {_NOT_SWEPT[name]}")
    if name not in _SPECS:
        import difflib

        close = difflib.get_close_matches(name, list(_SPECS), n=1)
        hint = f"; did you mean {close[0].replace('_', '-')}?" if close else " (see 'loadgen run --help')"
        raise SweepError(f"{where} {text}: not an option of loadgen run{hint}")
    return name


def convert_value(name: str, value: Any, where: str = "--vary") -> Any:
    """``value`` converted and checked by the option's own converter; a label's value
    as text. The error names the option."""
    if name.startswith(LABEL_PREFIX):
        if isinstance(value, (dict, list, tuple)):
            raise SweepError(f"{where} {name}: a label value is text, got {value!r}")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        try:
            _SPECS["label"].convert([f"{name[len(LABEL_PREFIX):]}={text}"])
        except ValueError as e:
            raise SweepError(f"{where} {name}: --label {e}") from None
        return text
    spec = _SPECS[name]
    try:
        return spec.convert(value)
    except ValueError as e:
        raise SweepError(f"{where} {name}: {spec.flag} {e}") from None


def _expand_range(text: str, m: "re.Match[str]", where: str) -> List[Any]:
    """``A:B:STEP``: A, A+STEP, ... up to B inclusive (down when STEP < 0), computed in
    decimal so that 0.1 steps give 0.3, not 0.30000000000000004."""
    try:
        a, b, step = (Decimal(g) for g in m.groups())
    except InvalidOperation:  # pragma: no cover - the pattern admits numbers only
        raise SweepError(f"{where}: {text!r} is not a range A:B:STEP") from None
    if step == 0 or (b - a) * step < 0:
        raise SweepError(f"{where}: range {text.strip()!r} never reaches its end: STEP must be non-zero and "
                         "point from A to B")
    count = int((b - a) / step) + 1
    if count > MAX_POINTS:
        raise SweepError(f"{where}: range {text.strip()!r} has {count:,} values, more than {MAX_POINTS:,}")
    integral = all(x == x.to_integral_value() for x in (a, step)) and all("." not in g and "e" not in g.lower()
                                                                          for g in m.groups())
    values = [a + step * i for i in range(count)]
    return [int(v) if integral else float(v) for v in values]


def parse_values(text: str, where: str = "--vary") -> List[Any]:
    """A comma list of values, each a value or an inclusive range ``A:B:STEP``
    (``1,2,4:16:4`` -> [1, 2, 4, 8, 12, 16]); values stay text where not a range."""
    out: List[Any] = []
    for item in text.split(","):
        if not item.strip():
            raise SweepError(f"{where}: empty value in {text!r} (values are a comma list, like 1,2,4)")
        m = _RANGE.fullmatch(item)
        out.extend(_expand_range(item, m, where) if m else [item.strip()])
    return out


def parse_vary(text: str) -> Dimension:
    """``NAME=VALUES`` of a ``--vary`` flag as a dimension, its values converted."""
    name_text, sep, values_text = text.partition("=")
    if not sep or not name_text.strip():
        raise SweepError(f"--vary {text!r}: must be NAME=VALUES, like concurrency=1,2,4 or target-qps=100:1000:100")
    name = sweep_name(name_text)
    return _dimension(name, parse_values(values_text, f"--vary {name_text.strip()}"), "--vary")


def _dimension(name: str, raw: Sequence[Any], where: str) -> Dimension:
    values: List[Any] = []
    for value in raw:
        converted = convert_value(name, value, where)
        if converted in values:
            raise SweepError(f"{where} {name}: the value {value!r} is given twice")
        values.append(converted)
    if not values:
        raise SweepError(f"{where} {name}: no values")
    return Dimension(name, tuple(values))


def _flat_items(table: Mapping[str, Any], where: str) -> List[Tuple[str, Any]]:
    """(name, value) of a TOML table whose labels may be nested (``label.config = ...``
    in TOML is ``{"label": {"config": ...}}``)."""
    items: List[Tuple[str, Any]] = []
    for key, value in table.items():
        if key in ("label", "labels") and isinstance(value, dict):
            items.extend((f"{LABEL_PREFIX}{k}", v) for k, v in value.items())
        else:
            items.append((str(key), value))
    return [(sweep_name(k, where), v) for k, v in items]


def vary_from_table(table: Any, where: str) -> List[Dimension]:
    """The dimensions of a ``vary`` table (``{concurrency = [1, 2, 4], label.config =
    ["a", "b"]}``); a value may be a list, a string like a --vary flag's ("1,2,4",
    "100:1000:100"), or one value."""
    if not isinstance(table, dict):
        raise SweepError(f"{where}: 'vary' must be a table like {{concurrency = [1, 2, 4]}}")
    dims = []
    for name, value in _flat_items(table, f"{where} vary:"):
        if isinstance(value, list):
            raw: List[Any] = value
        elif isinstance(value, str):
            raw = parse_values(value, f"{where} vary: {name}")
        else:
            raw = [value]
        dims.append(_dimension(name, raw, f"{where} vary:"))
    return dims


def points_from_list(items: Any, where: str) -> List[Dict[str, Any]]:
    """The points of a ``points`` list (``[{concurrency = 1, target_qps = 100}, ...]``),
    each value converted."""
    if not isinstance(items, list) or not all(isinstance(p, dict) for p in items):
        raise SweepError(f"{where}: 'points' must be a list of tables, like [{{concurrency = 1}}, "
                         "{concurrency = 2}]")
    if len(items) > MAX_POINTS:
        raise SweepError(f"{where}: {len(items):,} points, more than {MAX_POINTS:,}")
    points = []
    for i, item in enumerate(items):
        if not item:
            raise SweepError(f"{where}: point {i} sets no option")
        point_where = f"{where} point {i}:"
        points.append({name: convert_value(name, value, point_where) for name, value in _flat_items(item, point_where)})
    return points


def read_points_file(path: str) -> List[Dict[str, Any]]:
    """The points of ``--points FILE``: a TOML file with ``points = [...]`` (or a
    ``[sweep]`` table holding it), a JSON list of objects, or JSON lines of objects."""
    where = f"--points {path}:"
    try:
        text = read_text(path, what="--points", limit_bytes=CONFIG_LIMIT_BYTES)
    except InputFileError as e:
        raise SweepError(str(e)) from None
    if path.endswith(".toml"):
        return points_from_list(_toml_points(text, where), where)
    try:
        if path.endswith(".jsonl"):
            items: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            items = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise SweepError(f"{where} not JSON ({e}); give a .toml file, a JSON list, or .jsonl lines") from None
    return points_from_list(items, where)


def _toml_points(text: str, where: str) -> Any:
    try:
        import tomllib
    except ImportError:  # pragma: no cover - older Pythons
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SweepError(f"{where} not valid TOML: {e}") from None
    table = data.get("sweep", data)
    if not isinstance(table, dict) or "points" not in table:
        raise SweepError(f"{where} no 'points' list (write points = [{{concurrency = 1}}, ...])")
    return table["points"]


def combine(dimensions: Sequence[Dimension], points: Optional[Sequence[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """Every point: the grid of ``dimensions`` (the first varying slowest), each
    combined with every listed point when ``points`` are given (a listed point's values
    first). A name both listed and varied is an error."""
    names = [d.name for d in dimensions]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise SweepError(f"--vary {twice} is given twice")
    count = 1
    for d in dimensions:
        count *= len(d.values)
    listed = list(points) if points is not None else [{}]
    if count * len(listed) > MAX_POINTS:
        raise SweepError(f"the sweep has {count * len(listed):,} points, more than {MAX_POINTS:,}")
    for p in listed:
        both = sorted(set(p) & set(names))
        if both:
            raise SweepError(f"{both[0]} is both varied (--vary or [sweep] vary) and set by the points list")
    grid = [dict(zip(names, combo)) for combo in itertools.product(*(d.values for d in dimensions))]
    return [{**p, **g} for p in listed for g in grid]


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def point_slug(values: Mapping[str, Any], limit: int = 60) -> str:
    """A short folder-name-safe text of a point's values, like
    ``concurrency-4_config-a``; long ones are cut and end with a hash of the values."""
    parts = []
    for name, value in values.items():
        short = name[len(LABEL_PREFIX):] if name.startswith(LABEL_PREFIX) else name
        parts.append(f"{short}-{_value_text(value)}")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", "_".join(parts)).strip("-.") or "base"
    if len(slug) > limit:
        import hashlib

        digest = hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:8]
        slug = slug[: limit - 9].rstrip("-_.") + "-" + digest
    return slug


def value_env(value: Any) -> str:
    """A point's value as an environment variable's text (lists comma separated)."""
    return _value_text(value)


def env_name(name: str) -> str:
    """``LOADGEN_POINT_<NAME>`` of a swept option (``label.config`` -> ``..._LABEL_CONFIG``)."""
    return "LOADGEN_POINT_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()

