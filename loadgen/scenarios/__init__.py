"""Scenarios: each picks a schedule, a query shape, its metric and its validity rules.

MLPerf's four (``single-stream``, ``multi-stream``, ``server``, ``offline``) keep MLPerf's
meaning; the others (``constant``, ``poisson``, ``concurrency``, ``ramp``, ``trace``) are
the load patterns network users expect.
"""

from __future__ import annotations

from typing import Dict

from loadgen.scenarios.base import Scenario
from loadgen.scenarios.mlperf import MultiStream, Offline, Server, SingleStream
from loadgen.scenarios.network import Concurrency, Constant, Poisson, Ramp, Trace

__all__ = ["SCENARIOS", "Scenario", "get_scenario"]

SCENARIOS: Dict[str, Scenario] = {
    s.name: s
    for s in (
        SingleStream(), MultiStream(), Server(), Offline(),
        Constant(), Poisson(), Concurrency(), Ramp(), Trace(),
    )
}


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; ValueError listing the names otherwise."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}") from None
