"""The SUT of ``bench/bench_peak.py``: a server of fixed capacity, for both sides.

:class:`CapacityQueue` serves one sample at a time, ``service_s`` each, in arrival order:
a sample finishes ``service_s`` after the later of its arrival and the previous sample's
finish (a queue in time), and a timer thread hands everything due to ``done`` at its
finish time. Its capacity is exactly 1 / ``service_s`` samples/s whatever the speed of
Python on the machine (a late wake-up delays completions, it does not slow the server).

- ``loadgen find-peak --sut python:bench/peak_sut.py:sut``: :data:`sut`, a batched SUT
  (``issue(batch)``; completes with ``batch.complete_one``), ``PEAK_SERVICE_US``
  microseconds a sample (default 200: 5,000 samples/s).
- MLPerf's module: the child half of ``bench/bench_peak.py`` wraps the same queue in
  ``issue_query`` / ``QuerySamplesComplete``.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any, Callable, Deque, List, Tuple


class CapacityQueue:
    """A fixed-capacity server in time: ``add(items)``, later ``done(items)`` from its thread."""

    def __init__(self, service_s: float, done: Callable[[List[Any]], None]) -> None:
        self.service_s = service_s
        self.done = done
        self.busy_until = 0.0
        self.due: Deque[Tuple[float, List[Any]]] = collections.deque()
        self.cv = threading.Condition()
        threading.Thread(target=self._loop, name="peak-sut", daemon=True).start()

    def add(self, items: List[Any]) -> None:
        """Queues ``items`` (one sample each), arrived now."""
        now = time.monotonic()
        with self.cv:
            self.busy_until = max(now, self.busy_until) + self.service_s * len(items)
            self.due.append((self.busy_until, items))
            self.cv.notify()

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.due or self.due[0][0] > time.monotonic():
                    self.cv.wait(self.due[0][0] - time.monotonic() if self.due else None)
                now = time.monotonic()
                ready: List[Any] = []
                while self.due and self.due[0][0] <= now:
                    ready += self.due.popleft()[1]
            self.done(ready)


class LoadgenSUT:
    """The queue as a loadgen batched SUT: ``issue(batch)`` queues each query."""

    def __init__(self, service_us: float) -> None:
        self.queue = CapacityQueue(service_us * 1e-6, self._complete)

    def issue(self, batch: Any) -> None:
        self.queue.add([(batch, qid) for qid in batch.ids.tolist()])

    @staticmethod
    def _complete(items: List[Any]) -> None:
        for batch, qid in items:
            batch.complete_one(qid)


# One server for the whole process: every probe of a search loads this same object.
sut = LoadgenSUT(float(os.environ.get("PEAK_SERVICE_US", "200")))
