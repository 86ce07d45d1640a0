"""Dispatch: the drivers that feed Python SUTs from the native engine's queue.

The issue thread never calls into Python per query: it queues what is due, and a
dispatcher thread drains the queue in batches (one query at a time when the rate is low,
hundreds when it is high) and hands the queries to the SUT in its form: a function per
sample, a batched SUT with arrays, an ``async`` function on an event loop, or a loop SUT
(:class:`loadgen.sut.LoopSUT`) that completes queries through callbacks, or a callback SUT
(:class:`loadgen.sut.CallbackSUT`) that completes them from its own threads. Completions
go back in arrays, or one native call each from a callback SUT's threads.

A closed loop of ``concurrency`` > 1 queries runs a plain function on a pool of that
many threads (at most :data:`MAX_FUNCTION_THREADS`), each issuing its next query as its
last one returns: a function that releases the GIL (sleeping, I/O, native code) then has
``concurrency`` queries in flight, as the scenario says.

Whatever a SUT raises fails the queries of that call (kind: the exception's class name),
``SystemExit`` included. ``KeyboardInterrupt`` fails its query too and then stops the run
as Ctrl-C does: the main thread is interrupted, so ``loadgen run`` writes the result,
marked interrupted, and exits 130 (where Ctrl-C is ignored, the run is stopped here).
A run started on another thread (embedded, from a server's handler thread) is stopped
here, interrupted, and the main thread is left alone.
A ``SystemExit`` from a loop or callback SUT's opening or closing ends the run as
:class:`SutExit`, an error, never as the process's quiet exit.
"""

from __future__ import annotations

import _thread
import functools
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Set, Tuple, Union

from loadgen import _core
from loadgen.engine.settings import EngineSettings
from loadgen.sut.forms import Batch
from loadgen.units import ms_to_s, us_to_ns

if TYPE_CHECKING:  # asyncio is imported where an async or loop SUT runs, numpy where a
    import asyncio  # Python SUT completes queries: start-up costs

    import numpy as np
    import numpy.typing as npt

__all__ = ["DISPATCHED_FORMS", "MAX_FUNCTION_THREADS", "Dispatcher", "SutExit"]

_monotonic_ns = time.monotonic_ns

#: The SUT forms a :class:`Dispatcher` feeds (the native forms need none).
DISPATCHED_FORMS = ("function", "async", "batched", "loop", "callback")

#: The most threads a closed loop runs a plain function SUT on; a higher concurrency
#: queues behind them (and shows as issue delay): use an async or batched SUT for more.
MAX_FUNCTION_THREADS = 1024

#: What the engine hands out at a time: query ids, their samples (one row of indices per
#: query) and their scheduled times (ns).
_Taken = Tuple["npt.NDArray[np.int64]", "npt.NDArray[np.int64]", "npt.NDArray[np.int64]"]


class SutExit(RuntimeError):
    """The SUT called ``sys.exit()`` (raised ``SystemExit``) where no single query could
    fail for it: opening or closing a loop or callback SUT. The run is ended; the
    ``SystemExit`` is the ``__cause__``. :attr:`after_run` says it came as the SUT was
    closed, once the run had ended."""

    def __init__(self, message: str, after_run: bool) -> None:
        super().__init__(message)
        self.after_run = after_run


def _fatal(e: BaseException, stage: str) -> BaseException:
    """What a driver's fatal error ``e`` is re-raised as on the waiting thread: a
    ``SystemExit`` as :class:`SutExit` (re-raised as it is, it would end the process
    quietly with the status the SUT chose, the run's result lost), anything else as it is."""
    if not isinstance(e, SystemExit):
        return e
    code = "" if e.code is None else repr(e.code)
    closing = stage.startswith("in close")
    error = SutExit(f"the SUT called sys.exit({code}) {stage}" + ("" if closing else ": the run was ended"), closing)
    error.__cause__ = e
    return error


class Dispatcher:
    """Feeds the queries an engine queues to a Python SUT, on a background thread.

    Args:
        core: the native engine.
        sut: the SUT, in the form ``sut_form`` (one of :data:`DISPATCHED_FORMS`).
        settings: the run's settings (batch size, spinning, query shape).

    A loop SUT is opened on its event loop first, a callback SUT on the dispatcher thread;
    the dispatcher then starts the native run itself, so that the first scheduled time
    comes after the SUT is ready. Any other form expects the run to be started already.
    """

    def __init__(self, core: _core.Engine, sut: Any, sut_form: str, settings: EngineSettings) -> None:
        self.core = core
        self.sut = sut
        self.sut_form = sut_form
        self.settings = settings
        #: The fatal error that ended the dispatcher, if any (re-raised by the engine).
        self.error: Optional[BaseException] = None
        #: Set once a loop SUT is open and the run started (or the dispatcher failed).
        self.opened = threading.Event()
        #: Set once the SUT raised KeyboardInterrupt (the run is being stopped).
        self.interrupted = False
        self._interrupt_lock = threading.Lock()
        #: Where a loop or callback SUT's own code is running, for a fatal error's message.
        self.stage = "during the run"
        #: The run was started on the main thread (the dispatcher is made as it starts):
        #: only then may a SUT's KeyboardInterrupt interrupt the main thread.
        self.started_on_main = threading.current_thread() is threading.main_thread()
        self._thread = threading.Thread(target=self._drive_guarded, name="loadgen-dispatch", daemon=True)

    def start(self) -> None:
        """Starts the dispatcher thread; for a loop or callback SUT, returns once it is open
        and the run started.

        Raises:
            BaseException: what opening a loop or callback SUT raised.
        """
        self._thread.start()
        if self.sut_form in ("loop", "callback"):
            self.opened.wait()
            if self.error is not None:
                self._thread.join(5.0)
                raise self.error

    def join(self, timeout_s: float) -> None:
        """Waits up to ``timeout_s`` for the thread. A Python SUT call cannot be interrupted
        from outside, so a stuck one is left to its (daemon) thread."""
        self._thread.join(timeout_s)

    @property
    def thread_id(self) -> Optional[int]:
        """The dispatcher thread's kernel thread id (None before it started)."""
        return self._thread.native_id

    def pin(self) -> None:
        """Pins the calling (dispatcher) thread to ``settings.dispatcher_cpus``, if any.
        Called once the engine's threads exist: they must not inherit this pin."""
        if self.settings.dispatcher_cpus:
            os.sched_setaffinity(0, list(self.settings.dispatcher_cpus))

    def _drive_guarded(self, drive: Optional[Callable[[], None]] = None) -> None:
        try:
            if drive is None and self.sut_form not in ("loop", "callback"):
                self.pin()  # a loop or callback SUT's driver pins once it has started the engine
            if drive is not None:
                drive()
            elif self.sut_form == "function":
                self._drive_function()
            elif self.sut_form == "batched":
                self._drive_batched()
            elif self.sut_form == "callback":
                _CallbackDriver(self).run()
            else:
                self._drive_async()
        except BaseException as e:  # re-raised on the waiting thread
            if self.error is None:
                self.error = _fatal(e, self.stage)
            self.core.abort()
            self.opened.set()

    def sut_raised(self, e: BaseException, target: Union[int, Batch]) -> None:
        """A SUT call raised ``e``: the query it was for (an id), or those of a batch still
        in flight, fail with its kind and message. ``KeyboardInterrupt`` then stops the
        run and interrupts the main thread, once, as Ctrl-C would (``loadgen run`` writes
        the result, marked interrupted); a run started on another thread is stopped here
        instead, its main thread untouched."""
        kind, message = _error_text(e)
        if isinstance(target, Batch):
            target.fail(kind=kind, message=message)
        else:
            self.core.fail(target, kind, message)
        if isinstance(e, KeyboardInterrupt):
            with self._interrupt_lock:
                if self.interrupted:
                    return
                self.interrupted = True
            if self.started_on_main and callable(signal.getsignal(signal.SIGINT)):
                # Whoever handles Ctrl-C stops the run: loadgen run's handler stops it
                # and still writes the result; Python's default raises KeyboardInterrupt
                # in the main thread, which aborts a run waited on there.
                _thread.interrupt_main()
            else:  # an embedded run, or Ctrl-C is ignored in this process: stop the run here
                self.core.stop()

    def _batches(self) -> Iterator[_Taken]:
        core, s = self.core, self.settings
        spin_ns = us_to_ns(s.consumer_spin_us)
        while True:
            got = core.take_batch(s.batch_max, 0.1, spin_ns)
            if got is None:
                return
            if len(got[0]):
                yield got

    def _drive_serial(self, spin_ns: int, stamp: bool = False) -> None:
        # One query at a time, completion and the next query in one native call: the
        # whole per-query overhead is one Python call into the engine. With `stamp`, the
        # completion time is taken as the SUT returns, not after the wait for the GIL
        # that other threads of a pool hold.
        core, f = self.core, self.sut
        take_one, complete_take_one = core.take_one, core.complete_take_one
        monotonic_ns = time.monotonic_ns
        nxt = take_one(0.1, spin_ns)
        while nxt is not None:
            if not nxt:  # timed out waiting; look again
                nxt = take_one(0.1, spin_ns)
                continue
            qid, sample = nxt
            try:
                f(sample)
            except BaseException as e:  # a SUT error fails this query only
                self.sut_raised(e, qid)
                nxt = take_one(0.1, spin_ns)
                continue
            nxt = complete_take_one(qid, monotonic_ns() if stamp else 0, 0.1, spin_ns)

    def _drive_rows(self) -> None:
        # A pool thread's loop when queries carry several samples: one query per take.
        core, f = self.core, self.sut
        monotonic_ns = time.monotonic_ns
        while True:
            got = core.take_batch(1, 0.1, 0)
            if got is None:
                return
            ids, samples, _ = got
            if not len(ids):
                continue
            qid = int(ids[0])
            try:
                f(samples[0])
            except BaseException as e:  # a SUT error fails this query only
                self.sut_raised(e, qid)
                continue
            core.complete(qid, monotonic_ns())

    def _drive_pool(self, threads: int) -> None:
        # Closed loop: `threads` threads, each with one query in flight, this one among
        # them. They wait for queries without spinning: each issues its next query as
        # its last one returns, so a waiting thread has nothing to catch.
        drive: Callable[[], None] = (functools.partial(self._drive_serial, 0, stamp=True)
                                     if self.settings.samples_per_query == 1 else self._drive_rows)
        pool = [threading.Thread(target=self._drive_guarded, args=(self._on_sut_cpus(drive),),
                                 name=f"loadgen-sut-{i}", daemon=True) for i in range(1, threads)]
        for t in pool:
            t.start()
        try:
            drive()
        finally:
            for t in pool:  # a SUT call stuck past the end of the run keeps its thread
                t.join()

    def _on_sut_cpus(self, drive: Callable[[], None]) -> Callable[[], None]:
        """``drive`` run on ``settings.sut_cpus`` (as it is, without any)."""
        cpus = list(self.settings.sut_cpus)
        if not cpus:
            return drive

        def pinned() -> None:
            os.sched_setaffinity(0, cpus)
            drive()
        return pinned

    def _drive_function(self) -> None:
        core, f, s = self.core, self.sut, self.settings
        if core.inline_issue and s.mode == "closed" and s.concurrency > 1:
            self._drive_pool(min(s.concurrency, MAX_FUNCTION_THREADS))
            return
        if core.inline_issue and s.samples_per_query == 1:
            self._drive_serial(us_to_ns(s.consumer_spin_us))
            return
        import numpy as np

        monotonic_ns = time.monotonic_ns
        single = self.settings.samples_per_query == 1
        for ids, samples, _ in self._batches():
            done: List[int] = []
            stamps: List[int] = []
            sample_list = _per_query(samples, single)
            for qid, sample in zip(ids.tolist(), sample_list):
                try:
                    f(sample)
                except BaseException as e:  # a SUT error fails this query only
                    self.sut_raised(e, qid)
                    continue
                stamps.append(monotonic_ns())
                done.append(qid)
            if done:
                core.complete_many(np.array(done, dtype=np.int64), np.array(stamps, dtype=np.int64))

    def _drive_batched(self) -> None:
        core, sut = self.core, self.sut
        single = self.settings.samples_per_query == 1
        for ids, samples, scheduled in self._batches():
            batch = Batch(core, ids, samples[:, 0] if single else samples, scheduled)
            try:
                sut.issue(batch)
            except BaseException as e:  # fails the batch's queries still in flight
                self.sut_raised(e, batch)

    def _drive_async(self) -> None:
        import asyncio

        loop: asyncio.AbstractEventLoop
        try:
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        driver = _LoopDriver(self, loop) if self.sut_form == "loop" else _AsyncDriver(self, loop)
        try:
            loop.run_until_complete(driver.run())
        finally:
            loop.close()



def _error_text(e: BaseException) -> Tuple[str, str]:
    """The kind (class name) and message of what a SUT raised; the engine cleans and
    bounds both. An exception whose ``str()`` itself raises still has a message."""
    try:
        message = str(e)
    except BaseException as str_error:
        message = f"(str() of this exception raised {type(str_error).__name__})"
    return type(e).__name__, message


def _per_query(samples: npt.NDArray[np.int64], single: bool) -> List[Any]:
    """The sample of each query: an index when queries hold one sample, else its row."""
    return samples[:, 0].tolist() if single else list(samples)


class _AsyncDriver:
    """Feeds queued queries to an async SUT, woken by the engine's eventfd."""

    def __init__(self, dispatcher: Dispatcher, loop: asyncio.AbstractEventLoop) -> None:
        import asyncio

        self.dispatcher = dispatcher
        self.core = dispatcher.core
        self.f = dispatcher.sut
        self.settings = dispatcher.settings
        self.loop = loop
        self.tasks: Set[asyncio.Task[None]] = set()
        self.done_ids: List[int] = []
        self.done_ts: List[int] = []
        self.flush_scheduled = False
        self.exhausted = asyncio.Event()
        self.cancelled = asyncio.CancelledError

    async def run(self) -> None:
        import asyncio

        fd = self.core.eventfd()
        if fd < 0:
            raise OSError("the engine could not create an eventfd for the asyncio SUT")
        self.loop.add_reader(fd, self._on_ready)
        self._on_ready()
        try:
            await self.exhausted.wait()
            # Everything is handed out; let the rest finish until the engine ends
            # (completion, or cancellation after the grace period).
            while not self.core.wait(0.0):
                if not self.tasks:
                    await asyncio.sleep(0.001)
                else:
                    await asyncio.wait(self.tasks, timeout=0.01)
        finally:
            self.loop.remove_reader(fd)
            for t in list(self.tasks):
                t.cancel()
            self._flush()

    def _ready_batches(self, batch_max: int) -> Iterator[_Taken]:
        """The batches queued now. Sets ``exhausted`` when the run has nothing more to
        give, else re-arms the eventfd once they are handed out."""
        while True:
            got = self.core.take_batch(batch_max, 0.0, 0)
            if got is None:
                self.exhausted.set()
                return
            if not len(got[0]):
                self.core.arm_eventfd()
                return
            yield got

    def _on_ready(self) -> None:
        single = self.settings.samples_per_query == 1
        for ids, samples, _ in self._ready_batches(self.settings.batch_max):
            sample_list = _per_query(samples, single)
            for qid, sample in zip(ids.tolist(), sample_list):
                task = self.loop.create_task(self._one(qid, sample))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _one(self, qid: int, sample: Any) -> None:
        try:
            await self.f(sample)
        except self.cancelled:
            raise
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: asyncio would end the loop
            self.dispatcher.sut_raised(e, qid)
            return
        self.done_ts.append(time.monotonic_ns())
        self.done_ids.append(qid)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.done_ids:
            import numpy as np

            ids = np.array(self.done_ids, dtype=np.int64)
            ts = np.array(self.done_ts, dtype=np.int64)
            self.done_ids.clear()
            self.done_ts.clear()
            self.core.complete_many(ids, ts)
        if self.core.inline_issue and not self.exhausted.is_set():
            self._on_ready()  # closed loop: the completions (or failures) made room for more


class _LoopDriver(_AsyncDriver):
    """Feeds queued queries to a loop SUT (see :class:`loadgen.sut.LoopSUT`): no task per
    query; the SUT completes queries through this driver's callbacks, which batch them
    into one native call per loop iteration."""

    def __init__(self, dispatcher: Dispatcher, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(dispatcher, loop)
        self.opened = dispatcher.opened
        self.sut = dispatcher.sut
        self.closed_loop = bool(self.core.inline_issue)
        self._issue = self.sut.issue_query
        #: Whether the per-request records keep a stream's token events
        #: (:meth:`complete_stream`); a SUT that has them asks before it gathers them.
        self.keeps_token_events = bool(self.core.records_stats())

    async def run(self) -> None:
        # A failure here reaches Dispatcher.start through _drive_guarded, which records
        # it before waking the starter.
        import asyncio

        self.dispatcher.stage = "in open_on_loop()"
        await self.sut.open_on_loop(self.loop, self)
        self.dispatcher.stage = "during the run"
        self.core.start()
        self.dispatcher.pin()
        # The issue thread sets the start time as it begins (microseconds); asking for
        # queries before that would find none and sleep until the next wake-up.
        while not self.core.start_ns and not self.core.wait(0.0):
            time.sleep(0)
        self.opened.set()
        try:
            fd = self.core.eventfd()
            if fd < 0:
                raise OSError("the engine could not create an eventfd for the SUT's event loop")
            self.loop.add_reader(fd, self._on_ready)
            self._on_ready()
            try:
                await self.exhausted.wait()
                while not self.core.wait(0.0):
                    await asyncio.sleep(0.002)
            finally:
                self.loop.remove_reader(fd)
                self._flush()
        finally:
            self.dispatcher.stage = "in close_on_loop()"
            await self.sut.close_on_loop()

    def _on_ready(self) -> None:
        single = self.settings.samples_per_query == 1
        issue = self._issue
        batch_max = min(self.settings.batch_max, 256)  # woken per arrival: batches are small
        for ids, samples, scheduled in self._ready_batches(batch_max):
            sample_list = _per_query(samples, single)
            for qid, sample, t in zip(ids.tolist(), sample_list, scheduled.tolist()):
                try:
                    issue(qid, sample, t)
                except BaseException as e:  # a SUT error fails this query only
                    self.dispatcher.sut_raised(e, qid)

    # The sink the SUT calls, on the loop's thread. Open loop, completions are gathered
    # into one native call per loop iteration. Closed loop, each completion issues the
    # next query at once: deferring it to the end of the iteration would make it wait
    # behind every other callback due, and that wait is issue delay.
    def _issue_next(self) -> None:
        # Closed loop: one completion freed one slot; take_one is the cheap native path
        # (take_batch sizes its buffers for a whole batch).
        take_one, issue = self.core.take_one, self._issue
        while True:
            got = take_one(0.0, 0)
            if got is None:
                self.exhausted.set()
                return
            if not got:
                return
            qid, sample = got
            try:
                issue(qid, sample, _monotonic_ns())
                return
            except BaseException as e:  # a SUT error fails this query only; its slot is free again
                self.dispatcher.sut_raised(e, qid)

    def complete(self, qid: int, t_ns: int) -> None:
        """Query ``qid`` completed at ``t_ns``."""
        if self.closed_loop:
            self.core.complete(qid, t_ns)
            if not self.exhausted.is_set():
                self._issue_next()
            return
        self.done_ts.append(t_ns)
        self.done_ids.append(qid)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def complete_tokens(self, qid: int, t_ns: int, n_tokens: int, n_input: int = -1) -> None:
        """Query ``qid`` completed at ``t_ns`` with ``n_tokens`` output tokens (and
        ``n_input`` input tokens, when known, for its per-request record)."""
        self.core.complete(qid, t_ns, n_tokens, n_input)
        if self.closed_loop and not self.exhausted.is_set():
            self._issue_next()

    def complete_stream(self, qid: int, t_ns: int, n_tokens: int, n_input: int, event_ns: List[int],
                        tokens_per_event: List[int]) -> None:
        """:meth:`complete_tokens` for a stream whose token events (when each event that
        held tokens came, and its tokens) go in its per-request record."""
        self.core.complete(qid, t_ns, n_tokens, n_input, event_ns, tokens_per_event)
        if self.closed_loop and not self.exhausted.is_set():
            self._issue_next()

    def first_token(self, qid: int, t_ns: int) -> None:
        """Query ``qid`` produced its first token at ``t_ns``."""
        self.core.first_token(qid, t_ns)

    def follow_up(self, tag: int, at_ns: int) -> bool:
        """Multi-turn: one more query due at ``at_ns``, handed to the SUT with sample index
        ``tag``; called before completing the query it follows. False once issuing ended."""
        return bool(self.core.follow_up(tag, at_ns))

    def follow_ups(self) -> Dict[str, int]:
        """The engine's follow-ups: pending, issued, dropped."""
        return dict(self.core.follow_ups())

    def fail(self, qid: int, kind: str, message: str) -> None:
        """Query ``qid`` failed; ``kind`` is its error class."""
        self.core.fail(qid, kind, message)
        if self.closed_loop and not self.exhausted.is_set():
            self._issue_next()


class _CallbackDriver:
    """Feeds a callback SUT (see :class:`loadgen.sut.CallbackSUT`) from the dispatcher
    thread, and is the sink its threads complete queries through.

    Open loop, the dispatcher thread hands out queries as they fall due and each
    completion is one native call. Closed loop, the thread that completes a query issues
    the next one in the same native call (``complete_take_one``): no other thread wakes
    per query. The dispatcher thread then only looks, every few milliseconds, for room
    that no completion took: a slot freed by the engine's own timeout after the SUT had
    given up on its query.
    """

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.core = dispatcher.core
        self.sut = dispatcher.sut
        self.settings = dispatcher.settings
        self.closed_loop = bool(self.core.inline_issue)
        self._issue = self.sut.issue_query
        self._take_one = self.core.take_one
        self._complete_take_one = self.core.complete_take_one
        self._complete = self.core.complete
        self._fail = self.core.fail

    def run(self) -> None:
        # A failure here reaches Dispatcher.start through _drive_guarded, which records
        # it before waking the starter.
        if self.settings.samples_per_query != 1:
            raise ValueError("a callback SUT takes one sample per query (samples_per_query 1, got "
                             f"{self.settings.samples_per_query})")
        self.dispatcher.stage = "in open()"
        self.sut.open(self)
        self.dispatcher.stage = "during the run"
        try:
            self.core.start()
            self.dispatcher.pin()
            while not self.core.start_ns and not self.core.wait(0.0):
                time.sleep(0)
            self.dispatcher.opened.set()
            if self.closed_loop:
                self._feed_closed()
            else:
                self._feed_open()
            while not self.core.wait(0.05):  # everything handed out: wait for the end
                pass
        finally:
            self.dispatcher.stage = "in close()"
            self.sut.close()

    def _feed_open(self) -> None:
        # Woken per arrival: batches are small, and the buffers of a large one cost more
        # than the take (as for the loop SUT). No spinning before sleeping: a callback
        # SUT's completion thread needs the CPU more than an arrival needs the
        # microseconds a wake-up costs (the loop SUT sleeps on its eventfd alike).
        batch_max = min(self.settings.batch_max, 256)
        while True:
            got = self.core.take_batch(batch_max, 0.1, 0)
            if got is None:
                return
            if len(got[0]):
                self._issue_taken(got)

    def _feed_closed(self) -> None:
        timeout_ms = self.settings.timeout_ms
        look_s = ms_to_s(min(max(timeout_ms / 10, 1.0), 10.0)) if timeout_ms else 0.05
        batch_max = self.settings.batch_max
        while True:
            got = self.core.take_batch(batch_max, 0.0, 0)
            if got is None:
                return
            if len(got[0]):
                self._issue_taken(got)
            elif self.core.wait(look_s):
                return

    def _issue_taken(self, got: _Taken) -> None:
        ids, samples, scheduled = got
        issue = self._issue
        for qid, sample, t in zip(ids.tolist(), samples[:, 0].tolist(), scheduled.tolist()):
            try:
                issue(qid, sample, t)
            except BaseException as e:  # a SUT error fails this query only
                self.dispatcher.sut_raised(e, qid)

    def _issue_next(self, got: Any) -> None:
        # Closed loop: the slot just freed goes to the next query, on this thread.
        while got:  # (): none ready; None: the run hands out no more
            qid, sample = got
            try:
                self._issue(qid, sample, _monotonic_ns())
                return
            except BaseException as e:  # a SUT error fails this query only; its slot is free again
                self.dispatcher.sut_raised(e, qid)
                got = self._take_one(0.0, 0)

    # The sink, called from any thread.
    def complete(self, qid: int, t_ns: int) -> None:
        """Query ``qid`` completed at ``t_ns``."""
        if self.closed_loop:
            self._issue_next(self._complete_take_one(qid, t_ns, 0.0, 0))
        else:
            self._complete(qid, t_ns)

    def fail(self, qid: int, kind: str, message: str) -> None:
        """Query ``qid`` failed; ``kind`` is its error class."""
        self._fail(qid, kind, message)
        if self.closed_loop:
            self._issue_next(self._take_one(0.0, 0))

    def timed_out(self, qid: int) -> None:
        """The SUT gave up on ``qid`` at the run's timeout; the engine counts it as timed
        out (if it has not already, it does at its next look)."""
        if self.closed_loop:
            self._issue_next(self._take_one(0.0, 0))
