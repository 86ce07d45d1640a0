"""Test settings that behave like those of MLPerf LoadGen's Python module.

This module provides the settings structs of ``mlperf_loadgen`` (MLPerf LoadGen 6.0.17,
called "MLPerf" below):

* the enums :class:`TestScenario`, :class:`TestMode` and :class:`LoggingMode`, with
  MLPerf's member names and integer values;
* :class:`TestSettings`, :class:`LogOutputSettings` and :class:`LogSettings`, with
  MLPerf's attribute names, defaults and assignment rules (an assignment
  ``mlperf_loadgen`` refuses raises :class:`TypeError`, an unknown attribute raises
  :class:`AttributeError`).

Elsewhere: :meth:`TestSettings.FromConfig` reads configuration files through
:mod:`.config_file`; :mod:`.effective` derives the settings a run uses, and
:mod:`.detail_items` their detail-log entries.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar


__all__ = [
    "LOG_OUTPUT_SETTINGS_FIELDS",
    "LOG_SETTINGS_FIELDS",
    "TEST_SETTINGS_FIELDS",
    "LogOutputSettings",
    "LogSettings",
    "LoggingMode",
    "TestMode",
    "TestScenario",
    "TestSettings",
]

_U64_MAX = (1 << 64) - 1
_I32_MIN = -(1 << 31)
_I32_MAX = (1 << 31) - 1


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


def describe(value: object) -> str:
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
        except Exception:  # any failure is a refusal
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
        except Exception:  # any failure is a refusal
            return None
    return None


def _bool_or_none(value: object) -> bool | None:
    """The bool pybind11 would read from ``value``, or None if it refuses it."""
    if value is True or value is False:
        return value
    if value is None:
        return False
    if isinstance(value, enum.Enum):
        return None
    if getattr(type(value), "__bool__", None) is None:
        return None
    try:
        return bool(value)
    except Exception:  # any failure is a refusal
        return None


_Coercer = Callable[[str, str, Any], Any]


def unsigned64(owner: str, name: str, value: Any) -> int:
    result = _integer_or_none(value)
    if result is None or not 0 <= result <= _U64_MAX:
        raise TypeError(
            f"{owner}.{name} must be an integer in [0, 2**64 - 1], "
            f"got {describe(value)}"
        )
    return result


def _signed32(owner: str, name: str, value: Any) -> int:
    result = _integer_or_none(value)
    if result is None or not _I32_MIN <= result <= _I32_MAX:
        raise TypeError(
            f"{owner}.{name} must be an integer in [-2**31, 2**31 - 1], "
            f"got {describe(value)}"
        )
    return result


def _double(owner: str, name: str, value: Any) -> float:
    result = _float_or_none(value)
    if result is None:
        raise TypeError(f"{owner}.{name} must be a number, got {describe(value)}")
    return result


def _boolean(owner: str, name: str, value: Any) -> bool:
    result = _bool_or_none(value)
    if result is None:
        raise TypeError(f"{owner}.{name} must be a bool, got {describe(value)}")
    return result


def _string(owner: str, name: str, value: Any) -> str:
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    raise TypeError(f"{owner}.{name} must be a str, got {describe(value)}")


def _member_of(enum_type: type) -> _Coercer:
    def coerce(owner: str, name: str, value: Any) -> Any:
        if isinstance(value, enum_type):
            return value
        raise TypeError(
            f"{owner}.{name} must be a {enum_type.__name__} member, "
            f"got {describe(value)}"
        )

    return coerce


def _instance_copy_of(struct_type: type[_SettingsStruct]) -> _Coercer:
    def coerce(owner: str, name: str, value: Any) -> Any:
        if isinstance(value, struct_type):
            return value.copy()
        raise TypeError(
            f"{owner}.{name} must be a {struct_type.__name__}, got {describe(value)}"
        )

    return coerce


# ------------------------------------------------------------ settings structs


_Struct = TypeVar("_Struct", bound="_SettingsStruct")


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
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = []
        for name, _, _ in self._SPEC:
            value = getattr(self, name)
            shown = str(value) if isinstance(value, enum.Enum) else repr(value)
            parts.append(f"{name}={shown}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def copy(self: _Struct) -> _Struct:
        """Returns an independent copy (nested settings are copied too)."""
        duplicate = type(self).__new__(type(self))
        for name, _, _ in self._SPEC:
            value = getattr(self, name)
            if isinstance(value, _SettingsStruct):
                value = value.copy()
            object.__setattr__(duplicate, name, value)
        return duplicate

    def __copy__(self: _Struct) -> _Struct:
        return self.copy()

    def __deepcopy__(self: _Struct, memo: dict[int, Any]) -> _Struct:
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
        ("log_mode_async_poll_interval_ms", unsigned64, 1000),
        ("enable_trace", _boolean, False),
    )
    __slots__ = tuple(name for name, _, _ in _SPEC)

    log_output: LogOutputSettings
    log_mode: LoggingMode
    log_mode_async_poll_interval_ms: int
    enable_trace: bool


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
        ("multi_stream_samples_per_query", unsigned64, 8),
        ("server_target_qps", _double, 1.0),
        ("server_target_latency_ns", unsigned64, 100000000),
        ("server_target_latency_percentile", _double, 0.99),
        ("server_coalesce_queries", _boolean, False),
        ("server_find_peak_qps_decimals_of_precision", _signed32, 1),
        ("server_find_peak_qps_boundary_step_size", _double, 1.0),
        ("server_max_async_queries", unsigned64, 0),
        ("server_num_issue_query_threads", unsigned64, 0),
        ("offline_expected_qps", _double, 1.0),
        ("sample_concatenate_permutation", _boolean, False),
        ("min_duration_ms", unsigned64, 10000),
        ("max_duration_ms", unsigned64, 0),
        ("min_query_count", unsigned64, 100),
        ("max_query_count", unsigned64, 0),
        ("qsl_rng_seed", unsigned64, 0),
        ("sample_index_rng_seed", unsigned64, 0),
        ("schedule_rng_seed", unsigned64, 0),
        ("accuracy_log_rng_seed", unsigned64, 0),
        ("accuracy_log_probability", _double, 0.0),
        ("accuracy_log_sampling_target", unsigned64, 0),
        ("test05", _boolean, False),
        ("test05_qsl_rng_seed", unsigned64, 0),
        ("test05_sample_index_rng_seed", unsigned64, 0),
        ("test05_schedule_rng_seed", unsigned64, 0),
        ("print_timestamps", _boolean, False),
        ("performance_issue_unique", _boolean, False),
        ("performance_issue_same", _boolean, False),
        ("performance_issue_same_index", unsigned64, 0),
        ("performance_sample_count_override", unsigned64, 0),
        ("accuracy_sample_count_override", unsigned64, 0),
        ("use_token_latencies", _boolean, False),
        ("ttft_latency", unsigned64, 100000000),
        ("tpot_latency", unsigned64, 100000000),
        ("infer_token_latencies", _boolean, False),
        ("token_latency_scaling_factor", unsigned64, 0),
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
        from .config_file import from_config  # it builds on this module

        path_text = _path_argument(path)
        model_key = _key_argument("model", model)
        scenario_key = _key_argument("scenario", scenario)
        conf_kind = _signed32("TestSettings.FromConfig", "conf_type", conf_type)
        return from_config(self, path_text, model_key, scenario_key, conf_kind)


#: Attribute names of :class:`TestSettings`, in declaration order.
TEST_SETTINGS_FIELDS: tuple[str, ...] = TestSettings.__slots__
#: Attribute names of :class:`LogOutputSettings`, in declaration order.
LOG_OUTPUT_SETTINGS_FIELDS: tuple[str, ...] = LogOutputSettings.__slots__
#: Attribute names of :class:`LogSettings`, in declaration order.
LOG_SETTINGS_FIELDS: tuple[str, ...] = LogSettings.__slots__


def _path_argument(path: Any) -> Any:
    """FromConfig's ``path`` as given to ``open`` (cut at a NUL, like a C string)."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if isinstance(path, str):
        return path.split("\0", 1)[0]
    if isinstance(path, bytes):
        return path.split(b"\0", 1)[0]
    raise TypeError(
        f"TestSettings.FromConfig: path must be a str, got {describe(path)}"
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
        f"TestSettings.FromConfig: {name} must be a str, got {describe(value)}"
    )
