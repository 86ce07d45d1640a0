"""What :func:`loadgen.run` returns: a :class:`Result`, the engine's measurements with the
verdict, the summary and the result document that ``loadgen run`` gives.

Two ways to run, both through :func:`loadgen.run`:

- with :class:`~loadgen.EngineSettings` (``loadgen.run(settings, sut)``): the engine
  alone; the verdict is the one the matching scenario gives (``poisson``, ``constant``,
  ``concurrency``, ``ramp``, ``trace`` or ``offline``, by ``settings.mode``);
- with ``loadgen run``'s options (``loadgen.run(sut=model, scenario="poisson",
  target_qps=200, duration_s=10)``, or a :class:`~loadgen.options.RunOptions`): the run
  the command makes (:func:`loadgen.runner.run_benchmark`), ``--fail-if``, ``--slo``,
  ``--latency-bound-ms`` and every other option included, against a Python SUT or a
  ``--sut`` string.

Side effects: none on the process unless asked. No signal handler is installed, the
calling thread's CPU affinity is left alone (``pin_cpus``/``--pin`` pin only the threads
the run starts), ``sys.setswitchinterval`` is not touched, and the garbage collector is
not frozen (``freeze_gc=True`` asks for what ``loadgen run`` does). Any thread may call
it, a web server's handler thread included; several runs may go on at once, each with
its own engine (they share the machine's CPUs, which their verdicts then show).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from loadgen.engine.engine import Engine, RunResult
from loadgen.engine.settings import EngineSettings
from loadgen.units import ns_to_s

if TYPE_CHECKING:
    import pandas as pd

    from loadgen.options import RunOptions
    from loadgen.scenarios import Scenario

__all__ = ["Result"]

# loadgen run's output options: an embedded run saves with Result.save() instead.
_OUTPUT_OPTIONS = ("output", "json", "quiet", "no_html")

# The scenario whose rules judge an engine run of each mode.
_SCENARIO_OF_MODE = {"poisson": "poisson", "constant": "constant", "closed": "concurrency", "stages": "ramp",
                     "trace": "trace", "offline": "offline"}


@dataclasses.dataclass
class Result(RunResult):
    """One run: what the engine measured (every :class:`~loadgen.engine.RunResult`
    attribute: ``counts``, ``latency`` ...) and its verdict.

    :attr:`valid`, :attr:`reasons`, :meth:`summary` and :meth:`to_dict` come from the
    run's result document (``loadgen.result/1``, what ``loadgen run --json`` prints),
    built by the same code as the command's; for a run from engine settings it is built
    on first use.
    """

    _document: Optional[Dict[str, Any]] = dataclasses.field(default=None, repr=False, compare=False)
    _sut_name: str = dataclasses.field(default="python", repr=False, compare=False)
    _started_wall_s: float = dataclasses.field(default=0.0, repr=False, compare=False)

    @classmethod
    def of(cls, measured: RunResult, **extra: Any) -> Result:
        """A Result holding ``measured``'s figures (and ``extra``, this class's own fields)."""
        return cls(**{f.name: getattr(measured, f.name) for f in dataclasses.fields(RunResult)}, **extra)

    # ------------------------------------------------------------------ verdict

    @property
    def document(self) -> Dict[str, Any]:
        """The result document (not a copy: see :meth:`to_dict`)."""
        if self._document is None:
            self._document = _engine_document(self)
        return self._document

    @property
    def valid(self) -> bool:
        """VALID (True) or INVALID, as ``loadgen run`` says it first."""
        return bool(self.document["valid"])

    @property
    def passed(self) -> bool:
        """Valid, and every ``fail_if``/``require`` threshold met: ``loadgen run``'s exit 0."""
        return self.valid and all(t["passed"] for t in self.document.get("thresholds", []))

    @property
    def reasons(self) -> List[str]:
        """Why the run is INVALID (empty when valid), as the summary lists them."""
        return list(self.document["invalid_reasons"])

    @property
    def warnings(self) -> List[str]:
        """The diagnosis (which side limited the run) and the warnings the summary shows,
        each as 'label: text'; they do not make a run invalid."""
        from loadgen.results.render import diagnosis_items

        return [f"{label}: {text}" for label, text in diagnosis_items(self.document)]

    @property
    def metric(self) -> Dict[str, Any]:
        """The scenario's headline figure: ``{"name", "value", "unit"}``."""
        return dict(self.document["metric"])

    def summary(self) -> str:
        """The text summary ``loadgen run`` prints (VALID/INVALID and the reasons first)."""
        from loadgen.results.render import render_summary

        return render_summary(self.document)

    def verdict(self) -> Dict[str, Any]:
        """A small JSON-ready verdict: ``valid``, ``passed``, ``reasons``, ``warnings``,
        ``metric``, ``counts``, latency percentiles in ns, ``thresholds``."""
        doc = self.document
        latency = doc.get("latency_ns", {})
        return {
            "valid": self.valid, "passed": self.passed, "reasons": self.reasons, "warnings": self.warnings,
            "scenario": doc["scenario"], "metric": self.metric, "duration_s": doc["duration_s"],
            "counts": {k: doc["counts"][k] for k in ("issued", "completed", "failed", "timed_out", "cancelled")},
            "latency_ns": {k: latency.get(k) for k in ("p50", "p90", "p99", "max")},
            "thresholds": copy.deepcopy(doc.get("thresholds", [])),
        }

    def to_dict(self) -> Dict[str, Any]:
        """A copy of the result document (``loadgen.result/1``)."""
        return copy.deepcopy(self.document)

    def to_frame(self, timeseries: bool = False) -> pd.DataFrame:
        """A pandas DataFrame: one row of flattened keys, as :func:`loadgen.load_results`
        gives a result file; with ``timeseries``, one row per interval, as
        :func:`loadgen.results.load_timeseries` does.

        Raises:
            ImportError: pandas is not installed (``pip install pandas``).
        """
        try:
            import pandas
        except ImportError:
            raise ImportError("Result.to_frame needs pandas: pip install pandas") from None
        from loadgen.results.render import flatten, timeseries_rows

        if timeseries:
            return pandas.DataFrame(timeseries_rows(self.document))
        return pandas.DataFrame([flatten(self.document)])

    def save(self, directory: str) -> List[str]:
        """Writes result.json, summary.txt, latency.hlog and a results.csv row in
        ``directory``, as ``loadgen run --output`` does (without the HTML report);
        returns the paths."""
        from loadgen.results import write_outputs

        return write_outputs(self.document, directory)


# ---------------------------------------------------------------------- running

def run_options(options: RunOptions, sut: Any = None, *, freeze_gc: bool = False,
                stop_requested: Optional[Callable[[], bool]] = None) -> Result:
    """The run ``loadgen run`` makes with ``options``, against ``sut``: a Python SUT (any
    form :func:`loadgen.sut.classify_sut` accepts), or None for ``options.sut`` (a
    ``--sut`` string: a URL, ``demo``, ``module:attr``). What :func:`loadgen.run` does
    when given options. ``stop_requested`` (polled a few times a second) stops the run
    early when it returns True; the result is then interrupted and invalid.

    Raises:
        ValueError: an option or the SUT is unusable; the message names it.
        loadgen.runner.ResultError: the run ended but its document could not be built;
            its ``doc`` holds what was measured.
    """
    from loadgen.runner import plan, prepare, run_benchmark

    for name in _OUTPUT_OPTIONS:
        if getattr(options, name):
            raise ValueError(f"{name} is an option of the loadgen command, not of loadgen.run: "
                             "save an embedded run's files with Result.save(directory)")
    if sut is None:
        prepared = prepare(options)
    else:
        if isinstance(sut, str):
            raise ValueError("give a --sut string as the sut option (sut='http://...'), not with a Python SUT")
        prepared = (*plan(options), sut)
    measured: List[RunResult] = []
    started = time.time()
    doc = run_benchmark(options, given=_given(options), prepared=prepared, freeze_gc=freeze_gc,
                        on_measured=measured.append, stop_requested=stop_requested)
    return Result.of(measured[0], _document=doc, _sut_name=options.sut, _started_wall_s=started)


def options_of(sut: Any, overrides: Dict[str, Any]) -> Tuple[RunOptions, Any]:
    """The :class:`~loadgen.options.RunOptions` of ``loadgen.run(sut=..., scenario=...,
    **options)`` and the SUT to run: option values are checked as the command checks
    its flags (the environment and config files are not read). A Python SUT is named
    ``sut_name`` in the document (default: its qualified name).

    Raises:
        ValueError: an unknown option, or a bad value; the message names it.
    """
    from loadgen.cli.common import UsageError, check_applies, check_thresholds
    from loadgen.options import OPTION_SPECS, resolve

    flags = dict(overrides)
    name = flags.pop("sut_name", None)
    known = {spec.name for spec in OPTION_SPECS}
    unknown = sorted(set(flags) - known)
    if unknown:
        raise ValueError(f"unknown option(s): {', '.join(unknown)} (loadgen.run takes loadgen run's options, "
                         "by their long names with underscores, like target_qps)")
    if isinstance(sut, str):
        flags["sut"], sut = sut, None
    elif sut is not None:
        flags["sut"] = name or getattr(sut, "__qualname__", None) or type(sut).__name__
    options, given = resolve(flags, {})
    try:
        check_thresholds(options)
        check_applies(options, flags, given)
    except UsageError as e:
        raise ValueError(str(e)) from None
    return options, sut


def _given(options: RunOptions) -> Dict[str, Any]:
    """The options that differ from the defaults: what the document records as given."""
    from loadgen.options import RunOptions

    default = RunOptions()
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
            if getattr(options, f.name) != getattr(default, f.name)}


def run_engine(settings: EngineSettings, sut: Any) -> Result:
    """One engine run: :meth:`loadgen.Engine.run`, as a :class:`Result`."""
    engine = Engine(settings, sut)
    clock_offset_s = time.time() - ns_to_s(time.monotonic_ns())  # the wall clock minus the engine's
    measured = engine.run()
    started = clock_offset_s + ns_to_s(engine.start_ns) if engine.start_ns else time.time()
    name = getattr(sut, "__qualname__", None) or type(sut).__name__
    return Result.of(measured, _sut_name=name, _started_wall_s=started)


# ---------------------------------------------------------- an engine run's verdict

def _engine_document(result: Result) -> Dict[str, Any]:
    """The result document of a run from engine settings, judged by the scenario of its
    mode with the options that describe those settings."""
    from loadgen.results.document import build_document

    scenario, options = _engine_options(result.settings, result._sut_name)
    return build_document(scenario, options, result, interrupted=result.interrupted, given={},
                          started_wall=result._started_wall_s)


def _engine_options(s: EngineSettings, sut_name: str) -> Tuple[Scenario, RunOptions]:
    """The scenario of ``s.mode`` and the effective options that make those settings (as
    far as options can say them: the engine's own knobs, like ``batch_max``, have none)."""
    from loadgen.options import RunOptions
    from loadgen.scenarios import get_scenario
    from loadgen.units import NS_PER
    from loadgen.workers import stages_text

    scenario = get_scenario(_SCENARIO_OF_MODE[s.mode])
    bound_ms = s.latency_bounds_ns[0] / NS_PER["ms"] if s.latency_bounds_ns else None
    o = RunOptions(
        scenario=scenario.name, sut=sut_name, target_qps=s.target_qps, duration_s=s.duration_s,
        query_count=s.query_count, min_duration_s=s.min_duration_s, min_query_count=s.min_query_count,
        samples_per_query=s.samples_per_query, sample_count=s.sample_count, sample_order=s.sample_order,
        concurrency=s.concurrency, max_in_flight=s.max_in_flight, burstiness=s.burstiness,
        stages=stages_text(s.stages) if s.stages else None, poisson_arrivals=s.stages_poisson,
        trace="(engine trace_offsets_ns)" if s.mode == "trace" else None,
        schedule_seed=s.schedule_seed, sample_seed=s.sample_seed, spin_us=s.spin_us, pin_cpus=list(s.pin_cpus),
        inline_dispatch=s.inline_dispatch, timeout_ms=s.timeout_ms, grace_s=s.grace_s, interval_s=s.interval_s,
        significant_figures=s.significant_figures, latency_bound_ms=bound_ms, warmup_s=s.warmup_s,
        ramp_up_s=s.ramp_up_s, sched_slice_us=s.sched_slice_us,
    )
    return scenario, scenario.effective(o)
