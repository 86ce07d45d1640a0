"""loadgen: a load generator for machine-learning inference with native HDR histograms."""

from __future__ import annotations

try:
    from loadgen import _core  # noqa: F401
except ImportError as exc:  # pragma: no cover - only seen in an unbuilt source tree
    import os as _os

    _here = _os.path.dirname(_os.path.abspath(__file__))
    if _os.path.exists(_os.path.join(_here, _os.pardir, "setup.py")):
        _hint = (
            f"This is the unbuilt source tree ({_here}), imported because Python puts the "
            "current directory first: build it in place with `pip install -e .` (or "
            "`python setup.py build_ext --inplace`), or run from another directory to use "
            "an installed loadgen."
        )
    else:
        _hint = "Reinstall loadgen for this Python (`pip install --force-reinstall loadgen`)."
    raise ImportError(
        f"loadgen's native extension (loadgen._core) is not available. {_hint} "
        f"Original error: {exc}"
    ) from exc

from loadgen.engine import Engine, EngineSettings, RunResult, load_trace, run
from loadgen.stats.hdrlog import (
    HistogramLogError,
    HistogramLogReader,
    HistogramLogWriter,
    LogEntry,
    read_log,
)
from loadgen.stats.histogram import (
    DEFAULT_HIGHEST_TRACKABLE_VALUE,
    DEFAULT_PERCENTILES,
    HdrDecodeError,
    Histogram,
    RecordedBuckets,
)

from loadgen.results import load_results
from loadgen.sweep import load_sweep
from loadgen.sut import Batch, DemoSUT, FixedDelaySUT, NullSUT

from loadgen._version import __version__

__all__ = [
    "Batch",
    "DemoSUT",
    "Engine",
    "EngineSettings",
    "FixedDelaySUT",
    "NullSUT",
    "RunResult",
    "load_results",
    "load_sweep",
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
