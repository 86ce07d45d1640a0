"""StartTest and StartTestWithLogSettings: one test, in MLPerf's modes, with MLPerf's logs.

The handles come from :mod:`.handles`; the modes are :mod:`.modes`, each running the
native issue loop through a :class:`~loadgen.mlperf.session.Session`.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from .. import _core
from .accuracy_log import AccuracyLog
from .config_file import take_config_errors
from .detail_log import DetailLog, current_date_time_iso8601, log_paths
from .effective import apply_test05, effective_settings
from .handles import QslHandle, SutHandle, lookup
from .modes import run_accuracy, run_find_peak, run_performance
from .session import Session
from .settings import LogSettings, TestMode, TestScenario, TestSettings
from .summary import write_summary_trailer

__all__ = [
    "FirstTokenComplete",
    "QuerySamplesComplete",
    "StartTest",
    "StartTestWithLogSettings",
]

# MLPerf's completion calls name no run: they feed the one StartTest is running, natively.
QuerySamplesComplete = _core.mlperf_samples_complete
FirstTokenComplete = _core.mlperf_first_token_complete
_start_lock = threading.Lock()


def StartTest(
    sut: int,
    qsl: int,
    test_settings: TestSettings,
    audit_config_filename: str = "audit.config",
) -> None:
    """Runs a test with default log settings (logs in the working directory).

    Args:
        sut: a handle from ConstructSUT or ConstructFastSUT.
        qsl: a handle from ConstructQSL.
        test_settings: the :class:`TestSettings` (scenario, mode, targets, seeds ...).
        audit_config_filename: when this file exists, its settings override
            ``test_settings`` (MLPerf's compliance audits).
    """
    StartTestWithLogSettings(
        sut, qsl, test_settings, LogSettings(), audit_config_filename
    )


def _unsupported(ts: TestSettings, log_settings: LogSettings) -> None:
    checks = (
        (
            ts.server_num_issue_query_threads > 0,
            (
                "TestSettings.server_num_issue_query_threads > 0 (issue "
                "threads registered by the SUT); queries are issued on the thread that calls StartTest"
            ),
        ),
        (
            log_settings.enable_trace,
            "LogSettings.enable_trace (the Chrome trace file); set it to False",
        ),
    )
    for failed, what in checks:
        if failed:
            raise NotImplementedError(f"loadgen.mlperf does not support {what}")


def StartTestWithLogSettings(
    sut: int,
    qsl: int,
    test_settings: TestSettings,
    log_settings: LogSettings,
    audit_config_filename: str = "audit.config",
) -> None:
    """Runs a test: the mode and scenario of ``test_settings``, logs per ``log_settings``.

    Blocks until the test has ended. Queries are issued on the calling thread; completions
    may come from any thread. Writes ``mlperf_log_summary.txt``, ``mlperf_log_detail.txt``
    and ``mlperf_log_accuracy.json`` (names per ``log_settings.log_output``).

    Args:
        sut: a handle from ConstructSUT or ConstructFastSUT.
        qsl: a handle from ConstructQSL.
        test_settings: the :class:`TestSettings`.
        log_settings: the :class:`LogSettings`.
        audit_config_filename: as for :func:`StartTest`.

    Raises:
        NotImplementedError: for a setting this module does not support (named).
        TypeError: for a handle that is not live, or settings of the wrong type.
        ValueError: for settings that cannot run.
    """
    sut_obj = lookup(sut, SutHandle, "SUT")
    qsl_obj = lookup(qsl, QslHandle, "QSL")
    if not isinstance(test_settings, TestSettings):
        raise TypeError(
            f"test_settings must be loadgen.mlperf.TestSettings, got {type(test_settings).__name__}"
        )
    if not isinstance(log_settings, LogSettings):
        raise TypeError(
            f"log_settings must be loadgen.mlperf.LogSettings, got {type(log_settings).__name__}"
        )
    _unsupported(test_settings, log_settings)
    if not _start_lock.acquire(blocking=False):
        raise RuntimeError(
            "a test is already running in this process (StartTest is not re-entrant)"
        )
    try:
        _start(sut_obj, qsl_obj, test_settings, log_settings, audit_config_filename)
    finally:
        _start_lock.release()


def _start(
    sut: SutHandle,
    qsl: QslHandle,
    requested: TestSettings,
    log_settings: LogSettings,
    audit_config_filename: str,
) -> None:
    out = log_settings.log_output
    test_date_time = current_date_time_iso8601()
    paths = log_paths(out, test_date_time)
    os.makedirs(out.outdir or ".", exist_ok=True)
    with (
        open(paths["summary"], "w") as summary_fh,
        open(paths["detail"], "w") as detail_fh,
        open(paths["accuracy"], "w") as accuracy_fh,
    ):
        detail = DetailLog(
            detail_fh, copy_to_stdout=bool(out.copy_detail_to_stdout)
        )
        ts = requested.copy()
        use_tokens = bool(ts.use_token_latencies)
        accuracy_log = AccuracyLog(
            accuracy_fh,
            use_tokens=use_tokens,
            needs_first_token=int(ts.scenario) != int(TestScenario.Offline),
        )
        test = Session(
            sut, qsl, detail, summary_fh, accuracy_log, bool(out.copy_summary_to_stdout)
        )
        detail.log_version_info()
        t0 = time.perf_counter_ns()
        sut_name = str(sut.name_cb()) if sut.name_cb is not None else sut.name
        test.sut_name = sut_name
        detail.log_test_start(
            test_date_time=test_date_time,
            sut_name=sut_name,
            get_sut_name_duration_ns=time.perf_counter_ns() - t0,
            qsl_name=qsl.name,
            qsl_total_count=qsl.total_sample_count,
            qsl_performance_count=qsl.performance_sample_count,
        )
        ts = _settings_for_test(ts, detail, log_settings, audit_config_filename)
        eff = effective_settings(
            ts, qsl.performance_sample_count, qsl.total_sample_count
        )
        detail.log_settings(eff)
        for message in eff.setting_errors:
            detail.error("error_invalid_test_settings", message)
        try:
            _run_mode(test, eff)
        except BaseException as exc:
            detail.error(
                "error_runtime", f"the test ended with {type(exc).__name__}: {exc}"
            )
            raise
        finally:
            accuracy_log.close()
            write_summary_trailer(
                summary_fh, detail.warning_count, detail.error_count
            )
            detail.flush()


def _settings_for_test(
    ts: TestSettings, detail: DetailLog, log_settings: LogSettings, audit_config_filename: str
) -> TestSettings:
    """The requested settings after the configuration errors, audit.config and TEST05."""
    for message in take_config_errors():
        detail.error("error_invalid_config", message)
    if audit_config_filename and os.path.isfile(audit_config_filename):
        detail.log(
            "generic_message",
            f"Found Audit Config file ({audit_config_filename}). "
            "Overriding TestSettings from it.",
        )
        scenario_name = TestScenario(int(ts.scenario)).name
        ts.FromConfig(audit_config_filename, "*", scenario_name, 2)
        _unsupported(ts, log_settings)
    if ts.test05:
        detail.log(
            "generic_message", "Test05 flag detected: overriding the random seeds"
        )
        ts = apply_test05(ts)
    return ts


def _run_mode(test: Session, eff: Any) -> None:
    mode = TestMode(int(eff.mode))
    if mode == TestMode.SubmissionRun:
        run_accuracy(test, eff)
        run_performance(test, eff)
    elif mode == TestMode.AccuracyOnly:
        run_accuracy(test, eff)
    elif mode == TestMode.PerformanceOnly:
        run_performance(test, eff)
    else:
        run_find_peak(test, eff)
