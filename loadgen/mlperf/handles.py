"""MLPerf's SUT, QSL and QDL handles: ConstructSUT ... DestroyQSL.

MLPerf's Python module hands out integer handles; these are keys into a table of the
callbacks they were made from, which StartTest looks up with :func:`lookup`.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any, Callable

__all__ = [
    "ConstructFastSUT",
    "ConstructQDL",
    "ConstructQSL",
    "ConstructSUT",
    "DestroyFastSUT",
    "DestroyQDL",
    "DestroyQSL",
    "DestroySUT",
    "QslHandle",
    "SutHandle",
    "lookup",
]

_handles: dict[int, Any] = {}
_handle_ids = itertools.count(1)
_handles_lock = threading.Lock()


@dataclass
class SutHandle:
    issue: Callable[..., Any]
    flush: Callable[[], Any]
    fast: bool
    name: str
    name_cb: Callable[[], str] | None = None  # a query dispatch library names itself


@dataclass
class QslHandle:
    total_sample_count: int
    performance_sample_count: int
    load: Callable[[list], Any]
    unload: Callable[[list], Any]
    name: str = "PyQSL"


def _new_handle(obj: Any) -> int:
    with _handles_lock:
        handle = next(_handle_ids)
        _handles[handle] = obj
        return handle


def lookup(handle: int, kind: type, what: str) -> Any:
    obj = _handles.get(handle) if isinstance(handle, int) else None
    if not isinstance(obj, kind):
        raise TypeError(
            f"{what} {handle!r} is not a live handle from Construct{what}()"
        )
    return obj


def _destroy(handle: int, kind: type, what: str) -> None:
    lookup(handle, kind, what)
    with _handles_lock:
        del _handles[handle]


def _callable(value: Any, what: str) -> Callable:
    if not callable(value):
        raise TypeError(f"{what} must be callable, got {type(value).__name__}")
    return value


def ConstructSUT(
    issue_cb: Callable[[list], Any], flush_queries_cb: Callable[[], Any]
) -> int:
    """Creates a system under test from two callbacks.

    Args:
        issue_cb: called with a list of :class:`QuerySample` per query (or per coalesced
            group of Server queries), on the thread that called StartTest.
        flush_queries_cb: called once issuing has ended.

    Returns:
        A handle for StartTest and DestroySUT.
    """
    return _new_handle(
        SutHandle(
            _callable(issue_cb, "issue_cb"),
            _callable(flush_queries_cb, "flush_queries_cb"),
            False,
            "PySUT",
        )
    )


def DestroySUT(sut: int) -> None:
    """Releases a handle from ConstructSUT."""
    _destroy(sut, SutHandle, "SUT")


def ConstructFastSUT(
    fast_issue_cb: Callable[[list, list], Any], flush_queries_cb: Callable[[], Any]
) -> int:
    """Like ConstructSUT, but issue gets two lists: the sample ids and the QSL indices."""
    return _new_handle(
        SutHandle(
            _callable(fast_issue_cb, "fast_issue_cb"),
            _callable(flush_queries_cb, "flush_queries_cb"),
            True,
            "PyFastSUT",
        )
    )


def DestroyFastSUT(sut: int) -> None:
    """Releases a handle from ConstructFastSUT."""
    _destroy(sut, SutHandle, "SUT")


def ConstructQSL(
    total_sample_count: int,
    performance_sample_count: int,
    load_samples_to_ram: Callable[[list], Any],
    unload_samples_from_ram: Callable[[list], Any],
) -> int:
    """Creates a query sample library.

    Args:
        total_sample_count: samples in the data set.
        performance_sample_count: samples that fit in memory together (the loaded set of
            a performance run).
        load_samples_to_ram: called with a list of QSL indices before a run uses them.
        unload_samples_from_ram: called with the same list afterwards.

    Returns:
        A handle for StartTest and DestroyQSL.
    """
    for name, value in (
        ("total_sample_count", total_sample_count),
        ("performance_sample_count", performance_sample_count),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TypeError(f"{name} must be an int >= 0, got {value!r}")
    return _new_handle(
        QslHandle(
            total_sample_count,
            performance_sample_count,
            _callable(load_samples_to_ram, "load_samples_to_ram"),
            _callable(unload_samples_from_ram, "unload_samples_from_ram"),
        )
    )


def DestroyQSL(qsl: int) -> None:
    """Releases a handle from ConstructQSL."""
    _destroy(qsl, QslHandle, "QSL")


def ConstructQDL(
    issue_cb: Callable[[list], Any],
    flush_queries_cb: Callable[[], Any],
    name_cb: Callable[[], str],
) -> int:
    """Creates a query dispatch library: a SUT whose name comes from ``name_cb``.

    MLPerf uses it to forward queries to SUTs over the network (the harness's issue_cb
    does the forwarding). StartTest takes it where it takes a SUT.

    Args:
        issue_cb: as for :func:`ConstructSUT`.
        flush_queries_cb: as for :func:`ConstructSUT`.
        name_cb: returns the SUT name for the logs; called once per test.

    Returns:
        A handle for StartTest and DestroyQDL.
    """
    return _new_handle(
        SutHandle(
            _callable(issue_cb, "issue_cb"),
            _callable(flush_queries_cb, "flush_queries_cb"),
            False,
            "",
            _callable(name_cb, "name_cb"),
        )
    )


def DestroyQDL(qdl: int) -> None:
    """Releases a handle from ConstructQDL."""
    _destroy(qdl, SutHandle, "QDL")
