"""Test settings that behave like those of MLPerf LoadGen's Python module.

This module provides the settings half of ``mlperf_loadgen`` (MLPerf LoadGen 6.0.17,
called "MLPerf" below):

* the enums :class:`TestScenario`, :class:`TestMode` and :class:`LoggingMode`, with
  MLPerf's member names and integer values;
* :class:`TestSettings`, :class:`LogOutputSettings` and :class:`LogSettings`, with
  MLPerf's attribute names, defaults and assignment rules (an assignment
  ``mlperf_loadgen`` refuses raises :class:`TypeError`, an unknown attribute raises
  :class:`AttributeError`);
* :meth:`TestSettings.FromConfig`, which reads ``key = value`` configuration files and
  the built-in ``mlperf.conf`` exactly as MLPerf does, return codes included;
* :func:`effective_settings`, the normalisation MLPerf applies before a run (query
  counts, target QPS, durations), computed with the same integer and floating-point
  conversions so that generated query counts agree;
* :func:`requested_log_items` and :func:`effective_log_items`, the ``requested_*`` and
  ``effective_*`` entries of the detail log.

Configuration syntax, as MLPerf parses it:

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
* one invalid line makes :meth:`TestSettings.FromConfig` return ``-EINVAL`` without
  applying anything from that file; a file that cannot be opened gives ``-ENOENT``.
"""

from __future__ import annotations

import enum
import errno
import math
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ._builtin_conf import MLPERF_CONF

__all__ = [
    "BUILTIN_MLPERF_CONF",
    "LOG_OUTPUT_SETTINGS_FIELDS",
    "LOG_SETTINGS_FIELDS",
    "TEST_SETTINGS_FIELDS",
    "EffectiveSettings",
    "LogOutputSettings",
    "LogSettings",
    "LoggingMode",
    "TestMode",
    "TestScenario",
    "TestSettings",
    "all_log_items",
    "apply_test05",
    "effective_log_items",
    "effective_settings",
    "requested_log_items",
    "take_config_errors",
]

#: The built-in ``mlperf.conf`` text (MLPerf LoadGen 6.0.17), read by ``FromConfig``.
BUILTIN_MLPERF_CONF: str = MLPERF_CONF

_U64_MASK = (1 << 64) - 1
_U64_MAX = _U64_MASK
_I32_MIN = -(1 << 31)
_I32_MAX = (1 << 31) - 1
_NS_PER_MS = 1_000_000
_NS_PER_S = 1_000_000_000


# --------------------------------------------------------------------------- enums


class _PybindLikeEnum(enum.IntEnum):
    """An IntEnum whose ``str`` reads ``Type.Member``, as pybind11 enums print."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, format_spec: str) -> str:
        if not format_spec:
            return str(self)
        return int.__format__(int(self), format_spec)


class TestScenario(_PybindLikeEnum):
    """How queries are issued: singly, in groups, Poisson arrivals, or all at once."""

    SingleStream = 0
    MultiStream = 1
    Server = 2
    Offline = 3


class TestMode(_PybindLikeEnum):
    """What a run measures: accuracy, performance, both, or the Server peak QPS."""

    SubmissionRun = 0
    AccuracyOnly = 1
    PerformanceOnly = 2
    FindPeakPerformance = 3


class LoggingMode(_PybindLikeEnum):
    """When log entries are written out (only ``AsyncPoll`` has an effect)."""

    AsyncPoll = 0
    EndOfTestOnly = 1
    Synchronous = 2


# Keep pytest from collecting the Test* enums when a test module imports them.
TestScenario.__test__ = False  # type: ignore[attr-defined]
TestMode.__test__ = False  # type: ignore[attr-defined]


# ------------------------------------------------------------- assignment rules
#
# Each coercer returns the stored value, or raises TypeError naming the field. The
# rules follow pybind11's argument conversion for the C++ member type:
#   double:   float, or any object with __float__ or __index__ (not str, not None);
#   integers: int or any object with __int__ or __index__, but never a float (nor a
#             float subclass), and only within the C++ type's range;
#   bool:     True/False, None (False), or an object whose type defines __bool__
#             (int, float, numpy scalars, ...), but not an enum member;
#   enum:     only a member of that very enum;
#   string:   str, or bytes holding UTF-8.


def _describe(value: object) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _integer_or_none(value: object) -> int | None:
    """The integer pybind11 would read from ``value``, or None if it refuses it."""
    if isinstance(value, float):
        return None
    if isinstance(value, int):
        return int(value)
    value_type = type(value)
    if hasattr(value_type, "__int__") or hasattr(value_type, "__index__"):
        try:
            result = int(value)  # type: ignore[call-overload]
        except Exception:  # noqa: BLE001 - any failure is a refusal
            return None
        return result if isinstance(result, int) else None
    return None


def _float_or_none(value: object) -> float | None:
    """The double pybind11 would read from ``value``, or None if it refuses it."""
    if isinstance(value, float):
        return float(value)
    value_type = type(value)
    if hasattr(value_type, "__float__") or hasattr(value_type, "__index__"):
        try:
            return float(value)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - any failure is a refusal
            return None
    return None


def _bool_or_none(value: object) -> bool | None:
    """The bool pybind11 would read from ``value``, or None if it refuses it."""
    if value is True or value is False:
        return value  # type: ignore[return-value]
    if value is None:
        return False
    if isinstance(value, enum.Enum):
        return None
    if getattr(type(value), "__bool__", None) is None:
        return None
    try:
        return bool(value)
    except Exception:  # noqa: BLE001 - any failure is a refusal
        return None


_Coercer = Callable[[str, str, Any], Any]


def _unsigned64(owner: str, name: str, value: Any) -> int:
    result = _integer_or_none(value)
    if result is None or not 0 <= result <= _U64_MAX:
        raise TypeError(
            f"{owner}.{name} must be an integer in [0, 2**64 - 1], "
            f"got {_describe(value)}"
        )
    return result


def _signed32(owner: str, name: str, value: Any) -> int:
    result = _integer_or_none(value)
    if result is None or not _I32_MIN <= result <= _I32_MAX:
        raise TypeError(
            f"{owner}.{name} must be an integer in [-2**31, 2**31 - 1], "
            f"got {_describe(value)}"
        )
    return result


def _double(owner: str, name: str, value: Any) -> float:
    result = _float_or_none(value)
    if result is None:
        raise TypeError(f"{owner}.{name} must be a number, got {_describe(value)}")
    return result


def _boolean(owner: str, name: str, value: Any) -> bool:
    result = _bool_or_none(value)
    if result is None:
        raise TypeError(f"{owner}.{name} must be a bool, got {_describe(value)}")
    return result


def _string(owner: str, name: str, value: Any) -> str:
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    raise TypeError(f"{owner}.{name} must be a str, got {_describe(value)}")


def _member_of(enum_type: type) -> _Coercer:
    def coerce(owner: str, name: str, value: Any) -> Any:
        if isinstance(value, enum_type):
            return value
        raise TypeError(
            f"{owner}.{name} must be a {enum_type.__name__} member, "
            f"got {_describe(value)}"
        )

    return coerce


def _instance_copy_of(struct_type: type) -> _Coercer:
    def coerce(owner: str, name: str, value: Any) -> Any:
        if isinstance(value, struct_type):
            return value.copy()
        raise TypeError(
            f"{owner}.{name} must be a {struct_type.__name__}, got {_describe(value)}"
        )

    return coerce


# ------------------------------------------------------------ settings structs


class _SettingsStruct:
    """A C++-struct-like record: fixed fields, typed assignment, value equality.

    Subclasses set ``__slots__`` to their field names and ``_SPEC`` to
    ``(name, coercer, default)`` triples in declaration order, where a callable
    default is a factory.
    """

    __slots__ = ()
    _SPEC: ClassVar[tuple[tuple[str, _Coercer, Any], ...]] = ()
    _COERCERS: ClassVar[dict[str, _Coercer]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._COERCERS = {name: coercer for name, coercer, _ in cls._SPEC}

    def __init__(self, **fields: Any) -> None:
        for name, _, default in self._SPEC:
            object.__setattr__(self, name, default() if callable(default) else default)
        for name, value in fields.items():
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        coercer = self._COERCERS.get(name)
        if coercer is None:
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute '{name}'"
            )
        object.__setattr__(self, name, coercer(type(self).__name__, name, value))

    def __delattr__(self, name: str) -> None:
        raise AttributeError(
            f"attribute '{name}' of '{type(self).__name__}' objects cannot be deleted"
        )

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name, _, _ in self._SPEC)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = []
        for name, _, _ in self._SPEC:
            value = getattr(self, name)
            shown = str(value) if isinstance(value, enum.Enum) else repr(value)
            parts.append(f"{name}={shown}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def copy(self):
        """Returns an independent copy (nested settings are copied too)."""
        duplicate = type(self).__new__(type(self))
        for name, _, _ in self._SPEC:
            value = getattr(self, name)
            if isinstance(value, _SettingsStruct):
                value = value.copy()
            object.__setattr__(duplicate, name, value)
        return duplicate

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]):
        duplicate = self.copy()
        memo[id(self)] = duplicate
        return duplicate

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields as a dict in declaration order (nested ones as dicts)."""
        result: dict[str, Any] = {}
        for name, _, _ in self._SPEC:
            value = getattr(self, name)
            if isinstance(value, _SettingsStruct):
                value = value.to_dict()
            result[name] = value
        return result


class LogOutputSettings(_SettingsStruct):
    """Where the logs go: ``<outdir>/<datetime><prefix>summary<suffix>.txt`` etc.

    Attributes:
        outdir: directory of the log files.
        prefix: start of each log file name.
        suffix: end of each log file name, before the extension.
        prefix_with_datetime: put the test's date and time before ``prefix``.
        copy_detail_to_stdout: also print the detail log to standard output.
        copy_summary_to_stdout: also print the summary to standard output.
    """

    _SPEC = (
        ("outdir", _string, "."),
        ("prefix", _string, "mlperf_log_"),
        ("suffix", _string, ""),
        ("prefix_with_datetime", _boolean, False),
        ("copy_detail_to_stdout", _boolean, False),
        ("copy_summary_to_stdout", _boolean, False),
    )
    __slots__ = tuple(name for name, _, _ in _SPEC)

    outdir: str
    prefix: str
    suffix: str
    prefix_with_datetime: bool
    copy_detail_to_stdout: bool
    copy_summary_to_stdout: bool


class LogSettings(_SettingsStruct):
    """Top-level log settings.

    Attributes:
        log_output: where the logs go. Assigning stores a copy; reading returns the
            stored object, so ``log_settings.log_output.outdir = ...`` works.
        log_mode: when entries are written out.
        log_mode_async_poll_interval_ms: polling period of the log writer, ms.
        enable_trace: also write the trace log. Off by default here (MLPerf's default
            is on); the trace file is not supported, so StartTest raises
            NotImplementedError when this is set.
    """

    _SPEC = (
        ("log_output", _instance_copy_of(LogOutputSettings), LogOutputSettings),
        ("log_mode", _member_of(LoggingMode), LoggingMode.AsyncPoll),
        ("log_mode_async_poll_interval_ms", _unsigned64, 1000),
        ("enable_trace", _boolean, False),
    )
    __slots__ = tuple(name for name, _, _ in _SPEC)

    log_output: LogOutputSettings
    log_mode: LoggingMode
    log_mode_async_poll_interval_ms: int
    enable_trace: bool


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


def _reset_config_state() -> None:
    """Forgets earlier FromConfig calls (for tests): the next conf_type=1 call loads
    the built-in configuration again."""
    global _config_file_count
    with _CONFIG_LOCK:
        _config_file_count = 0
        _config_errors.clear()


class TestSettings(_SettingsStruct):
    """The modes and parameters of a test, as ``mlperf_loadgen.TestSettings``.

    All attributes have MLPerf's names, defaults and types. Durations without a
    unit suffix in their name follow MLPerf: ``ttft_latency`` and
    ``tpot_latency`` are nanoseconds.

    Attributes:
        scenario: the traffic pattern.
        mode: what the run measures.
        single_stream_expected_latency_ns: SingleStream latency hint, ns.
        single_stream_target_latency_percentile: reported percentile (fraction).
        multi_stream_expected_latency_ns: MultiStream query latency hint, ns.
        multi_stream_target_latency_percentile: reported percentile (fraction).
        multi_stream_samples_per_query: samples in each MultiStream query.
        server_target_qps: mean arrival rate of the Server scenario, queries/s.
        server_target_latency_ns: Server latency bound, ns.
        server_target_latency_percentile: percentile held to the bound (fraction).
        server_coalesce_queries: issue overdue Server queries in one call.
        server_find_peak_qps_decimals_of_precision: FindPeakPerformance precision.
        server_find_peak_qps_boundary_step_size: FindPeakPerformance widening step.
        server_max_async_queries: most outstanding Server queries, 0 for unlimited.
        server_num_issue_query_threads: issue threads registered by the SUT.
        offline_expected_qps: Offline throughput hint, samples/s.
        sample_concatenate_permutation: equal-issue sampling (whole permutations).
        min_duration_ms: minimum test duration, ms.
        max_duration_ms: maximum test duration, ms, 0 for unlimited.
        min_query_count: minimum number of queries.
        max_query_count: maximum number of queries, 0 for unlimited.
        qsl_rng_seed: seed of the loaded sample set choice.
        sample_index_rng_seed: seed of the sample order.
        schedule_rng_seed: seed of the Server arrival times.
        accuracy_log_rng_seed: seed of the accuracy log sampling in performance runs.
        accuracy_log_probability: probability of logging a response's data.
        accuracy_log_sampling_target: target number of logged responses.
        test05: run compliance TEST05 (use the test05 seeds).
        test05_qsl_rng_seed: TEST05 replacement of ``qsl_rng_seed``.
        test05_sample_index_rng_seed: TEST05 replacement of ``sample_index_rng_seed``.
        test05_schedule_rng_seed: TEST05 replacement of ``schedule_rng_seed``.
        print_timestamps: print the measurement interval's start and end.
        performance_issue_unique: issue every loaded sample at most once.
        performance_issue_same: issue the same sample over and over.
        performance_issue_same_index: which loaded sample ``performance_issue_same``
            repeats.
        performance_sample_count_override: replaces the QSL's performance sample
            count when non-zero.
        accuracy_sample_count_override: replaces the QSL's total sample count in
            accuracy mode when non-zero.
        use_token_latencies: measure first-token and per-token latencies.
        ttft_latency: time-to-first-token bound, ns.
        tpot_latency: time-per-output-token bound, ns.
        infer_token_latencies: derive token latencies from sample latencies.
        token_latency_scaling_factor: tokens per sample used for that derivation.
    """

    _SPEC = (
        ("scenario", _member_of(TestScenario), TestScenario.SingleStream),
        ("mode", _member_of(TestMode), TestMode.PerformanceOnly),
        ("single_stream_expected_latency_ns", _double, 1000000.0),
        ("single_stream_target_latency_percentile", _double, 0.90),
        ("multi_stream_expected_latency_ns", _double, 8000000.0),
        ("multi_stream_target_latency_percentile", _double, 0.99),
        ("multi_stream_samples_per_query", _unsigned64, 8),
        ("server_target_qps", _double, 1.0),
        ("server_target_latency_ns", _unsigned64, 100000000),
        ("server_target_latency_percentile", _double, 0.99),
        ("server_coalesce_queries", _boolean, False),
        ("server_find_peak_qps_decimals_of_precision", _signed32, 1),
        ("server_find_peak_qps_boundary_step_size", _double, 1.0),
        ("server_max_async_queries", _unsigned64, 0),
        ("server_num_issue_query_threads", _unsigned64, 0),
        ("offline_expected_qps", _double, 1.0),
        ("sample_concatenate_permutation", _boolean, False),
        ("min_duration_ms", _unsigned64, 10000),
        ("max_duration_ms", _unsigned64, 0),
        ("min_query_count", _unsigned64, 100),
        ("max_query_count", _unsigned64, 0),
        ("qsl_rng_seed", _unsigned64, 0),
        ("sample_index_rng_seed", _unsigned64, 0),
        ("schedule_rng_seed", _unsigned64, 0),
        ("accuracy_log_rng_seed", _unsigned64, 0),
        ("accuracy_log_probability", _double, 0.0),
        ("accuracy_log_sampling_target", _unsigned64, 0),
        ("test05", _boolean, False),
        ("test05_qsl_rng_seed", _unsigned64, 0),
        ("test05_sample_index_rng_seed", _unsigned64, 0),
        ("test05_schedule_rng_seed", _unsigned64, 0),
        ("print_timestamps", _boolean, False),
        ("performance_issue_unique", _boolean, False),
        ("performance_issue_same", _boolean, False),
        ("performance_issue_same_index", _unsigned64, 0),
        ("performance_sample_count_override", _unsigned64, 0),
        ("accuracy_sample_count_override", _unsigned64, 0),
        ("use_token_latencies", _boolean, False),
        ("ttft_latency", _unsigned64, 100000000),
        ("tpot_latency", _unsigned64, 100000000),
        ("infer_token_latencies", _boolean, False),
        ("token_latency_scaling_factor", _unsigned64, 0),
    )
    __slots__ = tuple(name for name, _, _ in _SPEC)

    scenario: TestScenario
    mode: TestMode
    single_stream_expected_latency_ns: float
    single_stream_target_latency_percentile: float
    multi_stream_expected_latency_ns: float
    multi_stream_target_latency_percentile: float
    multi_stream_samples_per_query: int
    server_target_qps: float
    server_target_latency_ns: int
    server_target_latency_percentile: float
    server_coalesce_queries: bool
    server_find_peak_qps_decimals_of_precision: int
    server_find_peak_qps_boundary_step_size: float
    server_max_async_queries: int
    server_num_issue_query_threads: int
    offline_expected_qps: float
    sample_concatenate_permutation: bool
    min_duration_ms: int
    max_duration_ms: int
    min_query_count: int
    max_query_count: int
    qsl_rng_seed: int
    sample_index_rng_seed: int
    schedule_rng_seed: int
    accuracy_log_rng_seed: int
    accuracy_log_probability: float
    accuracy_log_sampling_target: int
    test05: bool
    test05_qsl_rng_seed: int
    test05_sample_index_rng_seed: int
    test05_schedule_rng_seed: int
    print_timestamps: bool
    performance_issue_unique: bool
    performance_issue_same: bool
    performance_issue_same_index: int
    performance_sample_count_override: int
    accuracy_sample_count_override: int
    use_token_latencies: bool
    ttft_latency: int
    tpot_latency: int
    infer_token_latencies: bool
    token_latency_scaling_factor: int

    __test__ = False  # not a pytest test class

    def FromConfig(
        self,
        path: Any,
        model: Any,
        scenario: Any,
        conf_type: Any = 1,
    ) -> int:
        """Updates the settings from a configuration file and/or the built-in one.

        Args:
            path: the configuration file (str, bytes or path-like); ignored when
                ``conf_type`` is 0.
            model: the benchmark name matched against the first key component.
            scenario: the scenario name (``"SingleStream"``, ``"MultiStream"``,
                ``"Server"`` or ``"Offline"``) matched against the second one.
            conf_type: 1 (default): a user configuration; the first such call in
                the process loads the built-in ``mlperf.conf`` first, later ones
                report a configuration error instead. 0: only the built-in
                configuration; it alone may set the RNG seeds, the TEST05 keys and
                ``accuracy_log_probability``. Any other value: only the file, as
                for an ``audit.config``.

        Returns:
            0 on success; ``-ENOENT`` if the file cannot be opened (the built-in
            configuration, when due, is applied all the same); ``-EINVAL`` if a line
            is invalid (nothing from the file is applied). Problems are also
            reported through :func:`take_config_errors`.

        Raises:
            TypeError: an argument has a type ``mlperf_loadgen`` refuses.
        """
        global _config_file_count
        path_text = _path_argument(path)
        model_key = _key_argument("model", model)
        scenario_key = _key_argument("scenario", scenario)
        conf_kind = _signed32("TestSettings.FromConfig", "conf_type", conf_type)

        if conf_kind == 1:
            with _CONFIG_LOCK:
                first = _config_file_count == 0
                _config_file_count += 1
            if first:
                self._apply_config_text(BUILTIN_MLPERF_CONF, model_key, scenario_key, 0)
            else:
                _report_config_error(
                    "more than one configuration file was loaded; an official "
                    "submission must use a single user configuration"
                )

        if conf_kind == 0:
            text = BUILTIN_MLPERF_CONF
        else:
            text = _read_config_file(path_text)
            if text is None:
                _report_config_error(f"cannot open the configuration file {path_text}")
                return -errno.ENOENT
        return self._apply_config_text(text, model_key, scenario_key, conf_kind)

    def _apply_config_text(
        self, text: str, model: str, scenario: str, conf_kind: int
    ) -> int:
        """Parses ``text`` and applies it; returns FromConfig's result code."""
        values, problems = _parse_config(text)
        for problem in problems:
            _report_config_error(problem)
        if problems:
            return -errno.EINVAL

        def find(key: str, in_scenario: str | None = None) -> str | None:
            wanted = scenario if in_scenario is None else in_scenario
            for candidate in (
                f"{model}.{wanted}.{key}",
                f"*.{wanted}.{key}",
                f"{model}.*.{key}",
                f"*.*.{key}",
            ):
                found = values.get(candidate)
                if found is not None:
                    return found
            return None

        def store(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        def set_unsigned(
            name: str, key: str, in_scenario: str | None = None, scale: int = 1
        ) -> None:
            found = find(key, in_scenario)
            if found is not None:
                store(name, (_c_strtoull(found) * scale) & _U64_MASK)

        def set_double(
            name: str, key: str, in_scenario: str | None = None, scale: float = 1.0
        ) -> None:
            found = find(key, in_scenario)
            if found is not None:
                store(name, _c_strtod(found) * scale)

        def integer(key: str, in_scenario: str | None = None) -> int | None:
            found = find(key, in_scenario)
            return None if found is None else _c_strtoull(found)

        mode_value = integer("mode")
        if mode_value is not None:
            if mode_value <= TestMode.FindPeakPerformance:
                store("mode", TestMode(mode_value))
            else:
                _report_config_error(
                    f"the configuration's mode key has an invalid value ({mode_value})"
                )

        if conf_kind == 0:
            set_unsigned("qsl_rng_seed", "qsl_rng_seed")
            set_unsigned("sample_index_rng_seed", "sample_index_rng_seed")
            set_unsigned("schedule_rng_seed", "schedule_rng_seed")
            set_double(
                "accuracy_log_probability", "accuracy_log_probability", scale=0.01
            )
            flag = integer("test05")
            if flag is not None:
                store("test05", flag == 1)
            set_unsigned("test05_qsl_rng_seed", "test05_qsl_rng_seed")
            set_unsigned("test05_sample_index_rng_seed", "test05_sample_index_rng_seed")
            set_unsigned("test05_schedule_rng_seed", "test05_schedule_rng_seed")

        flag = integer("use_token_latencies")
        if flag is not None:
            store("use_token_latencies", flag == 1)
        if self.use_token_latencies:
            set_unsigned("ttft_latency", "ttft_latency", "Server", _NS_PER_MS)
            set_unsigned("tpot_latency", "tpot_latency", "Server", _NS_PER_MS)

        flag = integer("infer_token_latencies")
        if flag is not None:
            store("infer_token_latencies", flag == 1)
        if self.infer_token_latencies:
            set_unsigned("token_latency_scaling_factor", "token_latency_scaling_factor")

        set_double(
            "single_stream_target_latency_percentile",
            "target_latency_percentile",
            "SingleStream",
            0.01,
        )
        set_double(
            "multi_stream_target_latency_percentile",
            "target_latency_percentile",
            "MultiStream",
            0.01,
        )
        set_unsigned(
            "multi_stream_samples_per_query", "samples_per_query", "MultiStream"
        )
        set_double(
            "server_target_latency_percentile",
            "target_latency_percentile",
            "Server",
            0.01,
        )
        set_unsigned("server_target_latency_ns", "target_latency", "Server", _NS_PER_MS)

        flag = integer("performance_issue_unique")
        if flag is not None:
            store("performance_issue_unique", flag != 0)
        flag = integer("performance_issue_same")
        if flag is not None:
            store("performance_issue_same", flag != 0)
        set_unsigned("performance_issue_same_index", "performance_issue_same_index")

        flag = integer("sample_concatenate_permutation")
        if flag is not None:
            store("sample_concatenate_permutation", flag == 1)
        flag = integer("coalesce_queries", "Server")
        if flag is not None:
            store("server_coalesce_queries", flag != 0)
        flag = integer("max_async_queries", "Server")
        if flag is not None:
            # MLPerf narrows the value to a C int, then widens it back to
            # 64 bits unsigned: only the low 32 bits survive, sign-extended.
            low = flag & 0xFFFFFFFF
            if low > _I32_MAX:
                low -= 1 << 32
            store("server_max_async_queries", low & _U64_MASK)

        set_unsigned("min_duration_ms", "min_duration")
        set_unsigned("max_duration_ms", "max_duration")
        set_unsigned("min_query_count", "min_query_count")
        set_unsigned("max_query_count", "max_query_count")
        set_unsigned(
            "performance_sample_count_override", "performance_sample_count_override"
        )
        set_unsigned("accuracy_sample_count_override", "accuracy_sample_count_override")
        set_double(
            "single_stream_expected_latency_ns", "target_latency", "SingleStream", 1e6
        )
        set_double(
            "multi_stream_expected_latency_ns", "target_latency", "MultiStream", 1e6
        )
        set_double("server_target_qps", "target_qps", "Server")
        set_double("offline_expected_qps", "target_qps", "Offline")

        flag = integer("print_timestamps")
        if flag is not None:
            store("print_timestamps", flag != 0)

        set_unsigned("accuracy_log_rng_seed", "accuracy_log_rng_seed")
        set_unsigned("accuracy_log_sampling_target", "accuracy_log_sampling_target")
        return 0


#: Attribute names of :class:`TestSettings`, in declaration order.
TEST_SETTINGS_FIELDS: tuple[str, ...] = TestSettings.__slots__
#: Attribute names of :class:`LogOutputSettings`, in declaration order.
LOG_OUTPUT_SETTINGS_FIELDS: tuple[str, ...] = LogOutputSettings.__slots__
#: Attribute names of :class:`LogSettings`, in declaration order.
LOG_SETTINGS_FIELDS: tuple[str, ...] = LogSettings.__slots__


# ------------------------------------------------------------ config parsing


def _path_argument(path: Any) -> Any:
    """FromConfig's ``path`` as given to ``open`` (cut at a NUL, like a C string)."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if isinstance(path, str):
        return path.split("\0", 1)[0]
    if isinstance(path, bytes):
        return path.split(b"\0", 1)[0]
    raise TypeError(
        f"TestSettings.FromConfig: path must be a str, got {_describe(path)}"
    )


def _key_argument(name: str, value: Any) -> str:
    """A model or scenario name in the byte-per-character form the parser uses."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, str):
        try:
            return value.encode("utf-8").decode("latin-1")
        except UnicodeEncodeError:
            pass
    raise TypeError(
        f"TestSettings.FromConfig: {name} must be a str, got {_describe(value)}"
    )


def _read_config_file(path: Any) -> str | None:
    """The file's bytes, one character per byte; None when it cannot be opened.

    A directory opens but reads as empty, as a C++ input file stream behaves.
    """
    if isinstance(path, (str, bytes)) and len(path) == 0:
        return None
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except IsADirectoryError:
        return ""
    except (OSError, ValueError):
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


# --------------------------------------------------------- effective settings


def _as_int64(value: int) -> int:
    """A 64-bit unsigned value read as two's-complement signed."""
    value &= _U64_MASK
    return value - (1 << 64) if value >> 63 else value


def _double_to_uint64(value: float) -> int:
    """Converts double to uint64_t as MLPerf's x86-64 build does.

    Values in [0, 2**64) truncate toward zero; negative values that fit int64 wrap
    modulo 2**64; NaN and other out-of-range values give 2**63, or 0 from 2**64 up.
    """

    def truncate_to_int64_bits(x: float) -> int:
        if math.isnan(x) or not (-9223372036854775808.0 <= x < 9223372036854775808.0):
            return 1 << 63
        return int(x) & _U64_MASK

    two_to_63 = 9223372036854775808.0
    if value >= two_to_63:
        return truncate_to_int64_bits(value - two_to_63) ^ (1 << 63)
    return truncate_to_int64_bits(value)


def _divide(numerator: float, denominator: float) -> float:
    """IEEE division (a zero denominator gives an infinity or NaN, not an error)."""
    if denominator == 0.0:
        if numerator == 0.0 or math.isnan(numerator):
            return math.nan
        return math.copysign(math.inf, numerator) * math.copysign(1.0, denominator)
    return numerator / denominator


@dataclass(frozen=True)
class EffectiveSettings:
    """The settings a run uses, derived from the requested ones (MLPerf's
    ``TestSettingsInternal``).

    Field names are MLPerf's member names; its ``std::chrono`` durations are
    integer nanoseconds here, with ``_ns`` appended (they hold whole milliseconds,
    except ``target_latency_ns``).

    Attributes:
        requested: a copy of the requested settings.
        scenario: the requested scenario.
        mode: the requested mode.
        samples_per_query: samples in each query (Offline: in its single query).
        target_qps: the rate the schedule is generated for, queries/s.
        target_latency_ns: the Server latency bound, ns (0 elsewhere).
        target_latency_percentile: the reported latency percentile (fraction).
        max_async_queries: most outstanding queries, 0 for unlimited.
        target_duration_ns: the duration queries are generated for (0 for Offline).
        min_duration_ns: minimum test duration.
        max_duration_ns: maximum test duration, 0 for unlimited.
        min_query_count: minimum number of queries.
        max_query_count: maximum number of queries, 0 for unlimited.
        min_sample_count: ``min_query_count * samples_per_query`` (modulo 2**64).
        qsl_rng_seed: as requested.
        sample_index_rng_seed: as requested.
        schedule_rng_seed: as requested.
        accuracy_log_rng_seed: as requested.
        accuracy_log_probability: as requested.
        accuracy_log_sampling_target: as requested.
        print_timestamps: as requested.
        performance_issue_unique: as requested.
        performance_issue_same: as requested.
        performance_issue_same_index: as requested.
        performance_sample_count: the override, or the QSL's performance count.
        accuracy_sample_count: the override, or the QSL's total count.
        sample_concatenate_permutation: as requested.
        use_token_latencies: as requested.
        server_ttft_latency: the first-token bound, ns (signed 64-bit).
        server_tpot_latency: the per-token bound, ns (signed 64-bit).
        infer_token_latencies: as requested.
        token_latency_scaling_factor: as requested (signed 64-bit).
        setting_errors: problems MLPerf logs as
            ``error_invalid_test_settings``, in the order it logs them.
    """

    requested: TestSettings = field(hash=False)
    scenario: TestScenario
    mode: TestMode
    samples_per_query: int
    target_qps: float
    target_latency_ns: int
    target_latency_percentile: float
    max_async_queries: int
    target_duration_ns: int
    min_duration_ns: int
    max_duration_ns: int
    min_query_count: int
    max_query_count: int
    min_sample_count: int
    qsl_rng_seed: int
    sample_index_rng_seed: int
    schedule_rng_seed: int
    accuracy_log_rng_seed: int
    accuracy_log_probability: float
    accuracy_log_sampling_target: int
    print_timestamps: bool
    performance_issue_unique: bool
    performance_issue_same: bool
    performance_issue_same_index: int
    performance_sample_count: int
    accuracy_sample_count: int
    sample_concatenate_permutation: bool
    use_token_latencies: bool
    server_ttft_latency: int
    server_tpot_latency: int
    infer_token_latencies: bool
    token_latency_scaling_factor: int
    setting_errors: tuple[str, ...] = ()

    @property
    def target_duration_ms(self) -> int:
        """``target_duration_ns`` in whole milliseconds."""
        return self.target_duration_ns // _NS_PER_MS

    @property
    def min_duration_ms(self) -> int:
        """``min_duration_ns`` in whole milliseconds."""
        return self.min_duration_ns // _NS_PER_MS

    @property
    def max_duration_ms(self) -> int:
        """``max_duration_ns`` in whole milliseconds."""
        return self.max_duration_ns // _NS_PER_MS


def effective_settings(
    requested: TestSettings,
    qsl_performance_sample_count: int,
    qsl_total_sample_count: int,
) -> EffectiveSettings:
    """Derives the settings a run uses, as MLPerf LoadGen does before a test.

    Args:
        requested: the settings given to the test (after any audit.config and
            TEST05 adjustments, see :func:`apply_test05`).
        qsl_performance_sample_count: the QSL's ``PerformanceSampleCount()``.
        qsl_total_sample_count: the QSL's ``TotalSampleCount()``.

    Returns:
        The effective settings; invalid requests are reported in
        ``setting_errors`` and replaced as MLPerf replaces them.

    Raises:
        TypeError: ``requested`` is not a :class:`TestSettings` or a count is not
            an unsigned 64-bit integer.
        ValueError: SingleStream with ``sample_concatenate_permutation`` and a QSL
            performance sample count of 0 (MLPerf divides by it).
    """
    if not isinstance(requested, TestSettings):
        raise TypeError(
            f"effective_settings: requested must be a TestSettings, "
            f"got {_describe(requested)}"
        )
    qsl_performance = _unsigned64(
        "effective_settings",
        "qsl_performance_sample_count",
        qsl_performance_sample_count,
    )
    qsl_total = _unsigned64(
        "effective_settings", "qsl_total_sample_count", qsl_total_sample_count
    )
    r = requested.copy()
    errors: list[str] = []

    samples_per_query = 1
    target_qps = 1.0
    target_latency_ns = 0
    target_latency_percentile = 0.0
    max_async_queries = 0
    # MLPerf keeps these as signed 64-bit millisecond counts.
    target_duration_ms = _as_int64(r.min_duration_ms)
    min_duration_ms = _as_int64(r.min_duration_ms)
    max_duration_ms = _as_int64(r.max_duration_ms)
    min_query_count = r.min_query_count

    scenario = r.scenario
    if scenario is TestScenario.SingleStream:
        target_qps = _divide(float(_NS_PER_S), r.single_stream_expected_latency_ns)
        max_async_queries = 1
        target_latency_percentile = r.single_stream_target_latency_percentile
    elif scenario is TestScenario.MultiStream:
        target_qps = _divide(float(_NS_PER_S), r.multi_stream_expected_latency_ns)
        max_async_queries = 1
        target_latency_percentile = r.multi_stream_target_latency_percentile
    elif scenario is TestScenario.Server:
        if r.server_target_qps >= 0.0:
            target_qps = r.server_target_qps
        else:
            errors.append(
                f"server_target_qps must not be negative (requested "
                f"{r.server_target_qps!r}, using {target_qps!r} instead)"
            )
        target_latency_ns = _as_int64(r.server_target_latency_ns)
        target_latency_percentile = r.server_target_latency_percentile
        max_async_queries = r.server_max_async_queries
    else:  # Offline
        target_latency_percentile = 0.99
        if r.offline_expected_qps >= 0.0:
            target_qps = r.offline_expected_qps
        else:
            errors.append(
                f"offline_expected_qps must not be negative (requested "
                f"{r.offline_expected_qps!r}, using {target_qps!r} instead)"
            )
        max_async_queries = 1

    performance_sample_count = r.performance_sample_count_override or qsl_performance
    accuracy_sample_count = r.accuracy_sample_count_override or qsl_total
    sample_concatenate_permutation = r.sample_concatenate_permutation

    if scenario is TestScenario.MultiStream:
        samples_per_query = r.multi_stream_samples_per_query

    if scenario is TestScenario.Offline:
        # Generate 10 % more samples than the expected rate needs for the duration.
        slack = 1.1
        target_seconds = float(target_duration_ms) / 1000.0
        target_sample_count = _double_to_uint64(slack * target_seconds * target_qps)
        if r.performance_issue_unique:
            samples_per_query = performance_sample_count
        else:
            samples_per_query = max(min_query_count, target_sample_count)
        min_query_count = 1
        target_duration_ms = 0

    if sample_concatenate_permutation and scenario is TestScenario.SingleStream:
        # Equal issue: twice the expected query count, rounded up past a multiple
        # of the QSL's performance sample count (a whole multiple still gets one
        # more full round).
        slack = 2.0
        target_seconds = float(target_duration_ms) / 1000.0
        expected_queries = _double_to_uint64(slack * target_seconds * target_qps)
        min_query_count = max(min_query_count, expected_queries)
        if qsl_performance == 0:
            raise ValueError(
                "sample_concatenate_permutation in SingleStream needs a QSL "
                "performance sample count above 0"
            )
        min_query_count = (
            min_query_count + qsl_performance - min_query_count % qsl_performance
        ) & _U64_MASK

    min_sample_count = (min_query_count * samples_per_query) & _U64_MASK

    same_index = r.performance_issue_same_index
    if r.performance_issue_same and same_index >= performance_sample_count:
        errors.append(
            f"performance_issue_same_index ({r.performance_issue_same_index}) must be "
            f"below the performance sample count ({performance_sample_count})"
        )
    if r.performance_issue_unique and r.performance_issue_same:
        errors.append(
            "performance_issue_unique and performance_issue_same cannot both be set"
        )

    return EffectiveSettings(
        requested=r,
        scenario=scenario,
        mode=r.mode,
        samples_per_query=samples_per_query,
        target_qps=target_qps,
        target_latency_ns=target_latency_ns,
        target_latency_percentile=target_latency_percentile,
        max_async_queries=max_async_queries,
        target_duration_ns=target_duration_ms * _NS_PER_MS,
        min_duration_ns=min_duration_ms * _NS_PER_MS,
        max_duration_ns=max_duration_ms * _NS_PER_MS,
        min_query_count=min_query_count,
        max_query_count=r.max_query_count,
        min_sample_count=min_sample_count,
        qsl_rng_seed=r.qsl_rng_seed,
        sample_index_rng_seed=r.sample_index_rng_seed,
        schedule_rng_seed=r.schedule_rng_seed,
        accuracy_log_rng_seed=r.accuracy_log_rng_seed,
        accuracy_log_probability=r.accuracy_log_probability,
        accuracy_log_sampling_target=r.accuracy_log_sampling_target,
        print_timestamps=r.print_timestamps,
        performance_issue_unique=r.performance_issue_unique,
        performance_issue_same=r.performance_issue_same,
        performance_issue_same_index=r.performance_issue_same_index,
        performance_sample_count=performance_sample_count,
        accuracy_sample_count=accuracy_sample_count,
        sample_concatenate_permutation=sample_concatenate_permutation,
        use_token_latencies=r.use_token_latencies,
        server_ttft_latency=_as_int64(r.ttft_latency),
        server_tpot_latency=_as_int64(r.tpot_latency),
        infer_token_latencies=r.infer_token_latencies,
        token_latency_scaling_factor=_as_int64(r.token_latency_scaling_factor),
        setting_errors=tuple(errors),
    )


def apply_test05(ts: TestSettings) -> TestSettings:
    """Returns a copy of ``ts`` adjusted for compliance TEST05 when ``ts.test05``.

    The copy runs in PerformanceOnly mode with the three ``test05_*`` seeds in place
    of the QSL, sample index and schedule seeds. Without ``test05`` it is a plain
    copy.

    Args:
        ts: the requested settings.

    Returns:
        A new :class:`TestSettings`.
    """
    adjusted = ts.copy()
    if adjusted.test05:
        adjusted.mode = TestMode.PerformanceOnly
        adjusted.qsl_rng_seed = ts.test05_qsl_rng_seed
        adjusted.sample_index_rng_seed = ts.test05_sample_index_rng_seed
        adjusted.schedule_rng_seed = ts.test05_schedule_rng_seed
    return adjusted


# ------------------------------------------------------------------ logging


def requested_log_items(ts: TestSettings) -> list[tuple[str, object]]:
    """The ``requested_*`` detail log entries for ``ts``, in MLPerf's order.

    Args:
        ts: the settings the test runs with.

    Returns:
        ``(key, value)`` pairs; enums as their names, numbers and flags as Python
        ints, floats and bools.
    """
    items: list[tuple[str, object]] = [
        ("requested_scenario", ts.scenario.name),
        ("requested_test_mode", ts.mode.name),
    ]
    if ts.scenario is TestScenario.SingleStream:
        items += [
            (
                "requested_single_stream_expected_latency_ns",
                ts.single_stream_expected_latency_ns,
            ),
            (
                "requested_single_stream_target_latency_percentile",
                ts.single_stream_target_latency_percentile,
            ),
        ]
    elif ts.scenario is TestScenario.MultiStream:
        items += [
            (
                "requested_multi_stream_expected_latency_ns",
                ts.multi_stream_expected_latency_ns,
            ),
            (
                "requested_multi_stream_target_latency_percentile",
                ts.multi_stream_target_latency_percentile,
            ),
            (
                "requested_multi_stream_samples_per_query",
                ts.multi_stream_samples_per_query,
            ),
        ]
    elif ts.scenario is TestScenario.Server:
        items += [
            ("requested_server_target_qps", ts.server_target_qps),
            ("requested_server_target_latency_ns", ts.server_target_latency_ns),
            (
                "requested_server_target_latency_percentile",
                ts.server_target_latency_percentile,
            ),
            ("requested_server_coalesce_queries", ts.server_coalesce_queries),
            (
                "requested_server_find_peak_qps_decimals_of_precision",
                ts.server_find_peak_qps_decimals_of_precision,
            ),
            (
                "requested_server_find_peak_qps_boundary_step_size",
                ts.server_find_peak_qps_boundary_step_size,
            ),
            ("requested_server_max_async_queries", ts.server_max_async_queries),
            (
                "requested_server_num_issue_query_threads",
                ts.server_num_issue_query_threads,
            ),
        ]
    else:
        items.append(("requested_offline_expected_qps", ts.offline_expected_qps))

    items += [
        ("requested_min_duration_ms", ts.min_duration_ms),
        ("requested_max_duration_ms", ts.max_duration_ms),
        ("requested_min_query_count", ts.min_query_count),
        ("requested_max_query_count", ts.max_query_count),
        ("requested_qsl_rng_seed", ts.qsl_rng_seed),
        ("requested_sample_index_rng_seed", ts.sample_index_rng_seed),
        ("requested_schedule_rng_seed", ts.schedule_rng_seed),
        ("requested_accuracy_log_rng_seed", ts.accuracy_log_rng_seed),
        ("requested_accuracy_log_probability", ts.accuracy_log_probability),
        ("requested_accuracy_log_sampling_target", ts.accuracy_log_sampling_target),
        ("requested_print_timestamps", ts.print_timestamps),
        ("requested_performance_issue_unique", ts.performance_issue_unique),
        ("requested_performance_issue_same", ts.performance_issue_same),
        ("requested_performance_issue_same_index", ts.performance_issue_same_index),
        (
            "requested_performance_sample_count_override",
            ts.performance_sample_count_override,
        ),
        ("requested_accuracy_sample_count_override", ts.accuracy_sample_count_override),
        ("requested_sample_concatenate_permutation", ts.sample_concatenate_permutation),
    ]
    if ts.use_token_latencies:
        items.append(("requested_use_token_latencies", ts.use_token_latencies))
        if ts.scenario is not TestScenario.Offline:
            items += [
                ("requested_server_ttft_latency", ts.ttft_latency),
                ("requested_server_tpot_latency", ts.tpot_latency),
            ]
    return items


def effective_log_items(eff: EffectiveSettings) -> list[tuple[str, object]]:
    """The ``effective_*`` detail log entries for ``eff``, in MLPerf's order.

    Args:
        eff: the effective settings of the test.

    Returns:
        ``(key, value)`` pairs; durations in the units their keys name.
    """
    return [
        ("effective_scenario", eff.scenario.name),
        ("effective_test_mode", eff.mode.name),
        ("effective_samples_per_query", eff.samples_per_query),
        ("effective_target_qps", eff.target_qps),
        ("effective_target_latency_ns", eff.target_latency_ns),
        ("effective_target_latency_percentile", eff.target_latency_percentile),
        ("effective_max_async_queries", eff.max_async_queries),
        ("effective_target_duration_ms", eff.target_duration_ms),
        ("effective_min_duration_ms", eff.min_duration_ms),
        ("effective_max_duration_ms", eff.max_duration_ms),
        ("effective_min_query_count", eff.min_query_count),
        ("effective_max_query_count", eff.max_query_count),
        ("effective_min_sample_count", eff.min_sample_count),
        ("effective_qsl_rng_seed", eff.qsl_rng_seed),
        ("effective_sample_index_rng_seed", eff.sample_index_rng_seed),
        ("effective_schedule_rng_seed", eff.schedule_rng_seed),
        ("effective_accuracy_log_rng_seed", eff.accuracy_log_rng_seed),
        ("effective_accuracy_log_probability", eff.accuracy_log_probability),
        ("effective_accuracy_log_sampling_target", eff.accuracy_log_sampling_target),
        ("effective_print_timestamps", eff.print_timestamps),
        ("effective_performance_issue_unique", eff.performance_issue_unique),
        ("effective_performance_issue_same", eff.performance_issue_same),
        ("effective_performance_issue_same_index", eff.performance_issue_same_index),
        ("effective_performance_sample_count", eff.performance_sample_count),
        ("effective_accuracy_sample_count", eff.accuracy_sample_count),
        (
            "effective_sample_concatenate_permutation",
            eff.sample_concatenate_permutation,
        ),
    ]


def all_log_items(eff: EffectiveSettings) -> list[tuple[str, object]]:
    """The requested entries of ``eff.requested`` followed by the effective ones.

    Args:
        eff: the effective settings of the test.

    Returns:
        ``requested_log_items(eff.requested) + effective_log_items(eff)``.
    """
    return requested_log_items(eff.requested) + effective_log_items(eff)
