"""Units of time: the one table of factors, conversions to the integer nanoseconds the core
counts in, reading values like ``10ms`` and writing them for people.

Timestamps and durations inside the engine are integer nanoseconds from one monotonic
clock; settings carry their unit in their name (``grace_s``, ``timeout_ms``, ``spin_us``).
Everything that crosses between the two goes through this module, and so does every other
change of time unit (``tests/unit/test_units.py`` finds factors like ``/ 1e6`` written
elsewhere).
"""

from __future__ import annotations

import re
from typing import Dict, Optional

__all__ = [
    "NS_PER",
    "SECONDS_PER",
    "TIME_UNITS",
    "format_ns",
    "ms_to_ns",
    "ms_to_s",
    "ns_to_ms",
    "ns_to_s",
    "ns_to_us",
    "parse_duration_s",
    "s_to_ms",
    "s_to_ns",
    "to_ns",
    "us_to_ns",
]

#: The time units a value may be given in, smallest first.
TIME_UNITS = ("ns", "us", "ms", "s")

#: Nanoseconds per unit.
NS_PER: Dict[str, int] = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}

#: Seconds per unit, with the longer units a duration may be given in.
SECONDS_PER: Dict[str, float] = {**{u: n / 1e9 for u, n in NS_PER.items()}, "m": 60.0, "h": 3600.0}


def to_ns(value: float, unit: str) -> float:
    """``value`` in ``unit`` (one of :data:`TIME_UNITS`) as nanoseconds (not rounded).

    Raises:
        ValueError: an unknown unit; the message lists the known ones.
    """
    try:
        return value * NS_PER[unit]
    except KeyError:
        raise ValueError(f"unknown unit {unit!r} ({', '.join(TIME_UNITS)})") from None


def s_to_ns(seconds: Optional[float]) -> int:
    """Seconds as whole nanoseconds; None and 0 give 0 (the core's "none")."""
    return 0 if not seconds else int(round(seconds * NS_PER["s"]))


def ms_to_ns(ms: Optional[float]) -> int:
    """Milliseconds as whole nanoseconds; None and 0 give 0."""
    return 0 if not ms else int(round(ms * NS_PER["ms"]))


def us_to_ns(us: Optional[float]) -> int:
    """Microseconds as whole nanoseconds; None and 0 give 0."""
    return 0 if not us else int(round(us * NS_PER["us"]))


def ns_to_s(ns: float) -> float:
    """Nanoseconds as seconds."""
    return ns / NS_PER["s"]


def ns_to_ms(ns: float) -> float:
    """Nanoseconds as milliseconds."""
    return ns / NS_PER["ms"]


def ns_to_us(ns: float) -> float:
    """Nanoseconds as microseconds."""
    return ns / NS_PER["us"]


def s_to_ms(seconds: float) -> float:
    """Seconds as milliseconds (not rounded)."""
    return seconds * (NS_PER["s"] // NS_PER["ms"])


def ms_to_s(ms: float) -> float:
    """Milliseconds as seconds."""
    return ms / (NS_PER["s"] // NS_PER["ms"])


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|us|ms|s|m|h)?\s*$")


def parse_duration_s(text: str) -> float:
    """'10s', '500ms', '2m', '1.5' (seconds) -> seconds.

    Raises:
        ValueError: not a number with an optional unit (ns, us, ms, s, m, h).
    """
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a duration (like 10s, 500ms, 2m)")
    return float(m.group(1)) * SECONDS_PER[m.group(2) or "s"]


def format_ns(ns: float) -> str:
    """A duration in ns for people, in the largest unit that keeps it >= 1 ('1.250 ms')."""
    if ns >= NS_PER["s"]:
        return f"{ns / NS_PER['s']:.3f} s"
    if ns >= NS_PER["ms"]:
        return f"{ns / NS_PER['ms']:.3f} ms"
    if ns >= NS_PER["us"]:
        return f"{ns / NS_PER['us']:.1f} us"
    return f"{ns:.0f} ns"
