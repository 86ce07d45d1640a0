"""Writes ``mlperf_log_detail.txt``: MLPerf LoadGen's ``:::MLLOG {json}`` lines.

A :class:`DetailLog` writes the lines; :func:`write_detail_results` the result lines of a
performance run, from an :class:`~loadgen.mlperf.evaluate.Evaluation`, followed by ours
(``loadgen_*``: issue delay, encoded HDR histograms). Values are always valid JSON:
strings are JSON-escaped, infinities and NaN are written ``Infinity``/``-Infinity``/
``NaN``, an empty list is ``[]`` and an empty map ``{}``. For ordinary values the text is
byte for byte MLPerf's. :func:`log_paths` names the log files as MLPerf does.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import IO, Any, Callable

import numpy as np

from ..units import NS_PER

from ..stats.early_stopping import OrderStatistics
from .detail_items import all_log_items
from .evaluate import EXITED_EARLY_MESSAGE, LATENCY_PERCENTILES, Evaluation
from .figures import RunFigures
from .number_text import cpp_fixed
from .settings import TestScenario

__all__ = [
    "RAN_OUT_OF_QUERIES_MESSAGE",
    "DetailLog",
    "current_date_time_iso8601",
    "log_paths",
    "power_date_time",
    "write_detail_results",
]

#: The ``error_runtime`` detail line MLPerf writes when issuing ran out of queries.
RAN_OUT_OF_QUERIES_MESSAGE = (
    "Ending early: Ran out of generated queries to issue before the minimum query count "
    "and test duration were reached. Please update the relevant expected latency or "
    "target qps in the TestSettings so they are more accurate."
)

def _json_string(text: str) -> str:
    return json.dumps(str(text), ensure_ascii=False)


def _detail_value(value: Any) -> str:
    """A value as MLPerf's detail log encodes it (always valid JSON here)."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return f"{value:g}"
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, Mapping):
        items = sorted((str(k), str(v)) for k, v in value.items())
        return "{" + ",".join(f"{_json_string(k)}:{_json_string(v)}" for k, v in items) + "}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return '"' + bytes(value).hex().upper() + '"'
    if isinstance(value, (list, tuple, np.ndarray)):
        return "[" + ",".join(str(int(v)) for v in value) + "]"
    if value is None:
        return "null"
    return _json_string(str(value))


def power_date_time(epoch_ns: int) -> str:
    """A wall-clock time as MLPerf's power lines write it: UTC ``MM-DD-YYYY HH:MM:SS.mmm``.

    Args:
        epoch_ns: ns since the Unix epoch (``time.time_ns()``).
    """
    seconds, remainder_ns = divmod(int(epoch_ns), NS_PER["s"])
    stamp = time.strftime("%m-%d-%Y %H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{remainder_ns // NS_PER['ms']:03d}"


def current_date_time_iso8601(epoch_s: float | None = None) -> str:
    """The test's date and time as MLPerf names files and logs it.

    MLPerf formats the *local* time and appends a literal ``Z``; this does the same.

    Args:
        epoch_s: seconds since the epoch; now when None.

    Returns:
        e.g. ``"2024-05-01T12:34:56Z"``.
    """
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.localtime(epoch_s))


def _default_clock() -> Callable[[], int]:
    try:
        from .. import _core

        return _core.now_ns
    except (ImportError, AttributeError):  # pragma: no cover
        return time.monotonic_ns


@lru_cache(maxsize=1)
def _package_identity() -> dict[str, Any]:
    """Version, build dates and file digests of this loadgen, for the version lines."""
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        from importlib.metadata import version as _dist_version

        version = _dist_version("loadgen")
    except ImportError:  # not installed as a distribution (PackageNotFoundError)
        version = ""
    if not version:
        from .._version import __version__ as version
    digests: dict[str, str] = {}
    build_time: float | None = None
    for sub in ("", "mlperf"):
        folder = os.path.join(package_dir, sub)
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                continue
            try:
                with open(path, "rb") as f:
                    digests[f"/{sub + '/' if sub else ''}{name}"] = hashlib.sha1(f.read()).hexdigest()
            except OSError:
                continue
            if name.startswith("_core"):
                build_time = os.path.getmtime(path)
    if build_time is None:
        build_time = time.time()
    local = datetime.datetime.fromtimestamp(build_time).isoformat()
    utc = datetime.datetime.fromtimestamp(build_time, datetime.timezone.utc).replace(tzinfo=None).isoformat()
    return {"version": str(version), "build_local": local, "build_utc": utc, "sha1": digests}


class DetailLog:
    """Writes ``mlperf_log_detail.txt``: one ``:::MLLOG {json}`` line per entry.

    Each line carries, in MLPerf's order: key, value, time_ms (since the log's origin,
    with 6 decimals), namespace, event_type and metadata (is_error, is_warning, the
    Python file and line that logged it, pid, tid). Thread-safe.

    Args:
        fh: text stream to write to (the caller owns it).
        origin_ns: the clock reading that time_ms counts from; now when None.
        clock: a monotonic ns clock; loadgen's native clock by default.
        copy_to_stdout: also print every line (MLPerf's copy_detail_to_stdout).
    """

    def __init__(
        self,
        fh: IO[str],
        *,
        origin_ns: int | None = None,
        clock: Callable[[], int] | None = None,
        copy_to_stdout: bool = False,
    ) -> None:
        self._fh = fh
        self._clock = clock or _default_clock()
        self.origin_ns = int(self._clock() if origin_ns is None else origin_ns)
        self.copy_to_stdout = copy_to_stdout
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.error_count = 0
        self.warning_count = 0

    # ------------------------------------------------------------- the entries

    def now_ns(self) -> int:
        """The log's clock now (ns, the clock ``time_ms`` counts on)."""
        return int(self._clock())

    def write_entry(self, key: str, value: Any, is_error: bool, is_warning: bool,
                    time_ns: int | None, depth: int) -> None:
        """Writes one ``:::MLLOG`` line: ``key`` and ``value``, flagged as an error or a
        warning, at ``time_ns`` (now when None), naming the caller ``depth`` frames up
        (1: this method's caller) as its file and line. Thread-safe."""
        frame = sys._getframe(depth)
        file_name = os.path.basename(frame.f_code.co_filename)
        line_no = frame.f_lineno
        elapsed = int((self._clock() if time_ns is None else time_ns) - self.origin_ns)
        whole_ms, fraction_ns = divmod(max(elapsed, 0), NS_PER["ms"])
        line = (
            f':::MLLOG {{"key": {_json_string(key)}, "value": {_detail_value(value)}, '
            f'"time_ms": {whole_ms}.{fraction_ns:06d}, "namespace": "mlperf::logging", '
            f'"event_type": "POINT_IN_TIME", "metadata": {{"is_error": {"true" if is_error else "false"}, '
            f'"is_warning": {"true" if is_warning else "false"}, "file": {_json_string(file_name)}, '
            f'"line_no": {line_no}, "pid": {self._pid}, "tid": {threading.get_native_id()}}}}}\n'
        )
        with self._lock:
            if is_error:
                self.error_count += 1
            if is_warning:
                self.warning_count += 1
            self._fh.write(line)
            if is_error:
                self._fh.flush()
            if self.copy_to_stdout:
                sys.stdout.write(line)

    def log(self, key: str, value: Any, *, time_ns: int | None = None) -> None:
        """Writes one entry.

        Args:
            key: MLPerf's key, e.g. ``"result_validity"``.
            value: bool, int, float, str, a sequence of ints, a str-to-str mapping or bytes
                (written as upper-case hex).
            time_ns: the clock reading to stamp it with; now when None.
        """
        self.write_entry(key, value, False, False, time_ns, 2)

    def error(self, key: str, message: Any, *, time_ns: int | None = None) -> None:
        """Writes an error entry (``is_error`` true; counted in ``num_errors``).

        Args:
            key: e.g. ``"error_runtime"``, ``"error_invalid_test_settings"``.
            message: what went wrong.
            time_ns: as for :meth:`log`.
        """
        self.write_entry(key, message, True, False, time_ns, 2)

    def warning(self, key: str, message: Any, *, time_ns: int | None = None) -> None:
        """Writes a warning entry (``is_warning`` true), e.g. ``"warning_generic_message"``."""
        self.write_entry(key, message, False, True, time_ns, 2)

    def interval_start(self, key: str, value: Any, *, time_ns: int | None = None) -> None:
        """Writes the opening entry of an interval (MLPerf: ``power_begin``)."""
        self.write_entry(key, value, False, False, time_ns, 2)

    def interval_end(self, key: str, value: Any, *, time_ns: int | None = None) -> None:
        """Writes the closing entry of an interval (MLPerf: ``power_end``)."""
        self.write_entry(key, value, False, False, time_ns, 2)

    def flush(self) -> None:
        """Flushes the stream."""
        with self._lock:
            self._fh.flush()

    # ------------------------------------------------- MLPerf's standard entries

    def log_version_info(self, *, git_revision: str = "NA") -> None:
        """Writes the ``loadgen_*`` version lines that open every MLPerf detail log.

        The values describe this package: its version, the build time of its native
        extension and the SHA-1 of its files. Git details are ``"NA"`` (as MLPerf writes
        them for a build outside a git checkout), which MLPerf does not flag as an error.

        Args:
            git_revision: appended to the version after " @ ".
        """
        ident = _package_identity()
        self.write_entry("loadgen_version", f"{ident['version']} @ {git_revision}", False, False, None, 1)
        self.write_entry("loadgen_build_date_local", ident["build_local"], False, False, None, 1)
        self.write_entry("loadgen_build_date_utc", ident["build_utc"], False, False, None, 1)
        self.write_entry("loadgen_git_commit_date", "NA", False, False, None, 1)
        self.write_entry("loadgen_git_log_message", "NA", False, False, None, 1)
        self.write_entry("loadgen_git_status_message", "NA", False, False, None, 1)
        self.write_entry("loadgen_file_sha1", ident["sha1"], False, False, None, 1)

    def log_test_start(
        self,
        *,
        test_date_time: str,
        sut_name: str,
        get_sut_name_duration_ns: int,
        qsl_name: str,
        qsl_total_count: int,
        qsl_performance_count: int,
    ) -> None:
        """Writes the test identity lines (test_datetime, sut_name, qsl_* ...)."""
        for key, value in (
            ("test_datetime", test_date_time),
            ("sut_name", sut_name),
            ("get_sut_name_duration_ns", int(get_sut_name_duration_ns)),
            ("qsl_name", qsl_name),
            ("qsl_reported_total_count", int(qsl_total_count)),
            ("qsl_reported_performance_count", int(qsl_performance_count)),
        ):
            self.write_entry(key, value, False, False, None, 1)

    def log_items(self, items: Iterable[tuple[str, Any]]) -> None:
        """Writes ``(key, value)`` pairs, e.g. the requested_* or effective_* settings."""
        for key, value in items:
            self.write_entry(key, value, False, False, None, 1)

    def log_settings(self, eff: Any) -> None:
        """Writes the requested_* then the effective_* settings lines of ``eff``."""
        for key, value in all_log_items(eff):
            self.write_entry(key, value, False, False, None, 1)

    def log_generated_queries(self, query_count: int, samples_per_query: int, duration_ns: int) -> None:
        """Writes generated_query_count, generated_samples_per_query, generated_query_duration."""
        self.write_entry("generated_query_count", int(query_count), False, False, None, 1)
        self.write_entry("generated_samples_per_query", int(samples_per_query), False, False, None, 1)
        self.write_entry("generated_query_duration", int(duration_ns), False, False, None, 1)

    def log_loaded_qsl_set(self, indices: Sequence[int]) -> None:
        """Writes ``loaded_qsl_set``: the sample indices loaded into memory."""
        self.write_entry("loaded_qsl_set", list(indices), False, False, None, 1)

    def log_power(self, start_epoch_ns: int, active_duration_ns: int) -> None:
        """Writes power_begin and power_end (UTC wall clock, ms precision).

        Args:
            start_epoch_ns: wall-clock time (``time.time_ns()``) when issuing started.
            active_duration_ns: from the start of issuing to the last completion.
        """
        self.write_entry("power_begin", power_date_time(start_epoch_ns), False, False, None, 1)
        self.write_entry("power_end", power_date_time(int(start_epoch_ns) + int(active_duration_ns)),
                    False, False, None, 1)


def write_detail_results(detail: DetailLog, eff: Any, fig: RunFigures, ev: Evaluation) -> None:
    """Writes a performance run's result lines to the detail log, in MLPerf's order.

    MLPerf's lines (result_validity ... result_*_percentile_latency_ns, token and inferred
    token lines) come first, then our additions (``loadgen_*``: issue delay, encoded HDR
    histograms), and ``num_errors`` last.

    Args:
        detail: the detail log.
        eff: the effective settings.
        fig: what the run measured.
        ev: ``evaluate(eff, fig)``.
    """
    scenario = int(eff.scenario)
    use_tokens = bool(getattr(eff, "use_token_latencies", False))
    lines = _validity_items(ev, scenario, use_tokens)
    lines += _scenario_items(ev, scenario)
    lines += [
        ("result_min_latency_ns", ev.sample_latency_min_ns),
        ("result_max_latency_ns", ev.sample_latency_max_ns),
        ("result_mean_latency_ns", ev.sample_latency_mean_ns),
    ]
    lines += _percentile_items("result_{}_percentile_latency_ns", ev.sample_latency_percentiles_ns)
    if use_tokens:
        lines += _token_items(ev, scenario)
    if getattr(eff, "infer_token_latencies", False):
        if scenario == TestScenario.Server:
            lines.append(("result_inferred_completed_tokens_per_second", ev.inferred_tokens_per_s))
        elif scenario == TestScenario.Offline:
            lines.append(("result_inferred_tokens_per_second", ev.inferred_tokens_per_s))
    lines += _detail_extras(fig)
    stamp = detail.now_ns()
    for key, value in lines:
        detail.write_entry(key, value, False, False, stamp, 1)
    detail.write_entry("num_errors", detail.error_count, False, False, stamp, 1)


def _percentile_items(key: str, values: Mapping[float, int]) -> list[tuple[str, Any]]:
    return [(key.format(cpp_fixed(p * 100)), values[p]) for p in LATENCY_PERCENTILES]


def _validity_items(ev: Evaluation, scenario: int, use_tokens: bool) -> list[tuple[str, Any]]:
    lines: list[tuple[str, Any]] = [("result_validity", ev.result_validity)]
    if ev.has_perf_constraints:
        lines.append(("result_perf_constraints_met", ev.perf_constraints_met))
    lines.append(("result_min_duration_met", ev.min_duration_met))
    lines.append(("result_min_queries_met", ev.min_queries_met))
    lines.append(("early_stopping_met", ev.early_stopping_met))
    if not ev.valid:
        reason = ""
        if not ev.perf_constraints_met:
            reason += ev.perf_constraints_recommendation + " "
        if not ev.min_duration_met:
            reason += ev.min_duration_recommendation + " "
        if not ev.min_queries_met:
            reason += EXITED_EARLY_MESSAGE + " "
        if ev.unrecorded_text:
            reason += ev.unrecorded_text
        reason = reason.rstrip()
        lines.append(("result_invalid_reason", reason.replace("\n", " ")))
    if not use_tokens:
        lines.append(("early_stopping_result", ev.early_stopping_text.replace("\n", " ")))
    else:
        lines.append(("early_stopping_ttft_result", ev.early_stopping_ttft_text.replace("\n", " ")))
        lines.append(("early_stopping_tpot_result", ev.early_stopping_tpot_text.replace("\n", " ")))
    lines.append(("result_query_count", ev.query_count))
    if scenario == TestScenario.Server:
        lines.append(("result_overlatency_query_count", ev.overlatency_query_count))
    return lines


def _scenario_items(ev: Evaluation, scenario: int) -> list[tuple[str, Any]]:
    lines: list[tuple[str, Any]] = []
    if scenario == TestScenario.SingleStream:
        lines += [
            ("result_qps_with_loadgen_overhead", ev.qps_with_loadgen_overhead),
            ("result_qps_without_loadgen_overhead", ev.qps_without_loadgen_overhead),
            ("early_stopping_latency_ss", ev.early_stopping_latency_ss_ns),
            ("early_stopping_latency_ms", ev.early_stopping_latency_ms_ns),
        ]
    elif scenario == TestScenario.MultiStream:
        lines += [
            ("result_min_query_latency_ns", ev.query_latency_min_ns),
            ("result_max_query_latency_ns", ev.query_latency_max_ns),
            ("result_mean_query_latency_ns", ev.query_latency_mean_ns),
        ]
        lines += _percentile_items("result_{}_percentile_per_query_latency_ns", ev.query_latency_percentiles_ns)
        lines.append(("early_stopping_latency_ms", ev.early_stopping_latency_ms_ns))
    elif scenario == TestScenario.Server:
        lines += [
            ("result_scheduled_samples_per_sec", ev.scheduled_samples_per_s),
            ("result_completed_samples_per_sec", ev.completed_samples_per_s),
        ]
    elif scenario == TestScenario.Offline:
        lines.append(("result_samples_per_second", ev.samples_per_s))
    return lines


def _token_items(ev: Evaluation, scenario: int) -> list[tuple[str, Any]]:
    lines: list[tuple[str, Any]] = []
    if scenario != TestScenario.Offline:
        lines += [
            ("result_first_token_min_latency_ns", ev.first_token_min_ns),
            ("result_first_token_max_latency_ns", ev.first_token_max_ns),
            ("result_first_token_mean_latency_ns", ev.first_token_mean_ns),
        ]
        lines += _percentile_items(
            "result_first_token_{}_percentile_latency_ns", ev.first_token_percentiles_ns
        )
        lines += [
            ("result_token_throughput_with_loadgen_overhead", ev.tokens_per_s_with_loadgen_overhead),
            ("result_token_throughput", ev.tokens_per_s_detail_throughput),
        ]
        lines += _percentile_items("result_time_per_output_token_{}_percentile_ns", ev.tpot_percentiles_ns)
        lines += [
            ("result_time_to_output_token_min", ev.tpot_min_ns),
            ("result_time_to_output_token_max", ev.tpot_max_ns),
            ("result_time_to_output_token_mean", ev.tpot_mean_ns),
            ("result_completed_tokens_per_second", ev.completed_tokens_per_s),
        ]
    else:
        lines.append(("result_tokens_per_second", ev.tokens_per_s))
    return lines


def _detail_extras(fig: RunFigures) -> list[tuple[str, Any]]:
    """Our additions to the detail log, all keyed ``loadgen_*``."""
    extras: list[tuple[str, Any]] = []
    delay = fig.issue_delay
    if delay is not None and delay.total_count:
        view = OrderStatistics(delay)
        extras += [
            ("loadgen_issue_delay_count", view.count),
            ("loadgen_issue_delay_min_ns", view.min),
            ("loadgen_issue_delay_max_ns", view.max),
            ("loadgen_issue_delay_mean_ns", round(delay.mean)),
        ]
        extras += [
            (f"loadgen_issue_delay_p{p * 100:g}_ns", view.at(int(view.count * p))) for p in LATENCY_PERCENTILES
        ]
    for key, histogram in (
        ("loadgen_sample_latency_hdr", fig.sample_latency),
        ("loadgen_query_latency_hdr", fig.query_latency),
        ("loadgen_issue_delay_hdr", fig.issue_delay),
        ("loadgen_first_token_latency_hdr", fig.first_token_latency),
        ("loadgen_time_per_output_token_hdr", fig.time_per_output_token),
    ):
        if histogram is not None and histogram.total_count:
            extras.append((key, histogram.encode()))
    extras += [
        ("loadgen_samples_issued", int(fig.samples_issued)),
        ("loadgen_unknown_completions", int(fig.unknown_completions)),
        ("loadgen_ran_out_of_generated_queries", bool(fig.ran_out_of_generated_queries)),
    ]
    return extras


def log_paths(log_output_settings: Any, test_date_time: str) -> dict[str, str]:
    """The four log file paths, named as MLPerf's LogOutputSettings name them.

    ``outdir + "/" + prefix [+ test_date_time + "_"] + kind + suffix + extension``.

    Args:
        log_output_settings: has ``outdir``, ``prefix``, ``suffix`` and
            ``prefix_with_datetime`` (like ``lg.LogOutputSettings``).
        test_date_time: :func:`current_date_time_iso8601` at the start of the test.

    Returns:
        ``{"summary": ..., "detail": ..., "accuracy": ..., "trace": ...}``.
    """
    head = f"{log_output_settings.outdir}/{log_output_settings.prefix}"
    if log_output_settings.prefix_with_datetime:
        head += f"{test_date_time}_"
    suffix = log_output_settings.suffix
    return {
        "summary": f"{head}summary{suffix}.txt",
        "detail": f"{head}detail{suffix}.txt",
        "accuracy": f"{head}accuracy{suffix}.json",
        "trace": f"{head}trace{suffix}.json",
    }
