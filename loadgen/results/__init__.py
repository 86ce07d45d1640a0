"""Results: the result document of a run (:mod:`.document`), ``--fail-if``/``--require``
thresholds (:mod:`.thresholds`), renderers (:mod:`.render`: text summary, CSV, HDR log)
and result files (:mod:`.files`: writing a run's outputs, reading documents back)."""

from loadgen.results.document import SCHEMA, build_document, environment, histogram_summary
from loadgen.results.files import load_result, load_results, load_timeseries, result_files, write_outputs
from loadgen.results.render import render_summary
from loadgen.results.thresholds import THRESHOLD_METRICS, ThresholdError, evaluate_thresholds, parse_threshold

__all__ = [
    "SCHEMA",
    "THRESHOLD_METRICS",
    "ThresholdError",
    "build_document",
    "environment",
    "evaluate_thresholds",
    "histogram_summary",
    "load_result",
    "load_results",
    "load_timeseries",
    "parse_threshold",
    "render_summary",
    "result_files",
    "write_outputs",
]
