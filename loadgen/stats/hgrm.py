"""HdrHistogram's percentile distribution format (``.hgrm``), the text that
``outputPercentileDistribution`` writes and HdrHistogram's plotter
(``plotFiles.html``) reads::

           Value     Percentile TotalCount 1/(1-Percentile)

           0.950 0.000000000000          1           1.00
           ...
          12.345 1.000000000000       1000
    #[Mean    =        1.234, StdDeviation   =        0.567]
    #[Max     =       12.345, Total count    =         1000]
    #[Buckets =           22, SubBuckets     =         2048]

Rows step through percentiles ``ticks_per_half_distance`` times per halving of the
distance to 100% (10%, 20%, ... 50%, 55%, ... 75%, 77.5%, ...), each at the highest
value equivalent to the bucket reached, as HdrHistogram's Java and C implementations
step. Values are divided by a scaling ratio (1e6: nanoseconds written as milliseconds).
"""

from __future__ import annotations

import math
from typing import Iterator, Tuple

from loadgen.stats.histogram import Histogram

__all__ = ["percentile_distribution", "percentile_steps"]


def _next_level(level: float, ticks_per_half_distance: int) -> float:
    """The percentile after ``level``: HdrHistogram's PercentileIterator step, with its
    whole number of halvings (the Java and C implementations truncate the logarithm)."""
    gap = 100.0 - level
    if gap <= 0:
        return level
    halvings = int(math.log(100.0 / gap) / math.log(2))
    return level + 100.0 / float(ticks_per_half_distance * 2 ** (halvings + 1))


def percentile_steps(histogram: Histogram, ticks_per_half_distance: int = 5) -> Iterator[Tuple[int, float, int]]:
    """``(value, percentile level, count at or below the value)`` for each row of the
    distribution, the last at 100%; nothing for an empty histogram.

    Raises:
        ValueError: ``ticks_per_half_distance`` < 1.
    """
    if ticks_per_half_distance < 1:
        raise ValueError(f"ticks_per_half_distance must be at least 1, got {ticks_per_half_distance}")
    total = histogram.total_count
    if total == 0:
        return
    buckets = histogram.recorded_buckets()
    level, running, value = 0.0, 0, 0
    for value, count in zip(buckets.highest_values.tolist(), buckets.counts.tolist()):
        running += count
        while 100.0 * running / total >= level:
            yield value, level, running
            level = _next_level(level, ticks_per_half_distance)
            if running >= total:  # the last bucket gives one row, then the 100% row
                break
        if running >= total:
            break
    yield value, 100.0, total


def percentile_distribution(histogram: Histogram, scaling_ratio: float = 1.0,
                            ticks_per_half_distance: int = 5) -> str:
    """The ``.hgrm`` text of ``histogram``: the percentile rows, then the mean, standard
    deviation, max, total count and layout footer. Values (and the mean, deviation and
    max) are divided by ``scaling_ratio`` and written to the histogram's significant
    figures.

    Raises:
        ValueError: ``scaling_ratio`` is not a positive number, or
            ``ticks_per_half_distance`` < 1.
    """
    if not scaling_ratio > 0 or math.isinf(scaling_ratio):
        raise ValueError(f"the value scaling ratio must be a positive number, got {scaling_ratio}")
    digits = histogram.significant_figures
    lines = ["%12s %14s %10s %14s\n\n" % ("Value", "Percentile", "TotalCount", "1/(1-Percentile)")]
    for value, level, count in percentile_steps(histogram, ticks_per_half_distance):
        scaled = value / scaling_ratio
        if level != 100.0:
            lines.append(f"{scaled:12.{digits}f} {level / 100:2.12f} {count:10d} {1 / (1 - level / 100):14.2f}\n")
        else:
            lines.append(f"{scaled:12.{digits}f} {level / 100:2.12f} {count:10d}\n")
    top = histogram.highest_equivalent_value(histogram.max) if histogram.total_count else 0
    lines.append(f"#[Mean    = {histogram.mean / scaling_ratio:12.{digits}f}, "
                 f"StdDeviation   = {histogram.stddev / scaling_ratio:12.{digits}f}]\n")
    lines.append(f"#[Max     = {top / scaling_ratio:12.{digits}f}, Total count    = {histogram.total_count:12d}]\n")
    lines.append(f"#[Buckets = {histogram.bucket_count:12d}, SubBuckets     = {histogram.sub_bucket_count:12d}]\n")
    return "".join(lines)
