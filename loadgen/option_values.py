"""What each option of ``loadgen run`` accepts: the converters of the option table
(:data:`loadgen.options.OPTION_SPECS`), each turning a value from a flag, a config file or
the environment into its typed value, or raising :class:`OptionError` with a message that
names the allowed range or form; and the grammars of labels and load stages."""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from loadgen import defaults as D
from loadgen.units import parse_duration_s

__all__ = ["OptionError", "parse_labels", "parse_stages", "bool_value", "choice_value", "cpu_list_value",
           "dist_value", "float_value", "gpus_value", "header_list_value", "input_list_value", "int_value",
           "json_object_value", "label_list_value", "model_mix_value", "pin_value", "price_value", "ramp_up_value",
           "raw_list_value", "slo_list_value", "storage_list_value", "str_list_value", "str_value",
           "think_dist_value", "tools_file_value"]


class OptionError(ValueError):
    """A bad option value; the message names the option (as a flag) and what is allowed."""


# --------------------------------------------------------------------------- converters

def _range_text(lo: Optional[float], hi: Optional[float], lo_open: bool, unit: str) -> str:
    """The allowed range for messages, like '0..1e+08 s' or '> 0 and <= 1e+08'."""
    u = f" {unit}" if unit else ""
    if lo is not None and hi is not None:
        return f"> {lo:g} and <= {hi:g}{u}" if lo_open else f"{lo:g}..{hi:g}{u}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo:g}{u}"
    return f"<= {hi:g}{u}" if hi is not None else "any finite number"


def float_value(lo: Optional[float] = None, hi: Optional[float] = None, lo_open: bool = False,
           unit: str = "", zero_or_min: Optional[float] = None) -> Callable[[Any], Any]:
    """A finite number in [lo, hi] ((lo, hi] with ``lo_open``); with ``zero_or_min``, 0
    (none) or at least that. Every message gives the allowed range."""
    allowed = _range_text(lo, hi, lo_open, unit)
    u = f" {unit}" if unit else ""
    if zero_or_min is not None:
        allowed = f"0 (none) or {zero_or_min:g}..{hi:g}{' ' + unit if unit else ''}"

    def convert(v: Any) -> float:
        try:
            x = float(v)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"must be a number, got {v!r} (allowed: {allowed})") from None
        if not math.isfinite(x):
            raise ValueError(f"must be finite, got {v!r} (allowed: {allowed})")
        if lo is not None and (x < lo or (lo_open and x == lo)):
            raise ValueError(f"must be {'>' if lo_open else '>='} {lo:g}{u}, got {v!r} (allowed: {allowed})")
        if hi is not None and x > hi:
            raise ValueError(f"must be <= {hi:g}{u}, got {v!r} (allowed: {allowed})")
        if zero_or_min is not None and 0 < x < zero_or_min:
            raise ValueError(f"must be 0 (none) or >= {zero_or_min:g}{u}, got {v!r} (allowed: {allowed})")
        return x
    return _with_unit(convert, unit)


def _with_unit(convert: Callable[[Any], Any], unit: str) -> Callable[[Any], Any]:
    """``convert`` carrying the unit of its values (``OptionSpec.unit`` reads it), so that
    an option's unit is written once, where its range is."""
    setattr(convert, "unit", unit)  # noqa: B010 (an attribute a Callable's type does not declare)
    return convert


def int_value(lo: Optional[int] = None, hi: Optional[int] = None, why: str = "") -> Callable[[Any], int]:
    """An integer in [lo, hi]; ``why`` says where the upper limit comes from."""
    allowed = f"{lo if lo is not None else ''}..{hi if hi is not None else ''}" + (f", {why}" if why else "")

    def convert(v: Any) -> int:
        if isinstance(v, bool):
            raise ValueError(f"must be an integer, got {v!r}")
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        try:
            x = int(str(v).replace("_", "")) if not isinstance(v, int) else v
        except ValueError:
            raise ValueError(f"must be an integer, got {v!r}") from None
        if lo is not None and x < lo:
            raise ValueError(f"must be >= {lo}, got {v!r} (allowed: {allowed})")
        if hi is not None and x > hi:
            raise ValueError(f"must be <= {hi}, got {v!r} (allowed: {allowed})")
        return x
    return convert


def choice_value(*choices: str) -> Callable[[Any], str]:
    def convert(v: Any) -> str:
        s = str(v)
        if s not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}; got {v!r}")
        return s
    return convert


def bool_value(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"must be true or false, got {v!r}")


def str_value(v: Any) -> str:
    return str(v)


def _dist_of(**limits: Any) -> Callable[[Any], str]:
    """A distribution's validator (loadgen.llm.dist; ``limits`` as parse_dist takes them)."""

    def check(v: Any) -> str:
        from loadgen.llm.dist import parse_dist

        parse_dist(str(v), **limits)
        return str(v)

    return check


dist_value = _dist_of()


def model_mix_value(v: Any) -> str:
    """``NAME`` or ``NAME=WEIGHT,...`` (loadgen.llm.models), kept as written."""
    from loadgen.llm.models import parse_model_mix

    parse_model_mix(str(v))
    return str(v)


def tools_file_value(v: Any) -> str:
    """A ``--tools`` file that reads as an OpenAI tools array (loadgen/llm/tools.py)."""
    from loadgen.llm.tools import check_tools_file

    return check_tools_file(v)


think_dist_value = _with_unit(_dist_of(limit=3_600_000, low=0, unit="ms"), "ms")


def json_object_value(v: Any) -> str:
    """JSON text of an object (a TOML table is written back as JSON)."""
    import json

    if isinstance(v, dict):
        return json.dumps(v)
    try:
        obj = json.loads(str(v))
    except (ValueError, RecursionError) as e:
        raise ValueError(f"must be a JSON object, got {v!r} ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"must be a JSON object like '{{\"temperature\": 0}}', got {v!r}")
    return str(v)


def str_list_value(v: Any) -> List[str]:
    if isinstance(v, (list, tuple)):
        return [str(x) for x in v]
    return [s.strip() for s in str(v).split(";") if s.strip()]


def raw_list_value(v: Any) -> List[str]:
    """A repeatable value kept whole (headers may hold ';')."""
    if isinstance(v, (list, tuple)):
        return [str(x) for x in v]
    return [str(v)] if str(v).strip() else []


def storage_list_value(v: Any) -> List[str]:
    """'key=value' options of a --output URL's filesystem."""
    from loadgen.storage import parse_storage_options

    items = str_list_value(v)
    parse_storage_options(items)
    return items


def header_list_value(v: Any) -> List[str]:
    from loadgen.net.options import parse_header

    items = raw_list_value(v)
    for item in items:
        parse_header(item)
    return items


def slo_list_value(v: Any) -> List[str]:
    from loadgen.results.goodput import parse_slos

    items = raw_list_value(v)
    parse_slos(items)
    return items


def input_list_value(v: Any) -> List[str]:
    from loadgen.net.tensors import parse_input_spec

    items = [x for item in raw_list_value(v) for x in (item.split(";") if ";" in item else [item])]
    for item in items:
        parse_input_spec(item)
    return items


def cpu_list_value(v: Any) -> List[int]:
    """'0,2-3' -> [0, 2, 3]."""
    if isinstance(v, (list, tuple)):
        items = [str(x) for x in v]
    else:
        items = [s for s in str(v).split(",") if s.strip()]
    cpus: List[int] = []
    for item in items:
        item = item.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not m:
            raise ValueError(f"must be CPU numbers like 0,2-3; got {v!r}")
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if b < a:
            raise ValueError(f"range {item} goes backwards")
        if b > D.MAX_CPU:  # checked before the list is built
            raise ValueError(f"CPU {b} in {item!r} is past the largest CPU number Linux has, {D.MAX_CPU}")
        cpus.extend(range(a, b + 1))
    return cpus


_LABEL_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def label_list_value(v: Any) -> List[str]:
    """'key=value' labels: the key a name (letters, digits, '_', '.', '-'; 64 at most),
    the value any text without a line break."""
    items = raw_list_value(v)
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"must be KEY=VALUE, like gpu=h100; got {item!r}")
        if not _LABEL_KEY.fullmatch(key):
            raise ValueError(f"label name {key!r} must start with a letter or '_' and hold only letters, "
                             "digits, '_', '.', '-' (64 characters at most)")
        if "\n" in value or "\r" in value:
            raise ValueError(f"label {key!r}: the value holds a line break")
    return items


def parse_labels(items: List[str]) -> Dict[str, str]:
    """``--label`` values as a dict; a later value for a name replaces an earlier one."""
    return dict(item.partition("=")[::2] for item in items)


def price_value(v: Any) -> str:
    from loadgen.results.cost import parse_price

    return parse_price(v).text


def gpus_value(v: Any) -> str:
    from loadgen.telemetry.gpu_select import parse_gpus

    s = str(v).strip()
    parse_gpus(s)
    return s


def pin_value(v: Any) -> str:
    s = str(v).strip()
    if s != "auto":
        cpu_list_value(s)
    return s


_ramp_up_seconds = float_value(0, D.MAX_TIME_S, unit="s")


def ramp_up_value(v: Any) -> Optional[float]:
    """``--ramp-up-s``: auto (None: the scenario chooses) or a duration in seconds."""
    if isinstance(v, str) and v.strip().lower() == "auto":
        return None
    return float(_ramp_up_seconds(v))


_with_unit(ramp_up_value, "s")


def parse_stages(text: Any, ramp: str = "step") -> List[Tuple[float, float, float]]:
    """Parses ``--stages``: 'DURATION:QPS' or 'DURATION:QPS1-QPS2' stages, comma separated.

    'D:Q' holds Q for D (ramp 'step'), or ramps linearly from the previous stage's end
    rate to Q over D (ramp 'linear'; the first stage starts from 0). 'D:A-B' always ramps
    from A to B. Returns [(duration_s, start_qps, end_qps)].
    """
    parts = [str(p) for p in text] if isinstance(text, (list, tuple)) else [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ValueError("needs at least one stage, like 10s:100,30s:1000")
    stages: List[Tuple[float, float, float]] = []
    previous = 0.0
    for i, part in enumerate(parts):
        duration, sep, rate = part.strip().partition(":")
        if not sep:
            raise ValueError(f"stage {i + 1} {part!r} must be DURATION:QPS (like 10s:100)")
        try:
            d = parse_duration_s(duration)
            if "-" in rate.strip().lstrip("-"):
                a, b = (float(x) for x in rate.split("-", 1))
            else:
                b = float(rate)
                a = previous if ramp == "linear" else b
        except ValueError:
            raise ValueError(f"stage {i + 1} {part!r} must be DURATION:QPS or DURATION:QPS-QPS") from None
        if not d > 0:
            raise ValueError(f"stage {i + 1} {part!r}: duration must be > 0")
        if not D.MIN_DURATION_S <= d <= D.MAX_TIME_S:
            raise ValueError(f"stage {i + 1} {part!r}: duration must be {_STAGE_DURATIONS}")
        if not (a >= 0 and b >= 0 and math.isfinite(a) and math.isfinite(b)):
            raise ValueError(f"stage {i + 1} {part!r}: rates must be finite and >= 0")
        if max(a, b) > D.MAX_TARGET_QPS:
            raise ValueError(f"stage {i + 1} {part!r}: rates must be <= {D.MAX_TARGET_QPS:g} queries/s "
                             f"({_RATE_WHY})")
        stages.append((d, a, b))
        previous = b
    if not any(a > 0 or b > 0 for _, a, b in stages):
        raise ValueError("at least one stage needs a rate > 0")
    total = sum(d for d, _, _ in stages)
    if total > D.MAX_TIME_S:
        raise ValueError(f"the stages last {total:g} s in all, more than {D.MAX_TIME_S:g} s")
    return stages


_STAGE_DURATIONS = f"between 1 us and {D.MAX_TIME_S:g} s (about 3 years)"
_RATE_WHY = "the engine issues tens of millions of queries per second at most"
