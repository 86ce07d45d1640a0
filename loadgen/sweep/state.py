"""A sweep's folder as it stands: the manifest, the records of the points run so far,
and the decision to resume, refuse a changed configuration, mix, or start over."""

from __future__ import annotations

import datetime as _dt
import os
from typing import IO, Any, Dict, List, Optional, Sequence

from loadgen.net.options import options_redactor
from loadgen.options import RunOptions
from loadgen.sweep.files import (
    MANIFEST_FILE, MANIFEST_SCHEMA, POINTS_DIR, SWEEP_CSV, SWEEP_JSONL, read_manifest, read_records, write_manifest,
    write_records,
)
from loadgen.sweep.grid import SweepError
from loadgen.sweep.plan import PlannedRun, key_options
from loadgen.sweep.settings import SweepSettings

__all__ = ["LOCK_FILE", "SweepState", "base_differences", "open_sweep"]

#: Held (flock) while a sweep writes to its folder, so that two cannot mix their files.
LOCK_FILE = ".sweep.lock"


def _now() -> str:
    return _dt.datetime.now(tz=_dt.timezone.utc).isoformat(timespec="seconds")


def base_differences(recorded: Dict[str, Any], base: Dict[str, Any], swept: Sequence[str]) -> List[str]:
    """The options (but the swept ones) whose base value differs from the recorded, as
    ``--name was X, now Y``."""
    out = []
    for name in sorted(set(recorded) & set(base)):
        if name not in swept and recorded[name] != base[name]:
            out.append(f"--{name.replace('_', '-')} was {recorded[name]!r}, now {base[name]!r}")
    return out


class SweepState:
    """The records of a sweep folder by point key, kept in step with its files (which
    never hold the secrets of any point's options: credential headers, URL passwords
    and keys)."""

    def __init__(self, directory: str, runs: Sequence[PlannedRun], records: List[Dict[str, Any]],
                 lock: Optional[IO[bytes]]) -> None:
        self.directory = directory
        self.runs = list(runs)
        self._redactor = options_redactor(*(r.options for r in self.runs))
        self.records: Dict[str, Dict[str, Any]] = {}
        self._earlier: List[str] = []  # keys of records no planned run has, in their order
        planned = {r.key for r in runs}
        for record in records:
            key = record["sweep"]["key"]
            if key not in planned and key not in self.records:
                self._earlier.append(key)
            self.records[key] = record
        self._lock = lock

    def finished(self, run: PlannedRun) -> bool:
        """Whether the run is done (ran to its end, hooks included) in an earlier sweep."""
        record = self.records.get(run.key)
        return record is not None and record["sweep"]["status"] == "done"

    def ordered(self) -> List[Dict[str, Any]]:
        """The records in point order (index, then repeat), then those of earlier points
        that are no longer planned (kept with --force-mix, or after the grid shrank)."""
        planned = sorted(self.runs, key=lambda r: (r.index, r.repeat))
        keys = [r.key for r in planned if r.key in self.records] + self._earlier
        return [self.records[k] for k in keys]

    def planned_records(self) -> List[Optional[Dict[str, Any]]]:
        """The record of each planned run (None where it has not run), in point order."""
        return [self.records.get(r.key) for r in sorted(self.runs, key=lambda r: (r.index, r.repeat))]

    def folder(self, run: PlannedRun) -> str:
        """The run's folder: its planned one, unless an earlier record of other options
        (kept with --force-mix) has it; then the first free ``-2``, ``-3``, ... of it."""
        taken = {r["sweep"].get("dir") for k, r in self.records.items() if k != run.key}
        folder, n = run.dir, 1
        while folder in taken:
            n += 1
            folder = f"{run.dir}-{n}"
        return folder

    def update(self, record: Dict[str, Any]) -> List[str]:
        """Keeps a point's record and rewrites sweep.jsonl and sweep.csv; returns their paths."""
        self.records[record["sweep"]["key"]] = self._redactor.doc(record)
        return write_records(self.directory, self.ordered())

    def close(self) -> None:
        """Releases the folder's lock."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _lock(directory: str) -> Optional[IO[bytes]]:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no flock (Windows): no lock
        return None
    f = open(os.path.join(directory, LOCK_FILE), "ab")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise SweepError(f"--output {directory}: another loadgen sweep is writing there") from None
    return f


def _move_aside(directory: str) -> Optional[str]:
    """--restart: the earlier sweep's files moved into ``restarted-<time>/``; returns
    that folder (None when there was nothing to move)."""
    names = [n for n in (MANIFEST_FILE, SWEEP_JSONL, SWEEP_CSV, POINTS_DIR) if os.path.lexists(os.path.join(directory, n))]
    if not names:
        return None
    stamp = _dt.datetime.now(tz=_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    aside = os.path.join(directory, f"restarted-{stamp}")
    suffix = 1
    while os.path.lexists(aside):
        suffix += 1
        aside = os.path.join(directory, f"restarted-{stamp}-{suffix}")
    os.makedirs(aside)
    for name in names:
        os.rename(os.path.join(directory, name), os.path.join(aside, name))
    return aside


def _manifest(base: RunOptions, swept: Sequence[str], runs: Sequence[PlannedRun], settings: SweepSettings,
              earlier: Optional[Dict[str, Any]], mixed: bool) -> Dict[str, Any]:
    manifest: Dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "created_at": earlier.get("created_at", _now()) if earlier else _now(),
        "updated_at": _now(),
        "base": key_options(base),
        "swept": list(swept),
        "settings": {"repeat": settings.repeat, "order": settings.order, "order_seed": settings.order_seed,
                     "before_point": settings.before_point, "after_point": settings.after_point,
                     "hook_timeout_s": settings.hook_timeout_s, "stop_on_error": settings.stop_on_error},
        "points": [{"index": r.index, "repeat": r.repeat, "key": r.key, "values": r.values, "dir": r.dir,
                    "seed": r.options.seed}
                   for r in sorted(runs, key=lambda r: (r.index, r.repeat))],
    }
    if earlier:
        mixes = list(earlier.get("earlier_bases", []))
        if mixed:
            mixes.append(earlier["base"])
        if mixes:
            manifest["earlier_bases"] = mixes
    return manifest


def open_sweep(directory: str, base: RunOptions, swept: Sequence[str], runs: Sequence[PlannedRun],
               settings: SweepSettings) -> SweepState:
    """Opens (creating) the sweep folder and decides how this sweep goes on from what is
    there: resume (same base options), refuse (the base options changed), mix
    (``force_mix``) or start over (``restart``: the earlier files are moved aside).
    Writes the manifest. Holds the folder's lock until :meth:`SweepState.close`.

    Raises:
        SweepError: the base options changed, or the folder's files are not a sweep's.
    """
    os.makedirs(directory, exist_ok=True)
    redactor = options_redactor(base, *(r.options for r in runs))
    lock = _lock(directory)
    try:
        if settings.restart:
            _move_aside(directory)
        try:
            earlier = read_manifest(directory)
            records = read_records(directory)
        except ValueError as e:
            raise SweepError(f"--output {directory}: {e}; use --restart to move it aside and start over") from None
        if records and earlier is None:
            raise SweepError(f"--output {directory} holds {SWEEP_JSONL} but no {MANIFEST_FILE}; use --restart to "
                             "move them aside and start over")
        mixed = False
        if earlier is not None:
            # Compared as written: redacted (a manifest written before redaction is redacted here).
            problems = base_differences(redactor.doc(earlier["base"]), redactor.doc(key_options(base)),
                                        [*swept, *earlier["swept"]])
            if problems and not settings.force_mix:
                raise SweepError(
                    f"--output {directory} holds a sweep of other base options ({'; '.join(problems)}). Give the "
                    "same options to resume it, --restart to move it aside and start over, or --force-mix to "
                    "run these points beside the earlier ones")
            mixed = bool(problems)
        if earlier is not None:
            earlier = redactor.doc(earlier)
        write_manifest(directory, redactor.doc(_manifest(base, swept, runs, settings, earlier, mixed)))
        return SweepState(directory, runs, records, lock)
    except BaseException:
        if lock is not None:
            lock.close()
        raise
