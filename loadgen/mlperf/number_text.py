"""Numbers as MLPerf LoadGen's C++ prints and divides them, for byte-exact log text."""

from __future__ import annotations

import math

from ..units import NS_PER, ms_to_s, ns_to_s

__all__ = ["cpp_divide", "cpp_fixed", "cpp_stream_double", "ms_setting_s", "size_minus_one"]

_U64 = 1 << 64


def _printf(value: float, spec: str) -> str:
    """``value`` formatted by ``spec`` as glibc's printf does, NaN and infinities included."""
    value = float(value)
    if math.isnan(value):
        # glibc prints the sign of a NaN; x86's default NaN (0/0) has it set.
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return format(value, spec)


def cpp_fixed(value: float, precision: int = 2) -> str:
    """A double as C++ ``std::fixed`` with ``precision`` decimals (MLPerf's DoubleToString).

    Args:
        value: the number.
        precision: digits after the decimal point.

    Returns:
        e.g. ``"1946.97"``, ``"inf"``, ``"-nan"``.
    """
    return _printf(value, f".{precision}f")


def cpp_stream_double(value: float) -> str:
    """A double as a default-configured C++ ostream prints it (``%g``, 6 significant digits).

    Args:
        value: the number.

    Returns:
        e.g. ``"2000"``, ``"0.9"``, ``"1.15499e+06"``, ``"inf"``.
    """
    return _printf(value, "g")


def cpp_divide(numerator: float, denominator: float) -> float:
    """IEEE division, as C++ does it: x/0 is +-inf, 0/0 is NaN (with the sign bit set)."""
    if denominator == 0:
        if numerator == 0 or math.isnan(numerator):
            return -math.nan
        return math.copysign(math.inf, numerator) * math.copysign(1.0, denominator)
    return numerator / denominator


def size_minus_one(count: int) -> int:
    # MLPerf subtracts one from an unsigned count; with no samples that wraps around.
    return (count - 1) % _U64


def ms_setting_s(duration_ns: int) -> float:
    """A duration setting, in seconds, as MLPerf converts its millisecond settings."""
    duration_ns = int(duration_ns)
    if duration_ns % NS_PER["ms"] == 0:
        return ms_to_s(duration_ns // NS_PER["ms"])
    return ns_to_s(duration_ns)

