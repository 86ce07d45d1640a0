"""An MLPerf LoadGen-compatible API on loadgen's native engine.

A harness written for the MLPerf LoadGen Python module runs unchanged after one edit::

    import loadgen.mlperf as lg     # was: import mlperf_loadgen as lg

It gets the same queries (same sample indices, order and count for the same settings and
seeds), the same validity rules and MLPerf's log files, with less overhead per query and
memory that does not grow with the length of the run; the detail log adds loadgen's own
figures (issue delay, HDR histograms) under ``loadgen_*`` keys. What is not supported
raises NotImplementedError naming it. Knobs MLPerf has no setting for are in
:data:`options`.
"""

from __future__ import annotations

from .._core import QuerySample, QuerySampleResponse
from .handles import (
    ConstructFastSUT,
    ConstructQDL,
    ConstructQSL,
    ConstructSUT,
    DestroyFastSUT,
    DestroyQDL,
    DestroyQSL,
    DestroySUT,
)
from .run_options import options
from .runtime import (
    FirstTokenComplete,
    QuerySamplesComplete,
    StartTest,
    StartTestWithLogSettings,
)
from .settings import (
    LoggingMode,
    LogOutputSettings,
    LogSettings,
    TestMode,
    TestScenario,
    TestSettings,
)


class VectorQuerySample(list):
    """A list of QuerySample (MLPerf exposes this name for its vector type)."""


class VectorQuerySampleResponse(list):
    """A list of QuerySampleResponse (MLPerf exposes this name for its vector type)."""


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
    "LogOutputSettings",
    "LogSettings",
    "LoggingMode",
    "QuerySample",
    "QuerySampleResponse",
    "QuerySamplesComplete",
    "StartTest",
    "StartTestWithLogSettings",
    "TestMode",
    "TestScenario",
    "TestSettings",
    "VectorQuerySample",
    "VectorQuerySampleResponse",
    "options",
]
