"""Scale-out: one load shared by N workers (pods), each a separate ``loadgen run``.

Kubernetes (an Indexed Job) or the user starts the workers; loadgen adds no coordinator.
Each worker knows its index I (``--worker-index``, by default ``$JOB_COMPLETION_INDEX``)
and the count N (``--workers``, ``$LOADGEN_WORKERS``), and from them alone:

- runs its share of the load (:meth:`loadgen.scenarios.Scenario.for_worker`: 1/N of the
  rate, its share of the concurrency, the ceiling of 1/N of the query counts);
- draws its own random streams, seeded by :func:`worker_seed` from ``--seed`` and I;
- waits for the common ``--start-at`` (:func:`wait_until`);
- records who it was and when it started (:func:`worker_section`), so that
  ``loadgen merge`` can check that every worker is there once and add their histograms.

Worker 0 of 1 (the default) is a plain run: none of this changes it.
"""

from __future__ import annotations

import math
import os
import platform
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from loadgen.options import RunOptions

__all__ = ["SAMPLE_STREAM", "SCHEDULE_STREAM", "START_LATE_WARN_S", "TOTAL_LOAD", "add_worker_section",
           "concurrency_share", "count_share", "late_start_reason", "splitmix64", "stages_text", "total_load",
           "wait_until", "worker_section", "worker_seed"]

_MASK64 = (1 << 64) - 1

#: The ``stream`` of :func:`worker_seed` for the arrival schedule and the sample order.
SCHEDULE_STREAM, SAMPLE_STREAM = 0, 1

#: A worker that starts later than ``--start-at`` by more than this says so.
START_LATE_WARN_S = 0.01


def splitmix64(x: int) -> int:
    """SplitMix64's output function of the 64-bit state ``x + 0x9E3779B97F4A7C15``
    (Steele, Lea and Flood, 2014): a bijection of 64-bit integers whose outputs for
    nearby inputs look unrelated."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def worker_seed(seed: int, index: int, stream: int) -> int:
    """The seed of worker ``index``'s random ``stream`` (:data:`SCHEDULE_STREAM` or
    :data:`SAMPLE_STREAM`) for the base ``seed``:
    ``splitmix64(splitmix64(seed) ^ (2 * index + stream))``. Reproducible, and different
    for every (seed, index, stream), so that N workers' Poisson schedules are independent
    and together make one Poisson process at the total rate."""
    return splitmix64(splitmix64(seed & _MASK64) ^ ((2 * index + stream) & _MASK64))


def count_share(total: Optional[int], count: int) -> Optional[int]:
    """A worker's share of a query count (``--query-count``, ``--min-query-count``): the
    ceiling of ``total / count``, so that the workers together reach ``total``; None and
    0 stay as they are."""
    if not total:
        return total
    return -(-total // count)


def concurrency_share(total: int, index: int, count: int) -> int:
    """Worker ``index``'s share of ``total`` queries in flight: ``total // count``, plus
    one for the first ``total % count`` workers, so that the shares add up to ``total``.

    Raises:
        ValueError: ``total`` is smaller than ``count``: a worker would have none.
    """
    if total < count:
        raise ValueError(f"--concurrency {total} cannot be shared by --workers {count}: every worker "
                         f"needs at least one query in flight (give --concurrency {count} or more)")
    return total // count + (1 if index < total % count else 0)


def stages_text(stages: Sequence[Tuple[float, float, float]]) -> str:
    """``--stages`` text for parsed stages, every stage written 'D:A-B' (its start and
    end rate explicit, so that it reads back the same whatever ``--ramp`` says)."""
    return ",".join(f"{d!r}s:{a!r}-{b!r}" for d, a, b in stages)


def wait_until(start_at: float, stop_requested: Optional[Callable[[], bool]] = None,
               clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Sleeps until the wall-clock time ``start_at`` (seconds since the epoch), waking
    every 0.1 s to poll ``stop_requested``. Returns False when a stop was requested
    before then, True otherwise (at once when ``start_at`` has passed)."""
    while True:
        if stop_requested is not None and stop_requested():
            return False
        left = start_at - clock()
        if left <= 0:
            return True
        sleep(min(left, 0.1))


#: The options a worker takes a share of: the worker section's ``"total"`` holds their
#: values for all workers together (what ``loadgen merge`` judges the merged run by).
TOTAL_LOAD = ("target_qps", "concurrency", "stages", "query_count", "min_query_count")


def total_load(o: RunOptions) -> Dict[str, Any]:
    """:data:`TOTAL_LOAD` of the effective options of all workers together."""
    return {name: getattr(o, name) for name in TOTAL_LOAD}


def worker_section(o: RunOptions, seed_given: Dict[str, bool], total: Dict[str, Any],
                   started_at_epoch_s: float) -> Dict[str, Any]:
    """The result's ``"worker"`` section of a worker's effective options ``o``.

    Args:
        o: the worker's effective options (its share, its seeds).
        seed_given: whether ``schedule_seed`` and ``sample_seed`` were given (not derived).
        total: the load of all workers together (the options before the share).
        started_at_epoch_s: when the run started (its first scheduled time), on the wall
            clock.
    """
    late = None if o.start_at is None else started_at_epoch_s - o.start_at
    return {
        "index": o.worker_index or 0,
        "count": o.workers,
        "start_at": o.start_at,
        "start_tolerance_s": o.start_tolerance_s,
        "started_at_epoch_s": started_at_epoch_s,
        "start_late_s": late,
        "seeds": {
            "seed": o.seed, "schedule": o.schedule_seed, "sample": o.sample_seed,
            "derived": o.workers > 1 and not all(seed_given.values()),
        },
        "total": total,
        "hostname": platform.node(),
        "pod": os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or None,
    }


def late_start_reason(section: Dict[str, Any]) -> Optional[str]:
    """The invalid reason of a worker that started after ``start_at`` by more than its
    tolerance, naming the lateness; None when it started in time (or had no start_at)."""
    late = section.get("start_late_s")
    tolerance = section.get("start_tolerance_s", 0.0)
    if late is None or not late > tolerance:
        return None
    return (f"worker {section['index']} of {section['count']} started {_seconds(late)} after --start-at "
            f"{section['start_at']:.3f}, more than --start-tolerance-s {tolerance:g}: its load did not "
            "overlap the other workers' as planned")


def _seconds(s: float) -> str:
    return f"{s:.3f} s" if math.isfinite(s) else str(s)


def add_worker_section(doc: Dict[str, Any], section: Optional[Dict[str, Any]]) -> None:
    """Puts ``section`` (None: nothing) in the result ``doc`` as ``"worker"``, and makes
    the result invalid when the worker started too late (:func:`late_start_reason`)."""
    if section is None:
        return
    doc["worker"] = section
    reason = late_start_reason(section)
    if reason is not None and reason not in doc["invalid_reasons"]:
        doc["invalid_reasons"].append(reason)
        doc["valid"] = False
