"""MLPerf's ``key = value`` configuration files (``mlperf.conf``, ``user.conf``).

:func:`from_config` is :meth:`TestSettings.FromConfig <loadgen.mlperf.settings.TestSettings.FromConfig>`'s
work: it reads a file (and, on the first user configuration of the process, the built-in
``mlperf.conf``) exactly as MLPerf does, return codes included. Configuration syntax, as
MLPerf parses it:

* each line is split at white space (space, tab, vertical tab, form feed, carriage
  return) into tokens; a line is ``KEY = VALUE`` with ``=`` as a token of its own;
* a token that is exactly ``#`` ends the line, unless a value is expected: then it is
  an invalid value (so ``a.b.c = 1 # note`` is an error, ``# note`` a comment);
* a key token followed by nothing, or by ``=`` and nothing, is ignored silently;
* a value must be a whole C integer (decimal, ``0x`` hexadecimal, ``0`` octal, with
  an optional sign) or a whole C floating-point number (decimal, hexadecimal, ``inf``,
  ``nan``); several values on one line each replace the previous one;
* keys are ``MODEL.SCENARIO.NAME``; a lookup tries ``model.scenario``, then
  ``*.scenario``, then ``model.*``, then ``*.*``, and the last line giving a key wins;
* one invalid line makes FromConfig return ``-EINVAL`` without applying anything from
  that file; a file that cannot be opened gives ``-ENOENT``.
"""

from __future__ import annotations

import errno
import os
import math
import re
import threading
from typing import Any

from ..units import NS_PER

from ..files import CONFIG_LIMIT_BYTES, FileTooLargeError, InputFileError, read_bytes
from ._builtin_conf import MLPERF_CONF
from .settings import TestMode, TestSettings

__all__ = ["BUILTIN_MLPERF_CONF", "from_config", "reset_config_state", "take_config_errors"]

#: The built-in ``mlperf.conf`` text (MLPerf LoadGen 6.0.17), read by ``FromConfig``.
BUILTIN_MLPERF_CONF: str = MLPERF_CONF

_U64_MASK = (1 << 64) - 1
_U64_MAX = _U64_MASK
_I32_MAX = (1 << 31) - 1
_NS_PER_MS = NS_PER["ms"]

# Process-wide state of FromConfig, as in MLPerf: the built-in configuration
# is loaded by the first conf_type=1 call only; later ones report an error instead.
_CONFIG_LOCK = threading.Lock()
_config_file_count = 0
_config_errors: list[str] = []


def _report_config_error(message: str) -> None:
    with _CONFIG_LOCK:
        _config_errors.append(message)


def take_config_errors() -> list[str]:
    """Returns, and forgets, the configuration errors reported since the last call.

    These are the problems MLPerf logs under ``error_invalid_config`` (file
    not found, invalid line, invalid ``mode`` value, a second user configuration);
    the runtime writes them to the detail log of the next test.

    Returns:
        The messages in the order they occurred.
    """
    with _CONFIG_LOCK:
        messages = list(_config_errors)
        _config_errors.clear()
    return messages


def reset_config_state() -> None:
    """Forgets earlier FromConfig calls (for tests): the next conf_type=1 call loads
    the built-in configuration again."""
    global _config_file_count
    with _CONFIG_LOCK:
        _config_file_count = 0
        _config_errors.clear()


def from_config(ts: TestSettings, path: Any, model: str, scenario: str, conf_kind: int) -> int:
    """Updates ``ts`` from a configuration file and/or the built-in one.

    Args:
        ts: the settings to update.
        path: the file (str or bytes, as given to ``open``); ignored when ``conf_kind`` is 0.
        model: the benchmark name matched against the first key component.
        scenario: the scenario name matched against the second one.
        conf_kind: as FromConfig's ``conf_type``: 1 a user configuration (the first
            in the process loads the built-in one first), 0 only the built-in one,
            anything else only the file.

    Returns:
        FromConfig's result: 0, ``-ENOENT`` or ``-EINVAL``.
    """
    global _config_file_count
    if conf_kind == 1:
        with _CONFIG_LOCK:
            first = _config_file_count == 0
            _config_file_count += 1
        if first:
            _apply_config_text(ts, BUILTIN_MLPERF_CONF, model, scenario, 0)
        else:
            _report_config_error(
                "more than one configuration file was loaded; an official "
                "submission must use a single user configuration"
            )
    if conf_kind == 0:
        text = BUILTIN_MLPERF_CONF
    else:
        try:
            read = _read_config_file(path)
        except FileTooLargeError as e:
            _report_config_error(e.problem)
            return -errno.EINVAL
        if read is None:
            _report_config_error(f"cannot open the configuration file {path}")
            return -errno.ENOENT
        text = read
    return _apply_config_text(ts, text, model, scenario, conf_kind)


def _apply_config_text(ts: TestSettings, text: str, model: str, scenario: str, conf_kind: int) -> int:
    """Parses ``text`` and applies it; returns FromConfig's result code."""
    values, problems = _parse_config(text)
    for problem in problems:
        _report_config_error(problem)
    if problems:
        return -errno.EINVAL
    config = _Applier(ts, values, model, scenario)
    mode_value = config.integer("mode")
    if mode_value is not None:
        if mode_value <= TestMode.FindPeakPerformance:
            config.store("mode", TestMode(mode_value))
        else:
            _report_config_error(f"the configuration's mode key has an invalid value ({mode_value})")
    if conf_kind == 0:
        _apply_builtin_only(config)
    _apply_tokens(config)
    _apply_latencies(config)
    _apply_issue(config)
    _apply_counts(config)
    return 0


class _Applier:
    """Looks keys up as MLPerf does and stores what it finds in the settings."""

    def __init__(self, ts: TestSettings, values: dict[str, str], model: str, scenario: str) -> None:
        self.ts, self.values, self.model, self.scenario = ts, values, model, scenario

    def find(self, key: str, in_scenario: str | None = None) -> str | None:
        wanted = self.scenario if in_scenario is None else in_scenario
        for candidate in (
            f"{self.model}.{wanted}.{key}",
            f"*.{wanted}.{key}",
            f"{self.model}.*.{key}",
            f"*.*.{key}",
        ):
            found = self.values.get(candidate)
            if found is not None:
                return found
        return None

    def store(self, name: str, value: Any) -> None:
        object.__setattr__(self.ts, name, value)

    def unsigned(self, name: str, key: str, in_scenario: str | None = None, scale: int = 1) -> None:
        found = self.find(key, in_scenario)
        if found is not None:
            self.store(name, (_c_strtoull(found) * scale) & _U64_MASK)

    def double(self, name: str, key: str, in_scenario: str | None = None, scale: float = 1.0) -> None:
        found = self.find(key, in_scenario)
        if found is not None:
            self.store(name, _c_strtod(found) * scale)

    def integer(self, key: str, in_scenario: str | None = None) -> int | None:
        found = self.find(key, in_scenario)
        return None if found is None else _c_strtoull(found)

    def flag(self, name: str, key: str, in_scenario: str | None = None, *, exactly_one: bool = False) -> None:
        """A 0/1 key: true when 1 (``exactly_one``) or when not 0."""
        value = self.integer(key, in_scenario)
        if value is not None:
            self.store(name, value == 1 if exactly_one else value != 0)


def _apply_builtin_only(c: _Applier) -> None:
    """Keys only the built-in mlperf.conf may set: seeds, TEST05, log probability."""
    c.unsigned("qsl_rng_seed", "qsl_rng_seed")
    c.unsigned("sample_index_rng_seed", "sample_index_rng_seed")
    c.unsigned("schedule_rng_seed", "schedule_rng_seed")
    c.double("accuracy_log_probability", "accuracy_log_probability", scale=0.01)
    c.flag("test05", "test05", exactly_one=True)
    c.unsigned("test05_qsl_rng_seed", "test05_qsl_rng_seed")
    c.unsigned("test05_sample_index_rng_seed", "test05_sample_index_rng_seed")
    c.unsigned("test05_schedule_rng_seed", "test05_schedule_rng_seed")


def _apply_tokens(c: _Applier) -> None:
    c.flag("use_token_latencies", "use_token_latencies", exactly_one=True)
    if c.ts.use_token_latencies:
        c.unsigned("ttft_latency", "ttft_latency", "Server", _NS_PER_MS)
        c.unsigned("tpot_latency", "tpot_latency", "Server", _NS_PER_MS)
    c.flag("infer_token_latencies", "infer_token_latencies", exactly_one=True)
    if c.ts.infer_token_latencies:
        c.unsigned("token_latency_scaling_factor", "token_latency_scaling_factor")


def _apply_latencies(c: _Applier) -> None:
    c.double("single_stream_target_latency_percentile", "target_latency_percentile", "SingleStream", 0.01)
    c.double("multi_stream_target_latency_percentile", "target_latency_percentile", "MultiStream", 0.01)
    c.unsigned("multi_stream_samples_per_query", "samples_per_query", "MultiStream")
    c.double("server_target_latency_percentile", "target_latency_percentile", "Server", 0.01)
    c.unsigned("server_target_latency_ns", "target_latency", "Server", _NS_PER_MS)


def _apply_issue(c: _Applier) -> None:
    c.flag("performance_issue_unique", "performance_issue_unique")
    c.flag("performance_issue_same", "performance_issue_same")
    c.unsigned("performance_issue_same_index", "performance_issue_same_index")
    c.flag("sample_concatenate_permutation", "sample_concatenate_permutation", exactly_one=True)
    c.flag("server_coalesce_queries", "coalesce_queries", "Server")
    value = c.integer("max_async_queries", "Server")
    if value is not None:
        # MLPerf narrows the value to a C int, then widens it back to
        # 64 bits unsigned: only the low 32 bits survive, sign-extended.
        low = value & 0xFFFFFFFF
        if low > _I32_MAX:
            low -= 1 << 32
        c.store("server_max_async_queries", low & _U64_MASK)


def _apply_counts(c: _Applier) -> None:
    c.unsigned("min_duration_ms", "min_duration")
    c.unsigned("max_duration_ms", "max_duration")
    c.unsigned("min_query_count", "min_query_count")
    c.unsigned("max_query_count", "max_query_count")
    c.unsigned("performance_sample_count_override", "performance_sample_count_override")
    c.unsigned("accuracy_sample_count_override", "accuracy_sample_count_override")
    c.double("single_stream_expected_latency_ns", "target_latency", "SingleStream", _NS_PER_MS)
    c.double("multi_stream_expected_latency_ns", "target_latency", "MultiStream", _NS_PER_MS)
    c.double("server_target_qps", "target_qps", "Server")
    c.double("offline_expected_qps", "target_qps", "Offline")
    c.flag("print_timestamps", "print_timestamps")
    c.unsigned("accuracy_log_rng_seed", "accuracy_log_rng_seed")
    c.unsigned("accuracy_log_sampling_target", "accuracy_log_sampling_target")


def _read_config_file(path: Any) -> str | None:
    """The file's bytes, one character per byte; None when it cannot be opened.

    A directory opens but reads as empty, as a C++ input file stream behaves. A file over
    :data:`loadgen.files.CONFIG_LIMIT_BYTES` raises :class:`loadgen.files.FileTooLargeError`.
    """
    if isinstance(path, (str, bytes)) and len(path) == 0:
        return None
    try:
        name = os.fsdecode(path)
    except TypeError:
        return None
    if os.path.isdir(name):
        return ""
    try:
        data = read_bytes(name, what="configuration file", limit_bytes=CONFIG_LIMIT_BYTES)
    except FileTooLargeError:
        raise
    except InputFileError:
        return None
    return data.decode("latin-1")


_C_SPACE = re.compile("[ \t\n\v\f\r]+")

# Whole tokens that strtoul (base 0) or strtod consume completely.
_STRTOUL_WHOLE = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|[1-9][0-9]*|0[0-7]*)")
_STRTOD_WHOLE = re.compile(
    r"[+-]?(?:"
    r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
    r"|0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?"
    r"|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?"
    r"|[nN][aA][nN](?:\([0-9A-Za-z_]*\))?"
    r")"
)
# The leading part of a token that strtoull (base 0) reads.
_STRTOULL_PREFIX = re.compile(r"([+-]?)(?:0[xX]([0-9a-fA-F]+)|(0[0-7]*)|([1-9][0-9]*))")


def _is_config_value(token: str) -> bool:
    return bool(_STRTOUL_WHOLE.fullmatch(token) or _STRTOD_WHOLE.fullmatch(token))


def _c_strtoull(text: str) -> int:
    """strtoull(text, nullptr, 0): the leading integer, wrapped or saturated."""
    match = _STRTOULL_PREFIX.match(text)
    if match is None:
        return 0
    sign, hex_digits, octal_digits, decimal_digits = match.groups()
    if hex_digits is not None:
        magnitude = int(hex_digits, 16)
    elif octal_digits is not None:
        magnitude = int(octal_digits, 8)
    else:
        magnitude = int(decimal_digits, 10)
    if magnitude > _U64_MAX:
        return _U64_MAX
    return (-magnitude) & _U64_MASK if sign == "-" else magnitude


def _c_strtod(text: str) -> float:
    """strtod of a token that :func:`_is_config_value` accepted (read whole)."""
    body = text.lstrip("+-")
    negative = text.startswith("-")
    lowered = body.lower()
    if lowered.startswith("inf"):
        value = math.inf
    elif lowered.startswith("nan"):
        value = math.nan
    elif lowered.startswith("0x"):
        try:
            value = float.fromhex(body)
        except OverflowError:
            value = math.inf
    else:
        value = float(body)
    return -value if negative else value


def _parse_config(text: str) -> tuple[dict[str, str], list[str]]:
    """Splits configuration text into ``{key: value token}`` and error messages."""
    values: dict[str, str] = {}
    problems: list[str] = []
    for line_number, line in enumerate(text.split("\n"), start=1):
        key = ""
        expecting = 0  # 0: key, 1: '=', 2: value(s)
        for token in _C_SPACE.split(line):
            if not token:
                continue
            if token == "#" and expecting != 2:
                break
            if expecting == 2:
                if _is_config_value(token):
                    values[key] = token
                    continue
                problems.append(
                    f"configuration line {line_number}: the value must be an integer "
                    "or a floating-point number"
                )
                break
            if expecting == 1 and token != "=":
                problems.append(
                    f"configuration line {line_number}: expected 'key = value'"
                )
                break
            if expecting == 0:
                key = token
            expecting += 1
    return values, problems

