"""Side-by-side benchmark of loadgen's issue engine against MLPerf LoadGen.

One invocation runs every case with ``loadgen`` and with ``mlperf_loadgen`` (through
``bench/mlperf_peer.py``) on the same machine and prints both figures, their ratio and
the target from the project's issue. Every single run of either side happens in a
fresh child process: peak RSS is then per run, and runs cannot disturb each other.
The loadgen child is this file run as ``python bench/bench_engine.py --child SPEC``
(SPEC is a JSON file, or an inline JSON object). It runs one loadgen configuration
and prints one ``BENCH_ENGINE_RESULT {...}`` JSON line with the figures and its peak
RSS. That makes a single configuration easy to profile, for example:

    py-spy record -o /tmp/p.svg -- python bench/bench_engine.py --child \
        '{"sut": "function", "settings": {"mode": "poisson", "target_qps": 500000, "duration_s": 5}}'

Cases (``--only`` takes these names, comma-separated):

  server_10ms          highest valid Server QPS at a 10 ms p99 bound. loadgen runs an
                       instant per-query Python function SUT; the peer runs its
                       instant SUT. Target: loadgen >= 3x the peer.
  server_10ms_batched  the same, with loadgen's batched SUT (issue(batch) ->
                       batch.complete()). Target: >= 1,000,000 QPS. The peer figure is
                       the same MLPerf search as server_10ms, and it is reused if
                       server_10ms already ran.
  server_1ms           the same at a 1 ms bound, with loadgen's batched SUT. Target:
                       >= 100,000 QPS.
  server_10ms_inline,  server_10ms and server_1ms with inline_dispatch: the Python
  server_1ms_inline    dispatcher issues queries itself instead of an issue thread
                       handing them over (one busy thread instead of two).
  issue_delay          loadgen Poisson at 100k QPS, native NullSUT, spin_us=1000, the
                       issue thread pinned. Reports issue delay (issued - scheduled)
                       p50 and p99. Targets: p50 about 1 us (met if <= 1.5 us), p99
                       < 20 us. MLPerf reports no issue delay, so there is no peer
                       figure. The peer's Server p50 latency at 100k is printed as
                       context.
  offline              samples/s with the batched Python SUT, 1000 queries x 1000
                       samples and 1e6 queries x 1 sample (with and without
                       inline_dispatch), against the peer's Offline run of 1e6
                       samples. Target: >= 10x.
  single_stream        p90 latency of an empty Python function SUT, loadgen closed
                       loop with concurrency 1, against the peer's SingleStream.
                       Target: ours <= half of the peer's.
  memory               peak RSS of loadgen (NullSUT, offline) for 1e6, 1e7 and 1e8
                       queries against the peer's Offline run with 1e6 and 1e7
                       queries. Target: < 200 MB at 1e8 and flat in N.

Validity of a loadgen Server probe. The primary rule is MLPerf's: p99 of latency,
measured from each query's *scheduled* time, <= bound. The probe must also pass these
checks:
  - completed == issued, with no failures, time-outs or cancellations;
  - the achieved completed QPS is within max(1%, 3/sqrt(expected queries)) of the
    target;
  - issue_delay p99 <= bound (a health check on the generator; it is also reported).
For a Python SUT the engine stamps "issued" when the Python dispatcher takes the query
off its queue, so issue_delay there includes the dispatcher's own delay and tracks
latency for an instant SUT; only with the native SUTs (issue_delay case) is it the
issue thread alone. MLPerf's early-stopping test is not applied. At these query counts (>= 5,000 per
probe) it amounts to the p99 rule.

The search is geometric bisection (``mlperf_peer.geometric_max_valid``), the same one
as ``mlperf_peer.server_max_valid_qps``: the bracket [lo, hi] itself is never probed,
each probe runs at sqrt(a*b), and the search stops at b/a <= 1+rel_precision, at
max_probes, or at a time budget. If no probe was valid, lo is probed at the end.

Each figure is the median of ``--repeats`` runs, or of that many independent searches.
The runs of the two sides are interleaved. The spread is printed as [min-max]. The
machine is shared and noisy, so the 1-minute load average is recorded before every
case and every run.

Usage:
    python bench/bench_engine.py                       # full run, ~20-25 min
    python bench/bench_engine.py --quick               # smoke run, < ~2 min
    python bench/bench_engine.py --only offline,memory --repeats 5 --json /tmp/b.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from mlperf_peer import read_status_kb  # bench/ is this script's folder, first on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULT_MARK = "BENCH_ENGINE_RESULT "
CASES = ("server_10ms", "server_10ms_inline", "server_10ms_batched", "server_1ms",
         "server_1ms_inline", "issue_delay", "offline", "single_stream", "memory")

# Error text that points at a half-rebuilt extension (another developer may be running
# `python setup.py build_ext --inplace` meanwhile). Such a child is retried after a
# pause.
TRANSIENT_MARKERS = ("ImportError", "ModuleNotFoundError", "undefined symbol",
                     "AttributeError", "loadgen._core", "invalid ELF header",
                     "file too short", "cannot open shared object")


# ================================================================== child side

def instant_sut(sample_index):
    """An instant per-query Python SUT: the query completes when this returns."""
    return None


class InstantBatchSUT:
    """An instant batched SUT: completes the whole batch inside issue()."""

    def issue(self, batch):
        batch.complete()


def _import_loadgen(attempts: int = 12, pause_s: float = 5.0):
    last = None
    for _ in range(attempts):
        try:
            return importlib.import_module("loadgen")
        except ImportError as e:  # a rebuild in progress: wait and retry
            last = e
            for name in [m for m in sys.modules if m == "loadgen" or m.startswith("loadgen.")]:
                del sys.modules[name]
            time.sleep(pause_s)
    raise last  # type: ignore[misc]


def _pcts(h, ps=(50, 90, 99, 99.9)) -> Dict[str, int]:
    out = {("p%g" % p).replace(".", ""): int(h.value_at_percentile(p)) for p in ps}
    out["max"] = int(h.max)
    out["min"] = int(h.min)
    out["mean"] = float(h.mean)
    out["count"] = int(h.total_count)
    return out


def _child_main(spec_arg: str) -> int:
    """Run one loadgen configuration; print one RESULT_MARK JSON line."""
    if spec_arg.lstrip().startswith("{"):
        spec = json.loads(spec_arg)
    else:
        with open(spec_arg) as f:
            spec = json.load(f)
    t0 = time.perf_counter()
    lg = _import_loadgen()
    import_s = time.perf_counter() - t0
    rss_before_kb = read_status_kb("VmRSS")
    kind = spec.get("sut", "null")
    if kind == "null":
        sut = lg.NullSUT()
    elif kind == "fixed_delay":
        sut = lg.FixedDelaySUT(float(spec.get("delay_us", 0)))
    elif kind == "function":
        sut = instant_sut
    elif kind == "batched":
        sut = InstantBatchSUT()
    else:
        raise SystemExit("unknown sut %r" % kind)
    settings = lg.EngineSettings(**spec.get("settings", {}))
    cpu0 = os.times()
    w0 = time.perf_counter()
    r = lg.run(settings, sut)
    wall_s = time.perf_counter() - w0
    cpu1 = os.times()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    core_file = getattr(getattr(lg, "_core", None), "__file__", None)
    out = {
        "sut": kind,
        "settings": spec.get("settings", {}),
        "counts": dict(r.counts),
        "errors": dict(r.errors),
        "error_messages": list(r.error_messages)[:5],
        "interrupted": bool(r.interrupted),
        "duration_s": r.duration_s,
        "issue_duration_s": r.issue_duration_s,
        "completed_qps": r.completed_qps,
        "samples_per_s": r.samples_per_s,
        "samples_per_query": r.samples_per_query,
        "latency": _pcts(r.latency),
        "issue_delay": _pcts(r.issue_delay),
        "service_time": _pcts(r.service_time),
        "run_wall_s": wall_s,
        "run_cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
        "import_s": import_s,
        "rss_before_run_kb": rss_before_kb,
        "maxrss_kb": ru.ru_maxrss,
        "vm_hwm_kb": read_status_kb("VmHWM"),
        "loadgen_version": getattr(lg, "__version__", "?"),
        "core_mtime": (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.path.getmtime(core_file)))
                       if core_file else None),
    }
    sys.stdout.write(RESULT_MARK + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


# ================================================================= parent side

def child_env() -> Dict[str, str]:
    """The environment of every child, loadgen's and the peer's alike. numpy's OpenBLAS
    starts a worker thread that busy-waits after import; on 2 vCPUs it competes with
    the engine's threads, so children run it single-threaded (neither side uses BLAS)."""
    env = dict(os.environ)
    env["OPENBLAS_NUM_THREADS"] = "1"
    return env


def run_loadgen(spec: Dict[str, Any], timeout_s: float, transient_retries: int = 6,
                pause_s: float = 20.0) -> Dict[str, Any]:
    """Run one loadgen configuration in a child process (this file with --child).

    Returns the child's figures plus ok, error, attempts, proc_wall_s, wait4_maxrss_kb
    and loadavg_1m_before. A child that fails with an import or attribute error (an
    extension being rebuilt) is retried after a pause, up to transient_retries times.
    """
    attempts = 0
    while True:
        attempts += 1
        res = _spawn_child(spec, timeout_s)
        res["attempts"] = attempts
        if res["ok"]:
            return res
        tail = res.get("stderr_tail") or ""
        if attempts > transient_retries or not any(m in tail for m in TRANSIENT_MARKERS):
            return res
        print("    (loadgen child failed, looks transient -- retrying in %.0f s: %s)"
              % (pause_s, tail.strip().splitlines()[-1][:160] if tail.strip() else "?"),
              flush=True)
        time.sleep(pause_s)


def _spawn_child(spec: Dict[str, Any], timeout_s: float) -> Dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="bench_engine_")
    spec_path = os.path.join(tmp, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
    res: Dict[str, Any] = {"ok": False, "error": None, "loadavg_1m_before": os.getloadavg()[0]}
    env = child_env()
    try:
        with open(out_path, "wb") as so, open(err_path, "wb") as se:
            t0 = time.perf_counter()
            # cwd is the scratch folder, so the child imports the installed package, not
            # the source tree.
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", spec_path],
                                    cwd=tmp, env=env, stdout=so, stderr=se,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = t0 + timeout_s
            try:
                while True:
                    pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
                    if pid == proc.pid:
                        break
                    if time.perf_counter() > deadline:
                        try:  # our own child's session only (start_new_session)
                            os.killpg(proc.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                        _, status, rusage = os.wait4(proc.pid, 0)
                        res["error"] = "timeout after %.0f s" % timeout_s
                        break
                    time.sleep(0.02)
            except BaseException:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                    os.wait4(proc.pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
                raise
            res["proc_wall_s"] = time.perf_counter() - t0
        rc = os.waitstatus_to_exitcode(status)
        res["returncode"] = rc
        res["wait4_maxrss_kb"] = rusage.ru_maxrss
        with open(out_path, "rb") as f:
            stdout = f.read().decode("utf-8", "replace")
        with open(err_path, "rb") as f:
            res["stderr_tail"] = f.read()[-3000:].decode("utf-8", "replace")
        for line in stdout.splitlines():
            if line.startswith(RESULT_MARK):
                res.update(json.loads(line[len(RESULT_MARK):]))
                break
        if res["error"] is None and rc != 0:
            res["error"] = "child exited %s: %s" % (rc, res["stderr_tail"][-600:])
        if res["error"] is None and "counts" not in res:
            res["error"] = "child printed no result"
        res["ok"] = res["error"] is None
        if res["ok"]:
            res.pop("stderr_tail", None)
        res["peak_rss_kb"] = max(res.get("maxrss_kb") or 0, res.get("wait4_maxrss_kb") or 0)
    finally:
        for p in (spec_path, out_path, err_path):
            try:
                os.unlink(p)
            except OSError:
                pass
        try:
            os.rmdir(tmp)
        except OSError:
            pass
    return res


def loadgen_server_validity(r: Dict[str, Any], target_qps: float, bound_ms: float,
                            duration_s: float) -> Tuple[bool, List[str]]:
    """MLPerf-style validity of one loadgen Server run, plus the checks listed in the
    module docstring. Returns (valid, reasons it is invalid)."""
    if not r.get("ok"):
        return False, ["run failed: %s" % (r.get("error") or "?")[:200]]
    why = []
    bound_ns = bound_ms * 1e6
    c = r["counts"]
    if r.get("interrupted"):
        why.append("interrupted")
    if c["issued"] <= 0:
        why.append("nothing issued")
    if c["completed"] != c["issued"] or c.get("failed") or c.get("timed_out") or c.get("cancelled"):
        why.append("completed %d != issued %d (failed %d, timed out %d, cancelled %d)" % (
            c["completed"], c["issued"], c.get("failed", 0), c.get("timed_out", 0),
            c.get("cancelled", 0)))
    if r["latency"]["p99"] > bound_ns:
        why.append("latency p99 %s > %g ms" % (fmt_ns(r["latency"]["p99"]), bound_ms))
    if r["issue_delay"]["p99"] > bound_ns:
        why.append("issue_delay p99 %s > %g ms" % (fmt_ns(r["issue_delay"]["p99"]), bound_ms))
    tol = max(0.01, 3.0 / math.sqrt(max(target_qps * duration_s, 1.0)))
    dev = r["completed_qps"] / target_qps - 1.0
    if abs(dev) > tol:
        why.append("completed qps %.0f is %+.1f%% off target (tol %.1f%%)" % (
            r["completed_qps"], 100 * dev, 100 * tol))
    return not why, why


# =================================================================== formatting

def fmt_ns(v: Any) -> str:
    if v is None:
        return "-"
    v = float(v)
    if v >= 1e9:
        return "%.2f s" % (v / 1e9)
    if v >= 1e6:
        return "%.2f ms" % (v / 1e6)
    if v >= 1e3:
        return "%.2f us" % (v / 1e3)
    return "%.0f ns" % v


def fmt_qps(v: Any) -> str:
    if v is None:
        return "-"
    v = float(v)
    if v >= 1e6:
        return "%.2fM" % (v / 1e6)
    if v >= 1e3:
        return "%.1fk" % (v / 1e3)
    return "%.0f" % v


def fmt_mb(v: Any) -> str:
    return "-" if v is None else "%.1f MB" % v


def med(xs: List[Optional[float]]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs: List[Optional[float]], f: Callable[[Any], str]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f(xs[0]) + " (n=1)"
    return "%s [%s-%s] (n=%d)" % (f(statistics.median(xs)), f(min(xs)), f(max(xs)), len(xs))


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    if num is None or den is None or den == 0:
        return None
    return num / den


def fmt_ratio(x: Optional[float]) -> str:
    return "-" if x is None else "%.2fx" % x


# ======================================================================= context

def machine_context() -> Dict[str, Any]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ctx: Dict[str, Any] = {
        "cpu_model": cpu,
        "nproc": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "loadavg": os.getloadavg(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    try:
        import numpy
        ctx["numpy"] = numpy.__version__
    except Exception as e:  # pragma: no cover
        ctx["numpy"] = "? (%s)" % e
    try:
        import importlib.metadata as md
        ctx["mlperf_loadgen"] = md.version("mlcommons-loadgen")
    except Exception:
        ctx["mlperf_loadgen"] = "?"
    try:
        ctx["loadgen"] = _import_loadgen(attempts=3).__version__
    except Exception as e:
        ctx["loadgen"] = "? (%s)" % e
    try:
        head = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h %s"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        ctx["git"] = head + (" (+uncommitted changes)" if dirty else "")
    except Exception:
        ctx["git"] = "?"
    return ctx


def print_context(ctx: Dict[str, Any]) -> None:
    print("machine: %s, nproc %s (affinity %s), %s" % (
        ctx["cpu_model"], ctx["nproc"], ctx["affinity"], ctx["platform"]))
    print("python %s, numpy %s, loadgen %s, mlperf_loadgen (mlcommons-loadgen) %s" % (
        ctx["python"], ctx["numpy"], ctx["loadgen"], ctx["mlperf_loadgen"]))
    print("git: %s;  %s;  loadavg %.2f %.2f %.2f" % ((ctx["git"], ctx["date_utc"]) + tuple(ctx["loadavg"])))


# ========================================================================= bench

class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = args.quick
        self.repeats = args.repeats
        self.results: Dict[str, Any] = {}
        self.rows: List[Dict[str, Any]] = []
        self._peer_cache: Dict[str, Any] = {}
        import mlperf_peer  # bench/ is on sys.path (this file's directory)
        self.peer = mlperf_peer
        q = self.quick
        self.srv_duration_s = 1.0 if q else 5.0
        self.srv_rel = 0.25 if q else 0.05
        self.srv_max_probes = 5 if q else 12
        self.srv_max_total_s = 40.0 if q else 240.0
        self.lg_lo, self.lg_hi = 1000.0, 16e6

    # --------------------------------------------------------------- helpers
    def case_header(self, name: str, what: str) -> None:
        la = os.getloadavg()
        print("\n== %s: %s" % (name, what), flush=True)
        print("   loadavg before: %.2f %.2f %.2f" % la, flush=True)
        self.results.setdefault(name, {})["loadavg_before"] = la

    def row(self, case: str, ours: str, peer: str, r: Optional[float], target: str,
            met: Optional[bool], **extra: Any) -> None:
        self.rows.append({"case": case, "loadgen": ours, "peer": peer, "ratio": fmt_ratio(r),
                          "ratio_value": r, "target": target, "met": met, **extra})
        print("   -> %s: loadgen %s | peer %s | ratio %s | target %s | %s" % (
            case, ours, peer, fmt_ratio(r), target,
            {True: "MET", False: "NOT MET", None: "n/a"}[met]), flush=True)

    def lg_server_probe(self, sut: str, bound_ms: float, seed: int, q: float,
                        tag: str = "loadgen", inline: bool = False) -> Tuple[bool, Dict[str, Any]]:
        """One loadgen Server run at q QPS, judged by loadgen_server_validity."""
        dur = self.srv_duration_s
        spec = {"sut": sut, "settings": {
            "mode": "poisson", "target_qps": q, "duration_s": dur, "grace_s": 1.0,
            "schedule_seed": seed, "sample_seed": seed, "interval_s": 0,
            "inline_dispatch": inline}}
        r = run_loadgen(spec, timeout_s=dur + 60)
        ok, why = loadgen_server_validity(r, q, bound_ms, dur)
        rec = {"p99_ns": r.get("latency", {}).get("p99"),
               "p50_ns": r.get("latency", {}).get("p50"),
               "issue_delay_p50_ns": r.get("issue_delay", {}).get("p50"),
               "issue_delay_p99_ns": r.get("issue_delay", {}).get("p99"),
               "service_time_p99_ns": r.get("service_time", {}).get("p99"),
               "completed_qps": r.get("completed_qps"), "counts": r.get("counts"),
               "run_cpu_s": r.get("run_cpu_s"), "run_wall_s": r.get("run_wall_s"),
               "why_invalid": why, "loadavg_1m_before": r.get("loadavg_1m_before"),
               "peak_rss_kb": r.get("peak_rss_kb"), "attempts": r.get("attempts"),
               "core_mtime": r.get("core_mtime"), "error": r.get("error")}
        print("      %-7s %9.0f qps  %-7s p99 %-9s issue-delay p99 %-9s compl %7s cpu %4.2f/s "
              "la %.2f  %s" % (
                  tag, q, "VALID" if ok else "INVALID", fmt_ns(rec["p99_ns"]),
                  fmt_ns(rec["issue_delay_p99_ns"]), fmt_qps(rec["completed_qps"]),
                  (rec["run_cpu_s"] or 0) / (rec["run_wall_s"] or 1),
                  rec["loadavg_1m_before"], "; ".join(why)), flush=True)
        return ok, rec

    def lg_server_search(self, sut: str, bound_ms: float, seed: int,
                         inline: bool = False) -> Dict[str, Any]:
        def probe(q: float):
            return self.lg_server_probe(sut, bound_ms, seed, q, inline=inline)

        return self.peer.geometric_max_valid(probe, self.lg_lo, self.lg_hi, self.srv_rel,
                                             self.srv_max_probes, self.srv_max_total_s)

    def peer_server_search(self, bound_ms: float) -> Dict[str, Any]:
        lo = 1000.0 if bound_ms >= 10 else (300.0 if self.quick else 200.0)
        r = self.peer.server_max_valid_qps(
            bound_ms, duration_s=self.srv_duration_s, lo=lo, hi=400000,
            rel_precision=self.srv_rel, max_probes=self.srv_max_probes,
            max_total_s=self.srv_max_total_s)
        for p in r["probes"]:
            why = ""
            if not p["valid"]:
                why = ", ".join(n for n, k in (("latency", "perf_constraints_met"),
                                               ("early-stopping", "early_stopping_met"),
                                               ("min-duration", "min_duration_met"))
                                if p.get(k) is False) or (p.get("error") or "?")
            print("      peer    %9.0f qps  %-7s p99 %-9s compl %9s  %s" % (
                p["qps"], p["result"], fmt_ns(p["p99_ns"]), fmt_qps(p["completed_qps"]), why),
                flush=True)
        return r

    def _search_line(self, who: str, i: int, s: Dict[str, Any]) -> None:
        print("    %s search %d: max valid %s, min invalid %s, %d probes, %.0f s%s" % (
            who, i + 1, fmt_qps(s["max_valid_qps"]), fmt_qps(s["min_invalid_qps"]),
            s["n_probes"], s["total_s"],
            " (every probe valid: bracket top %s reached)" % fmt_qps(s.get("hi"))
            if s.get("hit_top") else ""), flush=True)

    # ------------------------------------------------------------------ cases
    def case_server(self, name: str, sut: str, bound_ms: float, inline: bool = False) -> None:
        self.case_header(name, "highest valid Server QPS at %g ms p99; loadgen %s SUT%s, "
                         "%g s Poisson probes, bisection to %g%%" % (
                             bound_ms, "per-query function" if sut == "function" else "batched",
                             " with inline_dispatch" if inline else "",
                             self.srv_duration_s, 100 * self.srv_rel))
        peer_key = "server_%gms" % bound_ms
        reuse = peer_key in self._peer_cache
        lg_runs: List[Dict[str, Any]] = []
        peer_runs: List[Dict[str, Any]] = list(self._peer_cache.get(peer_key, []))
        if reuse:
            print("   peer: reusing the MLPerf search of this run's %s case (same search)" % peer_key)
        for i in range(self.repeats):
            print("   repeat %d/%d (loadavg %.2f)" % (i + 1, self.repeats, os.getloadavg()[0]), flush=True)
            s = self.lg_server_search(sut, bound_ms, seed=i, inline=inline)
            lg_runs.append(s)
            self._search_line("loadgen", i, s)
            if not reuse:
                p = self.peer_server_search(bound_ms)
                peer_runs.append(p)
                self._search_line("peer   ", i, p)
        self._peer_cache[peer_key] = peer_runs
        lv = [s["max_valid_qps"] for s in lg_runs]
        pv = [p["max_valid_qps"] for p in peer_runs]
        lm, pm = med(lv), med(pv)
        r = ratio(lm, pm)
        # A direct check at the target rate, independent of the bisection (validity is
        # not always monotonic in QPS): `repeats` runs at exactly the target.
        if name.startswith("server_10ms") and sut == "function":
            tq = 3.0 * pm if pm else None
        elif name == "server_10ms_batched":
            tq = 1e6
        else:
            tq = 1e5
        at_target: List[Dict[str, Any]] = []
        if tq:
            print("   check at the target rate %s (%d run(s)):" % (fmt_qps(tq), self.repeats), flush=True)
            for i in range(self.repeats):
                ok, rec = self.lg_server_probe(sut, bound_ms, 100 + i, tq, tag="target",
                                               inline=inline)
                rec.update({"qps": tq, "valid": ok})
                at_target.append(rec)
        self.results[name].update({"loadgen": lg_runs, "peer": peer_runs, "peer_reused": reuse,
                                   "loadgen_median_qps": lm, "peer_median_qps": pm, "ratio": r,
                                   "at_target": at_target})
        hit = " (bracket top)" if any(s.get("hit_top") for s in lg_runs) else ""
        ours = spread(lv, fmt_qps) + hit
        if at_target:
            ours += "; at %s: %d/%d valid, p99 %s" % (
                fmt_qps(tq), sum(x["valid"] for x in at_target), len(at_target),
                fmt_ns(med([x["p99_ns"] for x in at_target])))
        peer = spread(pv, fmt_qps)
        if name.startswith("server_10ms") and sut == "function":
            self.row(name, ours, peer, r, ">= 3x peer", None if r is None else r >= 3.0,
                     loadgen_value=lm, peer_value=pm)
        elif name == "server_10ms_batched":
            self.row(name, ours, peer, r, ">= 1,000,000 QPS",
                     None if lm is None else lm >= 1e6, loadgen_value=lm, peer_value=pm)
        else:
            self.row(name, ours, peer, r, ">= 100,000 QPS", None if lm is None else lm >= 1e5,
                     loadgen_value=lm, peer_value=pm)

    def case_issue_delay(self) -> None:
        dur = 1.0 if self.quick else 3.0
        aff = sorted(os.sched_getaffinity(0))
        pin = [1] if 1 in aff else ([aff[-1]] if aff else [])
        self.case_header("issue_delay", "loadgen Poisson 100k QPS, NullSUT, spin_us=1000, "
                         "pin_cpus=%s (affinity %s), %g s" % (pin, aff, dur))
        lg_runs, peer_runs = [], []
        for i in range(self.repeats):
            spec = {"sut": "null", "settings": {
                "mode": "poisson", "target_qps": 100000.0, "duration_s": dur, "spin_us": 1000.0,
                "pin_cpus": pin, "schedule_seed": i, "interval_s": 0}}
            r = run_loadgen(spec, timeout_s=dur + 60)
            lg_runs.append(r)
            if r.get("ok"):
                d, lat = r["issue_delay"], r["latency"]
                print("    loadgen %d: issue delay p50 %s p90 %s p99 %s p99.9 %s max %s; "
                      "latency p50 %s p99 %s; %d issued (loadavg %.2f)" % (
                          i + 1, fmt_ns(d["p50"]), fmt_ns(d["p90"]), fmt_ns(d["p99"]),
                          fmt_ns(d["p999"]), fmt_ns(d["max"]), fmt_ns(lat["p50"]), fmt_ns(lat["p99"]),
                          r["counts"]["issued"], r["loadavg_1m_before"]), flush=True)
            else:
                print("    loadgen %d: FAILED %s" % (i + 1, r.get("error")), flush=True)
            p = self.peer.server_run(100000, dur, 10)
            peer_runs.append(p)
            print("    peer    %d: Server 100k %g s (instant Python SUT): %s, latency p50 %s "
                  "p99 %s (loadavg %.2f)" % (i + 1, dur, p.get("result"), fmt_ns(p.get("p50_ns")),
                                              fmt_ns(p.get("p99_ns")),
                                              p.get("loadavg_1m_before") or -1), flush=True)
        ok = [r for r in lg_runs if r.get("ok")]
        p50s = [r["issue_delay"]["p50"] for r in ok]
        p99s = [r["issue_delay"]["p99"] for r in ok]
        m50, m99 = med(p50s), med(p99s)
        peer_p50 = med([p.get("p50_ns") for p in peer_runs])
        self.results["issue_delay"].update({
            "pin_cpus": pin, "loadgen": lg_runs, "peer_context": peer_runs,
            "issue_delay_p50_ns": m50, "issue_delay_p99_ns": m99,
            "loadgen_latency_p50_ns": med([r["latency"]["p50"] for r in ok]),
            "peer_server_latency_p50_ns": peer_p50})
        self.row("issue_delay p50", spread(p50s, fmt_ns),
                 "n/a (no issue delay in MLPerf); peer Server p50 latency @100k: %s" % fmt_ns(peer_p50),
                 None, "about 1 us (<= 1.5 us)", None if m50 is None else m50 <= 1500,
                 loadgen_value=m50, peer_value=None)
        self.row("issue_delay p99", spread(p99s, fmt_ns), "n/a", None, "< 20 us",
                 None if m99 is None else m99 < 20000, loadgen_value=m99, peer_value=None)

    def case_offline(self) -> None:
        self.case_header("offline", "samples/s, batched Python SUT (issue(batch) -> "
                         "batch.complete()) vs the peer's Offline, 1e6 samples")
        configs = [("1000x1000", 1000, 1000, False), ("1e6x1", 1_000_000, 1, False),
                   ("1e6x1 inline", 1_000_000, 1, True)]
        lg_runs: Dict[str, List[Dict[str, Any]]] = {c[0]: [] for c in configs}
        peer_runs: List[Dict[str, Any]] = []
        for i in range(self.repeats):
            for label, nq, spq, inline in configs:
                spec = {"sut": "batched", "settings": {
                    "mode": "offline", "query_count": nq, "samples_per_query": spq,
                    "sample_count": 1024, "sample_seed": i, "interval_s": 0,
                    "inline_dispatch": inline}}
                r = run_loadgen(spec, timeout_s=180)
                lg_runs[label].append(r)
                if r.get("ok"):
                    samples = r["counts"]["completed"] * r["samples_per_query"]
                    r["samples_per_s_wall"] = samples / r["run_wall_s"] if r["run_wall_s"] else None
                    print("    loadgen %d %-9s: %s samples/s (run: first scheduled -> end %.3f s), "
                          "%s samples/s (wall around run() %.3f s), peak RSS %s (loadavg %.2f)" % (
                              i + 1, label, fmt_qps(r["samples_per_s"]), r["duration_s"],
                              fmt_qps(r["samples_per_s_wall"]), r["run_wall_s"],
                              fmt_mb(r["peak_rss_kb"] / 1024), r["loadavg_1m_before"]), flush=True)
                else:
                    print("    loadgen %d %s: FAILED %s" % (i + 1, label, r.get("error")), flush=True)
            p = self.peer.offline_run(1_000_000, 0.1)
            peer_runs.append(p)
            print("    peer    %d 1 query x 1e6: %s samples/s (log), %s samples/s (wall around "
                  "StartTest %.3f s), %s (loadavg %.2f)" % (
                      i + 1, fmt_qps(p.get("samples_per_s")), fmt_qps(p.get("samples_per_s_wall")),
                      p.get("test_wall_s") or -1, p.get("result"),
                      p.get("loadavg_1m_before") or -1), flush=True)
        pv = [p.get("samples_per_s") for p in peer_runs]
        pm = med(pv)
        self.results["offline"].update({"loadgen": lg_runs, "peer": peer_runs,
                                        "peer_median_samples_per_s": pm})
        for label, _, _, _ in configs:
            lv = [r.get("samples_per_s") for r in lg_runs[label] if r.get("ok")]
            lm = med(lv)
            r = ratio(lm, pm)
            self.results["offline"]["loadgen_median_samples_per_s_" + label] = lm
            self.row("offline %s" % label, spread(lv, fmt_qps) + " samples/s",
                     spread(pv, fmt_qps) + " samples/s", r, ">= 10x peer",
                     None if r is None else r >= 10.0, loadgen_value=lm, peer_value=pm)

    def case_single_stream(self) -> None:
        dur = 1.0 if self.quick else 2.0
        self.case_header("single_stream", "p90 latency, empty Python function SUT; loadgen "
                         "closed loop, concurrency 1, consumer_spin_us=2000, %g s" % dur)
        lg_runs, peer_runs = [], []
        for i in range(self.repeats):
            spec = {"sut": "function", "settings": {
                "mode": "closed", "concurrency": 1, "duration_s": dur, "consumer_spin_us": 2000.0,
                "sample_seed": i, "interval_s": 0}}
            r = run_loadgen(spec, timeout_s=dur + 60)
            lg_runs.append(r)
            if r.get("ok"):
                lat = r["latency"]
                print("    loadgen %d: p50 %s p90 %s p99 %s, %d queries, %s q/s (loadavg %.2f)" % (
                    i + 1, fmt_ns(lat["p50"]), fmt_ns(lat["p90"]), fmt_ns(lat["p99"]),
                    r["counts"]["completed"], fmt_qps(r["completed_qps"]),
                    r["loadavg_1m_before"]), flush=True)
            else:
                print("    loadgen %d: FAILED %s" % (i + 1, r.get("error")), flush=True)
            p = self.peer.single_stream_run(dur)
            peer_runs.append(p)
            print("    peer    %d: p50 %s p90 %s p99 %s, %s queries, %s q/s, %s (loadavg %.2f)" % (
                i + 1, fmt_ns(p.get("p50_ns")), fmt_ns(p.get("p90_ns")), fmt_ns(p.get("p99_ns")),
                p.get("query_count"), fmt_qps(p.get("queries_per_s")), p.get("result"),
                p.get("loadavg_1m_before") or -1), flush=True)
        lv = [r["latency"]["p90"] for r in lg_runs if r.get("ok")]
        pv = [p.get("p90_ns") for p in peer_runs]
        lm, pm = med(lv), med(pv)
        r = ratio(pm, lm)  # peer / ours: > 1 means ours is lower
        self.results["single_stream"].update({"loadgen": lg_runs, "peer": peer_runs,
                                              "loadgen_p90_ns": lm, "peer_p90_ns": pm})
        self.row("single_stream p90", spread(lv, fmt_ns), spread(pv, fmt_ns), r,
                 "ours <= peer/2 (ratio >= 2x)", None if r is None else r >= 2.0,
                 loadgen_value=lm, peer_value=pm)

    def case_memory(self) -> None:
        ns = [1_000_000, 10_000_000] + ([] if self.quick else [100_000_000])
        self.case_header("memory", "peak RSS; loadgen NullSUT mode=offline spin_us=0 "
                         "interval_s=1 for N = %s; peer Offline, one "
                         "QuerySamplesComplete per sample" % ", ".join("%.0e" % n for n in ns))
        peer_ns = [1_000_000] + ([] if self.quick else [10_000_000])
        lg_runs: Dict[int, List[Dict[str, Any]]] = {n: [] for n in ns}
        peer_runs: Dict[int, List[Dict[str, Any]]] = {n: [] for n in peer_ns}
        peer_skip: Dict[int, str] = {}
        if self.quick:
            peer_skip[10_000_000] = "not run in --quick (takes ~20 s and ~2.1 GB)"
        for i in range(self.repeats):
            for n in ns:
                spec = {"sut": "null", "settings": {
                    "mode": "offline", "query_count": n, "spin_us": 0.0, "interval_s": 1.0,
                    "sample_seed": i}}
                r = run_loadgen(spec, timeout_s=600)
                lg_runs[n].append(r)
                if r.get("ok"):
                    print("    loadgen %d N=%.0e: peak RSS %s (%s after import, +%s), %d completed, "
                          "run %.2f s (loadavg %.2f)" % (
                              i + 1, n, fmt_mb(r["peak_rss_kb"] / 1024),
                              fmt_mb((r["rss_before_run_kb"] or 0) / 1024),
                              fmt_mb((r["peak_rss_kb"] - (r["rss_before_run_kb"] or 0)) / 1024),
                              r["counts"]["completed"], r["run_wall_s"], r["loadavg_1m_before"]),
                          flush=True)
                else:
                    print("    loadgen %d N=%.0e: FAILED %s" % (i + 1, n, r.get("error")), flush=True)
            for n in peer_ns:
                if n in peer_skip:
                    continue
                p = self.peer.peak_rss_for_queries(n, "Offline", batched=False, timeout_s=120)
                if not p.get("ok"):
                    peer_skip[n] = "did not finish within 120 s: %s" % (p.get("error") or "?")[:120]
                    print("    peer    %d N=%.0e: skipped -- %s" % (i + 1, n, peer_skip[n]), flush=True)
                    continue
                peer_runs[n].append(p)
                print("    peer    %d N=%.0e: peak RSS %s (%s before test, %.0f B/query), "
                      "test %.2f s" % (i + 1, n, fmt_mb(p["peak_rss_mb"]), fmt_mb(p["rss_before_mb"]),
                                        p["bytes_per_query"] or -1, p["test_wall_s"] or -1),
                      flush=True)
        for n, why in peer_skip.items():
            print("    peer N=%.0e: %s" % (n, why))
        self.results["memory"].update({
            "loadgen": {str(n): v for n, v in lg_runs.items()},
            "peer": {str(n): v for n, v in peer_runs.items()},
            "peer_skipped": {str(n): v for n, v in peer_skip.items()}})
        lmed = {}
        for n in ns:
            lv = [r["peak_rss_kb"] / 1024 for r in lg_runs[n] if r.get("ok")]
            lmed[n] = med(lv)
            pv = [p["peak_rss_mb"] for p in peer_runs.get(n, [])]
            pm = med(pv)
            bpq = med([p.get("bytes_per_query") for ps in peer_runs.values() for p in ps])
            peer_txt = (spread(pv, fmt_mb) if pv else
                        ("skipped: " + peer_skip[n]) if n in peer_skip else
                        "not run (at ~%.0f B/query: ~%.0f GB)" % (bpq, bpq * n / 1e9) if bpq
                        else "not run")
            if n == 100_000_000:
                flat = (lmed.get(n) is not None and lmed.get(1_000_000) is not None
                        and lmed[n] <= 1.1 * lmed[1_000_000])
                met = None if lmed[n] is None else (lmed[n] < 200 and flat)
                self.row("memory N=1e8", spread(lv, fmt_mb), peer_txt, None,
                         "< 200 MB and flat in N (<= 1.1x the 1e6 figure)", met,
                         loadgen_value=lmed[n], peer_value=None)
            else:
                r = ratio(pm, lmed[n])
                self.row("memory N=1e%d" % round(math.log10(n)), spread(lv, fmt_mb), peer_txt, r,
                         "flat in N (peer/ours shown)", None, loadgen_value=lmed[n], peer_value=pm)
        self.results["memory"]["loadgen_median_peak_mb"] = {str(k): v for k, v in lmed.items()}

    # ------------------------------------------------------------------- main
    def run(self, cases: List[str]) -> None:
        for c in cases:
            t = time.perf_counter()
            try:
                if c == "server_10ms":
                    self.case_server(c, "function", 10.0)
                elif c == "server_10ms_inline":
                    self.case_server(c, "function", 10.0, inline=True)
                elif c == "server_1ms_inline":
                    self.case_server(c, "batched", 1.0, inline=True)
                elif c == "server_10ms_batched":
                    self.case_server(c, "batched", 10.0)
                elif c == "server_1ms":
                    self.case_server(c, "batched", 1.0)
                elif c == "issue_delay":
                    self.case_issue_delay()
                elif c == "offline":
                    self.case_offline()
                elif c == "single_stream":
                    self.case_single_stream()
                elif c == "memory":
                    self.case_memory()
            except Exception as e:  # one broken case must not lose the others
                import traceback
                traceback.print_exc()
                self.results.setdefault(c, {})["error"] = repr(e)
                self.row(c, "ERROR", "-", None, "-", None, error=repr(e))
            self.results.setdefault(c, {})["case_s"] = time.perf_counter() - t
            print("   (%s took %.0f s)" % (c, time.perf_counter() - t), flush=True)

    def summary(self) -> str:
        head = ["case", "loadgen", "peer (mlperf_loadgen)", "ratio", "target", "met?"]
        rows = [[r["case"], r["loadgen"], r["peer"], r["ratio"], r["target"],
                 {True: "yes", False: "NO", None: "-"}[r["met"]]] for r in self.rows]
        w = [max(len(h), *(len(x[i]) for x in rows)) if rows else len(h) for i, h in enumerate(head)]
        lines = ["| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(head)) + " |",
                 "|" + "|".join("-" * (x + 2) for x in w) + "|"]
        for x in rows:
            lines.append("| " + " | ".join(x[i].ljust(w[i]) for i in range(len(head))) + " |")
        return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="cases: " + ", ".join(CASES))
    ap.add_argument("--quick", action="store_true",
                    help="smoke run (< ~2 min): 1 s probes, coarse bisection, no 1e8 memory "
                         "case, repeats 1 unless --repeats is given")
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs (or searches) per figure; the median is reported (default 3, "
                         "1 with --quick)")
    ap.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(CASES))
    ap.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    cases = [c.strip() for c in args.only.split(",") if c.strip()] or list(CASES)
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error("unknown case(s) %s; choose from %s" % (", ".join(bad), ", ".join(CASES)))
    sys.path.insert(0, HERE)
    t0 = time.perf_counter()
    ctx = machine_context()
    print("bench_engine: loadgen vs mlperf_loadgen, cases %s, repeats %d%s" % (
        ", ".join(cases), args.repeats, ", QUICK" if args.quick else ""))
    print_context(ctx)
    b = Bench(args)
    b.run(cases)
    total = time.perf_counter() - t0
    builds: Dict[str, int] = {}

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if x.get("core_mtime"):
                builds[x["core_mtime"]] = builds.get(x["core_mtime"], 0) + 1
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(b.results)
    ctx_end = machine_context()
    print("\n== summary (medians of %d; [min-max] spread; ratio > 1 means loadgen is better: "
          "QPS and samples/s loadgen/peer, latency and memory peer/loadgen)" % args.repeats)
    print(b.summary())
    print("total %.0f s; loadavg now %.2f %.2f %.2f" % ((total,) + os.getloadavg()))
    print("loadgen extension builds (mtime of loadgen/_core) used by the children: %s%s" % (
        ", ".join("%s (%d runs)" % kv for kv in sorted(builds.items())) or "-",
        "  ** the extension was rebuilt during this run **" if len(builds) > 1 else ""))
    if ctx_end.get("git") != ctx.get("git"):
        print("git at the end: %s (was %s at the start)" % (ctx_end.get("git"), ctx.get("git")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"context": ctx, "context_end": ctx_end, "args": vars(args),
                       "total_s": total, "core_builds": builds, "rows": b.rows,
                       "results": b.results}, f, indent=1, default=str)
        print("wrote %s" % args.json)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child_main(sys.argv[2]))
    sys.exit(main())
