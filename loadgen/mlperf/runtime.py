"""The run behind the MLPerf-compatible API: SUT/QSL handles, StartTest and completions.

The native issue loop (``loadgen._core.MlperfRun``) yields the queries MLPerf's LoadGen
would generate for the same settings and seeds, issues them on the thread that called
StartTest (no hand-off to another thread), and counts completions per sample, wait-free,
from any thread. This module walks MLPerf's test modes around it (loading and unloading
the QSL sets, accuracy then performance, the peak search) and writes MLPerf's logs
through :mod:`.summary`, :mod:`.detail_log` and :mod:`.accuracy_log`.
"""

from __future__ import annotations

import ctypes
import io
import itertools
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

from .. import _core
from ..stats.histogram import Histogram
from .accuracy_log import AccuracyLog
from .detail_log import DetailLog, current_date_time_iso8601, log_paths, write_detail_results
from .evaluate import Evaluation, evaluate
from .figures import RunFigures
from .summary import write_summary, write_summary_trailer
from .config_file import take_config_errors
from .effective import EffectiveSettings, apply_test05, effective_settings
from .settings import LogSettings, TestMode, TestScenario, TestSettings

__all__ = [
    "ConstructFastSUT",
    "ConstructQDL",
    "ConstructQSL",
    "ConstructSUT",
    "DestroyFastSUT",
    "DestroyQDL",
    "DestroyQSL",
    "DestroySUT",
    "FirstTokenComplete",
    "QuerySamplesComplete",
    "StartTest",
    "StartTestWithLogSettings",
    "options",
]


@dataclass
class Options:
    """Knobs of loadgen.mlperf that MLPerf's TestSettings have no field for.

    Attributes:
        spin_us: Server: the issuing thread spins this long before each scheduled time
            instead of sleeping all the way (smaller issue delay; costs a busy core).
        table_capacity: queries tracked at once (a power of 2); a Server run with more
            outstanding waits for room (the wait shows up as latency).
        peak_probe_min_duration_ms: FindPeakPerformance: length of each search probe
            (capped at min_duration_ms). The answer is then confirmed at full length.
        peak_relative_precision: FindPeakPerformance stops refining when the bounds are
            this close (relative), or at MLPerf's decimals of precision, whichever first.
        peak_max_probes: FindPeakPerformance: bound on search probes.
        peak_confirm_runs: FindPeakPerformance: a rate is the answer when this many
            full-length runs in a row hold at it (near capacity one run can pass by luck).
        peak_latency_headroom: FindPeakPerformance: in the confirmation runs the
            target-percentile latency may use this fraction of the bound, or twice its
            value at the lower bound (server_target_qps), whichever is more (never more
            than the bound). Near capacity the tail swings from run to run, so a rate
            that only just passes fails on a rerun.
        peak_max_confirmations: FindPeakPerformance: rates tried at full length, stepping down
            by ``peak_relative_precision`` * 5 after each that does not hold.
        completion_timeout_s: how long the end of a run waits for outstanding samples
            (< 0: forever, as MLPerf does). When it passes, the run is reported with the
            samples that did complete, and an error line names the missing count.
    """

    spin_us: float = 0.0
    table_capacity: int = 1 << 17
    peak_probe_min_duration_ms: int = 1000
    peak_relative_precision: float = 0.01
    peak_max_probes: int = 24
    peak_confirm_runs: int = 3
    peak_latency_headroom: float = 0.5
    peak_max_confirmations: int = 6
    completion_timeout_s: float = -1.0


options = Options()

# After an interruption, how long outstanding samples may still complete (seconds).
_INTERRUPT_GRACE_S = 1.0

# --------------------------------------------------------------------------- handles

_handles: dict[int, Any] = {}
_handle_ids = itertools.count(1)
_handles_lock = threading.Lock()


@dataclass
class _SUT:
    issue: Callable[..., Any]
    flush: Callable[[], Any]
    fast: bool
    name: str
    name_cb: Callable[[], str] | None = None  # a query dispatch library names itself


@dataclass
class _QSL:
    total_sample_count: int
    performance_sample_count: int
    load: Callable[[list], Any]
    unload: Callable[[list], Any]
    name: str = "PyQSL"


def _new_handle(obj: Any) -> int:
    with _handles_lock:
        handle = next(_handle_ids)
        _handles[handle] = obj
        return handle


def _lookup(handle: int, kind: type, what: str) -> Any:
    obj = _handles.get(handle) if isinstance(handle, int) else None
    if not isinstance(obj, kind):
        raise TypeError(
            f"{what} {handle!r} is not a live handle from Construct{what}()"
        )
    return obj


def _destroy(handle: int, kind: type, what: str) -> None:
    _lookup(handle, kind, what)
    with _handles_lock:
        del _handles[handle]


def _callable(value: Any, what: str) -> Callable:
    if not callable(value):
        raise TypeError(f"{what} must be callable, got {type(value).__name__}")
    return value


def ConstructSUT(
    issue_cb: Callable[[list], Any], flush_queries_cb: Callable[[], Any]
) -> int:
    """Creates a system under test from two callbacks.

    Args:
        issue_cb: called with a list of :class:`QuerySample` per query (or per coalesced
            group of Server queries), on the thread that called StartTest.
        flush_queries_cb: called once issuing has ended.

    Returns:
        A handle for StartTest and DestroySUT.
    """
    return _new_handle(
        _SUT(
            _callable(issue_cb, "issue_cb"),
            _callable(flush_queries_cb, "flush_queries_cb"),
            False,
            "PySUT",
        )
    )


def DestroySUT(sut: int) -> None:
    """Releases a handle from ConstructSUT."""
    _destroy(sut, _SUT, "SUT")


def ConstructFastSUT(
    fast_issue_cb: Callable[[list, list], Any], flush_queries_cb: Callable[[], Any]
) -> int:
    """Like ConstructSUT, but issue gets two lists: the sample ids and the QSL indices."""
    return _new_handle(
        _SUT(
            _callable(fast_issue_cb, "fast_issue_cb"),
            _callable(flush_queries_cb, "flush_queries_cb"),
            True,
            "PyFastSUT",
        )
    )


def DestroyFastSUT(sut: int) -> None:
    """Releases a handle from ConstructFastSUT."""
    _destroy(sut, _SUT, "SUT")


def ConstructQSL(
    total_sample_count: int,
    performance_sample_count: int,
    load_samples_to_ram: Callable[[list], Any],
    unload_samples_from_ram: Callable[[list], Any],
) -> int:
    """Creates a query sample library.

    Args:
        total_sample_count: samples in the data set.
        performance_sample_count: samples that fit in memory together (the loaded set of
            a performance run).
        load_samples_to_ram: called with a list of QSL indices before a run uses them.
        unload_samples_from_ram: called with the same list afterwards.

    Returns:
        A handle for StartTest and DestroyQSL.
    """
    for name, value in (
        ("total_sample_count", total_sample_count),
        ("performance_sample_count", performance_sample_count),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TypeError(f"{name} must be an int >= 0, got {value!r}")
    return _new_handle(
        _QSL(
            total_sample_count,
            performance_sample_count,
            _callable(load_samples_to_ram, "load_samples_to_ram"),
            _callable(unload_samples_from_ram, "unload_samples_from_ram"),
        )
    )


def DestroyQSL(qsl: int) -> None:
    """Releases a handle from ConstructQSL."""
    _destroy(qsl, _QSL, "QSL")


def ConstructQDL(
    issue_cb: Callable[[list], Any],
    flush_queries_cb: Callable[[], Any],
    name_cb: Callable[[], str],
) -> int:
    """Creates a query dispatch library: a SUT whose name comes from ``name_cb``.

    MLPerf uses it to forward queries to SUTs over the network (the harness's issue_cb
    does the forwarding). StartTest takes it where it takes a SUT.

    Args:
        issue_cb: as for :func:`ConstructSUT`.
        flush_queries_cb: as for :func:`ConstructSUT`.
        name_cb: returns the SUT name for the logs; called once per test.

    Returns:
        A handle for StartTest and DestroyQDL.
    """
    return _new_handle(
        _SUT(
            _callable(issue_cb, "issue_cb"),
            _callable(flush_queries_cb, "flush_queries_cb"),
            False,
            "",
            _callable(name_cb, "name_cb"),
        )
    )


def DestroyQDL(qdl: int) -> None:
    """Releases a handle from ConstructQDL."""
    _destroy(qdl, _SUT, "QDL")


# ------------------------------------------------------------------- the active run


class _Accuracy:
    """Accuracy runs: each sample's sequence id and QSL index, and the hooks that log
    the response bytes after the native run has counted the completion."""

    def __init__(self, log: AccuracyLog) -> None:
        self.log = log
        self.samples: dict[int, tuple[int, int]] = {}  # id -> (seq_id, qsl index)
        self.first_tokens: dict[int, bytes] = {}

    def on_complete(
        self, responses: Sequence[Any], response_cb: Callable[[Any], Any] | None
    ) -> None:
        for response in responses:
            seq_qsl = self.samples.pop(response.id, None)
            if seq_qsl is None:
                continue  # not logged (sampled logging left it out)
            if response_cb is not None:
                response_cb(response)
            self.log.add(
                seq_qsl[0],
                seq_qsl[1],
                _read_bytes(response),
                token_count=response.n_tokens,
                token_data=self.first_tokens.pop(response.id, None),
            )

    def on_first_token(
        self, responses: Sequence[Any], response_cb: Callable[[Any], Any] | None
    ) -> None:
        if not self.log.needs_first_token:
            return
        for response in responses:
            if response.id not in self.samples:
                continue
            if response_cb is not None:
                response_cb(response)
            self.first_tokens[response.id] = _read_bytes(response)


def _read_bytes(response: Any) -> bytes:
    if response.size and response.data:
        return ctypes.string_at(response.data, response.size)
    return b""


# MLPerf's completion calls name no run: they feed the one StartTest is running, natively.
QuerySamplesComplete = _core.mlperf_samples_complete
FirstTokenComplete = _core.mlperf_first_token_complete
_start_lock = threading.Lock()


# ---------------------------------------------------------------------- running once


class _Test:
    """One StartTest: the handles, the logs and the sample sequence numbering."""

    def __init__(
        self,
        sut: _SUT,
        qsl: _QSL,
        detail: DetailLog,
        summary_fh: Any,
        accuracy_log: AccuracyLog,
        copy_summary: bool,
    ) -> None:
        self.sut = sut
        self.qsl = qsl
        self.detail = detail
        self.summary_fh = summary_fh
        self.accuracy_log = accuracy_log
        self.copy_summary = copy_summary
        self.next_seq_id = 0  # MLPerf numbers samples across the whole test
        # ...and draws each one's accuracy-log value from one default-seeded stream.
        self.acc_rng = _core.MlperfMt19937()
        self.sut_name = sut.name

    def load(self, indices: list) -> None:
        self.detail.log_loaded_qsl_set(indices)
        self.qsl.load(list(indices))

    def unload(self, indices: list) -> None:
        self.qsl.unload(list(indices))

    def run_once(
        self,
        eff: EffectiveSettings,
        loaded: list,
        distribution_end: int,
        *,
        accuracy: bool,
    ) -> RunFigures:
        """Issues one run over the loaded set and waits for its samples."""
        scenario = int(eff.scenario)
        target_qps = float(eff.target_qps)
        if not target_qps > 0 or not math.isfinite(target_qps):
            raise ValueError(
                f"the run's target QPS must be a positive number, got {target_qps!r} "
                "(check server_target_qps, offline_expected_qps or the expected latency)"
            )
        run = _core.MlperfRun(
            scenario=scenario,
            accuracy=accuracy,
            loaded_samples=[int(i) for i in loaded],
            sample_distribution_end=int(distribution_end),
            samples_per_query=int(eff.samples_per_query),
            target_duration_ns=int(eff.target_duration_ns),
            min_query_count=int(eff.min_query_count),
            max_query_count=int(eff.max_query_count),
            max_duration_ns=int(eff.max_duration_ns),
            max_async_queries=int(eff.max_async_queries),
            target_qps=target_qps,
            performance_issue_unique=bool(eff.performance_issue_unique),
            performance_issue_same=bool(eff.performance_issue_same),
            performance_issue_same_index=int(eff.performance_issue_same_index),
            sample_concatenate_permutation=bool(eff.sample_concatenate_permutation),
            sample_index_rng_seed=int(eff.sample_index_rng_seed),
            schedule_rng_seed=int(eff.schedule_rng_seed),
            coalesce=bool(eff.requested.server_coalesce_queries)
            and scenario == int(TestScenario.Server),
            spin_ns=int(options.spin_us * 1000),
            table_capacity=int(options.table_capacity),
        )
        use_tokens = bool(eff.use_token_latencies)
        issue = self.sut.issue
        seq_start = self.next_seq_id
        log_probability = 1.0 if accuracy else _log_probability(eff)
        logging = log_probability > 0
        if logging:
            acc = _Accuracy(self.accuracy_log)
            issue = self._numbering_issue(acc, eff, log_probability, accuracy)
            _core.mlperf_set_active(run, acc.on_complete, acc.on_first_token)
        else:
            _core.mlperf_set_active(run)
        wall_start_ns = time.time_ns()
        error: BaseException | None = None
        try:
            try:
                # The numbering wrapper takes QuerySample lists and calls a fast SUT itself.
                run.issue_all(issue, fast=self.sut.fast and not logging)
            except BaseException as exc:  # noqa: BLE001 - Ctrl-C or issue_query's error, re-raised below
                error = exc
            complete = False
            if error is None:
                try:
                    self.sut.flush()
                    complete = run.wait_all(options.completion_timeout_s)
                except BaseException as exc:  # noqa: BLE001 - Ctrl-C while draining, re-raised below
                    error = exc
            else:
                # What was measured is kept: outstanding samples get a short grace.
                complete = run.wait_all(_INTERRUPT_GRACE_S)
        finally:
            # Completions after this point are late: counted, never applied to a later run.
            _core.mlperf_set_active(None)
        counts = run.counts()
        run.drain_generator()
        # MLPerf numbers every generated sample, issued or not, and draws each one's
        # accuracy-log value as it is generated: account for the ones never issued.
        generated = counts["samples_issued"]
        if not accuracy:
            generated = run.generated_query_count * run.generated_samples_per_query
        unnumbered = seq_start + generated - self.next_seq_id
        if unnumbered > 0:
            self.next_seq_id += unnumbered
            self.acc_rng.skip_reals(unnumbered)
        if not complete:
            missing = counts["samples_issued"] - counts["samples_completed"]
            self.detail.error(
                "error_runtime",
                f"{missing} issued samples were not completed within "
                f"{options.completion_timeout_s} s; they are left out of the results",
            )
        self.detail.log_generated_queries(
            run.generated_query_count,
            run.generated_samples_per_query,
            run.generated_query_duration_ns,
        )
        if counts["ended_naturally"]:
            self.detail.log(
                "generic_message",
                "Ending naturally: Minimum query count and test duration met.",
            )
        if counts["ran_out_of_generated_queries"] and not accuracy:
            self.detail.error(
                "error_runtime",
                "Ending early: ran out of generated queries before the minimum query count and "
                "test duration were reached. Make the expected latency or target QPS in the "
                "TestSettings more accurate.",
            )
        if counts["too_many_outstanding"]:
            self.detail.error(
                "error_runtime",
                f"Ending early: too many outstanding queries (more than "
                f"{eff.max_async_queries}).",
            )
        if counts["max_query_count_reached"]:
            self.detail.error(
                "error_runtime",
                f"Ending early: max query count reached ({counts['queries_issued']} queries).",
            )
        if counts["max_duration_reached"]:
            self.detail.error(
                "error_runtime", "Ending early: max test duration reached."
            )
        if counts["unknown_completions"]:
            self.detail.error(
                "error_runtime",
                f"{counts['unknown_completions']} completions named samples that were not "
                "in flight (completed twice, or never issued)",
            )
        start = counts["start_ns"]
        self.detail.log_power(
            wall_start_ns, max(counts["max_completion_ns"] - start, 0)
        )
        multi = scenario == int(TestScenario.MultiStream)
        fig = RunFigures(
            sample_latency=Histogram._wrap(run.sample_latency()),
            sample_latency_sum_ns=counts["latency_sum_ns"],
            query_latency=Histogram._wrap(run.query_latency()) if multi else None,
            query_latency_sum_ns=counts["query_latency_sum_ns"],
            sample_count=counts["samples_completed"],
            queries_issued=counts["queries_issued"],
            samples_issued=counts["samples_issued"],
            max_latency_s=counts["max_latency_ns"] / 1e9,
            final_query_scheduled_s=counts["final_scheduled_offset_ns"] / 1e9,
            final_query_issued_s=max(counts["final_issued_ns"] - start, 0) / 1e9,
            final_query_all_samples_done_s=max(
                (counts["final_done_ns"] or counts["max_completion_ns"]) - start, 0
            )
            / 1e9,
            issue_delay=Histogram._wrap(run.issue_delay()),
            first_token_latency=Histogram._wrap(run.first_token_latency())
            if use_tokens
            else None,
            time_per_output_token=Histogram._wrap(run.time_per_output_token())
            if use_tokens
            else None,
            tokens_per_sample_sum=counts["tokens"],
            ran_out_of_generated_queries=counts["ran_out_of_generated_queries"],
            too_many_outstanding=counts["too_many_outstanding"],
            max_query_count_reached=counts["max_query_count_reached"],
            max_duration_reached=counts["max_duration_reached"],
            generated_query_count=run.generated_query_count,
            generated_samples_per_query=run.generated_samples_per_query,
            generated_query_duration_ns=run.generated_query_duration_ns,
            start_ns=start,
            end_ns=counts["max_completion_ns"],
            unknown_completions=counts["unknown_completions"],
        )
        if error is not None:
            fig.extra["interrupted"] = f"{type(error).__name__}: {error}"
            self.detail.error(
                "error_runtime",
                f"the run was interrupted by {type(error).__name__}: {error}; "
                f"{counts['samples_completed']} samples completed before it",
            )
            if not accuracy:
                self.report(eff, fig)
            raise error
        return fig

    def _numbering_issue(
        self, acc: _Accuracy, eff: EffectiveSettings, probability: float, accuracy: bool
    ) -> Callable:
        """Numbers each issued sample as MLPerf does and picks the ones whose response
        is logged: all of them in accuracy runs, else those whose accuracy-log value
        (shifted by a per-run offset drawn from accuracy_log_rng_seed) is at most
        ``probability`` (MLPerf's sampled logging, as its compliance audits use)."""
        sut = self.sut
        samples = acc.samples
        rng = self.acc_rng
        offset = _core.MlperfMt19937(int(eff.accuracy_log_rng_seed)).uniform_reals(1)[0]

        def issue(query_samples: list) -> None:
            values = rng.uniform_reals(len(query_samples))
            for s, value in zip(query_samples, values):
                shifted = value + offset
                if shifted >= 1.0:
                    shifted -= 1.0
                if accuracy or shifted <= probability:
                    samples[s.id] = (self.next_seq_id, s.index)
                self.next_seq_id += 1
            if sut.fast:
                sut.issue(
                    [s.id for s in query_samples], [s.index for s in query_samples]
                )
            else:
                sut.issue(query_samples)

        return issue

    def report(self, eff: EffectiveSettings, fig: RunFigures) -> Evaluation:
        """Writes the summary and the detail result lines of a performance run."""
        ev = evaluate(eff, fig)
        if "interrupted" in fig.extra:
            ev.valid = False
            ev.recommendations.append(
                f"The run was interrupted ({fig.extra['interrupted']})."
            )
        text = io.StringIO()
        write_summary(text, eff, fig, ev, self.sut_name)
        self.summary_fh.write(text.getvalue())
        if self.copy_summary:
            print(text.getvalue(), end="")
        write_detail_results(self.detail, eff, fig, ev)
        return ev


# ------------------------------------------------------------------------ the modes


def _log_probability(eff: EffectiveSettings) -> float:
    """The chance that a performance run logs a response (MLPerf's sampled logging)."""
    if int(eff.accuracy_log_sampling_target) > 0:
        spq = int(eff.samples_per_query)
        expected = int(
            float(eff.target_qps) * (int(eff.min_duration_ns) // 1_000_000) / 1000
        )
        minimum = int(eff.min_query_count) * spq
        if int(eff.scenario) != int(TestScenario.Offline):
            expected *= spq
        else:
            minimum = int(eff.min_sample_count)
        expected = max(expected, minimum)
        return int(eff.accuracy_log_sampling_target) / expected if expected else 1.0
    return float(eff.accuracy_log_probability)


def _performance_set(test: _Test, eff: EffectiveSettings) -> tuple[list, int]:
    sets = _loadable_sets(test, eff, int(eff.performance_sample_count))
    if not sets:
        raise ValueError("the QSL has no samples to load (total_sample_count is 0)")
    return sets[0]


def _loadable_sets(
    test: _Test, eff: EffectiveSettings, total: int
) -> list[tuple[list, int]]:
    set_size = int(eff.performance_sample_count)
    if set_size < 1:
        raise ValueError(
            "performance_sample_count is 0: give the QSL a performance sample count "
            "or set TestSettings.performance_sample_count_override"
        )
    padding = (
        int(eff.samples_per_query) - 1
        if int(eff.scenario) == int(TestScenario.MultiStream)
        else 0
    )
    sets = _core.mlperf_loadable_sets(
        total_sample_count=total,
        qsl_total_count=test.qsl.total_sample_count,
        set_size=set_size,
        padding=padding,
        qsl_rng_seed=int(eff.qsl_rng_seed),
    )
    return [(s, len(s) - padding) for s in sets]


def _run_performance(test: _Test, eff: EffectiveSettings) -> None:
    loaded, end = _performance_set(test, eff)
    test.load(loaded)
    fig = test.run_once(eff, loaded, end, accuracy=False)
    test.report(eff, fig)
    test.unload(loaded)


def _run_accuracy(test: _Test, eff: EffectiveSettings) -> None:
    for loaded, end in _loadable_sets(test, eff, int(eff.accuracy_sample_count)):
        test.load(loaded)
        test.run_once(eff, loaded, end, accuracy=True)
        test.unload(loaded)


def _with_qps(eff: EffectiveSettings, qps: float, **changes: Any) -> EffectiveSettings:
    from dataclasses import replace

    return replace(eff, target_qps=float(qps), **changes)


def _perf_constraints_met(eff: EffectiveSettings, fig: RunFigures) -> bool:
    return _judge(eff, fig)[0]


def _judge(eff: EffectiveSettings, fig: RunFigures) -> tuple[bool, int]:
    """(meets the latency bound, the target-percentile sample latency in ns)."""
    ev = evaluate(eff, fig)
    return bool(ev.perf_constraints_met) and not fig.too_many_outstanding, int(
        ev.sample_latency_target_ns
    )


def _run_find_peak(test: _Test, eff: EffectiveSettings) -> None:
    """Highest Server QPS that meets the latency bound, confirmed at full length.

    Short probes (``options.peak_probe_min_duration_ms``) find the bounds: the user's
    server_target_qps must hold, then the rate widens by (1 + boundary step size) until a
    probe fails, then bisects until the bounds are within MLPerf's decimals of precision
    or ``options.peak_relative_precision``. Short probes are optimistic (queues have
    little time to build), so the answer is run again at the full min duration, and
    lowered until such a run holds; only a rate that held at full length is reported.
    """
    detail = test.detail
    if int(eff.scenario) != int(TestScenario.Server):
        detail.error(
            "error_invalid_test_settings",
            "Finding peak performance is only supported in the Server scenario.",
        )
        return
    loaded, end = _performance_set(test, eff)
    test.load(loaded)
    try:
        probe_ms = min(
            int(options.peak_probe_min_duration_ms),
            int(eff.min_duration_ns) // 1_000_000,
        )
        probe_ns = max(probe_ms, 1) * 1_000_000
        probe = {
            "target_duration_ns": probe_ns,
            "min_duration_ns": probe_ns,
            "min_query_count": min(int(eff.min_query_count), 64),
        }
        probes = 0

        probe_latency_ns: dict[float, int] = {}

        def holds(qps: float) -> bool:
            nonlocal probes
            probes += 1
            fig = test.run_once(
                _with_qps(eff, qps, **probe),
                loaded,
                end,
                accuracy=False,
            )
            ok, latency_ns = _judge(_with_qps(eff, qps, **probe), fig)
            probe_latency_ns.setdefault(qps, latency_ns)
            detail.log(
                "generic_message",
                f"FindPeakPerformance: probe {probes} at {qps:.6f} QPS "
                f"({probe_ms} ms): {'meets' if ok else 'misses'} the latency bound",
            )
            return ok

        base = float(eff.target_qps)
        detail.log(
            "generic_message",
            f"FindPeakPerformance: checking the lower bound {base:.6f} QPS",
        )
        if not holds(base):
            # A short probe can fail by chance: the lower bound gets one full-length run,
            # and the search goes on only if that run holds.
            fig = test.run_once(eff, loaded, end, accuracy=False)
            if not _perf_constraints_met(eff, fig):
                detail.error(
                    "error_runtime",
                    "FindPeakPerformance: the initial lower bound (server_target_qps) "
                    "does not meet the performance constraints",
                )
                test.report(eff, fig)
                return
            detail.log(
                "generic_message",
                "FindPeakPerformance: the lower bound holds at full length; searching above it",
            )
        step = float(eff.requested.server_find_peak_qps_boundary_step_size)
        if not step > 0:
            step = 1.0
        decimals = int(eff.requested.server_find_peak_qps_decimals_of_precision)
        lower, upper = base, base * (1 + step)
        while probes < options.peak_max_probes and holds(upper):
            lower, upper = upper, upper * (1 + step)
        detail.log(
            "generic_message", f"FindPeakPerformance: bounds [{lower:.6f}, {upper:.6f})"
        )

        def finished(lo: float, hi: float) -> bool:
            scale = 10.0**decimals
            return (
                math.floor(lo * scale) + 1 >= math.floor(hi * scale)
                or (hi - lo) <= options.peak_relative_precision * lo
            )

        while probes < options.peak_max_probes and not finished(lower, upper):
            mid = lower + (upper - lower) / 2
            if holds(mid):
                lower = mid
            else:
                upper = mid
        # Confirm at full length; step down until full runs hold with room to spare.
        bound_ns = int(eff.target_latency_ns)
        base_latency_ns = probe_latency_ns.get(base, bound_ns)
        ceiling_ns = int(
            max(
                options.peak_latency_headroom * bound_ns,
                min(bound_ns, 2 * base_latency_ns),
            )
        )
        candidate = lower
        factor = 1.0 - max(5 * options.peak_relative_precision, 0.01)
        for attempt in range(int(options.peak_max_confirmations)):
            confirm_eff = _with_qps(eff, candidate)
            held = True
            for _ in range(max(1, int(options.peak_confirm_runs))):
                fig = test.run_once(confirm_eff, loaded, end, accuracy=False)
                held, latency_ns = _judge(confirm_eff, fig)
                # Near capacity the tail swings from run to run (a queue that builds in
                # one run drains in the next), so a rate that passes once can fail the
                # next time: the answer must pass with room to spare.
                roomy = latency_ns <= ceiling_ns
                detail.log(
                    "generic_message",
                    f"FindPeakPerformance: full-length run at {candidate:.6f} QPS: "
                    f"target-percentile latency {latency_ns} ns (ceiling {ceiling_ns}), "
                    f"{'holds' if held and roomy else 'does not hold'}",
                )
                held = held and roomy
                if not held:
                    break
            if held or attempt + 1 == int(options.peak_max_confirmations):
                if held:
                    detail.log(
                        "generic_message",
                        f"FindPeakPerformance: Found peak performance field: {candidate:.6f}",
                    )
                else:
                    detail.error(
                        "error_runtime",
                        "FindPeakPerformance: no full-length run held; "
                        f"reporting the last one, at {candidate:.6f} QPS",
                    )
                test.report(confirm_eff, fig)
                return
            candidate *= factor
    finally:
        test.unload(loaded)


# ------------------------------------------------------------------------ StartTest


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
    sut_obj = _lookup(sut, _SUT, "SUT")
    qsl_obj = _lookup(qsl, _QSL, "QSL")
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
    sut: _SUT,
    qsl: _QSL,
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
        test = _Test(
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
        eff = effective_settings(
            ts, qsl.performance_sample_count, qsl.total_sample_count
        )
        detail.log_settings(eff)
        for message in eff.setting_errors:
            detail.error("error_invalid_test_settings", message)
        try:
            mode = TestMode(int(eff.mode))
            if mode == TestMode.SubmissionRun:
                _run_accuracy(test, eff)
                _run_performance(test, eff)
            elif mode == TestMode.AccuracyOnly:
                _run_accuracy(test, eff)
            elif mode == TestMode.PerformanceOnly:
                _run_performance(test, eff)
            else:
                _run_find_peak(test, eff)
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
