"""loadgen: a load generator for machine-learning inference with native HDR histograms."""

from __future__ import annotations

try:
    from loadgen import _core  # noqa: F401
except ImportError as exc:  # pragma: no cover - only seen in an unbuilt source tree
    raise ImportError(
        "loadgen's native extension (loadgen._core) is not built or does not match this "
        "Python. Install the package with `pip install .` from the source tree (or "
        "`python setup.py build_ext --inplace` for a development checkout). "
        f"Original error: {exc}"
    ) from exc

from loadgen.engine import Engine, EngineSettings, RunResult, load_trace, run
from loadgen.hdrlog import (
    HistogramLogError,
    HistogramLogReader,
    HistogramLogWriter,
    LogEntry,
    read_log,
)
from loadgen.histogram import (
    DEFAULT_HIGHEST_TRACKABLE_VALUE,
    DEFAULT_PERCENTILES,
    HdrDecodeError,
    Histogram,
    RecordedBuckets,
)

from loadgen.results import load_results
from loadgen.sut import Batch, DemoSUT, FixedDelaySUT, NullSUT

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "DemoSUT",
    "Engine",
    "EngineSettings",
    "FixedDelaySUT",
    "NullSUT",
    "RunResult",
    "load_results",
    "load_trace",
    "run",
    "DEFAULT_HIGHEST_TRACKABLE_VALUE",
    "DEFAULT_PERCENTILES",
    "HdrDecodeError",
    "Histogram",
    "HistogramLogError",
    "HistogramLogReader",
    "HistogramLogWriter",
    "LogEntry",
    "RecordedBuckets",
    "__version__",
    "read_log",
]
