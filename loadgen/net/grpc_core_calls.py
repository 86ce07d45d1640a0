"""Unary calls on a grpcio channel through grpcio's core binding (``grpc._cython.cygrpc``),
completed on a thread of this module's own.

grpcio's ``.future()`` builds, per call, a rendezvous object with its condition, an event
handler, a call state and a deadline conversion, and runs its callbacks through its own
completion loop; here a call is its six operations in one batch and one event, handled
by a plain function: about 50 us less Python per call at concurrency 1. The binding is
not grpcio's public API, so :meth:`CoreCalls.start` probes it with one real call before
the run and the gRPC client uses ``.future()`` wherever the probe fails (an older or
newer grpcio whose binding differs).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

__all__ = ["CoreCalls"]

#: handler(tag, code, details, message, t_ns): the call's status code (an int, 0 is OK),
#: its status details, the response message (None without one), and when it ended.
Handler = Callable[[Any, int, str, Optional[bytes], int], None]

_PROBE_TIMEOUT_S = 5.0


class CoreCalls:
    """Unary calls of one method on one channel, each ending in ``handler``, which runs on
    this object's thread. Thread-safe: :meth:`call` may be called from any thread,
    including the handler's.

    Args:
        channel: a ``grpc.Channel`` from ``grpc.insecure_channel`` / ``secure_channel``.
        method: the method's path (``/package.Service/Method``).
        handler: called once per call, on this object's thread.
    """

    def __init__(self, channel: Any, method: str, handler: Handler) -> None:
        from grpc._cython import cygrpc

        self._cy = channel._channel
        self._method = method.encode()
        self._handler = handler
        self._ops = (cygrpc.SendInitialMetadataOperation, cygrpc.SendMessageOperation,
                     cygrpc.SendCloseFromClientOperation, cygrpc.ReceiveInitialMetadataOperation,
                     cygrpc.ReceiveMessageOperation, cygrpc.ReceiveStatusOnClientOperation)
        self._handle = self._cy.get_registered_call_handle(self._method)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    def start(self, probe_method: str, metadata: Optional[Sequence[Tuple[str, str]]]) -> bool:
        """Makes one call of ``probe_method`` (empty request) through the binding and
        waits for it; on success starts the completion thread. False (and nothing
        running) when the binding does not work as expected."""
        done: Dict[str, Any] = {}
        ended = threading.Event()
        ops = self._batch(b"", metadata)
        try:
            self._cy.integrated_call(0, probe_method.encode(), None, time.time() + _PROBE_TIMEOUT_S, metadata,
                                     None, ((ops, "probe"),), None, self._cy.get_registered_call_handle(
                                         probe_method.encode()))
            deadline = time.monotonic() + _PROBE_TIMEOUT_S + 1.0
            while time.monotonic() < deadline:
                event = self._cy.next_call_event()
                if getattr(event, "tag", None) == "probe":
                    done["code"] = event.batch_operations[5].code()
                    ended.set()
                    break
        except Exception:  # not the binding this module was written for
            return False
        if not ended.is_set() or not isinstance(done.get("code"), int):
            return False
        self._thread = threading.Thread(target=self._run, name="loadgen-grpc-completions", daemon=True)
        self._thread.start()
        return True

    def _batch(self, data: bytes, metadata: Optional[Sequence[Tuple[str, str]]]) -> tuple:
        s_meta, s_msg, s_close, r_meta, r_msg, r_status = self._ops
        return (s_meta(metadata, 0), s_msg(data, 0), s_close(0), r_meta(0), r_msg(0), r_status(0))

    def call(self, data: bytes, timeout_s: Optional[float], metadata: Optional[Sequence[Tuple[str, str]]],
             tag: Any) -> None:
        """Starts one call with request bytes ``data``; ``handler(tag, ...)`` follows."""
        self._call(self._method, self._handle, data, timeout_s, metadata, tag)

    def _call(self, method: bytes, handle: Any, data: bytes, timeout_s: Optional[float],
              metadata: Optional[Sequence[Tuple[str, str]]], tag: Any) -> None:
        deadline = None if timeout_s is None else time.time() + timeout_s
        with self._lock:
            self._in_flight += 1
        try:
            self._cy.integrated_call(0, method, None, deadline, metadata, None, ((self._batch(data, metadata), tag),),
                                     None, handle)
        except BaseException:
            with self._lock:
                self._in_flight -= 1
            raise

    def _run(self) -> None:
        next_event, handler, monotonic_ns = self._cy.next_call_event, self._handler, time.monotonic_ns
        while True:
            try:
                event = next_event()
            except Exception:  # the channel is gone
                return
            t = monotonic_ns()
            ops = event.batch_operations
            if ops is None or len(ops) != 6:  # not a call's batch (the queue shut down)
                return
            with self._lock:
                self._in_flight -= 1
                last = self._stopping and self._in_flight == 0
            try:
                handler(event.tag, ops[5].code(), ops[5].details() or "", ops[4].message(), t)
            except Exception:  # the handler fails its own query; nothing may end this loop
                pass
            if last:
                return

    def stop(self, wake_method: str, metadata: Optional[Sequence[Tuple[str, str]]]) -> bool:
        """Lets the completion thread end with the last call in flight. Call it before
        closing the channel: the thread must never wait on a closed channel's queue with
        no call left to end, so a last call of ``wake_method`` (empty request, 0.25 s
        deadline) is started when none is in flight. Closing the channel then cancels
        what is left, and the thread ends as those calls end (:meth:`join`). False when
        that last call could not start: the thread is left waiting (a daemon), and the
        channel must then be left open."""
        if self._thread is None:
            return True
        with self._lock:
            self._stopping = True
            idle = self._in_flight == 0
        if idle:
            wake = wake_method.encode()
            try:
                self._call(wake, self._cy.get_registered_call_handle(wake), b"", 0.25, metadata, None)
            except Exception:
                return False
        return True

    def join(self, timeout_s: float) -> None:
        """Waits up to ``timeout_s`` for the completion thread (after :meth:`stop`)."""
        if self._thread is not None:
            self._thread.join(timeout_s)
