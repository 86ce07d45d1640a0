"""One StartTest: its logs, MLPerf's sample numbering, and runs of the native issue loop.

The native issue loop (``loadgen._core.MlperfRun``) yields the queries MLPerf's LoadGen
would generate for the same settings and seeds, issues them on the thread that called
StartTest (no hand-off to another thread), and counts completions per sample, wait-free,
from any thread. A :class:`Session` runs it once per :meth:`~Session.run_once` and
reports a performance run through :mod:`.evaluate`, :mod:`.summary` and :mod:`.detail_log`.
"""

from __future__ import annotations

import ctypes
import io
import math
import time
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple

from .. import _core
from ..stats.histogram import Histogram
from ..units import NS_PER, ms_to_s, ns_to_s, us_to_ns
from .accuracy_log import AccuracyLog
from .detail_log import DetailLog, write_detail_results
from .effective import EffectiveSettings
from .evaluate import Evaluation, evaluate
from .figures import RunFigures
from .handles import QslHandle, SutHandle
from .run_options import options
from .settings import TestScenario
from .summary import write_summary

__all__ = ["Session"]

# After an interruption, how long outstanding samples may still complete (seconds).
_INTERRUPT_GRACE_S = 1.0


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



class Session:
    """One StartTest: the handles, the logs and the sample sequence numbering."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        sut: SutHandle,
        qsl: QslHandle,
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
        run = _new_run(eff, loaded, distribution_end, accuracy)
        seq_start = self.next_seq_id
        error, complete, wall_start_ns = self._issue_and_wait(run, eff, accuracy)
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
        self._log_run_end(run, counts, eff, complete, accuracy)
        self.detail.log_power(wall_start_ns, max(counts["max_completion_ns"] - counts["start_ns"], 0))
        fig = _figures(run, counts, eff)
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

    def _issue_and_wait(
        self, run: Any, eff: EffectiveSettings, accuracy: bool
    ) -> tuple[BaseException | None, bool, int]:
        """(the error that ended issuing or None, whether every sample completed, the
        wall-clock start in ns)."""
        issue = self.sut.issue
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
            except BaseException as exc:  # Ctrl-C or issue_query's error, re-raised by run_once
                error = exc
            complete = False
            if error is None:
                try:
                    self.sut.flush()
                    complete = run.wait_all(options.completion_timeout_s)
                except BaseException as exc:  # Ctrl-C while draining, re-raised by run_once
                    error = exc
            else:
                # What was measured is kept: outstanding samples get a short grace.
                complete = run.wait_all(_INTERRUPT_GRACE_S)
        finally:
            # Completions after this point are late: counted, never applied to a later run.
            _core.mlperf_set_active(None)
        return error, complete, wall_start_ns

    def _log_run_end(
        self, run: Any, counts: dict, eff: EffectiveSettings, complete: bool, accuracy: bool
    ) -> None:
        """The detail-log lines on how issuing ended and what did not complete."""
        detail = self.detail
        if not complete:
            missing = counts["samples_issued"] - counts["samples_completed"]
            detail.error(
                "error_runtime",
                f"{missing} issued samples were not completed within "
                f"{options.completion_timeout_s} s; they are left out of the results",
            )
        detail.log_generated_queries(
            run.generated_query_count, run.generated_samples_per_query, run.generated_query_duration_ns
        )
        if counts["ended_naturally"]:
            detail.log("generic_message", "Ending naturally: Minimum query count and test duration met.")
        errors = []
        if counts["ran_out_of_generated_queries"] and not accuracy:
            errors.append(
                "Ending early: ran out of generated queries before the minimum query count and "
                "test duration were reached. Make the expected latency or target QPS in the "
                "TestSettings more accurate."
            )
        if counts["too_many_outstanding"]:
            errors.append(f"Ending early: too many outstanding queries (more than {eff.max_async_queries}).")
        if counts["max_query_count_reached"]:
            errors.append(f"Ending early: max query count reached ({counts['queries_issued']} queries).")
        if counts["max_duration_reached"]:
            errors.append("Ending early: max test duration reached.")
        if counts["unknown_completions"]:
            errors.append(
                f"{counts['unknown_completions']} completions named samples that were not "
                "in flight (completed twice, or never issued)"
            )
        for message in errors:
            detail.error("error_runtime", message)

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




def _log_probability(eff: EffectiveSettings) -> float:
    """The chance that a performance run logs a response (MLPerf's sampled logging)."""
    if int(eff.accuracy_log_sampling_target) > 0:
        spq = int(eff.samples_per_query)
        expected = int(
            float(eff.target_qps) * ms_to_s(int(eff.min_duration_ns) // NS_PER["ms"])
        )
        minimum = int(eff.min_query_count) * spq
        if int(eff.scenario) != int(TestScenario.Offline):
            expected *= spq
        else:
            minimum = int(eff.min_sample_count)
        expected = max(expected, minimum)
        return int(eff.accuracy_log_sampling_target) / expected if expected else 1.0
    return float(eff.accuracy_log_probability)


def _new_run(eff: EffectiveSettings, loaded: list, distribution_end: int, accuracy: bool) -> Any:
    """The native issue loop for one run over the loaded set."""
    scenario = int(eff.scenario)
    target_qps = float(eff.target_qps)
    if not target_qps > 0 or not math.isfinite(target_qps):
        raise ValueError(
            f"the run's target QPS must be a positive number, got {target_qps!r} "
            "(check server_target_qps, offline_expected_qps or the expected latency)"
        )
    bounds = _bounds_ns(eff)
    return _core.MlperfRun(
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
        spin_ns=us_to_ns(options.spin_us),
        table_capacity=int(options.table_capacity),
        latency_bounds_ns=bounds.latency,
        ttft_bounds_ns=bounds.ttft,
        tpot_bounds_ns=bounds.tpot,
    )


class _Bounds(NamedTuple):
    """Bounds (ns) the native run counts exactly: sample latency, TTFT, TPOT."""

    latency: list[int]
    ttft: list[int]
    tpot: list[int]


def _bounds_ns(eff: EffectiveSettings) -> _Bounds:
    """Server: the bounds the native run counts exactly as it records: the target latency
    (sample latencies and, as MLPerf counts its over-latency first tokens, first tokens),
    and, in token runs, the TTFT and TPOT bounds."""
    if int(eff.scenario) != int(TestScenario.Server):
        return _Bounds([], [], [])
    target = int(getattr(eff, "target_latency_ns", 0))
    ttft = [target]
    tpot = []
    if getattr(eff, "use_token_latencies", False):
        ttft.append(int(eff.server_ttft_latency))
        tpot.append(int(eff.server_tpot_latency))
    return _Bounds(_usable([target]), _usable(ttft), _usable(tpot))


def _usable(bounds: list[int]) -> list[int]:
    """The distinct bounds the native run can count (a bound below 1 ns is never met)."""
    return sorted({b for b in bounds if b >= 1})


def _over(bounds: list[int], counts: list[int]) -> dict[int, int]:
    return dict(zip(bounds, counts))


def _figures(run: Any, counts: dict, eff: EffectiveSettings) -> RunFigures:
    """What the run measured, from the native run and its counts."""
    start = counts["start_ns"]
    scenario = int(eff.scenario)
    use_tokens = bool(eff.use_token_latencies)
    multi = scenario == int(TestScenario.MultiStream)
    bounds = _bounds_ns(eff)
    rec = run.recorder
    return RunFigures(
        sample_latency=Histogram.from_core(rec.latency()),
        sample_latency_sum_ns=counts["latency_sum_ns"],
        query_latency=Histogram.from_core(rec.query_latency()) if multi else None,
        query_latency_sum_ns=counts["query_latency_sum_ns"],
        sample_count=counts["samples_completed"],
        queries_issued=counts["queries_issued"],
        samples_issued=counts["samples_issued"],
        max_latency_s=ns_to_s(counts["max_latency_ns"]),
        final_query_scheduled_s=ns_to_s(counts["final_scheduled_offset_ns"]),
        final_query_issued_s=ns_to_s(max(counts["final_issued_ns"] - start, 0)),
        final_query_all_samples_done_s=ns_to_s(
            max((counts["final_done_ns"] or counts["max_completion_ns"]) - start, 0)
        ),
        issue_delay=Histogram.from_core(rec.issue_delay()),
        first_token_latency=Histogram.from_core(rec.ttft())
        if use_tokens
        else None,
        time_per_output_token=Histogram.from_core(rec.tpot())
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
        latency_over=_over(bounds.latency, rec.over_bound()),
        ttft_over=_over(bounds.ttft, rec.over_ttft_bound()),
        tpot_over=_over(bounds.tpot, rec.over_tpot_bound()),
        out_of_range=counts["out_of_range"],
        first_token_out_of_range=counts["first_token_out_of_range"],
    )
