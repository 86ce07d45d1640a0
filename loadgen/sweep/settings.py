"""The settings of a sweep itself (hooks, order, repeats, resuming), from ``loadgen
sweep``'s flags or the config file's ``[sweep]`` table (flags win), each checked where
it enters."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from loadgen import defaults as D
from loadgen.sweep.grid import Dimension, SweepError, points_from_list, vary_from_table

__all__ = ["HOOK_TIMEOUT_S", "MAX_REPEAT", "POINT_GAP_S", "ORDERS", "TABLE_KEYS", "SweepSettings", "split_table", "sweep_settings"]

#: The default bound of a hook's run time, in seconds.
HOOK_TIMEOUT_S = 600.0
#: The default time between points of a sweep with --start-at.
POINT_GAP_S = 5.0
#: The most times ``--repeat`` runs each point.
MAX_REPEAT = 1000
ORDERS = ("given", "shuffled")


@dataclass(frozen=True)
class SweepSettings:
    """How a sweep runs its points.

    Attributes:
        before_point, after_point: shell commands run before and after each point.
        hook_timeout_s: the longest a hook may run; longer is a failed point.
        stop_on_error: stop at the first failed point (else record it and go on).
        order: "given" (the grid's order) or "shuffled".
        order_seed: the seed of the shuffled order (None: the run's --seed).
        repeat: runs of each point (rounds: every point once, then again).
        restart: move an earlier sweep's files in the folder aside and start over.
        force_mix: resume although the base options changed, keeping the earlier points.
        point_gap_s: with --start-at: the time between one point's planned end and the
            next point's start (hooks, preparing the SUT, draining).
    """

    before_point: Optional[str] = None
    after_point: Optional[str] = None
    hook_timeout_s: float = HOOK_TIMEOUT_S
    stop_on_error: bool = False
    order: str = "given"
    order_seed: Optional[int] = None
    repeat: int = 1
    restart: bool = False
    force_mix: bool = False
    point_gap_s: float = POINT_GAP_S


def _command(v: Any) -> Optional[str]:
    if not isinstance(v, str):
        raise ValueError(f"must be a shell command (text), got {v!r}")
    return v if v.strip() else None


def _timeout(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number of seconds, got {v!r}") from None
    if not (math.isfinite(x) and 0 < x <= D.MAX_TIME_S):
        raise ValueError(f"must be > 0 and <= {D.MAX_TIME_S:g} s, got {v!r}")
    return x


def _gap(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number of seconds, got {v!r}") from None
    if not (math.isfinite(x) and 0 <= x <= D.MAX_TIME_S):
        raise ValueError(f"must be >= 0 and <= {D.MAX_TIME_S:g} s, got {v!r}")
    return x


def _integer(lo: int, hi: int) -> Callable[[Any], int]:
    def convert(v: Any) -> int:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise ValueError(f"must be an integer, got {v!r}")
        try:
            x = int(v)
        except (TypeError, ValueError):
            raise ValueError(f"must be an integer, got {v!r}") from None
        if not lo <= x <= hi:
            raise ValueError(f"must be in {lo}..{hi}, got {v!r}")
        return x
    return convert


def _order(v: Any) -> str:
    if v not in ORDERS:
        raise ValueError(f"must be one of {', '.join(ORDERS)}; got {v!r}")
    return str(v)


def _flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, got {v!r}")
    return v


_CONVERT: Dict[str, Callable[[Any], Any]] = {
    "before_point": _command, "after_point": _command, "hook_timeout_s": _timeout, "stop_on_error": _flag,
    "order": _order, "order_seed": _integer(0, 2**64 - 1), "repeat": _integer(1, MAX_REPEAT),
    "restart": _flag, "force_mix": _flag, "point_gap_s": _gap,
}
#: The settings a ``[sweep]`` table may hold (--restart and --force-mix are flags only:
#: they are decisions about one folder, not part of a sweep's definition).
TABLE_KEYS = ("before_point", "after_point", "hook_timeout_s", "stop_on_error", "order", "order_seed", "repeat",
              "point_gap_s")


def sweep_settings(flags: Mapping[str, Any], table: Mapping[str, Any], where: str) -> SweepSettings:
    """The settings from ``table`` (the ``[sweep]`` table's settings, named in ``where``)
    overridden by ``flags`` (name -> value given on the command line)."""
    values: Dict[str, Any] = {}
    for source, items in ((where, table), ("flag", flags)):
        for name, raw in items.items():
            try:
                values[name] = _CONVERT[name](raw)
            except ValueError as e:
                flag = "--" + name.replace("_", "-")
                raise SweepError(f"{flag} ({source}): {e}") from None
    return SweepSettings(**values)



def split_table(table: Mapping[str, Any], where: str) -> Tuple[List[Dimension], Optional[List[Dict[str, Any]]],
                                                               Dict[str, Any]]:
    """A ``[sweep]`` table's parts: its grid (``vary``), its list of points (``points``,
    None when absent) and its settings (raw, for :func:`sweep_settings`)."""
    dims: List[Dimension] = []
    points: Optional[List[Dict[str, Any]]] = None
    raw: Dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name == "vary":
            dims = vary_from_table(value, where)
        elif name == "points":
            points = points_from_list(value, where)
        elif name in TABLE_KEYS:
            raw[name] = value
        else:
            import difflib

            close = difflib.get_close_matches(name, ["vary", "points", *TABLE_KEYS], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SweepError(f"{where} unknown key {key!r}{hint} (it holds vary, points, "
                             f"{', '.join(TABLE_KEYS)}; run options go outside the table)")
    return dims, points, raw
