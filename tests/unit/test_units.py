"""loadgen.units: the one table of time units, conversions to ns, durations like '10ms'; and
no other module of loadgen writes a time factor of its own."""

import ast
import pathlib
import re

import pytest

from loadgen.units import (
    NS_PER,
    SECONDS_PER,
    TIME_UNITS,
    format_ns,
    ms_to_ns,
    ms_to_s,
    ns_to_ms,
    ns_to_s,
    ns_to_us,
    parse_duration_s,
    s_to_ms,
    s_to_ns,
    to_ns,
    us_to_ns,
)

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "loadgen"


def test_factors_agree_between_the_ns_and_the_seconds_tables():
    assert TIME_UNITS == ("ns", "us", "ms", "s")
    for unit in TIME_UNITS:
        assert SECONDS_PER[unit] * 1e9 == pytest.approx(NS_PER[unit])
    assert SECONDS_PER["m"] == 60.0 and SECONDS_PER["h"] == 3600.0


@pytest.mark.parametrize("value, unit, ns", [(3, "ns", 3), (2.5, "us", 2500), (5, "ms", 5_000_000),
                                             (0.25, "s", 250_000_000)])
def test_to_ns_scales_by_the_unit(value, unit, ns):
    assert to_ns(value, unit) == ns


def test_to_ns_names_the_known_units_for_an_unknown_one():
    with pytest.raises(ValueError, match="unknown unit 'min'.*ns, us, ms, s"):
        to_ns(1, "min")


def test_conversions_round_to_whole_ns_and_treat_none_and_zero_as_none():
    assert s_to_ns(1.5) == 1_500_000_000 and isinstance(s_to_ns(1.5), int)
    assert ms_to_ns(0.0000015) == 2  # 1.5 ns rounds to even
    assert us_to_ns(100) == 100_000
    for f in (s_to_ns, ms_to_ns, us_to_ns):
        assert f(None) == 0 and f(0) == 0
    assert ns_to_s(2_500_000_000) == 2.5


def test_conversions_between_other_units_scale_without_rounding():
    assert ns_to_ms(1_500_000) == 1.5 and ns_to_us(1_500) == 1.5
    assert s_to_ms(0.001) == 1.0 and ms_to_s(1500) == 1.5
    assert ns_to_ms(1) == 1e-6 and ms_to_s(1) == 0.001


@pytest.mark.parametrize("text, seconds", [("10s", 10.0), ("500ms", 0.5), ("2m", 120.0), ("1.5", 1.5),
                                           ("1h", 3600.0), (" 250 us ", 0.00025), ("1e3ns", 1e-6)])
def test_parse_duration_s_reads_a_number_with_an_optional_unit(text, seconds):
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten", "10 days", "-1s", "s"])
def test_parse_duration_s_rejects_what_is_not_a_duration(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration_s(text)


@pytest.mark.parametrize("ns, text", [(0, "0 ns"), (999, "999 ns"), (1000, "1.0 us"), (1_250_000, "1.250 ms"),
                                      (2_000_000_000, "2.000 s")])
def test_format_ns_picks_the_largest_unit_that_keeps_the_value_at_least_1(ns, text):
    assert format_ns(ns) == text


# ------------------------------------------------------------ time factors elsewhere

#: Numbers that change a time unit (1e3 is also the "k" of rates and mJ per J: only those
#: in a time-named expression count).
_FACTORS = {1e3, 1e6, 1e9, 1e-3, 1e-6, 1e-9}
#: An expression is about time when it names a value with a time unit (``latency_ns``,
#: ``duration_s``), a unit itself, or the clock.
_TIME_WORDS = re.compile(r"\b[a-z0-9_]*_(ns|us|ms|s)\b|\b(ns|us|ms)\b|monotonic|seconds|millis|micros|nanos")
#: Factors that stay, each with why: (file, text of its line).
_ALLOWED = {
    ("net/blocking_get.py", "sock.settimeout(max(deadline - time.monotonic(), 0.001))"):
        "a floor of 1 ms on a socket timeout in seconds: a duration, not a change of unit",
    ("net/openai_stream.py", '"output_tokens_per_s": NamedHistogram(self.tokens_per_s, "tokens/s", scale=1000.0,'):
        "tokens/s kept as milli-tokens/s in an integer histogram: a rate's scale",
    ("telemetry/gpu_fake.py", "def __init__(self, start_ns: int = 1_000_000_000) -> None:"):
        "the fake clock starts at 1 s: a value, not a change of unit",
}


def _context(node, parents, lines):
    """The text of the smallest statement or call around ``node`` that spans at most four
    lines (else its own line), comments left out."""
    around, n = [], node
    while n in parents and not isinstance(n, ast.stmt):
        n = parents[n]
        if isinstance(n, (ast.stmt, ast.Call)):
            around.append(n)
    for c in reversed(around):
        if c.end_lineno - c.lineno <= 3:
            return "\n".join(line.split("#")[0] for line in lines[c.lineno - 1:c.end_lineno])
    return lines[node.lineno - 1].split("#")[0]


def inline_time_factors(package: pathlib.Path):
    """(file, line number, text) of each time factor written in ``package`` outside
    units.py: a factor multiplying or dividing, given to a call or as a default, or in a
    table, where the expression is about time."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "units.py" or path.name.endswith("_pb2.py"):
            continue
        src = path.read_text(encoding="utf-8")
        lines = src.splitlines()
        tree = ast.parse(src)
        parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and type(node.value) in (int, float)
                    and float(node.value) in _FACTORS):
                continue
            parent = parents.get(node)
            uses = (isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Mult, ast.Div, ast.FloorDiv, ast.Mod))
                    or isinstance(parent, (ast.Call, ast.keyword, ast.arguments, ast.Dict)))
            if uses and _TIME_WORDS.search(_context(node, parents, lines)):
                code = lines[node.lineno - 1].split("  #")[0].strip()
                found.append((path.relative_to(package).as_posix(), node.lineno, code))
    return found


def test_time_factors_are_written_only_in_the_units_module():
    found = inline_time_factors(PACKAGE)
    unexplained = [f"{f}:{n}: {text}" for f, n, text in found if (f, text) not in _ALLOWED]
    assert not unexplained, ("convert times with loadgen.units (ns_to_ms, s_to_ns, NS_PER[...]) instead of "
                             "a factor:\n" + "\n".join(unexplained))
    assert {(f, text) for f, _, text in found} == set(_ALLOWED), "an allowed factor is gone: drop it from the list"


def test_the_scan_finds_a_factor_and_a_second_unit_table(tmp_path):
    (tmp_path / "a.py").write_text("def f(latency_ns):\n    return latency_ns / 1e6\n"
                                   "TABLE = {'ns': 1.0, 'us': 1e3}\nRATE_K = 2 * 1e3\n")
    assert sorted((n, text) for _, n, text in inline_time_factors(tmp_path)) == [
        (2, "return latency_ns / 1e6"), (3, "TABLE = {'ns': 1.0, 'us': 1e3}")]
