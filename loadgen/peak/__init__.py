"""Peak search: the highest rate, or the concurrency where throughput stops growing, that
a SUT sustains within a latency bound.

:mod:`loadgen.peak.search` is the search itself (bracket widening, bisection, confirmation
with step-down), pure logic over probe functions, shared with ``loadgen.mlperf``'s
FindPeakPerformance. :mod:`loadgen.peak.driver` runs it over real runs
(:func:`~loadgen.peak.driver.find_peak`, what ``loadgen find-peak`` calls).
"""
