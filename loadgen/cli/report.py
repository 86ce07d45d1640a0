"""``loadgen report`` (saved results) and ``loadgen hlog`` (HdrHistogram interval logs)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, Optional, Sequence

from loadgen.cli.common import EXIT_INVALID, EXIT_OK, UsageError, read
from loadgen.results import load_result, render_summary, result_files
from loadgen.results.files import atomic_write
from loadgen.files import HLOG_LIMIT_BYTES, InputFileError, open_bounded
from loadgen.stats.hdrlog import HistogramLogError, HistogramLogReader, LogEntry
from loadgen.stats.hgrm import percentile_distribution
from loadgen.stats.histogram import DEFAULT_PERCENTILES, HdrDecodeError, Histogram
from loadgen.units import NS_PER, TIME_UNITS

__all__ = ["register"]


def register(sub: Any) -> Dict[str, Any]:
    """Adds ``report`` and ``hlog``; returns {name: (handler, known flags or None)}."""
    report = sub.add_parser("report", help="re-render the summary of a saved result.json, or an HTML report",
                            description="Prints the summary of saved results (a result.json "
                            "or a folder holding one). With --html, writes one self-contained HTML "
                            "report instead: several results are overlaid, and sweep folders give the "
                            "throughput/latency curve over their points.")
    report.add_argument("paths", nargs="+", metavar="RESULT_OR_DIR", help="result.json files or folders "
                        "(searched for result.json), or sweep folders")
    report.add_argument("--json", action="store_true", help="print the result JSON instead")
    report.add_argument("--hgrm", metavar="FILE", help="write one result's histogram (--histogram) as "
                        "HdrHistogram's percentile distribution (.hgrm) to FILE ('-': stdout) instead")
    report.add_argument("--histogram", default="latency_ns", metavar="KEY",
                        help="with --hgrm: the result's histogram, a key of its 'histograms' index (default latency_ns)")
    report.add_argument("--unit", choices=sorted(TIME_UNITS), default="us",
                        help="with --hgrm: the unit of the values written (default: us)")
    report.add_argument("--html", metavar="OUT.html", help="write an HTML report of all the results to this file")

    hlog = sub.add_parser(
        "hlog", help="summarize HdrHistogram interval logs (.hlog)",
        description="Merges the intervals of one or more HdrHistogram interval logs, per tag, "
        "and prints count, min, mean, percentiles and max.",
    )
    hlog.add_argument("paths", nargs="+", metavar="FILE", help="interval log files")
    hlog.add_argument("--tag", help="only intervals with this tag ('' for untagged)")
    hlog.add_argument("--unit", choices=sorted(TIME_UNITS), default="us",
                      help="unit to print values in; recorded values are taken as ns (default: us)")
    hlog.add_argument("--json", action="store_true", help="print JSON instead of a table")
    hlog.add_argument("--hgrm", metavar="FILE", help="write the merged intervals (of one tag) as HdrHistogram's "
                      "percentile distribution (.hgrm), values in --unit, to FILE ('-': stdout) instead")
    return {"report": (_cmd_report, None), "hlog": (_cmd_hlog, None)}


def _load(path: str) -> Dict[str, Any]:
    return load_result(path, what="report RESULT_OR_DIR")


def _write_hgrm(target: str, h: Histogram, unit: str) -> int:
    """Writes ``h``'s percentile distribution, values in ``unit``, to ``target`` ('-': stdout)."""
    text = percentile_distribution(h, float(NS_PER[unit]))
    if target == "-":
        sys.stdout.write(text)
        return EXIT_OK
    try:
        atomic_write(target, text)
    except OSError as e:
        raise UsageError(f"--hgrm: cannot write {target}: {e.strerror or e}") from None
    print(f"wrote {target}", file=sys.stderr)
    return EXIT_OK


def _result_hgrm(args: argparse.Namespace, files: Sequence[str]) -> int:
    if len(files) != 1:
        raise UsageError(f"--hgrm writes one result's histogram; {', '.join(args.paths)} hold {len(files)}")
    doc = read(_load, files[0])
    entry = (doc.get("histograms") or {}).get(args.histogram)
    summary = doc.get(args.histogram)
    if entry is None or not isinstance(summary, dict) or not isinstance(summary.get("hdr"), str):
        known = ", ".join(doc.get("histograms") or {}) or "none"
        raise UsageError(f"--histogram: {files[0]} has no histogram {args.histogram!r} (it has: {known})")
    if entry.get("unit") != "ns" or entry.get("scale", 1) != 1:
        raise UsageError(f"--histogram: {args.histogram} is in {entry.get('unit')}, not a time in ns")
    try:
        h = Histogram.decode(summary["hdr"])
    except HdrDecodeError as e:
        raise UsageError(f"{files[0]}: {args.histogram}.hdr cannot be decoded: {e}") from None
    return _write_hgrm(args.hgrm, h, args.unit)
def _run_name(path: str) -> str:
    """A result's name in a report: its folder (or the file when it is not result.json)."""
    folder, base = os.path.split(path)
    return (folder or ".") if base == "result.json" else path


def _cmd_report_html(args: argparse.Namespace) -> int:
    """``report --html OUT``: the results overlaid, or the sweeps' curves; exit 1 when one
    of them is invalid, like the summary."""
    from loadgen.results.html import BokehMissing, render_html, render_sweep_html, write_html
    from loadgen.sweep.files import is_sweep_folder, read_records

    if args.json:
        raise UsageError("--html and --json exclude each other: write the report, or print the JSON")
    out = os.path.abspath(args.html)
    if os.path.isdir(out):
        raise UsageError(f"--html {args.html} is a folder; give the file to write, like report.html")
    if not os.path.isdir(os.path.dirname(out)):
        raise UsageError(f"--html {args.html}: the folder {os.path.dirname(args.html)} does not exist")
    sweeps = [p for p in args.paths if is_sweep_folder(p)]
    try:
        if sweeps:
            if len(sweeps) != len(args.paths):
                others = [p for p in args.paths if p not in sweeps]
                raise UsageError(f"give sweep folders or results, not both: {', '.join(sweeps)} are sweeps, "
                                 f"{', '.join(others)} are not")
            named = [(p, read(read_records, p)) for p in sweeps]
            text = render_sweep_html(named)
            valid = all(r.get("valid") for _, rs in named for r in rs)
        else:
            files = result_files(args.paths)
            if not files:
                raise UsageError(f"no result.json found in {', '.join(args.paths)}")
            runs = [(_run_name(path), read(_load, path)) for path in files]
            text = render_html(runs)
            valid = all(doc.get("valid", False) for _, doc in runs)
    except BokehMissing as e:
        raise UsageError(str(e)) from None
    try:
        write_html(out, text)
    except OSError as e:
        raise UsageError(f"--html: cannot write {args.html}: {e.strerror or e}") from None
    print(f"wrote {args.html}")
    return EXIT_OK if valid else EXIT_INVALID


def _cmd_report(args: argparse.Namespace) -> int:
    if args.html is not None:
        return _cmd_report_html(args)
    files = result_files(args.paths)
    if not files:
        raise UsageError(f"no result.json found in {', '.join(args.paths)}")
    if args.hgrm is not None:
        return _result_hgrm(args, files)
    status = EXIT_OK
    for path in files:
        doc = read(_load, path)
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            if len(files) > 1:
                print(f"== {path}")
            # load_result checked the schema; these are the last line of defence.
            try:
                sys.stdout.write(render_summary(doc))
            except KeyError as e:
                if doc.get("partial"):
                    raise UsageError(f"{path} is a partial result (its document could not be built after "
                                      f"the run) without {e} for a summary; 'loadgen report --json' shows "
                                      "what it holds") from None
                raise UsageError(f"{path}: the result is missing {e}; is it complete?") from None
            except (TypeError, ValueError, AttributeError, OverflowError) as e:
                raise UsageError(f"{path}: the result cannot be summarized: {e}") from None
        if not doc.get("valid", False):
            status = EXIT_INVALID
    return status


# --------------------------------------------------------------------------------- hlog

def _merge_logs(paths: Sequence[str], tag: Optional[str]) -> Dict[str, Dict[str, Any]]:
    """The intervals of every log merged per tag, each log streamed (bounded per line and
    in all, :data:`~loadgen.files.HLOG_LIMIT_BYTES`) rather than read whole."""
    merged: Dict[str, Dict[str, Any]] = {}
    for path in paths:
        try:
            with open_bounded(path, what="hlog FILE", limit_bytes=HLOG_LIMIT_BYTES) as stream, \
                    HistogramLogReader(stream) as reader:
                for entry in reader:
                    _merge_entry(merged, entry, tag, path)
        except InputFileError as e:
            raise UsageError(str(e)) from None
        except HistogramLogError as e:
            raise UsageError(f"hlog FILE: {path}: {e}") from None
    return merged


def _merge_entry(merged: Dict[str, Dict[str, Any]], entry: LogEntry, tag: Optional[str], path: str) -> None:
    key = entry.tag or ""
    if tag is not None and key != tag:
        return
    slot = merged.setdefault(key, {"intervals": 0, "histogram": None})
    slot["intervals"] += 1
    if slot["histogram"] is None:
        slot["histogram"] = entry.histogram.copy()
        return
    try:
        slot["histogram"].add(entry.histogram)
    except ValueError as e:
        raise UsageError(f"{path} line {entry.line_number}: {e}") from None


def _summarize(h: Histogram, scale: float) -> Dict[str, float]:
    out: Dict[str, float] = {"count": h.total_count, "min": h.min / scale, "mean": h.mean / scale}
    for p, v in h.percentiles(DEFAULT_PERCENTILES).items():
        out[f"p{p:g}"] = v / scale
    out["max"] = h.max / scale
    return out


def _cmd_hlog(args: argparse.Namespace) -> int:
    merged = _merge_logs(args.paths, args.tag)
    if not merged:
        print("no intervals found" + (f" with tag {args.tag!r}" if args.tag is not None else ""),
              file=sys.stderr)
        return EXIT_INVALID
    scale = NS_PER[args.unit]
    if args.hgrm is not None:
        if len(merged) > 1:
            raise UsageError(f"--hgrm writes one histogram; the logs have tags {', '.join(repr(t) for t in merged)}: "
                             "choose one with --tag ('' for untagged)")
        return _write_hgrm(args.hgrm, next(iter(merged.values()))["histogram"], args.unit)
    rows = {tag or "(untagged)": {"intervals": slot["intervals"], **_summarize(slot["histogram"], scale)}
            for tag, slot in sorted(merged.items())}
    if args.json:
        print(json.dumps({"unit": args.unit, "tags": rows}, indent=2))
        return EXIT_OK
    columns = list(next(iter(rows.values())).keys())
    print(f"{'tag':<16}" + "".join(f"{c:>14}" for c in columns) + f"   ({args.unit})")
    for tag, row in rows.items():
        cells = [f"{row[c]:>14d}" if isinstance(row[c], int) else f"{row[c]:>14.3f}" for c in columns]
        print(f"{tag:<16}" + "".join(cells))
    return EXIT_OK

