"""Systems under test: the forms loadgen can drive, and how it recognises them.

- native: :class:`NullSUT` (completes at once, on the issue thread) and
  :class:`FixedDelaySUT` (completes a fixed time after issue, from a native thread);
  for calibration and microbenchmarks, no Python per query;
- a plain function ``f(sample_index)``: the query completes when it returns;
- an ``async def`` function ``f(sample_index)``: run on an asyncio loop (uvloop when
  installed); the query completes when the coroutine returns;
- a loop SUT (:class:`LoopSUT`): runs on the engine's event loop and completes each
  query through callbacks, with no task per query; the network clients are loop SUTs;
- a callback SUT (:class:`CallbackSUT`): fed from the dispatcher thread with no event loop,
  it completes queries from its own threads (an RPC library's completion thread); the
  gRPC client is one;
- a batched SUT: an object with ``issue(batch)``; the :class:`Batch` carries numpy
  arrays ``ids`` and ``sample_indices`` and is completed later, from any thread, with
  ``batch.complete()`` or ``batch.complete_many(ids)``.

An exception raised by a SUT fails that query (counted by kind, the first messages kept,
cleaned and cut to a bounded size), ``SystemExit`` included; it never ends the run or
hangs it. ``KeyboardInterrupt`` fails its query and stops the run as Ctrl-C would.
A plain function in a closed loop of ``concurrency`` N > 1 runs on N threads.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol, Union

from loadgen import _core
from loadgen.units import SECONDS_PER, us_to_ns

if TYPE_CHECKING:  # annotations only: asyncio is imported where a loop runs, numpy where a batch is
    import asyncio

    import numpy as np
    import numpy.typing as npt

__all__ = ["Batch", "CallbackSUT", "DemoSUT", "FixedDelaySUT", "LoopSUT", "NullSUT", "QuerySink", "SUTForm",
           "classify_sut"]


@dataclass(frozen=True)
class NullSUT:
    """Native SUT that completes every query the moment it is issued."""

    def native_settings(self) -> _core.NativeSutSettings:
        """The engine's settings for this SUT.

        Returns:
            A ``_core.NativeSutSettings`` of kind ``null``.
        """
        return _core.NativeSutSettings(kind=_core.SutKind.null)


@dataclass(frozen=True)
class FixedDelaySUT:
    """Native SUT that completes every query ``delay_us`` microseconds after issue.

    Args:
        delay_us: the service time in microseconds (>= 0).
    """

    delay_us: float

    def __post_init__(self) -> None:
        if not (self.delay_us >= 0):
            raise ValueError(f"FixedDelaySUT.delay_us must be >= 0, got {self.delay_us}")

    def native_settings(self) -> _core.NativeSutSettings:
        """The engine's settings for this SUT.

        Returns:
            A ``_core.NativeSutSettings`` of kind ``fixed_delay`` with ``delay_ns``.
        """
        return _core.NativeSutSettings(kind=_core.SutKind.fixed_delay, delay_ns=us_to_ns(self.delay_us))


@dataclass(frozen=True)
class DemoSUT:
    """Native simulated model server, the default SUT of ``loadgen run``.

    ``workers`` workers each take up to ``max_batch`` waiting queries at once and serve
    them in ``service_us + per_item_us * (batch - 1)`` microseconds, times a lognormal
    factor (median 1, shape ``sigma``). Queueing and batching make its latency rise with
    load as a real inference server's does; its capacity is about
    ``workers * max_batch / (service_us + per_item_us * (max_batch - 1))`` queries per
    microsecond (about 8,500 QPS with the defaults).

    Args:
        workers: concurrent workers (1..4096).
        max_batch: most queries a worker serves at once (>= 1).
        service_us: median service time of a batch of one.
        per_item_us: added per extra query in a batch.
        sigma: lognormal shape of the service-time noise (0 = none, up to 3).
        seed: seed of the service-time draws.
    """

    workers: int = 4
    max_batch: int = 8
    service_us: float = 2000.0
    per_item_us: float = 250.0
    sigma: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.workers, int) and 1 <= self.workers <= 4096):
            raise ValueError(f"DemoSUT.workers must be an integer in 1..4096, got {self.workers!r}")
        if not (isinstance(self.max_batch, int) and self.max_batch >= 1):
            raise ValueError(f"DemoSUT.max_batch must be an integer >= 1, got {self.max_batch!r}")
        for name in ("service_us", "per_item_us"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"DemoSUT.{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 <= self.sigma <= 3:
            raise ValueError(f"DemoSUT.sigma must be in 0..3, got {self.sigma!r}")

    def native_settings(self) -> _core.NativeSutSettings:
        """The engine's settings for this SUT.

        Returns:
            A ``_core.NativeSutSettings`` of kind ``demo`` with these parameters in ns.
        """
        return _core.NativeSutSettings(
            kind=_core.SutKind.demo, workers=self.workers, max_batch=self.max_batch,
            service_ns=us_to_ns(self.service_us), per_item_ns=us_to_ns(self.per_item_us),
            sigma=float(self.sigma), seed=self.seed,
        )

    @property
    def capacity_qps(self) -> float:
        """Queries per second the demo server can sustain at full batches."""
        per_batch_us = self.service_us + self.per_item_us * (self.max_batch - 1)
        return self.workers * self.max_batch / (per_batch_us * SECONDS_PER["us"]) if per_batch_us > 0 else float("inf")




class QuerySink(Protocol):
    """What a :class:`LoopSUT` completes its queries through (the engine gives it to
    ``open_on_loop``). Call on the loop's thread; times are ``time.monotonic_ns()``."""

    def complete(self, qid: int, t_ns: int) -> None:
        """Query ``qid`` completed at ``t_ns``."""

    def complete_tokens(self, qid: int, t_ns: int, n_tokens: int, n_input: int = -1) -> None:
        """Query ``qid`` completed at ``t_ns`` with ``n_tokens`` output tokens; ``n_input``
        (-1: not known) is the request's input tokens, for its per-request record."""

    def first_token(self, qid: int, t_ns: int) -> None:
        """Query ``qid`` produced its first token at ``t_ns``."""

    def fail(self, qid: int, kind: str, message: str) -> None:
        """Query ``qid`` failed; ``kind`` is its error class."""


class LoopSUT:
    """Base of SUTs that run on the engine's asyncio event loop (uvloop when installed)
    and complete queries through a sink instead of a return value.

    The engine calls, on the loop's thread: ``await open_on_loop(loop, sink)`` once before
    the first query; ``issue_query(query_id, sample_index, scheduled_ns)`` per query, which
    must not block; and ``await close_on_loop()`` at the end. Each query ends with one call
    of ``sink.complete(query_id, t_ns)``, ``sink.complete_tokens(query_id, t_ns, n_tokens)``
    or ``sink.fail(query_id, kind, message)``; ``sink.first_token(query_id, t_ns)`` records
    a stream's first token. Times are ``time.monotonic_ns()``.
    """

    async def open_on_loop(self, loop: asyncio.AbstractEventLoop, sink: QuerySink) -> None:
        """Called once on the run's loop before the first query."""

    def issue_query(self, query_id: int, sample_index: int, scheduled_ns: int) -> None:
        """Starts one query; must return without waiting."""
        raise NotImplementedError

    async def close_on_loop(self) -> None:
        """Called once on the run's loop after the last query ended."""


class CallbackSUT:
    """Base of SUTs that complete queries from threads of their own, with no event loop:
    a completion goes straight from the thread that saw the response into the engine.

    The engine calls, on its dispatcher thread: ``open(sink)`` once before the first
    query (connections made); ``issue_query(query_id, sample_index, scheduled_ns)`` per
    query, which must not block; and ``close()`` once the run has ended. Each query ends
    with one call, from any thread, of ``sink.complete(query_id, t_ns)`` or
    ``sink.fail(query_id, kind, message)``, or of ``sink.timed_out(query_id)`` when the
    SUT gave up at the run's per-query timeout (the engine counts the timeout itself). In
    a closed loop that call issues the next query at once, so ``issue_query`` is then
    called on the completing thread. Times are ``time.monotonic_ns()``. One sample per
    query.
    """

    callback_sut = True

    def open(self, sink: Any) -> None:
        """Called once on the dispatcher thread before the first query."""

    def issue_query(self, query_id: int, sample_index: int, scheduled_ns: int) -> None:
        """Starts one query; must return without waiting."""
        raise NotImplementedError

    def close(self) -> None:
        """Called once after the run has ended (queries still in flight are cancelled)."""


class Batch:
    """Queries handed to a batched SUT's ``issue(batch)``.

    Attributes:
        ids: int64 array of query ids.
        sample_indices: int64 array of sample indices, shape (len(ids),) when each query
            has one sample, else (len(ids), samples_per_query).
        scheduled_ns: int64 array: when each query was scheduled, on loadgen's clock
            (``time.monotonic_ns()``); latency is measured from these times.
    """

    __slots__ = ("ids", "sample_indices", "scheduled_ns", "_engine")

    def __init__(self, engine: _core.Engine, ids: np.ndarray, sample_indices: np.ndarray,
                 scheduled_ns: np.ndarray) -> None:
        self._engine = engine
        self.ids = ids
        self.sample_indices = sample_indices
        self.scheduled_ns = scheduled_ns

    def __len__(self) -> int:
        return len(self.ids)

    def complete(self, completed_ns: Optional[int] = None) -> int:
        """Completes every query of the batch (now, or at ``completed_ns`` from
        loadgen's clock, which is ``time.monotonic_ns()``). Any thread. Returns how
        many were still in flight."""
        return self._engine.complete_many(self.ids, completed_ns)

    def complete_many(self, ids: npt.ArrayLike,
                      completed_ns: Union[None, int, npt.NDArray[np.int64]] = None) -> int:
        """Completes some queries, by id (any subset of this or another batch)."""
        import numpy as np

        return self._engine.complete_many(np.ascontiguousarray(ids, dtype=np.int64), completed_ns)

    def complete_one(self, query_id: int, *, completed_ns: int = 0, n_tokens: int = -1) -> bool:
        """Completes one query; ``n_tokens`` in 0 to ``MAX_TOKEN_COUNT`` (2**31 - 1)
        records its output tokens (and, after :meth:`first_token`, its time per output
        token); -1: not known. Any other count fails the query as ``invalid_token_count``
        (a message naming ``n_tokens`` and its range), so no total can wrap. False if it
        was not in flight or failed so."""
        return self._engine.complete(int(query_id), completed_ns, n_tokens)

    def first_token(self, query_id: int, t_ns: int = 0) -> bool:
        """Records when query ``query_id`` produced its first token (now by default):
        time to first token is measured from its scheduled time. Once per query."""
        return self._engine.first_token(int(query_id), t_ns)

    def fail(self, ids: Optional[npt.ArrayLike] = None, kind: str = "error", message: str = "") -> int:
        """Fails the given queries (all of the batch by default) with an error kind. The
        engine keeps the kind as a short identifier and the message cut to 500 bytes,
        without control characters. Returns how many were still in flight. Given ids
        that were not in flight are counted (as duplicate, unknown or late completions);
        by default those of the batch already resolved are skipped."""
        if ids is None:
            return sum(bool(self._engine.fail(int(i), kind, message, False)) for i in self.ids)
        import numpy as np

        return sum(bool(self._engine.fail(int(i), kind, message)) for i in np.asarray(ids, dtype=np.int64))


#: What kind of SUT something is: "null", "fixed_delay", "demo", "function", "async",
#: "batched", "loop", "callback", "native_client" (the core's network client).
SUTForm = str


def classify_sut(sut: Any) -> SUTForm:
    """Tells which SUT form ``sut`` is.

    Raises:
        ValueError: ``sut`` is none of the supported forms; the message lists them.
    """
    if isinstance(sut, NullSUT):
        return "null"
    if isinstance(sut, FixedDelaySUT):
        return "fixed_delay"
    if isinstance(sut, DemoSUT):
        return "demo"
    if getattr(sut, "native_client", False) is True and callable(getattr(sut, "native_settings", None)):
        return "native_client"
    if callable(getattr(sut, "issue_query", None)):
        if getattr(sut, "callback_sut", False) is True and callable(getattr(sut, "open", None)):
            return "callback"
        if callable(getattr(sut, "open_on_loop", None)):
            return "loop"
    issue = getattr(sut, "issue", None)
    if issue is not None and callable(issue):
        return "batched"
    if inspect.iscoroutinefunction(sut) or (callable(sut) and inspect.iscoroutinefunction(sut.__call__)):
        return "async"
    if callable(sut):
        return "function"
    raise ValueError(
        f"sut: {sut!r} is not a SUT; use loadgen.NullSUT(), loadgen.FixedDelaySUT(delay_us), "
        "loadgen.DemoSUT(), "
        "a function f(sample_index), an async function, or an object with issue(batch)"
    )


SUTLike = Union[NullSUT, FixedDelaySUT, Any]
