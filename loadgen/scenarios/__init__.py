"""Scenarios: each picks a schedule, a query shape, its metric and its validity rules.

MLPerf's four (``single-stream``, ``multi-stream``, ``server``, ``offline``) keep MLPerf's
meaning; the others (``constant``, ``poisson``, ``concurrency``, ``ramp``, ``trace``) are
the load patterns network users expect.
"""

from __future__ import annotations

from typing import Dict, Iterable, List

from loadgen.scenarios.base import SCENARIO_OPTIONS, Scenario
from loadgen.scenarios.mlperf import MultiStream, Offline, Server, SingleStream
from loadgen.scenarios.network import Concurrency, Constant, Poisson, Ramp, Trace

__all__ = ["SCENARIOS", "Scenario", "get_scenario", "options_not_applying"]

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


def options_not_applying(scenario: str, names: Iterable[str]) -> List[str]:
    """For each of the option names ``names`` that ``scenario`` does not read, a sentence
    naming the option (as a flag) and the scenarios it applies to."""
    s = get_scenario(scenario)
    out = []
    for name in names:
        if name not in SCENARIO_OPTIONS or name in s.uses:
            continue
        users = [t.name for t in SCENARIOS.values() if name in t.uses]
        out.append(f"--{name.replace('_', '-')} does not apply to the {scenario} scenario "
                   f"(it applies to {', '.join(users)})")
    return out
