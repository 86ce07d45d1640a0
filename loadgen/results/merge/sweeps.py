"""Merged sweeps as sweep folders: points matched across the workers' folders, their
``sweep`` sections, the merged sweep.jsonl lines and sweep.json.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from loadgen.results.merge.workers import Worker
from loadgen.sweep.files import MANIFEST_SCHEMA, POINTS_DIR

__all__ = ["merged_manifest", "sweep_key", "sweep_records", "sweep_section"]


def sweep_key(path: str, doc: Dict[str, Any]) -> str:
    """What identifies a sweep point across the workers' sweep folders: its
    ``sweep.key`` when the document has one, else the point's folder name
    (``points/NNN-<slug>``)."""
    sweep = doc.get("sweep")
    if isinstance(sweep, dict) and "key" in sweep:
        return json.dumps(sweep["key"], sort_keys=True)
    return os.path.basename(os.path.dirname(os.path.abspath(path)))


def sweep_section(workers: Sequence[Worker]) -> Dict[str, Any]:
    """A merged point's ``sweep`` section: the first worker's (index, values, key,
    repeat, seeds), with the status of the point on every worker: "done" when it is
    done on each, else the first other status (a worker's point failed or was
    interrupted)."""
    section: Dict[str, Any] = dict(workers[0].doc.get("sweep") or {})
    statuses = [str((w.doc.get("sweep") or {}).get("status", "done")) for w in workers]
    section["status"] = next((s for s in statuses if s != "done"), "done")
    section.pop("wall_s", None)
    return section


def sweep_records(merged: Sequence[Tuple[str, Dict[str, Any]]],
                  workers_records: Sequence[Sequence[Dict[str, Any]]] = ()) -> List[Dict[str, Any]]:
    """The merged points of :func:`merge_sweeps` as the lines of a sweep's sweep.jsonl
    (:mod:`loadgen.sweep.files`), in point order: each document with its ``sweep``
    section, complete (index, repeat, key, values, status, dir) also for points from
    results that lack one. ``workers_records``: the workers' own sweep.jsonl lines; a
    point that no worker has a result of (it failed everywhere: a hook, the server's
    readiness) is kept as the first worker's record of it, as a sweep keeps it."""
    keys = {str((doc.get("sweep") or {}).get("key")) for _, doc in merged}
    records = []
    for lines in workers_records:
        for record in lines:
            if str(record["sweep"]["key"]) not in keys and "schema" not in record:
                keys.add(str(record["sweep"]["key"]))
                records.append(record)
    for i, (name, doc) in enumerate(merged):
        section = dict(doc.get("sweep") or {})
        section.setdefault("index", i)
        section.setdefault("repeat", 0)
        section.setdefault("key", name)
        if not isinstance(section["key"], str):  # a sweep's keys are texts
            section["key"] = json.dumps(section["key"], sort_keys=True)
        section.setdefault("status", "done")
        if not isinstance(section.get("values"), dict) or not section["values"]:
            section["values"] = {"point": name}
        section["dir"] = f"{POINTS_DIR}/{name}"
        records.append({**doc, "sweep": section})
    return sorted(records, key=lambda r: (r["sweep"]["index"], r["sweep"]["repeat"]))


def merged_manifest(manifests: Sequence[Optional[Dict[str, Any]]], records: Sequence[Dict[str, Any]],
                    sources: Sequence[str]) -> Dict[str, Any]:
    """The sweep.json of a merged sweep: the first worker's manifest (its base options
    with the load of all workers, no worker index), the merged points, and
    ``merged_from``, the workers' sweep folders. A worker folder without a manifest
    gives one with the swept names of the points' values."""
    first = next((m for m in manifests if m), None)
    now = datetime.datetime.now(tz=datetime.timezone.utc).isoformat(timespec="seconds")
    manifest: Dict[str, Any] = dict(first) if first else {
        "schema": MANIFEST_SCHEMA, "created_at": now, "base": {},
        "swept": list(dict.fromkeys(k for r in records for k in r["sweep"]["values"]))}
    base = dict(manifest.get("base") or {})
    base.pop("worker_index", None)
    manifest.update(base=base, updated_at=now, merged_from=list(sources), points=[
        {k: r["sweep"][k] for k in ("index", "repeat", "key", "values", "dir", "seed") if k in r["sweep"]}
        for r in records])
    return manifest
