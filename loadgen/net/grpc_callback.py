"""The KServe v2 gRPC client with no event loop (``grpc_engine`` "callback"): grpcio's
synchronous channel, each call started from the thread that hands out the query and
completed on one completion thread per channel, straight into the engine (see
:class:`loadgen.sut.CallbackSUT`). In a closed loop the completion also starts the next
query there, so one thread wakes per call.

The calls go through grpcio's core binding (:class:`~loadgen.net.grpc_core_calls.CoreCalls`,
``grpc_calls`` "core") where a probe before the run finds it as expected, else through
``.future()`` and its done-callback on grpcio's own completion thread (``grpc_calls``
"future"); both end in the same checks, error classes and counts.

Preparation, error classes, response checks and the report are those of
:class:`~loadgen.net.kserve_grpc.KServeGrpcSUT` (the asyncio client).
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from typing import Any, Dict, Optional

from loadgen.net.grpc_core_calls import CoreCalls
from loadgen.net.kserve_grpc import RPC, KServeGrpcSUT, import_grpc
from loadgen.net.options import NetOptions
from loadgen.net.targets import Target
from loadgen.sut.forms import CallbackSUT

__all__ = ["KServeGrpcCallbackSUT"]

_monotonic_ns = time.monotonic_ns


def _hold_completion_thread(channel: Any) -> Optional[Any]:
    """Keeps the channel's completion thread for the run; returns the channel's call
    state to release it with (None where this grpcio has no such state: it then works as
    it is). grpcio starts that thread when a channel's first call starts and ends it when
    its last call ends, so an open loop whose calls all end between two arrivals would
    start a thread per call (and wait for it on the issuing thread). The hold counts as
    one more call in progress, as grpcio's own call management does."""
    import grpc._channel as impl

    state = getattr(channel, "_call_state", None)
    spin = getattr(impl, "_run_channel_spin_thread", None)
    if state is None or spin is None or not isinstance(getattr(state, "managed_calls", None), int):
        return None
    with state.lock:
        if state.managed_calls == 0:
            state.managed_calls = 1
            spin(state)
        else:
            state.managed_calls += 1
    return state


class KServeGrpcCallbackSUT(CallbackSUT, KServeGrpcSUT):
    """KServe v2 gRPC ``ModelInfer`` on grpcio's synchronous channel with done-callbacks.

    Calls in flight are capped as in the asyncio client (``pool_size``: the concurrency,
    the in-flight cap, or 64 for an uncapped open loop); queries over the cap wait in
    order and start as calls end.
    """

    grpc_engine = "callback"
    #: Calls through grpcio's core binding where its probe passes (False: always .future()).
    core_calls = True

    def __init__(self, target: Target, net: NetOptions, pool_size: int) -> None:
        super().__init__(target, net, pool_size)
        grpc = import_grpc()
        self._rpc_error = grpc.RpcError
        self._cancelled_error = grpc.FutureCancelledError
        self._status = {c.value[0]: c for c in grpc.StatusCode}
        self._unknown = grpc.StatusCode.UNKNOWN
        self._cores: list = []  # per channel: its CoreCalls, or None where calls use .future()
        self._lock = threading.Lock()
        self._running = 0  # calls started and not yet ended
        self._next_call = 0
        self._closed = False
        self._waiting: collections.deque = collections.deque()
        self._n_requests = 0
        self._holds: list = []  # (channel, call state) of the completion threads held

    def open(self, sink: Any) -> None:
        """Opens the channels, each connected by one ServerReady call, before the run."""
        self.sink = sink
        options = self.run_options()
        try:
            for _ in range(self.connections):
                ch = self.sync_channel(options)
                self.channels.append(ch)
                try:  # connects now rather than in the first measured call; a failure shows in the run
                    ch.unary_unary(RPC["ServerReady"])(b"", timeout=min(5.0, self.net.ready_timeout_s),
                                                       metadata=self.metadata_md)
                except self._rpc_error:
                    pass
                self.calls.append(ch.unary_unary(RPC["ModelInfer"]))
                core = self._core_calls(ch)
                self._cores.append(core)
                if core is None:
                    state = _hold_completion_thread(ch)
                    if state is not None:
                        self._holds.append((ch, state))
        except BaseException:
            self.close()
            raise
        self._n_requests = len(self.requests)

    def _core_calls(self, channel: Any) -> Optional[CoreCalls]:
        if not self.core_calls:
            return None
        try:
            core = CoreCalls(channel, RPC["ModelInfer"], self._core_done)
        except Exception:  # a grpcio without the binding's pieces
            return None
        return core if core.start(RPC["ServerReady"], self.metadata_md) else None

    def report(self) -> Dict[str, Any]:
        out = super().report()
        out["grpc_calls"] = "core" if self._cores and all(self._cores) else "future"
        return out

    def close(self) -> None:
        """Releases the completion threads and closes the channels; the calls they still
        carry end unreported (the engine has resolved their queries)."""
        self._closed = True
        left_open = set()
        for i, core in enumerate(self._cores):
            if core is not None and not core.stop(RPC["ServerReady"], self.metadata_md):
                left_open.add(i)
        for ch, state in self._holds:
            # A last call, started before the hold goes, ends the thread as it ends: a
            # thread left waiting with no call in progress would wait on a closed queue.
            last = ch.unary_unary(RPC["ServerReady"]).future(b"", timeout=0.25)
            with state.lock:
                state.managed_calls -= 1
            try:
                last.result(timeout=5.0)
            except Exception:  # its outcome does not matter, only that it ended
                pass
        self._holds.clear()
        for i, ch in enumerate(self.channels):
            if i not in left_open:
                ch.close()
        for core in self._cores:
            if core is not None:
                core.join(5.0)

    def issue_query(self, query_id: int, sample_index: int, scheduled_ns: int) -> None:
        data = self.requests[sample_index % self._n_requests]
        with self._lock:
            if self._running >= self.in_flight:
                self._waiting.append((query_id, data, scheduled_ns))
                return
            self._running += 1
        self._start(query_id, data, scheduled_ns)

    def _start(self, qid: int, data: bytes, scheduled_ns: int) -> None:
        i = self._next_call % len(self.calls)
        self._next_call += 1
        core = self._cores[i]
        try:
            if core is not None:
                core.call(data, self.call_timeout_s(scheduled_ns), self.metadata_md, qid)
                return
            future = self.calls[i].future(data, timeout=self.call_timeout_s(scheduled_ns), metadata=self.metadata_md)
        except BaseException:
            self._ended()
            raise
        future.add_done_callback(functools.partial(self._done, qid))

    def _ended(self) -> None:
        # One call ended: the oldest waiting query, if any, takes its place.
        with self._lock:
            if not self._waiting:
                self._running -= 1
                return
            qid, data, scheduled_ns = self._waiting.popleft()
        try:
            self._start(qid, data, scheduled_ns)
        except BaseException as e:  # fails that query only
            self.fail_query(qid, type(e).__name__, str(e))

    def _done(self, qid: int, future: Any) -> None:
        # On grpcio's completion thread, which logs and drops what a callback raises: an
        # error here fails the query instead of leaving it to the timeout.
        t = _monotonic_ns()
        if self._closed:
            return
        try:
            self._ended()
            self._resolve(qid, future, t)
        except Exception as e:
            self.fail_query(qid, type(e).__name__, f"the response handling raised: {e}")

    def _core_done(self, qid: Any, code: int, details: str, message: Optional[bytes], t: int) -> None:
        # On this client's completion thread (CoreCalls); qid None: the call that wakes it.
        if self._closed or qid is None:
            return
        try:
            self._ended()
            if code != 0:
                self._failed(qid, self._status.get(code, self._unknown), details)
            elif message is None:
                self.fail_query(qid, "invalid_response", "the call ended OK without a response message")
            else:
                self.answered(qid, message, t)
        except Exception as e:
            self.fail_query(qid, type(e).__name__, f"the response handling raised: {e}")

    def _failed(self, qid: int, code: Any, details: Optional[str]) -> None:
        failure = self.failure_of(code, details)
        if failure is None:  # a deadline the timeout set: the engine counts it as timed out
            self.sink.timed_out(qid)
        else:
            self.fail_query(qid, *failure)

    def _resolve(self, qid: int, future: Any, t: int) -> None:
        try:
            raw = future.result()
        except self._rpc_error as e:
            self._failed(qid, e.code(), e.details())
            return
        except self._cancelled_error:
            self.fail_query(qid, "grpc_CANCELLED", "the call was cancelled")
            return
        self.answered(qid, raw, t)
