"""Peak search: the highest rate, or the concurrency where throughput stops growing, that
a SUT sustains within a latency bound.

:mod:`loadgen.peak.search` is the search itself (bracket widening, bisection, confirmation
with step-down), pure logic over probe functions, shared with ``loadgen.mlperf``'s
FindPeakPerformance. :mod:`loadgen.peak.driver` runs it over real runs
(:func:`~loadgen.peak.driver.find_peak`, what ``loadgen find-peak`` calls).
"""

from typing import Any

__all__ = ["PeakSearch", "PeakSettings", "find_peak"]


def __getattr__(name: str) -> Any:
    # The driver (and the runner under it) loads on first use: loadgen.mlperf imports
    # loadgen.peak.search alone.
    if name in __all__:
        from loadgen.peak import driver

        return getattr(driver, name)
    raise AttributeError(f"module 'loadgen.peak' has no attribute {name!r}")
