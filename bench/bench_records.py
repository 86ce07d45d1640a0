"""What per-request records (``--record-requests``) cost the hot path.

An open-loop Poisson run at 100k queries/s on a native SUT (``null`` by default: every
query resolves on the issue thread, so the capture sits on the hottest path there is)
with records off, on as JSON lines, and on as Parquet (when pyarrow is installed).
Every run is a fresh child process (this file with ``--child SPEC``), the three modes
are interleaved round by round, and each figure is the median over the rounds:

- issue delay p99 (issued - scheduled: the generator's own lateness);
- the achieved rate (completed queries per second);
- the process's CPU seconds (user + system, the whole child: engine, writer, Python,
  and for Parquet the conversion after the run);
- the writer's throughput: records written per CPU second of the writer thread
  (``lg-records``: JSON lines, or for Parquet the raw spool);
- for Parquet, the conversion of the spool after the run (``convert_s`` of the result's
  ``requests`` section): seconds, and records per second.

Then, without the engine, the capture itself: 2 million records appended on one thread
(what the resolving thread pays per query) while ``lg-records`` writes them, and the
rate from the first append until the file is closed (``_core.time_request_log``); once
plain, and once with each record carrying a stream's token events (``--capture-events``,
default 32: the inter-token gaps of a 32-token stream, in the chunk's side arena and
written inline as ``itl_ns`` and ``tokens_per_event``).

Ratios on/off are printed at the end. Usage:

    python bench/bench_records.py                  # 5 rounds of 5 s
    python bench/bench_records.py --rounds 3 --duration-s 3 --qps 100000 --sut demo
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

MODES = ("off", "jsonl", "parquet")


def child(spec: Dict[str, Any]) -> Dict[str, Any]:
    """One run as ``spec`` says; its figures."""
    from loadgen.engine import Engine, EngineSettings
    from loadgen.sut.spec import load_sut

    path = spec.get("path")
    settings = EngineSettings(mode="poisson", target_qps=spec["qps"], duration_s=spec["duration_s"],
                              record_requests=path, interval_s=0)
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    engine = Engine(settings, load_sut(spec["sut"]))
    result = engine.run()
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    out: Dict[str, Any] = {
        "issue_delay_p99_ns": result.issue_delay.value_at_percentile(99.0),
        "completed_qps": result.completed_qps,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "wall_s": wall,
    }
    if path:
        stats = engine._core.records_stats()
        section = engine.requests_section(0.0) or {}
        writer_cpu_s = stats["writer_cpu_ns"] / 1e9
        out.update(records=section["records"], bytes=os.path.getsize(path), peak_buffered=stats["peak_buffered"],
                   writer_records_per_cpu_s=stats["written"] / writer_cpu_s if writer_cpu_s > 0 else None,
                   error=section.get("error", ""))
        if "convert_s" in section:
            out.update(convert_s=section["convert_s"], spool_bytes=stats["bytes"],
                       convert_records_per_s=section["records"] / section["convert_s"] if section["convert_s"] else None)
    return out


def run_child(spec: Dict[str, Any]) -> Dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                          timeout=spec["duration_s"] * 10 + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("BENCH_RECORDS "))
    result: Dict[str, Any] = json.loads(line[len("BENCH_RECORDS "):])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration-s", type=float, default=5.0)
    ap.add_argument("--qps", type=float, default=100_000)
    ap.add_argument("--sut", default="null")
    ap.add_argument("--dir", default=None, help="where the record files go (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="also write every run's figures here")
    ap.add_argument("--capture-events", type=int, default=32,
                    help="token events a record in the second capture (0: none); default %(default)s")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("BENCH_RECORDS " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    try:
        import pyarrow  # noqa: F401

        modes = list(MODES)
    except ImportError:
        modes = ["off", "jsonl"]
        print("pyarrow is not installed: no Parquet runs")
    folder = args.dir or tempfile.mkdtemp(prefix="bench-records-")
    runs: Dict[str, List[Dict[str, Any]]] = {m: [] for m in modes}
    try:
        for r in range(args.rounds):
            for mode in modes:
                path = None if mode == "off" else os.path.join(folder, f"r{r}.{mode}")
                spec = {"qps": args.qps, "duration_s": args.duration_s, "sut": args.sut, "path": path}
                figures = run_child(spec)
                runs[mode].append(figures)
                if path:
                    os.unlink(path)
                print(f"round {r + 1} {mode:7s} " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                           for k, v in figures.items()), flush=True)
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    report(runs, args)
    where = folder if args.dir else tempfile.gettempdir()
    plain = capture(where)
    if args.capture_events:
        with_events = capture(where, events=args.capture_events)
        print(f"capture with {args.capture_events} token events a record: x{with_events[0] / plain[0]:.2f} ns per "
              f"append, x{with_events[1] / plain[1]:.2f} records/s end to end")


def capture(folder: str, n: int = 2_000_000, repeats: int = 3, events: int = 0) -> Tuple[float, float]:
    """The native capture alone, each record with ``events`` token events: ns per append
    and end-to-end records/s (medians), printed and returned."""
    from loadgen import _core

    path = os.path.join(folder, "bench-records-capture.jsonl")
    figures = []
    try:
        for _ in range(repeats):
            append_ns, total_ns = _core.time_request_log(n, path, events)
            figures.append((append_ns, n / (total_ns / 1e9)))
    finally:
        if os.path.exists(path):
            os.unlink(path)
    append, rate = statistics.median(f[0] for f in figures), statistics.median(f[1] for f in figures)
    what = f" with {events} token events each" if events else ""
    print(f"capture{what}: {append:.1f} ns per append on the resolving thread; {rate:,.0f} records/s appended "
          f"and written as JSON lines (one thread each, medians of {repeats})")
    return append, rate


def report(runs: Dict[str, List[Dict[str, Any]]], args: argparse.Namespace) -> None:
    """Medians per mode, and each mode's ratio to records off."""
    def med(mode: str, key: str) -> float:
        values = [r[key] for r in runs[mode] if r.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    print(f"\n{args.qps:,.0f} queries/s Poisson, {args.sut} SUT, {args.duration_s:g} s x {args.rounds} rounds "
          f"(medians; ratio to off in brackets)")
    print(f"{'mode':8s} {'issue p99':>16s} {'rate q/s':>20s} {'CPU s':>16s} {'writer rec/CPU-s':>17s} {'MB':>7s}")
    off = {k: med("off", k) for k in ("issue_delay_p99_ns", "completed_qps", "cpu_s")}
    for mode in runs:
        p99, qps, cpu = med(mode, "issue_delay_p99_ns"), med(mode, "completed_qps"), med(mode, "cpu_s")
        writer = med(mode, "writer_rec_per_cpu_s") if mode == "off" else med(mode, "writer_records_per_cpu_s")
        size = med(mode, "bytes") / 1e6 if mode != "off" else float("nan")
        print(f"{mode:8s} {p99 / 1e3:9.1f} us [{p99 / off['issue_delay_p99_ns']:4.2f}] "
              f"{qps:12,.0f} [{qps / off['completed_qps']:5.3f}] {cpu:8.2f} [{cpu / off['cpu_s']:4.2f}] "
              f"{writer:17,.0f} {size:7.1f}")
    if "parquet" in runs:
        print(f"parquet conversion after the run: {med('parquet', 'convert_s'):.2f} s, "
              f"{med('parquet', 'convert_records_per_s'):,.0f} records/s, "
              f"spool {med('parquet', 'spool_bytes') / 1e6:.1f} MB (medians)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(runs, f, indent=2)


if __name__ == "__main__":
    main()
