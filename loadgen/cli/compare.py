"""``loadgen compare BASE NEW``: two results, merged results or sweeps side by side, with
a noise-aware verdict per figure and ``--fail-if-regression`` rules for CI."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from typing import Any, Dict, List, Tuple

from loadgen.cli.common import EXIT_INVALID, EXIT_OK, UsageError, read, warn
from loadgen.results import load_result, result_files
from loadgen.results.compare import (DEFAULT_ALPHA, DEFAULT_MIN_EFFECT_PCT, METRICS, SCHEMA, TEST_NAME, CompareError,
                                     compare_documents, compare_points, parse_rules, render_comparison)
from loadgen.sweep.files import is_sweep_folder, read_records

__all__ = ["register"]

_FLAGS = ["--fail-if-regression", "--alpha", "--min-effect", "--json"]


def register(sub: Any) -> Dict[str, Any]:
    """Adds ``compare``; returns {name: (handler, known flags)}."""
    p = sub.add_parser(
        "compare", help="compare two results (or sweeps) and call regressions beyond the noise",
        description="Puts the headline figures of BASE and NEW side by side with their change. The runs' "
        "per-interval figures give the noise: a change is called only when a two-sided Mann-Whitney U "
        "test over the intervals gives p < --alpha and the figure moved at least --min-effect percent. "
        "BASE and NEW are each a result.json (or a folder holding one), a merged result (loadgen merge), "
        "or a sweep folder (compared point by point); both of the same kind. Exit 1 when a "
        "--fail-if-regression rule fires, 0 otherwise.",
    )
    p.add_argument("base", metavar="BASE", help="the reference: a result.json, a folder holding one, or a sweep folder")
    p.add_argument("new", metavar="NEW", help="the run to judge, of the same kind as BASE")
    p.add_argument("--fail-if-regression", action="append", default=[], metavar="EXPR",
                   help="exit 1 when this change is called, like 'p99>+10%%', 'p99>+2ms', 'qps<-5%%' "
                   f"(repeatable, or a comma list; metrics: {', '.join(m.name for m in METRICS)})")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"significance level of the test (default {DEFAULT_ALPHA:g})")
    p.add_argument("--min-effect", default=str(DEFAULT_MIN_EFFECT_PCT), metavar="PCT",
                   help=f"smallest change, in percent, called better or worse (default {DEFAULT_MIN_EFFECT_PCT:g}%%)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    return {"compare": (_cmd_compare, _FLAGS)}


def _min_effect(text: str) -> float:
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise UsageError(f"--min-effect: {text!r} is not a percent, like 2 or 2%") from None
    if not 0 <= value < 1000:
        raise UsageError(f"--min-effect: {text!r} must be a percent in 0..1000")
    return value


def _load(path: str, side: str) -> Tuple[str, Any]:
    """(kind, what was read): ("sweep", its records) or ("result" / "merged result", a document)."""
    if not os.path.exists(path):
        raise UsageError(f"{side} {path}: no such file or folder")
    if is_sweep_folder(path):
        records = read(read_records, path)
        if not records:
            raise UsageError(f"{side} {path} is a sweep folder with no points run yet (its sweep.jsonl is empty)")
        return "sweep", records
    files = result_files([path])
    if len(files) != 1:
        found = f"holds {len(files)} result.json files" if files else "holds no result.json"
        raise UsageError(f"{side} {path} {found}; give one result, a merged result (loadgen merge) "
                         "or a sweep folder")
    doc = read(functools.partial(load_result, what=f"compare {side}"), files[0])
    return ("merged result" if isinstance(doc.get("merge"), dict) else "result"), doc


def _report(args: argparse.Namespace) -> Dict[str, Any]:
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha must be between 0 and 1 (exclusive), got {args.alpha:g}")
    min_effect = _min_effect(args.min_effect)
    try:
        rules = parse_rules(args.fail_if_regression)
    except CompareError as e:
        raise UsageError(f"--fail-if-regression: {e}") from None
    (b_kind, base), (n_kind, new) = _load(args.base, "BASE"), _load(args.new, "NEW")
    if b_kind != n_kind:
        raise UsageError(f"BASE {args.base} is a {b_kind} and NEW {args.new} is a {n_kind}: compare results "
                         "with results, merged results with merged results, sweeps with sweeps")
    not_compared: Dict[str, List[str]] = {}
    if b_kind == "sweep":
        comparisons, not_compared = compare_points(base, new, rules, alpha=args.alpha, min_effect_pct=min_effect)
        if not comparisons:
            raise UsageError(f"the sweeps {args.base} and {args.new} have no point in common that ran in both: "
                             + "; ".join(not_compared["base"] + not_compared["new"]))
    else:
        comparisons = [{"point": None, **compare_documents(base, new, rules, alpha=args.alpha,
                                                           min_effect_pct=min_effect)}]
    return {"schema": SCHEMA, "kind": b_kind, "base": args.base, "new": args.new, "test": TEST_NAME,
            "alpha": args.alpha, "min_effect_pct": min_effect, "rules": [r.expr for r in rules],
            "comparisons": comparisons, "not_compared": not_compared,
            "regression": any(c["fired"] for c in comparisons)}


def _cmd_compare(args: argparse.Namespace) -> int:
    report = _report(args)
    for one in report["comparisons"]:
        where = f"point {one['point']['name']}: " if one["point"] else ""
        for message in one["warnings"]:
            warn(where + message)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        sys.stdout.write(render_comparison(report))
    return EXIT_INVALID if report["regression"] else EXIT_OK
