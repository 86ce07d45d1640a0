"""``loadgen merge``: the results of a scaled-out run's workers as one result."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any, Dict, List, Sequence, Tuple

from loadgen.cli.common import (
    COMMON_FLAGS, EXIT_INVALID, EXIT_OK, UsageError, check_output, read, save_html, show_json,
)
from loadgen.options import OPTION_SPECS
from loadgen.results import load_result, render_summary, result_files, write_outputs
from loadgen.results.files import RESULT_FILE
from loadgen.results.merge import Input, merge_results, merge_sweeps, merged_manifest, sweep_records
from loadgen.sweep.files import MANIFEST_FILE, read_manifest, read_records, write_manifest, write_records

__all__ = ["register"]

#: What makes a folder a sweep's: its index, or its points.
SWEEP_INDEX, SWEEP_POINTS = "sweep.jsonl", "points"


def register(sub: Any) -> Dict[str, Any]:
    """Adds ``merge``; returns {name: (handler, known flags)}."""
    merge = sub.add_parser(
        "merge", help="merge the results of a scaled-out run's workers into one",
        description="Merges the results of the workers of one run (--workers N, one result each) into "
        "one result: histograms added exactly, counts summed, time series aligned on the wall clock, "
        "and the metric and validity computed again on the whole. Invalid when a worker is missing or "
        "given twice, was interrupted, started late, or ran other settings. The server's metrics "
        "(--server-metrics-url) and the network counters are merged too. Sweep folders (with "
        "points/*/result.json) are merged point by point into a sweep folder of their own (sweep.json, "
        "sweep.jsonl, sweep.csv, points/), which compare, report and load_sweep read as any sweep.",
    )
    merge.add_argument("paths", nargs="+", metavar="RESULT_OR_DIR",
                       help="the workers' result.json files, folders holding them, or their sweep folders")
    merge.add_argument("--output", metavar="DIR|URL", help="write result.json, summary.txt, latency.hlog and "
                       "results.csv here (for sweeps: sweep.json, sweep.jsonl, sweep.csv and the points under "
                       "DIR/points/); a URL (s3://bucket/prefix) is written locally, then uploaded")
    merge.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                       help="an fsspec filesystem option for a --output URL, like endpoint_url=http://127.0.0.1:9000 "
                       "(repeatable) [env LOADGEN_STORAGE_OPTION, which RESULT_OR_DIR URLs are read with]")
    merge.add_argument("--no-html", action="store_true", default=None,
                       help="do not write report.html in --output [env LOADGEN_NO_HTML]")
    merge.add_argument("--json", action="store_true", default=None,
                       help="print the merged result JSON (a list of the points' for sweeps) instead of the "
                       "summary [env LOADGEN_JSON]")
    merge.add_argument("--quiet", action="store_true", default=None,
                       help="print nothing but errors; the exit code says whether the merge is valid [env LOADGEN_QUIET]")
    return {"merge": (_cmd_merge, ["--output", "--storage-option", "--no-html", *COMMON_FLAGS])}


def _flag(args: argparse.Namespace, name: str) -> bool:
    """A switch (--no-html, --json, --quiet): given, or set in the environment as
    ``loadgen run`` reads it (LOADGEN_NO_HTML ...)."""
    if getattr(args, name, None):
        return True
    spec = next(s for s in OPTION_SPECS if s.name == name)
    raw = os.environ.get(spec.env)
    if raw is None:
        return False
    try:
        return bool(spec.convert(raw))
    except ValueError as e:
        raise UsageError(f"{spec.flag} ({spec.env}): {e}") from None


def _save_reports(merged: List[Tuple[str, Dict[str, Any]]], records: List[Dict[str, Any]], output: str) -> List[str]:
    """report.html of the merged result, or of each merged point and of the sweep."""
    from loadgen.results.html import render_html, render_sweep_html

    if not records:
        return save_html(lambda: render_html([(output, merged[0][1])]), output)
    written: List[str] = []
    for name, doc in merged:
        folder = os.path.join(output, SWEEP_POINTS, name)
        written += save_html(functools.partial(render_html, [(folder, doc)]), folder)
    return written + save_html(lambda: render_sweep_html([(output, records)]), output)


def _save_sweep(records: List[Dict[str, Any]], sources: Sequence[str], output: str) -> List[str]:
    """sweep.json, sweep.jsonl and sweep.csv of a merged sweep, as ``loadgen sweep``
    writes them, so that compare, report and load_sweep read the merged folder as a sweep."""
    manifests = [read(read_manifest, folder) for folder in sources]
    try:
        write_manifest(output, merged_manifest(manifests, records, sources))
        return [os.path.join(output, MANIFEST_FILE), *write_records(output, records)]
    except OSError as e:
        raise UsageError(f"--output: cannot write to {output}: {e.strerror or e}") from None


def is_sweep_folder(path: str) -> bool:
    """Whether ``path`` is a sweep's folder (it holds sweep.jsonl or points/)."""
    return os.path.isdir(path) and (os.path.isfile(os.path.join(path, SWEEP_INDEX))
                                    or os.path.isdir(os.path.join(path, SWEEP_POINTS)))


def _read_all(files: Sequence[str]) -> List[Input]:
    return [(path, read(functools.partial(load_result, what="merge RESULT_OR_DIR"), path)) for path in files]


def _merged(paths: Sequence[str]) -> List[Tuple[str, Dict[str, Any]]]:
    """(point name, or "" for a plain merge; the merged document) for the inputs."""
    sweeps = [p for p in paths if is_sweep_folder(p)]
    if sweeps and len(sweeps) != len(paths):
        others = [p for p in paths if p not in sweeps]
        raise UsageError(f"give sweep folders or results, not both: {', '.join(sweeps)} are sweeps, "
                         f"{', '.join(others)} are not")
    try:
        if sweeps:
            inputs = []
            for folder in sweeps:
                files = result_files([os.path.join(folder, SWEEP_POINTS)])
                if not files:
                    raise UsageError(f"{folder} is a sweep folder without any {SWEEP_POINTS}/*/{RESULT_FILE}")
                inputs.append(_read_all(files))
            return merge_sweeps(inputs)
        files = result_files(paths)
        if not files:
            raise UsageError(f"no {RESULT_FILE} found in {', '.join(paths)}")
        return [("", merge_results(_read_all(files)))]
    except ValueError as e:  # a result that cannot be merged at all; the message names it
        raise UsageError(str(e)) from None


def _cmd_merge(args: argparse.Namespace) -> int:
    check_output(args.output)
    no_html, as_json = _flag(args, "no_html"), _flag(args, "json")
    quiet = _flag(args, "quiet") and not as_json
    merged = _merged(args.paths)
    sources = [p for p in args.paths if is_sweep_folder(p)]
    # A sweep's lines: the merged points, and those that failed on every worker.
    records = sweep_records(merged, [read(read_records, folder) for folder in sources]) if sources else []
    failed = [r for r in records if "schema" not in r]
    written: List[str] = []
    if args.output:
        for name, doc in merged:
            folder = os.path.join(args.output, SWEEP_POINTS, name) if name else args.output
            try:
                written += write_outputs(doc, folder)
            except OSError as e:
                raise UsageError(f"--output: cannot write to {folder}: {e.strerror or e}") from None
        if records:
            written += _save_sweep(records, sources, args.output)
        if not no_html:
            written += _save_reports(merged, records, args.output)
    if as_json:
        code = show_json(records if records else merged[0][1], written, "merged result")
        if code is not None:
            return code
    elif not quiet:
        for name, doc in merged:
            if name:
                print(f"== {name}")
            sys.stdout.write(render_summary(doc))
        for r in failed:
            print(f"== {os.path.basename(str(r['sweep'].get('dir', r['sweep']['key'])))}\n"
                  f"{r['sweep']['status'].upper()} on every worker: {r['sweep'].get('error') or 'no result'}")
        if written:
            print(f"wrote {', '.join(written)}")
    valid = all(doc["valid"] for _, doc in merged) and not failed
    return EXIT_OK if valid else EXIT_INVALID
