"""``loadgen merge``: the results of a scaled-out run's workers as one result."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from typing import Any, Dict, List, Sequence, Tuple

from loadgen.cli.common import EXIT_INVALID, EXIT_OK, UsageError, check_output, read, save_html
from loadgen.options import OPTION_SPECS
from loadgen.results import load_result, render_summary, result_files, write_outputs
from loadgen.results.files import RESULT_FILE
from loadgen.results.merge import Input, merge_results, merge_sweeps

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
        "given twice, was interrupted, started late, or ran other settings. Sweep folders (with "
        "points/*/result.json) are merged point by point.",
    )
    merge.add_argument("paths", nargs="+", metavar="RESULT_OR_DIR",
                       help="the workers' result.json files, folders holding them, or their sweep folders")
    merge.add_argument("--output", metavar="DIR", help="write result.json, summary.txt, latency.hlog and "
                       "results.csv here (a sweep's points under DIR/points/)")
    merge.add_argument("--json", action="store_true", help="print the merged result JSON instead of the summary")
    merge.add_argument("--no-html", action="store_true", default=None,
                       help="do not write report.html in --output [env LOADGEN_NO_HTML]")
    return {"merge": (_cmd_merge, ["--output", "--json", "--no-html"])}


def _no_html(args: argparse.Namespace) -> bool:
    """--no-html, or LOADGEN_NO_HTML as ``loadgen run`` reads it."""
    if args.no_html:
        return True
    spec = next(s for s in OPTION_SPECS if s.name == "no_html")
    raw = os.environ.get(spec.env)
    if raw is None:
        return False
    try:
        return bool(spec.convert(raw))
    except ValueError as e:
        raise UsageError(f"{spec.flag} ({spec.env}): {e}") from None


def _save_reports(merged: List[Tuple[str, Dict[str, Any]]], output: str) -> List[str]:
    """report.html of the merged result, or of each merged point and of the sweep."""
    from loadgen.results.html import render_html, render_sweep_html

    if len(merged) == 1 and not merged[0][0]:
        return save_html(lambda: render_html([(output, merged[0][1])]), output)
    written: List[str] = []
    records = []
    for i, (name, doc) in enumerate(merged):
        folder = os.path.join(output, SWEEP_POINTS, name)
        written += save_html(functools.partial(render_html, [(folder, doc)]), folder)
        section = dict(doc.get("sweep") or {})
        section.update(status="done", index=section.get("index", i), values=section.get("values") or {"point": name})
        records.append({**doc, "sweep": section})
    return written + save_html(lambda: render_sweep_html([(output, records)]), output)


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
    no_html = _no_html(args)
    merged = _merged(args.paths)
    written: List[str] = []
    if args.output:
        for name, doc in merged:
            folder = os.path.join(args.output, SWEEP_POINTS, name) if name else args.output
            try:
                written += write_outputs(doc, folder)
            except OSError as e:
                raise UsageError(f"--output: cannot write to {folder}: {e.strerror or e}") from None
        if not no_html:
            written += _save_reports(merged, args.output)
    if args.json:
        docs = [doc for _, doc in merged]
        print(json.dumps(docs if any(name for name, _ in merged) else docs[0], indent=2))
    else:
        for name, doc in merged:
            if name:
                print(f"== {name}")
            sys.stdout.write(render_summary(doc))
        if written:
            print(f"wrote {', '.join(written)}")
    return EXIT_OK if all(doc["valid"] for _, doc in merged) else EXIT_INVALID
