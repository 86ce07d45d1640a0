"""The ``loadgen`` command line. Only :func:`main` turns errors into exit codes.

Exit codes: 0 success, 1 the command ran but failed, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional, Sequence

from loadgen import __version__
from loadgen.hdrlog import HistogramLogError, read_log
from loadgen.histogram import DEFAULT_PERCENTILES, Histogram

__all__ = ["main"]

_UNITS_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


class _UsageError(Exception):
    """Bad input from the user: exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits by default; main decides
        raise _UsageError(f"{self.prog}: {message}")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="loadgen", description="Load generator for ML inference.")
    parser.add_argument("--version", action="version", version=f"loadgen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    hlog = sub.add_parser(
        "hlog",
        help="summarize HdrHistogram interval logs (.hlog)",
        description="Merge the intervals of one or more HdrHistogram interval logs, per "
        "tag, and print count, min, mean, percentiles and max.",
    )
    hlog.add_argument("paths", nargs="+", metavar="FILE", help="interval log files")
    hlog.add_argument("--tag", help="only intervals with this tag ('' for untagged)")
    hlog.add_argument(
        "--unit", choices=sorted(_UNITS_NS), default="us",
        help="unit to print values in; recorded values are taken as ns (default: us)",
    )
    hlog.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def _merge_logs(paths: Sequence[str], tag: Optional[str]) -> dict:
    merged: dict = {}
    for path in paths:
        try:
            entries = read_log(path)
        except OSError as e:
            raise _UsageError(f"cannot read {path}: {e.strerror or e}") from None
        except HistogramLogError as e:
            raise _UsageError(f"{path}: {e}") from None
        for entry in entries:
            key = entry.tag or ""
            if tag is not None and key != tag:
                continue
            slot = merged.setdefault(key, {"intervals": 0, "histogram": None})
            slot["intervals"] += 1
            if slot["histogram"] is None:
                slot["histogram"] = entry.histogram.copy()
                continue
            try:
                slot["histogram"].add(entry.histogram)
            except ValueError as e:
                raise _UsageError(f"{path} line {entry.line_number}: {e}") from None
    return merged


def _summarize(h: Histogram, scale: float) -> dict:
    out = {"count": h.total_count, "min": h.min / scale, "mean": h.mean / scale}
    for p, v in h.percentiles(DEFAULT_PERCENTILES).items():
        out[f"p{p:g}"] = v / scale
    out["max"] = h.max / scale
    return out


def _cmd_hlog(args: argparse.Namespace) -> int:
    merged = _merge_logs(args.paths, args.tag)
    if not merged:
        print("no intervals found" + (f" with tag {args.tag!r}" if args.tag is not None else ""),
              file=sys.stderr)
        return 1
    scale = _UNITS_NS[args.unit]
    rows = {tag or "(untagged)": {"intervals": slot["intervals"], **_summarize(slot["histogram"], scale)}
            for tag, slot in sorted(merged.items())}
    if args.json:
        print(json.dumps({"unit": args.unit, "tags": rows}, indent=2))
        return 0
    columns = list(next(iter(rows.values())).keys())
    print(f"{'tag':<16}" + "".join(f"{c:>14}" for c in columns) + f"   ({args.unit})")
    for tag, row in rows.items():
        cells = [f"{row[c]:>14d}" if isinstance(row[c], int) else f"{row[c]:>14.3f}" for c in columns]
        print(f"{tag:<16}" + "".join(cells))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the command line and returns the process exit code."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        return _cmd_hlog(args)
    except _UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
