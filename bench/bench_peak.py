"""Peak search side by side: ``loadgen find-peak`` against MLPerf LoadGen's
FindPeakPerformance (``mlperf_loadgen``, TestMode.FindPeakPerformance, Server scenario).

Both search the highest Server rate whose p99 latency stays within the bound, on the same
SUT: ``bench/peak_sut.py``'s server of fixed capacity, one sample at a time, --service-us
(200 us: 5,000 samples/s) each, in arrival order, completed by a timer thread when due, so
that the capacity does not depend on how fast Python runs here. ``loadgen find-peak``
loads it as ``--sut python:bench/peak_sut.py:sut``; MLPerf's module gets the same queue
behind ``issue_query`` / ``QuerySamplesComplete`` in this file's child half. Every search
is a fresh child process; the sides alternate, round after round (--rounds, 3).

- ``loadgen find-peak --scenario server`` (MLPerf's Server rules: Poisson arrivals, the
  bound at p99, early stopping, a minimum duration): --start at the lower bound, widening
  x2, bisecting to --precision, every probe and the --confirm-runs confirmation runs
  --duration-s long. Its answer and search wall time come from the result's ``peak``
  section. The generator-overload rule (MLPerf has none) is relaxed to
  --max-issue-delay-ms.
- ``mlperf_loadgen`` FindPeakPerformance: server_target_qps at the lower bound,
  min_duration_ms = --duration-s, boundary step 1 (doubling), decimals of precision
  --decimals; every probe is a full run. Its answer is the detail log's "Found peak
  performance field", its wall time StartTest's.
- optionally ``loadgen.mlperf`` FindPeakPerformance (``--sides`` with loadgen.mlperf), the
  drop-in, whose search is the same module as ``find-peak``'s.

After each search one plain Server run at its answer, with the same tool and as long as a
probe, says whether the answer holds when run again. Prints each search, then per side the
answers' median [min-max] and relative spread ((max - min) / median), the wall time per
search, how many reruns held, and the ratios ours / theirs.

Usage:
    python bench/bench_peak.py                          # 3 rounds, 2 s runs (~6 min)
    python bench/bench_peak.py --quick                  # 1 round, 1 s runs
    python bench/bench_peak.py --sides find-peak,mlperf_loadgen,loadgen.mlperf --json /tmp/peak.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

import mlperf_peer  # bench/ is this script's folder, first on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.abspath(__file__)
SIDES = ("find-peak", "mlperf_loadgen", "loadgen.mlperf")


def _child_main(spec_path: str) -> int:
    """One MLPerf test (``spec["mode"]``) with the module ``spec["module"]`` over the
    fixed-capacity server; writes what the parent reads (mlperf_peer._run_child's spec)."""
    import importlib

    from bench_mlperf import _found_peak_qps
    from peak_sut import CapacityQueue

    with open(spec_path) as f:
        spec = json.load(f)
    lg = importlib.import_module(spec["module"])
    qsr, qsc = lg.QuerySampleResponse, lg.QuerySamplesComplete
    issued = [0]
    server = CapacityQueue(float(spec["service_us"]) * 1e-6, lambda ids: qsc([qsr(i, 0, 0) for i in ids]))

    def issue_query(query_samples: Any) -> None:
        issued[0] += len(query_samples)
        server.add([qs.id for qs in query_samples])

    settings, log_settings = mlperf_peer.spec_settings(lg, spec)
    sut = lg.ConstructSUT(issue_query, lambda: None)
    qsl = lg.ConstructQSL(spec["qsl_total"], spec["qsl_perf"], lambda s: None, lambda s: None)
    started = time.perf_counter()
    lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
    wall_s = time.perf_counter() - started
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)
    result = {"found_peak_qps": _found_peak_qps(os.path.join(spec["outdir"], mlperf_peer.DETAIL_FILE)),
              "test_wall_s": wall_s, "samples_issued": issued[0], "module": spec["module"]}
    with open(spec["result_path"], "w") as f:
        json.dump(result, f)
    return 0


def run_find_peak(a: argparse.Namespace) -> Dict[str, Any]:
    """One ``loadgen find-peak`` search in a child process."""
    cmd = [sys.executable, "-m", "loadgen", "find-peak", "--json", "--quiet", "--scenario", "server",
           "--sut", f"python:{os.path.join(HERE, 'peak_sut.py')}:sut", "--latency-bound-ms", str(a.bound_ms),
           "--start", str(a.lo), "--growth", "2", "--precision", str(a.precision), "--probe-s", str(a.duration_s),
           "--duration-s", str(a.duration_s), "--confirm-runs", str(a.confirm_runs),
           "--max-issue-delay-ms", str(a.max_issue_delay_ms)]
    env = dict(os.environ, PYTHONPATH=REPO, PEAK_SERVICE_US=str(a.service_us), OPENBLAS_NUM_THREADS="1")
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout_s, env=env, cwd=REPO)
    proc_wall = time.perf_counter() - started
    try:
        peak = json.loads(proc.stdout)["peak"]
    except (ValueError, KeyError):
        return {"ok": False, "error": f"exit {proc.returncode}: {proc.stderr[-500:]}", "proc_wall_s": proc_wall}
    return {"ok": proc.returncode == 0, "answer": peak["answer"], "wall_s": peak["search_wall_s"],
            "proc_wall_s": proc_wall, "runs": len(peak["runs"]), "probes": peak["probes"],
            "reason": peak["reason"], "error": None if proc.returncode == 0 else f"exit {proc.returncode}"}


def run_mlperf(a: argparse.Namespace, module: str) -> Dict[str, Any]:
    """One FindPeakPerformance test of ``module`` in a child process."""
    settings = {
        "server_target_qps": float(a.lo),
        "server_target_latency_ns": int(a.bound_ms * 1e6),
        "server_target_latency_percentile": 0.99,
        "min_duration_ms": int(a.duration_s * 1000),
        "min_query_count": 1,
        "server_find_peak_qps_decimals_of_precision": int(a.decimals),
        "server_find_peak_qps_boundary_step_size": 1,
    }
    r = mlperf_peer._run_child("Server", settings, mode="FindPeakPerformance", timeout_s=a.timeout_s,
                               script=SCRIPT, extra_spec={"module": module, "service_us": a.service_us})
    child = r.get("child") or {}
    answer = child.get("found_peak_qps") if r.get("ok") else None
    errors = [str(next(iter(e.values()))) for e in (r.get("detail") or {}).get("_errors") or []]
    return {"ok": answer is not None, "answer": answer, "wall_s": child.get("test_wall_s"),
            "proc_wall_s": r.get("proc_wall_s"), "samples": child.get("samples_issued"),
            "error": r.get("error") or ("; ".join(errors)[:300] if answer is None else None)}


def rerun(a: argparse.Namespace, side: str, answer: float) -> Dict[str, Any]:
    """One plain Server run at ``answer`` with the side's own tool, as long as a probe:
    does the answer hold when run again?"""
    if side != "find-peak":
        child = {"script": SCRIPT, "extra_spec": {"module": side, "service_us": a.service_us}}
        v = mlperf_peer.server_run(answer, a.duration_s, a.bound_ms, child=child)
        return {"held": bool(v.get("valid")), "p99_ns": v.get("p99_ns")}
    cmd = [sys.executable, "-m", "loadgen", "run", "--json", "--scenario", "server", "--sut",
           f"python:{os.path.join(HERE, 'peak_sut.py')}:sut", "--target-qps", repr(answer),
           "--duration-s", str(a.duration_s), "--latency-bound-ms", str(a.bound_ms),
           "--max-issue-delay-ms", str(a.max_issue_delay_ms)]
    env = dict(os.environ, PYTHONPATH=REPO, PEAK_SERVICE_US=str(a.service_us), OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout_s, env=env, cwd=REPO)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        return {"held": None, "p99_ns": None, "error": proc.stderr[-300:]}
    return {"held": bool(doc["valid"]), "p99_ns": doc["latency_ns"]["p99"]}


def summarize(values: List[float]) -> Dict[str, Optional[float]]:
    """median, min, max and (max - min) / median of the values (None when there are none)."""
    if not values:
        return {"median": None, "min": None, "max": None, "relative_spread": None}
    m = statistics.median(values)
    return {"median": m, "min": min(values), "max": max(values),
            "relative_spread": (max(values) - min(values)) / m if m else None}


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=None, help="searches per side (default 3; 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="1 round of 1 s runs")
    ap.add_argument("--sides", default="find-peak,mlperf_loadgen", help=f"comma-separated, of {', '.join(SIDES)}")
    ap.add_argument("--service-us", type=float, default=200.0,
                    help="the SUT's service time per sample (default 200: 5,000 samples/s)")
    ap.add_argument("--lo", type=float, default=1000.0, help="the lower bound / start, QPS (default 1000)")
    ap.add_argument("--bound-ms", type=float, default=10.0, help="p99 latency bound (default 10)")
    ap.add_argument("--duration-s", type=float, default=None,
                    help="every run's (minimum) duration on both sides (default 2; 1 with --quick)")
    ap.add_argument("--precision", type=float, default=0.05, help="find-peak --precision (default 0.05)")
    ap.add_argument("--confirm-runs", type=int, default=2, help="find-peak --confirm-runs (default 2)")
    ap.add_argument("--decimals", type=int, default=0,
                    help="MLPerf's server_find_peak_qps_decimals_of_precision (default 0: 1 QPS)")
    ap.add_argument("--max-issue-delay-ms", type=float, default=10.0,
                    help="find-peak's generator-overload limit (MLPerf has no such rule; default 10)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="bound on one search")
    ap.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    a = ap.parse_args(argv)
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.duration_s = a.duration_s or (1.0 if a.quick else 2.0)
    a.sides = [s.strip() for s in a.sides.split(",") if s.strip()]
    bad = [s for s in a.sides if s not in SIDES]
    if bad:
        ap.error(f"--sides: unknown {bad}; choose from {', '.join(SIDES)}")
    return a


def main(argv: Optional[List[str]] = None) -> int:
    a = _parse(argv)
    os.environ["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")  # loadgen.mlperf's children
    print(f"peak search, Server, p99 <= {a.bound_ms:g} ms, SUT of fixed capacity {1e6 / a.service_us:,.0f} "
          f"samples/s ({a.service_us:g} us a sample); "
          f"start / lower bound {a.lo:g} QPS; {a.duration_s:g} s runs; find-peak --precision {a.precision:g} "
          f"--confirm-runs {a.confirm_runs}; MLPerf decimals of precision {a.decimals}; mlcommons-loadgen "
          f"{importlib.metadata.version('mlcommons-loadgen')}; {a.rounds} rounds", flush=True)
    results: Dict[str, List[Dict[str, Any]]] = {side: [] for side in a.sides}
    for k in range(a.rounds):
        for side in a.sides:
            la = os.getloadavg()[0]
            r = run_find_peak(a) if side == "find-peak" else run_mlperf(a, side)
            r["loadavg_1m_before"] = la
            if r.get("answer") is not None:
                r["rerun"] = rerun(a, side, r["answer"])
            results[side].append(r)
            extra = f", {r['runs']} runs ({r['probes']} probes)" if "runs" in r else ""
            check = r.get("rerun") or {}
            held = {True: "held", False: "did NOT hold", None: "-"}[check.get("held")]
            print(f"  round {k + 1} {side:15s} answer {_fmt(r.get('answer'), ',.1f')} QPS, search "
                  f"{_fmt(r.get('wall_s'), '.1f')} s{extra} (load {la:.2f}); rerun {held} "
                  f"(p99 {_fmt((check.get('p99_ns') or 0) / 1e6 if check else None, '.2f')} ms)"
                  + (f"  !! {r['error']}" if r.get("error") else ""), flush=True)
    summary = {side: {"answer_qps": summarize([r["answer"] for r in rs if r.get("answer") is not None]),
                      "wall_s": summarize([r["wall_s"] for r in rs if r.get("answer") is not None and r.get("wall_s")]),
                      "searches": len(rs), "found": sum(1 for r in rs if r.get("answer") is not None),
                      "reruns_held": sum(1 for r in rs if (r.get("rerun") or {}).get("held"))}
               for side, rs in results.items()}
    print("\n| side | answer QPS, median [min-max] | relative spread | wall per search, median [min-max] "
          "| found | reruns held |")
    print("|---|---:|---:|---:|---:|---:|")
    for side, s in summary.items():
        ans, wall = s["answer_qps"], s["wall_s"]
        print(f"| {side} | {_fmt(ans['median'], ',.0f')} [{_fmt(ans['min'], ',.0f')}-{_fmt(ans['max'], ',.0f')}] | "
              f"{_fmt(ans['relative_spread'], '.1%')} | {_fmt(wall['median'], '.1f')} s "
              f"[{_fmt(wall['min'], '.1f')}-{_fmt(wall['max'], '.1f')}] | {s['found']}/{s['searches']} | "
              f"{s['reruns_held']}/{s['found']} |")
    ours, theirs = summary.get("find-peak"), summary.get("mlperf_loadgen")
    if ours and theirs:
        for key, what in (("answer_qps", "answer"), ("wall_s", "wall time")):
            o, t = ours[key]["median"], theirs[key]["median"]
            print(f"ratio find-peak / mlperf_loadgen, median {what}: {_fmt(o / t if o and t else None, '.2f')}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results, "summary": summary}, f, indent=2)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child_main(sys.argv[2]))
    sys.exit(main())
