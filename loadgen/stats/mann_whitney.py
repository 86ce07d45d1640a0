"""The two-sided Mann-Whitney U test (Wilcoxon rank-sum) of two independent samples.

It asks whether values drawn from one sample tend to be larger than values drawn from
the other, without assuming any distribution. The p-value is exact (the U statistic's
distribution counted over all orderings) when there are no ties and one sample has at
most 8 values, and otherwise the normal approximation with the tie correction and a
continuity correction: the same choices, and the same numbers, as
``scipy.stats.mannwhitneyu(x, y, alternative="two-sided")``.
"""

from __future__ import annotations

import math
from typing import List, NamedTuple, Sequence, Tuple

__all__ = ["EXACT_MAX_N", "MannWhitney", "mann_whitney_u"]

#: The exact distribution is used when there are no ties and one sample is at most this
#: long (scipy's rule); the normal approximation otherwise.
EXACT_MAX_N = 8


class MannWhitney(NamedTuple):
    """The result of :func:`mann_whitney_u`.

    Attributes:
        u: the U statistic of the first sample (how many (x, y) pairs have x > y, ties
            counting one half).
        p_value: the two-sided p-value, in 0..1.
        method: ``"exact"`` or ``"asymptotic"``.
    """

    u: float
    p_value: float
    method: str


def _ranks(values: Sequence[float]) -> Tuple[List[float], List[int]]:
    """Average ranks (1-based) of ``values`` in their order, and the size of each group
    of tied values."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    ties: List[int] = []
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2 + 1
        ties.append(end - start + 1)
        start = end + 1
    return ranks, ties


def _exact_sf(u: int, m: int, n: int) -> float:
    """P(U >= u) under the null hypothesis, for samples of ``m`` and ``n`` values with no
    ties: the coefficients of the Gaussian binomial [m + n choose m] in q, counted exactly."""
    m, n = min(m, n), max(m, n)
    coefficients = [1]  # the product of (1 - q^(n + i)) / (1 - q^i) for i in 1..m
    for i in range(1, m + 1):
        grown = coefficients + [0] * n
        for k in range(len(grown) - 1, n + i - 1, -1):  # times (1 - q^(n + i))
            grown[k] -= grown[k - n - i]
        for k in range(i, len(grown)):  # divided by (1 - q^i)
            grown[k] += grown[k - i]
        coefficients = grown
    total = sum(coefficients)
    return sum(coefficients[max(u, 0):]) / total


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> MannWhitney:
    """The two-sided Mann-Whitney U test of ``x`` against ``y``.

    Raises:
        ValueError: a sample is empty or holds a NaN.
    """
    if not x or not y:
        raise ValueError("the Mann-Whitney test needs at least one value in each sample")
    values = [float(v) for v in x] + [float(v) for v in y]
    if any(math.isnan(v) for v in values):
        raise ValueError("the Mann-Whitney test cannot rank NaN")
    n1, n2 = len(x), len(y)
    ranks, ties = _ranks(values)
    u1 = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    u = max(u1, n1 * n2 - u1)
    if min(n1, n2) <= EXACT_MAX_N and all(t == 1 for t in ties):
        return MannWhitney(u1, min(1.0, 2 * _exact_sf(int(round(u)), n1, n2)), "exact")
    n = n1 + n2
    tie_term = sum(t ** 3 - t for t in ties)
    variance = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1)))
    if variance <= 0:  # every value the same: nothing tells the samples apart
        return MannWhitney(u1, 1.0, "asymptotic")
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(variance)
    return MannWhitney(u1, min(1.0, 2 * _normal_sf(z)), "asymptotic")

