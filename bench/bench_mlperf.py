"""Side-by-side benchmark of ``loadgen.mlperf`` against MLPerf LoadGen (``mlperf_loadgen``).

``loadgen.mlperf`` is a drop-in replacement for the MLPerf LoadGen Python module, so
one harness (the child half of this file) runs unchanged on either: the module name is
the only difference, passed to the child, which does ``lg = import_module(name)`` and
then what an MLPerf harness does (TestSettings, LogSettings, ConstructSUT/ConstructQSL,
StartTestWithLogSettings, QuerySamplesComplete from the SUT). Every single run is a
fresh child process, ``python bench/bench_mlperf.py --child SPEC``, started through
``mlperf_peer._run_child`` (temporary working directory holding the logs,
OPENBLAS_NUM_THREADS=1, a time limit, wait4's peak RSS); the parent reads the figures
from the mlperf_log_summary.txt / mlperf_log_detail.txt both modules write. The two
sides run interleaved, one repeat of each side after the other. The children find
``loadgen`` through PYTHONPATH (--pythonpath, this checkout by default), in a copy of
the package taken when the benchmark starts, so that a rebuild of the checkout during
a run changes nothing.

Cases (``--cases`` takes these names, comma-separated):

  server        highest Server target QPS whose run is VALID ("Result is : VALID" in
                the summary), at a 10 ms and at a 1 ms p99 bound. Instant SUT:
                issue_query completes its samples with one QuerySamplesComplete call.
                Geometric bisection (``mlperf_peer.geometric_max_valid``) over
                [--server-lo, --server-hi]; every probe is a real run of
                --min-duration-ms with min_query_count 1, run again once if INVALID
                (--probe-tries), VALID if either run is.
  offline       Offline samples/s (the summary's "Samples per second") for one query of
                --offline-samples samples, the SUT completing them in one
                QuerySamplesComplete call, and one call per sample.
  single_stream SingleStream with an instant SUT: the summary's 90th percentile
                latency, and the test's wall time divided by the queries issued.
  memory        peak RSS (the child's VmHWM after the run, or wait4's ru_maxrss if
                larger) when 1e6 and 1e7 queries go through the module
                (--rss-scenario): SingleStream, N one-sample queries one after the
                other, where the harness holds no per-query objects; and Offline, the
                cheapest way to issue N samples (one query of N samples, completed one
                sample per call), where the list of N QuerySample objects handed to
                issue_query is part of the peak on either side.
  find_peak     TestMode.FindPeakPerformance, Server, 10 ms p99 bound, a SUT whose
                worker thread completes each sample after a fixed sleep (--peak-delay-us,
                100 us): wall time of the search and the QPS it reports; then a
                --peak-validate-runs separate PerformanceOnly runs of --peak-validate-s at that QPS with the
                same module, printing whether it held (VALID). The answer is the QPS
                of the detail log's "Found peak performance field" message; a search
                without one (its lower-bound probe missed the bound) is run again,
                --peak-tries searches at most.

Ratios are ours / theirs as printed (for QPS and samples/s above 1 is better for ours;
for latency, wall time and memory below 1 is). Figures are medians of --repeat runs
(cases server, offline and single_stream; memory and find_peak run once), with
[min-max] when there are several.

Usage:
    python bench/bench_mlperf.py --quick                       # smoke run, < 1 min
    python bench/bench_mlperf.py --json /tmp/bench_mlperf.json # full run
    python bench/bench_mlperf.py --cases offline,memory --repeat 5
    python bench/bench_mlperf.py --ours mlperf_loadgen          # both sides the same
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import mlperf_peer  # bench/ is this script's folder, first on sys.path
from bench_engine import fmt_mb, fmt_ns, fmt_qps, fmt_ratio, med, ratio, spread
from mlperf_peer import geometric_max_valid, read_status_kb

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.abspath(__file__)
CASES = ("server", "offline", "single_stream", "memory", "find_peak")


# ================================================================== child side

def _found_peak_qps(detail_path: str) -> float | None:
    """The QPS of the detail log's "Found peak performance field: X" message, if any."""
    mark = "Found peak performance field:"
    found = None
    try:
        with open(detail_path, errors="replace") as f:
            for line in f:
                i = line.find(mark)
                if i >= 0:
                    tail = line[i + len(mark):].split('"')[0].strip()
                    try:
                        found = float(tail)
                    except ValueError:
                        pass
    except OSError:
        pass
    return found


def _child_main(spec_path: str) -> int:
    """Run one test with the module named in the spec; write the result JSON.

    The spec is what ``mlperf_peer._run_child`` writes (scenario, mode, settings, sut,
    complete_per_sample, qsl_total, qsl_perf, outdir, result_path) plus ``module`` and,
    for sut="worker", ``delay_us``.
    """
    with open(spec_path) as f:
        spec = json.load(f)
    t0 = time.perf_counter()
    lg = importlib.import_module(spec["module"])
    import_s = time.perf_counter() - t0
    rss_before_kb = read_status_kb("VmRSS")

    stats = {"issue_calls": 0, "samples_issued": 0, "flush_calls": 0}
    qsr = lg.QuerySampleResponse
    qsc = lg.QuerySamplesComplete
    kind = spec.get("sut", "instant")
    worker = None

    if kind == "instant" and not spec.get("complete_per_sample"):
        def issue_query(query_samples):
            stats["issue_calls"] += 1
            stats["samples_issued"] += len(query_samples)
            qsc([qsr(qs.id, 0, 0) for qs in query_samples])
    elif kind == "instant":
        def issue_query(query_samples):
            stats["issue_calls"] += 1
            stats["samples_issued"] += len(query_samples)
            for qs in query_samples:
                qsc([qsr(qs.id, 0, 0)])
    elif kind == "worker":
        # A one-worker SUT: issue_query only enqueues; the worker serves one sample at
        # a time, sleeping delay_us (which releases the GIL) before completing it.
        import queue
        import threading

        delay_s = float(spec.get("delay_us", 100)) * 1e-6
        pending: queue.SimpleQueue = queue.SimpleQueue()

        def issue_query(query_samples):
            stats["issue_calls"] += 1
            stats["samples_issued"] += len(query_samples)
            for qs in query_samples:
                pending.put(qs.id)

        def work():
            while True:
                sample_id = pending.get()
                if sample_id is None:
                    return
                time.sleep(delay_s)
                qsc([qsr(sample_id, 0, 0)])

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
    else:
        raise SystemExit(f"unknown sut {kind!r}")

    def flush_queries():
        stats["flush_calls"] += 1

    def load_samples(indices):
        pass

    def unload_samples(indices):
        pass

    settings, log_settings = mlperf_peer.spec_settings(lg, spec)
    sut = lg.ConstructSUT(issue_query, flush_queries)
    qsl = lg.ConstructQSL(spec["qsl_total"], spec["qsl_perf"], load_samples,
                          unload_samples)
    cpu0 = os.times()
    t0 = time.perf_counter()
    lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
    test_wall_s = time.perf_counter() - t0
    cpu1 = os.times()
    hwm_kb = read_status_kb("VmHWM")
    rss_after_kb = read_status_kb("VmRSS")
    if worker is not None:
        pending.put(None)
        worker.join(timeout=5)
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)
    result = {
        "found_peak_qps": _found_peak_qps(os.path.join(spec["outdir"],
                                                       mlperf_peer.DETAIL_FILE)),
        "module": spec["module"],
        "module_file": getattr(lg, "__file__", None),
        "import_s": import_s,
        "test_wall_s": test_wall_s,
        "test_cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
        "vm_hwm_kb": hwm_kb,
        "rss_before_test_kb": rss_before_kb,
        "rss_after_test_kb": rss_after_kb,
        **stats,
    }
    with open(spec["result_path"], "w") as f:
        json.dump(result, f)
    return 0


# ================================================================= parent side

def _summary_num(r: dict[str, Any], key: str) -> float | None:
    v = (r.get("summary") or {}).get(key)
    return float(v) if isinstance(v, (int, float)) else None


def _summary_valid(r: dict[str, Any]) -> bool:
    """A run is VALID when the child succeeded and the summary says "Result is : VALID"."""
    return bool(r.get("ok")) and (r.get("summary") or {}).get("Result is") == "VALID"


def _short_error(r: dict[str, Any]) -> str:
    e = str(r.get("error") or "")
    lines = [x for x in e.strip().splitlines() if x.strip()]
    return (lines[0][:160] + (" ... " + lines[-1][:240] if len(lines) > 1 else "")
            if lines else "?")


def _fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def _lean(r: dict[str, Any]) -> dict[str, Any]:
    """A run's figures for the JSON file, without its long lists."""
    return {k: v for k, v in r.items()
            if k not in ("log_warnings", "log_errors", "qsl_load_calls",
                         "qsl_unload_calls")}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = args.quick
        self.sides = (("ours", args.ours), ("theirs", args.theirs))
        self.results: dict[str, Any] = {}
        self.rows: list[dict[str, Any]] = []
        self.errors: dict[str, list[str]] = {"ours": [], "theirs": []}
        self.module_files: dict[str, str | None] = {}
        self.case_s: dict[str, float] = {}

    # ------------------------------------------------------------ helpers
    def child(self, module: str, **extra: Any) -> dict[str, Any]:
        """mlperf_peer's ``child`` argument: run this file's harness with ``module``."""
        return {"script": SCRIPT, "extra_spec": {"module": module, **extra}}

    def note(self, side: str, what: str, r: dict[str, Any]) -> None:
        """Print and record any failure of a child."""
        if r.get("error"):
            msg = f"{what}: {_short_error(r)}"
            self.errors[side].append(msg)
            print(f"   !! {side} {msg}", flush=True)

    def header(self, name: str, what: str) -> dict[str, Any]:
        la = os.getloadavg()
        print(f"\n== {name}: {what}", flush=True)
        print(f"   loadavg before: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}", flush=True)
        res = self.results.setdefault(name, {})
        res["loadavg_before"] = la
        return res

    def row(self, case: str, ours: list[float | None], theirs: list[float | None],
            fmt: Callable[[Any], str], lower_is_better: bool = False,
            extra: str = "") -> None:
        r = ratio(med(ours), med(theirs))
        self.rows.append({
            "case": case, "ours": spread(ours, fmt), "theirs": spread(theirs, fmt),
            "ours_median": med(ours), "theirs_median": med(theirs),
            "ours_values": ours, "theirs_values": theirs, "ratio": r,
            "better": "lower" if lower_is_better else "higher", "extra": extra})
        print(f"   -> {case}: ours {spread(ours, fmt)} | theirs {spread(theirs, fmt)} | "
              f"ratio {fmt_ratio(r)} ({'lower' if lower_is_better else 'higher'} is "
              f"better){' | ' + extra if extra else ''}", flush=True)

    # --------------------------------------------------------------- server
    def server_search(self, side: str, module: str, bound_ms: float) -> dict[str, Any]:
        a = self.args
        child = self.child(module)

        def probe(q: float):
            tries = []
            for _ in range(max(1, a.probe_tries)):
                r = mlperf_peer.server_run(q, a.min_duration_ms / 1000.0, bound_ms,
                                           child=child)
                self.note(side, f"server probe at {q:.0f} qps", r)
                tries.append({
                    "result": (r.get("summary") or {}).get("Result is"),
                    "p99_ns": _summary_num(r, "99.00 percentile latency (ns)"),
                    "completed_qps": _summary_num(r, "Completed samples per second"),
                    "scheduled_qps": _summary_num(r, "Scheduled samples per second"),
                    "samples_issued": r.get("samples_issued"),
                    "test_wall_s": r.get("test_wall_s"), "error": r.get("error")})
                if _summary_valid(r) or not r.get("ok"):
                    break
            last = tries[-1]
            return _summary_valid(r), {**last, "tries": tries}

        q = self.quick
        return geometric_max_valid(probe, a.server_lo, a.server_hi,
                                   rel_precision=0.5 if q else 0.05,
                                   max_probes=2 if q else 12,
                                   max_total_s=10 if q else a.server_max_search_s)

    def case_server(self) -> None:
        a = self.args
        for bound_ms in (10.0, 1.0):
            name = f"server_{bound_ms:g}ms"
            res = self.header(name, f"highest VALID Server QPS, p99 bound {bound_ms:g} ms, "
                              f"instant SUT, {a.min_duration_ms} ms probes in "
                              f"[{fmt_qps(a.server_lo)}, {fmt_qps(a.server_hi)}]")
            found: dict[str, list[float | None]] = {"ours": [], "theirs": []}
            for i in range(a.repeat):
                for side, module in self.sides:
                    s = self.server_search(side, module, bound_ms)
                    res.setdefault(side, []).append(s)
                    found[side].append(s["max_valid_qps"])
                    steps = ", ".join(
                        f"{fmt_qps(p['qps'])}:{'V' if p['valid'] else 'x'}"
                        + (f"({fmt_ns(p['p99_ns'])})" if p.get("p99_ns") else "")
                        for p in s["probes"])
                    top = " (every probe VALID: raise --server-hi)" if s["hit_top"] else ""
                    print(f"   {side:6s} #{i + 1}: max VALID {fmt_qps(s['max_valid_qps'])}"
                          f", min INVALID {fmt_qps(s['min_invalid_qps'])}, "
                          f"{s['n_probes']} probes, {s['total_s']:.0f} s{top}  [{steps}]",
                          flush=True)
            # A search with no VALID probe (not even --server-lo) has no figure; the
            # median is then over the others, and the row says how many there were.
            none = [f"{side}: {found[side].count(None)} of {len(found[side])} searches "
                    f"found no VALID rate >= {fmt_qps(a.server_lo)}"
                    for side, _ in self.sides if None in found[side]]
            self.row(f"Server max VALID QPS, p99 <= {bound_ms:g} ms", found["ours"],
                     found["theirs"], fmt_qps, extra="; ".join(none))

    # -------------------------------------------------------------- offline
    def case_offline(self) -> None:
        a = self.args
        n = a.offline_samples
        res = self.header("offline", f"Offline samples/s, one query of {n:,} samples, "
                          "instant SUT")
        for batched in (True, False):
            label = "one complete call" if batched else "one call per sample"
            key = "batched" if batched else "per_sample"
            sps: dict[str, list[float | None]] = {"ours": [], "theirs": []}
            for i in range(a.repeat):
                for side, module in self.sides:
                    r = mlperf_peer.offline_run(n, 0.1, batched=batched,
                                                child=self.child(module))
                    self.note(side, f"offline {key}", r)
                    v = _summary_num(r, "Samples per second")
                    sps[side].append(v)
                    res.setdefault(key, {}).setdefault(side, []).append(_lean(r))
                    print(f"   {side:6s} #{i + 1} {label}: {fmt_qps(v)} samples/s "
                          f"(summary), test wall {_fmt_s(r.get('test_wall_s'))}, "
                          f"{r.get('samples_issued')} samples", flush=True)
            self.row(f"Offline samples/s, {label}", sps["ours"], sps["theirs"], fmt_qps)

    # -------------------------------------------------------- single stream
    def case_single_stream(self) -> None:
        a = self.args
        dur = a.single_stream_s
        res = self.header("single_stream", f"SingleStream, instant SUT, {dur:g} s runs")
        p90: dict[str, list[float | None]] = {"ours": [], "theirs": []}
        per_q: dict[str, list[float | None]] = {"ours": [], "theirs": []}
        # MLPerf generates 2 * duration / single_stream_expected_latency_ns queries up
        # front; a side that uses them up before the min duration (INVALID) is run
        # again with an expected latency of 3/4 of its measured time per query, which
        # then holds for its later repeats too.
        expected = {side: a.single_stream_expected_ns for side, _ in self.sides}
        for i in range(a.repeat):
            for side, module in self.sides:
                for _ in range(3):
                    r = mlperf_peer.single_stream_run(
                        dur, expected_latency_ns=expected[side],
                        child=self.child(module))
                    expected[side] = r.get("expected_latency_ns") or expected[side]
                    short = ((r.get("summary") or {}).get("Min duration satisfied")
                             == "NO")
                    n = r.get("samples_issued")
                    if not (r.get("ok") and short and n and r.get("test_wall_s")):
                        break
                    expected[side] = max(50, min(expected[side] // 2, int(
                        0.75 * r["test_wall_s"] * 1e9 / n)))
                    print(f"   {side:6s} #{i + 1}: ran out of queries before the min "
                          f"duration; again with single_stream_expected_latency_ns "
                          f"{expected[side]}", flush=True)
                self.note(side, "single_stream", r)
                v = _summary_num(r, "90.0th percentile latency (ns)")
                n = r.get("samples_issued")
                w = (r["test_wall_s"] * 1e9 / n) if n and r.get("test_wall_s") else None
                p90[side].append(v)
                per_q[side].append(w)
                res.setdefault(side, []).append(_lean(r))
                print(f"   {side:6s} #{i + 1}: p90 {fmt_ns(v)} (summary), wall/query "
                      f"{fmt_ns(w)}, {n} queries in {_fmt_s(r.get('test_wall_s'))}, "
                      f"{(r.get('summary') or {}).get('Result is')}, expected latency "
                      f"{r.get('expected_latency_ns')} ns", flush=True)
        self.row("SingleStream p90 latency (summary)", p90["ours"], p90["theirs"], fmt_ns,
                 lower_is_better=True)
        self.row("SingleStream test wall time / queries", per_q["ours"], per_q["theirs"],
                 fmt_ns, lower_is_better=True)

    # --------------------------------------------------------------- memory
    def case_memory(self) -> None:
        a = self.args
        scenarios = [x.strip() for x in a.rss_scenario.split(",") if x.strip()]
        sizes = (100_000, 1_000_000) if self.quick else (1_000_000, 10_000_000)
        res = self.header("memory", "peak RSS of the child, instant SUT, "
                          + " and ".join(scenarios))
        for scen in scenarios:
            how = {"SingleStream": "one-sample queries one after another",
                   "Offline": "one query of N samples, completed one sample per call",
                   "Server": f"{a.rss_server_qps:g} QPS"}[scen]
            print(f"   {scen}: {how}", flush=True)
            for n in sizes:
                peak: dict[str, list[float | None]] = {"ours": [], "theirs": []}
                for side, module in self.sides:
                    if side == "theirs" and n >= 10_000_000 and a.skip_peer_10m:
                        print(f"   {side:6s} {n:>10,}: skipped (--skip-peer-10m)")
                        continue
                    r = mlperf_peer.peak_rss_for_queries(
                        n, scen, server_qps=a.rss_server_qps, batched=False,
                        child=self.child(module))
                    self.note(side, f"memory {scen} {n}", r)
                    hwm = r.get("child_vm_hwm_kb")
                    v = max(hwm or 0, r.get("child_maxrss_kb") or 0) / 1024.0 or None
                    if not r.get("ok"):
                        v = None
                    peak[side].append(v)
                    res.setdefault(scen, {}).setdefault(str(n), {})[side] = r
                    print(f"   {side:6s} {n:>10,}: peak RSS {fmt_mb(v)} (VmHWM "
                          f"{fmt_mb((hwm or 0) / 1024.0)}; "
                          f"{fmt_mb(r.get('rss_before_mb'))} after import), "
                          f"{r.get('queries')} samples issued, test "
                          f"{_fmt_s(r.get('test_wall_s'))}", flush=True)
                self.row(f"peak RSS, {n:,} queries ({scen})", peak["ours"],
                         peak["theirs"], fmt_mb, lower_is_better=True)

    # ------------------------------------------------------------ find peak
    def case_find_peak(self) -> None:
        a = self.args
        q = self.quick
        validate_s = 1.0 if q else a.peak_validate_s
        duration_ms = int(1000 * validate_s) if a.peak_min_duration_ms is None else a.peak_min_duration_ms
        res = self.header("find_peak", f"FindPeakPerformance, Server, p99 <= 10 ms, SUT "
                          f"worker sleeping {a.peak_delay_us:g} us per sample, lower bound "
                          f"{a.peak_lo:g} QPS, min_duration_ms {duration_ms} for both "
                          f"(MLPerf probes at that length; ours probes at 1 s and confirms "
                          f"at that length); then one {validate_s:g} s PerformanceOnly run "
                          f"at the answer")
        settings = {
            "server_target_qps": float(a.peak_lo),
            "server_target_latency_ns": 10_000_000,
            "server_target_latency_percentile": 0.99,
            "min_duration_ms": duration_ms,
            "min_query_count": 1,
        }
        walls: dict[str, list[float | None]] = {"ours": [], "theirs": []}
        answers: dict[str, list[float | None]] = {"ours": [], "theirs": []}
        held: dict[str, str] = {}
        for side, module in self.sides:
            child = self.child(module, delay_us=a.peak_delay_us)
            searches = []
            for _ in range(max(1, a.peak_tries)):
                r = mlperf_peer._run_child("Server", settings, sut="worker",
                                           mode="FindPeakPerformance", timeout_s=600,
                                           **child)
                self.note(side, "find_peak", r)
                c = r.get("child") or {}
                s = r.get("summary") or {}
                d = r.get("detail") or {}
                # The answer is the QPS of "Found peak performance field: X" (the
                # summary's target_qps then says the same). Without that message the
                # search stopped at the lower bound: its first probe missed the bound.
                answer = c.get("found_peak_qps") if r.get("ok") else None
                wall = c.get("test_wall_s") if r.get("ok") else None
                searches.append({
                    "ok": r.get("ok"), "error": r.get("error"), "answer_qps": answer,
                    "summary_target_qps": s.get("target_qps"),
                    "result": s.get("Result is"), "test_wall_s": wall,
                    "proc_wall_s": r.get("proc_wall_s"),
                    "samples_issued": c.get("samples_issued"),
                    "scheduled_qps": s.get("Scheduled samples per second"),
                    "p99_ns": s.get("99.00 percentile latency (ns)"),
                    "log_errors": d.get("_errors"), "summary": s})
                if answer is not None:
                    print(f"   {side:6s}: peak {fmt_qps(answer)} QPS, search wall "
                          f"{_fmt_s(wall)}, {c.get('samples_issued')} samples over the "
                          f"search; summary: target_qps {s.get('target_qps')}, "
                          f"{s.get('Result is')}", flush=True)
                    break
                why = "; ".join(str(next(iter(e.values()))) for e in d.get("_errors") or [])
                print(f"   {side:6s}: no peak found in {_fmt_s(wall)} (summary: "
                      f"target_qps {s.get('target_qps')}, {s.get('Result is')}"
                      f"{'; ' + why[:200] if why else ''})"
                      + (" -- searching again" if len(searches) < a.peak_tries else ""),
                      flush=True)
            walls[side].append(wall)
            answers[side].append(answer)
            entry: dict[str, Any] = {**searches[-1], "searches": searches}
            if answer:
                # Near capacity one rerun is a coin toss: several reruns say how often
                # the answer holds.
                checks = []
                for _ in range(max(1, a.peak_validate_runs)):
                    v = mlperf_peer.server_run(answer, validate_s, 10.0, sut="worker",
                                               child=child)
                    self.note(side, f"find_peak validation at {answer:.0f}", v)
                    checks.append({
                        "result": (v.get("summary") or {}).get("Result is"),
                        "held": _summary_valid(v) if v.get("ok") else None,
                        "p99_ns": _summary_num(v, "99.00 percentile latency (ns)"),
                        "completed_qps": _summary_num(v, "Completed samples per second"),
                        "error": v.get("error")})
                n_held = sum(1 for c in checks if c["held"])
                held[side] = f"{n_held}/{len(checks)}"
                entry["validation"] = {"target_qps": answer, "duration_s": validate_s,
                                       "held": held[side], "runs": checks}
                print(f"   {side:6s}: {validate_s:g} s runs at {fmt_qps(answer)}: held "
                      f"{held[side]} (p99 "
                      f"{', '.join(fmt_ns(c['p99_ns']) for c in checks)})", flush=True)
            res[side] = entry

        self.row("FindPeakPerformance answer QPS", answers["ours"], answers["theirs"],
                 fmt_qps, extra=f"{validate_s:g} s reruns that held: ours "
                 f"{held.get('ours', '-')}, theirs {held.get('theirs', '-')}")
        self.row("FindPeakPerformance wall time", walls["ours"], walls["theirs"], _fmt_s,
                 lower_is_better=True)

    # ------------------------------------------------------------------ run
    def run(self, cases: list[str]) -> None:
        for c in cases:
            t = time.perf_counter()
            getattr(self, "case_" + c)()
            self.case_s[c] = time.perf_counter() - t

    def table(self) -> str:
        a = self.args
        lines = [(f"ours = {a.ours} ({self.module_files.get('ours', '?')}), theirs = "
                  f"{a.theirs} ({self.module_files.get('theirs', '?')}); ratio = ours / "
                  "theirs"),
                 "",
                 "| case | ours | theirs | ratio | better |",
                 "|---|---|---|---:|---|"]
        for r in self.rows:
            case = r["case"] + (f" ({r['extra']})" if r["extra"] else "")
            lines.append(f"| {case} | {r['ours']} | {r['theirs']} | "
                         f"{fmt_ratio(r['ratio'])} | {r['better']} |")
        return "\n".join(lines)


def _snapshot_package(path: str, module: str, attempts: int = 6,
                      pause_s: float = 20.0) -> str | None:
    """Copy the package of ``module`` found under ``path`` (e.g. ``loadgen`` of this
    checkout) to a temporary folder, so that a rebuild of the checkout during the run
    cannot change or break what the children import; return that folder.

    The copy is checked by importing ``module`` from it in a fresh process; a copy
    taken in the middle of a rebuild fails that check and is taken again after a
    pause. Returns None (children then use ``path`` itself) when ``path`` holds no
    such package.
    """
    top = module.split(".")[0]
    src = os.path.join(path, top)
    if not os.path.isdir(src):
        return None
    err = ""
    for _ in range(attempts):
        dst = tempfile.mkdtemp(prefix="bench_mlperf_pkg_")
        shutil.copytree(src, os.path.join(dst, top),
                        ignore=shutil.ignore_patterns("__pycache__"))
        check = subprocess.run(
            [sys.executable, "-c", f"import {module}, {top}; print({top}.__file__)"],
            cwd=dst, env=dict(os.environ, PYTHONPATH=dst), capture_output=True,
            text=True, timeout=120, check=False)
        if check.returncode == 0 and check.stdout.strip().startswith(dst):
            print(f"children import {module} from a snapshot of {src} ({dst})",
                  flush=True)
            return dst
        err = (check.stderr or check.stdout).strip().splitlines()[-1:] or ["?"]
        shutil.rmtree(dst, ignore_errors=True)
        print(f"snapshot of {src} does not import ({err[0][:200]}); retrying in "
              f"{pause_s:.0f} s", flush=True)
        time.sleep(pause_s)
    raise SystemExit(f"{module} from {src} does not import: {err}")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, < 1 min in all")
    ap.add_argument("--json", metavar="PATH", help="write all figures to PATH")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs per figure for server, offline and single_stream "
                         "(default 3, 1 with --quick)")
    ap.add_argument("--ours", default="loadgen.mlperf", help="module of our side")
    ap.add_argument("--theirs", default="mlperf_loadgen", help="module of their side")
    ap.add_argument("--pythonpath", default=REPO,
                    help="prepended to the children's PYTHONPATH (default: this "
                         "checkout, so that its loadgen package is the one imported, "
                         "from a snapshot unless --no-snapshot; '' for the installed "
                         "packages)")
    ap.add_argument("--no-snapshot", dest="snapshot", action="store_false",
                    help="children import from --pythonpath directly instead of from "
                         "a copy of its package taken at the start")
    ap.add_argument("--min-duration-ms", type=int, default=None,
                    help="min_duration_ms of each Server probe (default 2000; 500 with "
                         "--quick)")
    ap.add_argument("--server-lo", type=float, default=1000.0)
    ap.add_argument("--server-hi", type=float, default=8e6)
    ap.add_argument("--server-max-search-s", type=float, default=90.0,
                    help="time budget of one Server search")
    ap.add_argument("--probe-tries", type=int, default=None,
                    help="runs of a Server probe before it counts as INVALID (it is "
                         "VALID if any run is; default 2, 1 with --quick): one slow "
                         "wake-up on this shared VM otherwise ends a search early")
    ap.add_argument("--offline-samples", type=int, default=None,
                    help="samples of the Offline query (default 1e6; 1e5 with --quick)")
    ap.add_argument("--single-stream-s", type=float, default=None,
                    help="SingleStream min duration, s (default 5; 1 with --quick)")
    ap.add_argument("--single-stream-expected-ns", type=int, default=3000,
                    help="initial single_stream_expected_latency_ns")
    ap.add_argument("--rss-scenario", default="SingleStream,Offline",
                    help="comma-separated scenarios of the memory case, of "
                         "SingleStream, Offline, Server (default SingleStream,Offline)")
    ap.add_argument("--rss-server-qps", type=float, default=150000.0,
                    help="target QPS of a Server memory run")
    ap.add_argument("--skip-peer-10m", action="store_true",
                    help="skip the 1e7-query memory run of the --theirs module")
    ap.add_argument("--peak-lo", type=float, default=1000.0,
                    help="server_target_qps (lower bound) of FindPeakPerformance")
    ap.add_argument("--peak-delay-us", type=float, default=100.0,
                    help="per-sample sleep of the find_peak SUT's worker")
    ap.add_argument("--peak-min-duration-ms", type=int, default=None,
                    help="min_duration_ms of the FindPeakPerformance test (default: the "
                         "validation length, so both modules are held to the same run "
                         "length; MLPerf probes at this length, ours confirms at it)")
    ap.add_argument("--peak-validate-s", type=float, default=5.0,
                    help="duration of the runs that check the answer")
    ap.add_argument("--peak-validate-runs", type=int, default=3,
                    help="separate runs at the answer, each counted as held or not")
    ap.add_argument("--peak-tries", type=int, default=2,
                    help="searches per side until one finds a peak (a search whose "
                         "lower-bound probe misses the bound finds none)")
    args = ap.parse_args(argv)
    bad = [x for x in args.rss_scenario.split(",")
           if x.strip() and x.strip() not in ("SingleStream", "Offline", "Server")]
    if bad:
        ap.error(f"--rss-scenario: unknown {bad}")
    q = args.quick
    if args.repeat is None:
        args.repeat = 1 if q else 3
    if args.probe_tries is None:
        args.probe_tries = 1 if q else 2
    if args.min_duration_ms is None:
        args.min_duration_ms = 500 if q else 2000
    if args.offline_samples is None:
        args.offline_samples = 100_000 if q else 1_000_000
    if args.single_stream_s is None:
        args.single_stream_s = 1.0 if q else 5.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    snapshot = None
    if args.pythonpath and args.snapshot:
        snapshot = _snapshot_package(args.pythonpath, args.ours)
        args.pythonpath_used = snapshot
    else:
        args.pythonpath_used = args.pythonpath
    if args.pythonpath_used:
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = (args.pythonpath_used
                                    + (os.pathsep + old if old else ""))
    try:
        return _run(args, cases)
    finally:
        if snapshot:
            shutil.rmtree(snapshot, ignore_errors=True)


def _run(args: argparse.Namespace, cases: list[str]) -> int:
    try:
        theirs_ver = importlib.metadata.version("mlcommons-loadgen")
    except importlib.metadata.PackageNotFoundError:
        theirs_ver = "not installed"
    t0 = time.perf_counter()
    la = os.getloadavg()
    print(f"bench_mlperf: ours {args.ours}, theirs {args.theirs} (mlcommons-loadgen "
          f"{theirs_ver}); python {sys.version.split()[0]}, {os.cpu_count()} cpus; "
          f"loadavg {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    print(f"cases {','.join(cases)}; repeat {args.repeat}; "
          f"{'quick' if args.quick else 'full'} sizes", flush=True)
    bench = Bench(args)
    for side, module in bench.sides:
        where = subprocess.run(
            [sys.executable, "-c", f"import {module}; print({module}.__file__)"],
            cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=120,
            check=False)
        bench.module_files[side] = (where.stdout.strip() if where.returncode == 0 else
                                    "does not import: " + where.stderr.strip()[-300:])
        print(f"{side}: {module} from {bench.module_files[side]}", flush=True)
    bench.run(cases)
    total_s = time.perf_counter() - t0
    print(f"\n== summary ({total_s:.0f} s)\n")
    table = bench.table()
    print(table)
    for side in ("ours", "theirs"):
        if bench.errors[side]:
            print(f"\n{side}: {len(bench.errors[side])} failed run(s):")
            for e in bench.errors[side][:10]:
                print(f"  - {e}")
    if args.json:
        out = {"args": vars(args), "total_s": total_s, "module_files": bench.module_files,
               "theirs_version": theirs_ver, "case_s": bench.case_s, "rows": bench.rows,
               "errors": bench.errors, "cases": bench.results, "table": table}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child_main(sys.argv[2]))
    sys.exit(main())
