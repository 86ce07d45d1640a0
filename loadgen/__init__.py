"""loadgen: a load generator for machine-learning inference with native HDR histograms.

The public names are imported on first use (PEP 562), so that ``import loadgen`` and the
command line's ``--version`` and ``--help`` load neither numpy nor the native extension.
``from loadgen import Histogram`` and ``loadgen.Histogram`` work as before; the modules
behind a name load when it is first asked for. The native extension (``loadgen._core``)
loads with the first name that needs it, and, where it is missing, says how to build it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, List

from loadgen._version import __version__

if TYPE_CHECKING:  # what the lazy names are, for type checkers
    from loadgen.engine import Engine, EngineSettings, RunResult, load_trace, run
    from loadgen.result import Result
    from loadgen.results import load_results
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
    from loadgen.sut import Batch, DemoSUT, FixedDelaySUT, NullSUT
    from loadgen.sweep import load_sweep

# public name -> the module it comes from
_LAZY: Dict[str, str] = {
    "Batch": "loadgen.sut",
    "DemoSUT": "loadgen.sut",
    "FixedDelaySUT": "loadgen.sut",
    "NullSUT": "loadgen.sut",
    "Engine": "loadgen.engine",
    "EngineSettings": "loadgen.engine",
    "RunResult": "loadgen.engine",
    "load_trace": "loadgen.engine",
    "run": "loadgen.engine",
    "Result": "loadgen.result",
    "load_results": "loadgen.results",
    "load_sweep": "loadgen.sweep",
    "DEFAULT_HIGHEST_TRACKABLE_VALUE": "loadgen.stats.histogram",
    "DEFAULT_PERCENTILES": "loadgen.stats.histogram",
    "HdrDecodeError": "loadgen.stats.histogram",
    "Histogram": "loadgen.stats.histogram",
    "RecordedBuckets": "loadgen.stats.histogram",
    "HistogramLogError": "loadgen.stats.hdrlog",
    "HistogramLogReader": "loadgen.stats.hdrlog",
    "HistogramLogWriter": "loadgen.stats.hdrlog",
    "LogEntry": "loadgen.stats.hdrlog",
    "read_log": "loadgen.stats.hdrlog",
}

__all__ = [
    "Batch",
    "DemoSUT",
    "Engine",
    "EngineSettings",
    "FixedDelaySUT",
    "NullSUT",
    "Result",
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


def _core_missing(exc: ImportError) -> ImportError:
    """The error for a native extension that does not load: how to build or reinstall it."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(here, os.pardir, "setup.py")):
        hint = (
            f"This is the unbuilt source tree ({here}), imported because Python puts the "
            "current directory first: build it in place with `pip install -e .` (or "
            "`python setup.py build_ext --inplace`), or run from another directory to use "
            "an installed loadgen."
        )
    else:
        hint = "Reinstall loadgen for this Python (`pip install --force-reinstall loadgen`)."
    return ImportError(
        f"loadgen's native extension (loadgen._core) is not available. {hint} "
        f"Original error: {exc}"
    )


def __getattr__(name: str) -> Any:
    # `from loadgen import _core` (as every module that needs it does) asks for the
    # attribute before importing the submodule, so a missing or broken build shows here.
    if name == "_core":
        try:
            return importlib.import_module("loadgen._core")
        except ImportError as exc:
            raise _core_missing(exc) from exc
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'loadgen' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
