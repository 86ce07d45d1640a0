"""Peer-side measurements: the MLPerf LoadGen Python module (``mlperf_loadgen``).

This module drives ``mlperf_loadgen`` (PyPI ``mlcommons-loadgen``, 6.x) the way a real
MLPerf harness does (ConstructSUT / ConstructQSL / TestSettings / LogSettings /
StartTestWithLogSettings, QuerySamplesComplete from the SUT), so that our own
``loadgen`` can be benchmarked side by side against it.

Every measurement runs ``mlperf_loadgen`` in a fresh child process (this file run as a
script with ``--child``), so its process-global state, its memory and any crash stay
isolated. The child runs with its working directory and ``LogOutputSettings.outdir`` set
to a fresh temporary directory (which also keeps any stray ``audit.config`` in the
caller's directory from being picked up); the parent parses ``mlperf_log_summary.txt``
and the ``:::MLLOG`` lines of ``mlperf_log_detail.txt``, then deletes the directory.

Public functions (each returns a plain, JSON-serialisable dict):

    server_run(target_qps, duration_s, latency_bound_ms, sut="instant", batch=False)
    server_max_valid_qps(latency_bound_ms, duration_s=5, lo=1000, hi=400000,
                         rel_precision=0.05, max_probes=12, max_total_s=240)
    offline_run(sample_count, duration_s, batched=True)
    single_stream_run(duration_s)
    peak_rss_for_queries(n_queries, scenario="Offline", server_qps=100000)
    parse_summary(text) / parse_detail(text)      (log parsers)

Run ``python bench/mlperf_peer.py --quick`` for a small eyeball run (about 30 s),
or without ``--quick`` for bigger sizes (about 2.5 min); ``--json FILE`` also writes
all figures. Server tail latencies on this 2-core machine depend heavily on whatever
else is running: every result carries ``loadavg_1m_before``.

Requires ``pip install mlcommons-loadgen``. No networking is used.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

QSL_TOTAL_DEFAULT = 1024  # QSL size; like ResNet-50's performance_sample_count
SUMMARY_FILE = "mlperf_log_summary.txt"
DETAIL_FILE = "mlperf_log_detail.txt"


# --------------------------------------------------------------------------- parsing


_NUM_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def _num(s: str) -> Any:
    s = s.strip()
    if _NUM_RE.match(s):
        f = float(s)
        if f.is_integer() and "." not in s and "e" not in s.lower():
            return int(s)
        return f
    return s


def parse_summary(text: str) -> Dict[str, Any]:
    """Parse mlperf_log_summary.txt into {key: value}.

    Lines are ``key : value`` or ``key: value`` (the Offline "Samples per second: 1.2e+06",
    "Early stopping satisfied: Yes", "target_latency (ns): 0"); key and value are
    stripped and numbers converted. Bullet lines (`` * ...``) that follow
    ``Recommendations:`` / ``Early Stopping Result:`` are collected, newline-joined, under
    ``recommendations`` / ``early_stopping_result``. Banner lines are skipped.
    Notable keys: ``Result is`` ("VALID"/"INVALID"), ``Completed samples per second``,
    ``Scheduled samples per second`` (Server), ``Samples per second`` (Offline),
    ``90.0th percentile latency (ns)`` (SingleStream), ``NN.NN percentile latency (ns)``,
    ``QPS w/ loadgen overhead`` / ``QPS w/o loadgen overhead`` (SingleStream).
    """
    out: Dict[str, Any] = {}
    sections = {"Recommendations": "recommendations",
                "Early Stopping Result": "early_stopping_result"}
    collected: Dict[str, List[str]] = {}
    current: Optional[str] = None
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if current is not None:
            if stripped and (stripped.startswith("*") or line.startswith(" ")) \
                    and not stripped.endswith(" : Yes") and " : " not in stripped:
                collected.setdefault(current, []).append(stripped)
                continue
            current = None
        if not stripped or stripped.startswith("="):
            continue
        key, sep, val = stripped.partition(":")
        key = key.strip()
        if key in sections and not val.strip():
            current = sections[key]
            continue
        if sep and key and not key.startswith("*"):
            out[key] = _num(val.strip())
    for k, lines in collected.items():
        out[k] = "\n".join(lines)
    return out


def parse_detail(text: str) -> Dict[str, Any]:
    """Parse the ``:::MLLOG {json}`` lines of mlperf_log_detail.txt.

    Returns {key: value} (last occurrence wins) plus ``_warnings`` / ``_errors``: lists of
    the values of entries whose metadata has is_warning / is_error set. Keys of interest:
    result_validity, result_perf_constraints_met, result_min_duration_met,
    result_min_queries_met, early_stopping_met, result_query_count,
    result_overlatency_query_count, result_scheduled_samples_per_sec,
    result_completed_samples_per_sec, result_samples_per_second (Offline),
    result_{min,max,mean}_latency_ns, result_NN.NN_percentile_latency_ns,
    generated_query_count, generated_samples_per_query, effective_* settings, num_errors.
    """
    out: Dict[str, Any] = {}
    warnings: List[Any] = []
    errors: List[Any] = []
    times: Dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(":::MLLOG"):
            continue
        try:
            rec = json.loads(line[len(":::MLLOG"):])
        except ValueError:
            continue
        key = rec.get("key")
        val = rec.get("value")
        meta = rec.get("metadata") or {}
        tkey = key
        if key == "generic_message" and isinstance(val, str):
            tkey = "generic_message:" + val.split(":")[0].strip()
        if tkey is not None and "time_ms" in rec:
            times.setdefault(tkey, rec["time_ms"])
        if meta.get("is_error"):
            errors.append({key: val})
        elif meta.get("is_warning"):
            warnings.append({key: val})
        if key is not None:
            out[key] = val
    out["_warnings"] = warnings
    out["_errors"] = errors
    out["_time_ms"] = times
    return out


def _phases(detail: Dict[str, Any]) -> Dict[str, Optional[float]]:
    """Seconds spent in LoadGen's phases, from the detail log's time_ms stamps.

    generate_s: "Starting performance mode" -> generated_query_count (pre-generating
    the query schedule); issue_s: -> "Ending naturally..." (issuing and completing;
    Server has no such message, the logger statistics logged right after are used);
    post_s: -> result_validity (sorting latencies, early stopping, writing results).
    """
    t = detail.get("_time_ms", {})
    start = t.get("generic_message:Starting performance mode")
    gen = t.get("generated_query_count")
    end = t.get("generic_message:Ending naturally")
    if end is None:  # Server logs no "Ending" message; the logger stats follow the run
        end = t.get("logger_swap_request_slots_retry_count", t.get("power_begin"))
    res = t.get("result_validity")

    def diff(x, y):
        return (y - x) / 1000.0 if x is not None and y is not None else None

    return {"generate_s": diff(start, gen), "issue_s": diff(gen, end),
            "post_s": diff(end, res)}


def _percentiles(detail: Dict[str, Any]) -> Dict[str, Any]:
    """p50_ns, p90_ns, ... from the detail log's result_NN.NN_percentile_latency_ns."""
    out: Dict[str, Any] = {}
    pat = re.compile(r"^result_(\d+\.\d+)_percentile_latency_ns$")
    for k, v in detail.items():
        m = pat.match(k)
        if m:
            p = float(m.group(1))
            name = ("p%g" % p).replace(".", "")  # 50.00 -> p50, 99.90 -> p999
            out[name + "_ns"] = v
    for k in ("min", "max", "mean"):
        if "result_%s_latency_ns" % k in detail:
            out["%s_ns" % k] = detail["result_%s_latency_ns" % k]
    return out


# ------------------------------------------------------------------------ child side


def read_status_kb(field: str) -> Optional[int]:
    """A field of /proc/self/status in kB (VmRSS, VmHWM), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def spec_settings(lg: Any, spec: Dict[str, Any]) -> tuple:
    """(TestSettings, LogSettings) of a child spec, for either module: scenario, mode
    and settings from the spec; plain log names in spec["outdir"]; no trace."""
    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, spec["scenario"])
    settings.mode = getattr(lg.TestMode, spec.get("mode", "PerformanceOnly"))
    for k, v in spec.get("settings", {}).items():
        setattr(settings, k, v)

    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = spec["outdir"]
    log_settings.log_output.prefix = "mlperf_log_"
    log_settings.log_output.suffix = ""
    log_settings.log_output.prefix_with_datetime = False
    log_settings.log_output.copy_detail_to_stdout = False
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = False
    return settings, log_settings


def _child_main(spec_path: str) -> int:
    """Run one mlperf_loadgen test as described by the JSON spec; write result JSON."""
    with open(spec_path) as f:
        spec = json.load(f)
    t_import = time.perf_counter()
    import mlperf_loadgen as lg  # noqa: WPS433 (import in child only)

    import_s = time.perf_counter() - t_import
    rss_before_kb = read_status_kb("VmRSS")

    counters = {
        "issue_calls": 0,
        "samples_issued": 0,
        "max_samples_per_issue": 0,
        "flush_calls": 0,
        "qsl_load_calls": [],
        "qsl_unload_calls": [],
    }
    per_sample = bool(spec.get("complete_per_sample", False))
    sut_kind = spec.get("sut", "instant")
    QSR = lg.QuerySampleResponse
    QSC = lg.QuerySamplesComplete

    worker = None
    def count(query_samples):
        counters["issue_calls"] += 1
        n = len(query_samples)
        counters["samples_issued"] += n
        if n > counters["max_samples_per_issue"]:
            counters["max_samples_per_issue"] = n

    if sut_kind == "instant":
        if per_sample:
            def issue_cb(query_samples):
                count(query_samples)
                for qs in query_samples:
                    QSC([QSR(qs.id, 0, 0)])
        else:
            def issue_cb(query_samples):
                count(query_samples)
                QSC([QSR(qs.id, 0, 0) for qs in query_samples])
    elif sut_kind == "thread":
        # A harness-style SUT: issue_query only enqueues; one worker thread completes
        # whatever is queued (all queued samples in one QuerySamplesComplete call unless
        # complete_per_sample).
        import queue
        import threading

        q: "queue.SimpleQueue" = queue.SimpleQueue()

        def issue_cb(query_samples):
            count(query_samples)
            q.put([qs.id for qs in query_samples])

        def work():
            while True:
                ids = q.get()
                if ids is None:
                    return
                while True:  # drain what is already queued
                    try:
                        more = q.get_nowait()
                    except Exception:
                        break
                    if more is None:
                        q.put(None)
                        break
                    ids.extend(more)
                if per_sample:
                    for i in ids:
                        QSC([QSR(i, 0, 0)])
                else:
                    QSC([QSR(i, 0, 0) for i in ids])

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
    else:
        raise ValueError("unknown sut kind %r" % (sut_kind,))

    def flush_cb():
        counters["flush_calls"] += 1

    def load_cb(indices):
        counters["qsl_load_calls"].append(len(indices))

    def unload_cb(indices):
        counters["qsl_unload_calls"].append(len(indices))

    settings, log_settings = spec_settings(lg, spec)
    sut = lg.ConstructSUT(issue_cb, flush_cb)
    qsl = lg.ConstructQSL(spec["qsl_total"], spec["qsl_perf"], load_cb, unload_cb)
    cpu0 = os.times()
    t0 = time.perf_counter()
    lg.StartTestWithLogSettings(
        sut, qsl, settings, log_settings,
        os.path.join(spec["outdir"], "no-audit.config"),
    )
    test_wall_s = time.perf_counter() - t0
    cpu1 = os.times()
    hwm_kb = read_status_kb("VmHWM")
    rss_after_kb = read_status_kb("VmRSS")
    if worker is not None:
        q.put(None)
        worker.join(timeout=5)
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)
    result = {
        "import_s": import_s,
        "test_wall_s": test_wall_s,
        "test_cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
        "vm_hwm_kb": hwm_kb,
        "rss_before_test_kb": rss_before_kb,
        "rss_after_test_kb": rss_after_kb,
        **counters,
    }
    with open(spec["result_path"], "w") as f:
        json.dump(result, f)
    return 0


# ----------------------------------------------------------------------- parent side


def _run_child(scenario: str, settings: Dict[str, Any], *, sut: str = "instant",
               complete_per_sample: bool = False, qsl_total: int = QSL_TOTAL_DEFAULT,
               qsl_perf: Optional[int] = None, timeout_s: float = 600.0,
               mode: str = "PerformanceOnly", script: Optional[str] = None,
               extra_spec: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run one test in a child process; return the child's figures plus parsed logs.

    The child is ``python SCRIPT --child SPEC`` (SCRIPT defaults to this file); a
    different script must read the same spec (plus any ``extra_spec`` keys), write its
    result JSON to spec["result_path"] and its logs to spec["outdir"].

    Keys: ok, error, returncode, proc_wall_s, child_maxrss_kb (wait4's ru_maxrss of
    that child), child_cpu_s, child (dict from the child), summary (parsed summary),
    detail (parsed detail log).
    """
    tmp = tempfile.mkdtemp(prefix="mlperf_peer_")
    outdir = os.path.join(tmp, "logs")
    os.makedirs(outdir)
    spec = {
        "scenario": scenario,
        "mode": mode,
        "settings": settings,
        "sut": sut,
        "complete_per_sample": complete_per_sample,
        "qsl_total": int(qsl_total),
        "qsl_perf": int(qsl_perf if qsl_perf is not None else qsl_total),
        "outdir": outdir,
        "result_path": os.path.join(tmp, "result.json"),
    }
    spec.update(extra_spec or {})
    spec_path = os.path.join(tmp, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    res: Dict[str, Any] = {"ok": False, "error": None,
                           "loadavg_1m_before": os.getloadavg()[0]}
    try:
        with open(os.path.join(tmp, "stdout"), "wb") as so, \
                open(os.path.join(tmp, "stderr"), "wb") as se:
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [sys.executable, os.path.abspath(script or __file__), "--child",
                 spec_path],
                cwd=tmp, stdout=so, stderr=se, stdin=subprocess.DEVNULL,
                start_new_session=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
            )
            status = None
            rusage = None
            deadline = t0 + timeout_s

            def kill_child():
                try:  # its own session (start_new_session), so pgid == its pid
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return os.wait4(proc.pid, 0)

            try:
                while True:
                    pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
                    if pid == proc.pid:
                        break
                    if time.perf_counter() > deadline:
                        _, status, rusage = kill_child()
                        res["error"] = "timeout after %.0f s" % timeout_s
                        break
                    time.sleep(0.02)
            except BaseException:  # e.g. KeyboardInterrupt: never leave it running
                kill_child()
                proc.returncode = -9
                raise
            res["proc_wall_s"] = time.perf_counter() - t0
            proc.returncode = os.waitstatus_to_exitcode(status)
        res["returncode"] = proc.returncode
        res["child_maxrss_kb"] = rusage.ru_maxrss
        res["child_cpu_s"] = rusage.ru_utime + rusage.ru_stime
        if os.path.exists(spec["result_path"]):
            with open(spec["result_path"]) as f:
                res["child"] = json.load(f)
        sp = os.path.join(outdir, SUMMARY_FILE)
        dp = os.path.join(outdir, DETAIL_FILE)
        res["summary"] = parse_summary(open(sp).read()) if os.path.exists(sp) else {}
        res["detail"] = parse_detail(open(dp).read()) if os.path.exists(dp) else {}
        if proc.returncode != 0 and res["error"] is None:
            with open(os.path.join(tmp, "stderr"), "rb") as f:
                tail = f.read()[-2000:].decode("utf-8", "replace")
            res["error"] = "child exited %s: %s" % (proc.returncode, tail)
        if res["error"] is None and "child" not in res:
            res["error"] = "child wrote no result"
        if res["error"] is None and not res["summary"]:
            res["error"] = "no summary log written"
        res["ok"] = res["error"] is None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def _common_figures(r: Dict[str, Any]) -> Dict[str, Any]:
    d = r.get("detail", {})
    s = r.get("summary", {})
    c = r.get("child", {})
    validity = d.get("result_validity", s.get("Result is"))
    out = {
        "ok": r["ok"],
        "error": r["error"],
        "valid": validity == "VALID",
        "result": validity,
        "invalid_reason": d.get("result_invalid_reason", s.get("recommendations")),
        "perf_constraints_met": d.get("result_perf_constraints_met"),
        "min_duration_met": d.get("result_min_duration_met"),
        "min_queries_met": d.get("result_min_queries_met"),
        "early_stopping_met": d.get("early_stopping_met"),
        "early_stopping_result": d.get("early_stopping_result",
                                       s.get("early_stopping_result")),
        "query_count": d.get("result_query_count"),
        "generated_query_count": d.get("generated_query_count"),
        "samples_per_query": d.get("generated_samples_per_query"),
        "samples_issued": c.get("samples_issued"),
        "issue_calls": c.get("issue_calls"),
        "max_samples_per_issue": c.get("max_samples_per_issue"),
        "flush_calls": c.get("flush_calls"),
        "qsl_load_calls": c.get("qsl_load_calls"),
        "qsl_unload_calls": c.get("qsl_unload_calls"),
        "test_wall_s": c.get("test_wall_s"),
        "test_cpu_s": c.get("test_cpu_s"),
        "proc_wall_s": r.get("proc_wall_s"),
        "child_maxrss_kb": r.get("child_maxrss_kb"),
        "child_vm_hwm_kb": c.get("vm_hwm_kb"),
        "num_errors": d.get("num_errors"),
        "log_warnings": d.get("_warnings", []),
        "log_errors": d.get("_errors", []),
        "loadgen_version": d.get("loadgen_version"),
        "loadavg_1m_before": r.get("loadavg_1m_before"),
    }
    out.update(_phases(d))
    out.update(_percentiles(d))
    out["summary"] = s
    out["detail_results"] = {k: v for k, v in d.items()
                             if k.startswith(("result_", "effective_", "generated_"))}
    return out


# ------------------------------------------------------------------ public functions


def server_run(target_qps: float, duration_s: float, latency_bound_ms: float,
               sut: str = "instant", batch: bool = False,
               qsl_total: int = QSL_TOTAL_DEFAULT,
               timeout_s: Optional[float] = None,
               child: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """One Server-scenario PerformanceOnly run.

    Settings: server_target_qps=target_qps, min_duration_ms=duration_s*1000,
    min_query_count=1 (so the duration governs), server_target_latency_ns=bound,
    server_target_latency_percentile=0.99. ``batch=True`` sets server_coalesce_queries
    (loadgen may then hand several overdue queries to one issue_query call).
    ``sut="instant"`` completes every sample inside issue_query with one
    QuerySamplesComplete(list) per call (data pointer 0, size 0); ``sut="thread"`` queues
    and completes from a worker thread. ``child``: extra keyword arguments of
    _run_child (``script``, ``extra_spec``), to run another harness script; the same
    holds for offline_run, single_stream_run and peak_rss_for_queries.

    Returns valid, result, scheduled_qps, completed_qps, p50_ns/p90_ns/p95_ns/p97_ns/
    p99_ns/p999_ns, min/mean/max_ns, query_count, overlatency_count, test_wall_s (around
    StartTest), proc_wall_s (whole child), plus the keys of _common_figures.
    """
    settings = {
        "server_target_qps": float(target_qps),
        "server_target_latency_ns": int(round(latency_bound_ms * 1e6)),
        "server_target_latency_percentile": 0.99,
        "min_duration_ms": int(round(duration_s * 1000)),
        "min_query_count": 1,
        "server_coalesce_queries": bool(batch),
    }
    if timeout_s is None:
        timeout_s = 60 + 6 * duration_s
    r = _run_child("Server", settings, sut=sut, qsl_total=qsl_total, timeout_s=timeout_s,
                   **(child or {}))
    out = _common_figures(r)
    d = r.get("detail", {})
    s = r.get("summary", {})
    out.update({
        "scenario": "Server",
        "target_qps": float(target_qps),
        "duration_s": duration_s,
        "latency_bound_ms": latency_bound_ms,
        "sut": sut,
        "batch": batch,
        "scheduled_qps": d.get("result_scheduled_samples_per_sec",
                               s.get("Scheduled samples per second")),
        "completed_qps": d.get("result_completed_samples_per_sec",
                               s.get("Completed samples per second")),
        "overlatency_count": d.get("result_overlatency_query_count"),
    })
    return out


def geometric_max_valid(probe, lo: float, hi: float, rel_precision: float = 0.05,
                        max_probes: int = 12, max_total_s: float = 240.0) -> Dict[str, Any]:
    """Highest rate whose probe is valid, by geometric bisection (shared by both sides
    of bench/bench_engine.py, so the peer and loadgen are searched the same way).

    The bracket [lo, hi] is not probed itself; each probe runs at sqrt(a*b); a valid
    result raises a, an invalid one lowers b. Stops when b/a <= 1+rel_precision, after
    max_probes probes, or when the next probe would probably overrun max_total_s
    (judged by the slowest probe so far). If no probe was valid, lo is probed once more
    (beyond max_probes) so the answer says whether even lo passes. ``probe(q)`` returns
    (valid, record); each record gains qps, valid and wall_s.

    Returns max_valid_qps, min_invalid_qps (or None), bracket [a, b], converged,
    rel_precision, lo, hi, probes, n_probes, total_s and hit_top (every probe valid).
    """
    t_start = time.perf_counter()
    a, b = float(lo), float(hi)
    probes: List[Dict[str, Any]] = []
    best: Optional[float] = None
    worst: Optional[float] = None
    slowest = 0.0

    def one(q: float) -> bool:
        nonlocal best, worst, slowest
        t = time.perf_counter()
        ok, rec = probe(q)
        dt = time.perf_counter() - t
        slowest = max(slowest, dt)
        rec = dict(rec)
        rec.update({"qps": q, "valid": bool(ok), "wall_s": dt})
        probes.append(rec)
        if ok and (best is None or q > best):
            best = q
        if not ok and (worst is None or q < worst):
            worst = q
        return bool(ok)

    while b / a > 1 + rel_precision and len(probes) < max_probes:
        if probes and time.perf_counter() - t_start + slowest > max_total_s:
            break
        q = math.sqrt(a * b)
        if one(q):
            a = q
        else:
            b = q
    converged = b / a <= 1 + rel_precision
    if best is None and not any(p["qps"] == float(lo) for p in probes):
        one(float(lo))
    return {"max_valid_qps": best, "min_invalid_qps": worst, "bracket": [a, b],
            "converged": converged, "rel_precision": rel_precision,
            "lo": lo, "hi": hi, "probes": probes, "n_probes": len(probes),
            "total_s": time.perf_counter() - t_start,
            "hit_top": best is not None and worst is None}


def server_max_valid_qps(latency_bound_ms: float, duration_s: float = 5, lo: float = 1000,
                         hi: float = 400000, rel_precision: float = 0.05,
                         max_probes: int = 12, max_total_s: float = 240,
                         sut: str = "instant", batch: bool = False) -> Dict[str, Any]:
    """Highest target QPS whose Server run is VALID, by geometric_max_valid over
    server_run (a failed child counts as INVALID).

    Validity is assumed monotonic in QPS, which fails at the low end: a Server run with
    too few queries (below ~460 for p99 with zero over-bound queries, more with some) is
    INVALID by early stopping alone, so keep lo * duration_s well above that.

    Returns geometric_max_valid's keys plus latency_bound_ms and duration_s; each probe
    holds qps, valid, result, p99_ns, completed_qps, query_count, perf_constraints_met,
    early_stopping_met, min_duration_met, wall_s and error.
    """
    def probe(q: float):
        r = server_run(q, duration_s, latency_bound_ms, sut=sut, batch=batch)
        ok = bool(r["ok"] and r["valid"])
        return ok, {
            "result": r.get("result"), "p99_ns": r.get("p99_ns"),
            "completed_qps": r.get("completed_qps"), "query_count": r.get("query_count"),
            "perf_constraints_met": r.get("perf_constraints_met"),
            "early_stopping_met": r.get("early_stopping_met"),
            "min_duration_met": r.get("min_duration_met"), "error": r.get("error"),
        }

    out = geometric_max_valid(probe, lo, hi, rel_precision, max_probes, max_total_s)
    out.update({"latency_bound_ms": latency_bound_ms, "duration_s": duration_s})
    return out


def offline_run(sample_count: int, duration_s: float, batched: bool = True,
                sut: str = "instant", qsl_total: int = QSL_TOTAL_DEFAULT,
                timeout_s: Optional[float] = None,
                child: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """One Offline-scenario PerformanceOnly run of exactly ``sample_count`` samples.

    LoadGen issues Offline as ONE query of max(min_query_count,
    int(1.1 * min_duration_s * offline_expected_qps)) samples. We set
    min_query_count = sample_count and offline_expected_qps = sample_count /
    (1.1 * duration_s) (slightly less), i.e. as high as possible without generating more
    than sample_count samples; min_duration_ms = duration_s*1000 (the run is VALID only if
    the SUT took at least that long, so use a small duration for an instant SUT).
    batched=True: the SUT completes all samples of the query in one QuerySamplesComplete
    call; batched=False: one call per sample.

    Returns samples_per_s (the log's "Samples per second"), samples, valid, test_wall_s,
    latency figures, plus the keys of _common_figures.
    """
    sample_count = int(sample_count)
    if duration_s > 0:
        expected = sample_count / (1.1 * duration_s) * 0.999
    else:
        expected = float(sample_count)
    settings = {
        "offline_expected_qps": float(expected),
        "min_duration_ms": int(round(duration_s * 1000)),
        "min_query_count": sample_count,
    }
    if timeout_s is None:
        timeout_s = 120 + sample_count / 20000.0
    r = _run_child("Offline", settings, sut=sut, complete_per_sample=not batched,
                   qsl_total=qsl_total, timeout_s=timeout_s, **(child or {}))
    out = _common_figures(r)
    d = r.get("detail", {})
    s = r.get("summary", {})
    sps = d.get("result_samples_per_second", s.get("Samples per second"))
    out.update({
        "scenario": "Offline",
        "sample_count": sample_count,
        "duration_s": duration_s,
        "batched": batched,
        "sut": sut,
        "samples": out.get("samples_issued"),
        "samples_per_s": sps,
        "samples_per_s_wall": (out["samples_issued"] / out["test_wall_s"]
                               if out.get("samples_issued") and out.get("test_wall_s")
                               else None),
    })
    return out


def single_stream_run(duration_s: float, expected_latency_ns: int = 3000,
                      qsl_total: int = QSL_TOTAL_DEFAULT,
                      timeout_s: Optional[float] = None,
                      child: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """One SingleStream PerformanceOnly run with an empty SUT.

    The SUT completes the (single) sample immediately inside issue_query. Settings:
    min_duration_ms=duration_s*1000, min_query_count=1, target percentile 0.9,
    single_stream_expected_latency_ns=expected_latency_ns. LoadGen pre-generates
    2 * duration / expected_latency queries up front and stops once min_duration is
    met, or earlier when it runs out of them (then min_duration_met is False and the
    run INVALID). So expected_latency_ns must be below ~2x the real per-query cycle
    (2-2.5 us for an empty Python SUT here); much smaller values waste memory (about
    300 B per pre-generated query) and generation time. If the run ends INVALID for
    min duration, it is retried once with half the expected latency (``retried``).

    Returns p50_ns/p90_ns/p99_ns/..., p90_early_stopping_ns / p99_early_stopping_ns
    (SingleStream's early-stopping estimates), query_count, queries_per_s (the log's
    "QPS w/ loadgen overhead"), queries_per_s_without_overhead, valid, test_wall_s, plus
    the keys of _common_figures.
    """
    settings = {
        "min_duration_ms": int(round(duration_s * 1000)),
        "min_query_count": 1,
        "single_stream_expected_latency_ns": int(expected_latency_ns),
        "single_stream_target_latency_percentile": 0.9,
    }
    if timeout_s is None:
        timeout_s = 60 + 4 * duration_s
    r = _run_child("SingleStream", settings, qsl_total=qsl_total, timeout_s=timeout_s,
                   **(child or {}))
    retried = False
    if r["ok"] and r.get("detail", {}).get("result_min_duration_met") is False:
        retried = True
        expected_latency_ns = max(1, int(expected_latency_ns) // 2)
        settings["single_stream_expected_latency_ns"] = expected_latency_ns
        r = _run_child("SingleStream", settings, qsl_total=qsl_total,
                       timeout_s=timeout_s, **(child or {}))
    out = _common_figures(r)
    d = r.get("detail", {})
    s = r.get("summary", {})
    qc = out.get("query_count")
    out.update({
        "scenario": "SingleStream",
        "duration_s": duration_s,
        "expected_latency_ns": int(expected_latency_ns),
        "retried": retried,
        "p90_early_stopping_ns": d.get("early_stopping_latency_ss"),
        "p99_early_stopping_ns": d.get("early_stopping_latency_ms"),
        "p90_summary_ns": s.get("90.0th percentile latency (ns)"),
        "queries_per_s": d.get("result_qps_with_loadgen_overhead"),
        "queries_per_s_without_overhead": d.get("result_qps_without_loadgen_overhead"),
        "queries_per_s_wall": (qc / out["test_wall_s"] if qc and out.get("test_wall_s")
                               else None),
    })
    return out


def peak_rss_for_queries(n_queries: int, scenario: str = "Server",
                         server_qps: float = 150000.0, batched: bool = True,
                         timeout_s: Optional[float] = None,
                         child: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Peak RSS of a child that pushes ~n_queries samples through mlperf_loadgen.

    scenario="Server" (default): Server at server_qps for n_queries/server_qps seconds
    (min_query_count=n_queries), instant SUT, 1 s latency bound (validity is irrelevant
    here); 1e6 queries take ~7 s. scenario="Offline": one Offline query of exactly
    n_queries samples (min_duration 0), instant SUT completing all in one call
    (batched=True; the Python list of 1e6 QuerySampleResponse objects the harness builds
    is then part of the peak) or one call per sample (batched=False); 1e6 take ~1.5 s.
    scenario="SingleStream": n_queries one-sample queries, one after another
    (min_duration 0), instant SUT; no per-query Python objects outlive a query.

    Returns peak_rss_mb (max of wait4's ru_maxrss and the child's VmHWM), rss_before_mb
    (child RSS after importing mlperf_loadgen, before the test), peak_rss_delta_mb,
    bytes_per_query (delta / queries), queries (samples actually issued), test_wall_s,
    proc_wall_s.
    """
    n_queries = int(n_queries)
    if scenario == "Offline":
        settings = {
            "offline_expected_qps": float(n_queries),
            "min_duration_ms": 0,
            "min_query_count": n_queries,
        }
    elif scenario == "SingleStream":
        settings = {
            "min_duration_ms": 0,
            "min_query_count": n_queries,
            "single_stream_expected_latency_ns": 1_000_000,
            "single_stream_target_latency_percentile": 0.9,
        }
    elif scenario == "Server":
        settings = {
            "server_target_qps": float(server_qps),
            "server_target_latency_ns": 1_000_000_000,
            "server_target_latency_percentile": 0.99,
            "min_duration_ms": int(1000 * n_queries / server_qps),
            "min_query_count": n_queries,
        }
    else:
        raise ValueError("scenario must be 'Offline', 'SingleStream' or 'Server'")
    if timeout_s is None:
        timeout_s = 120 + n_queries / 10000.0
    r = _run_child(scenario, settings, timeout_s=timeout_s,
                   complete_per_sample=(scenario == "Offline" and not batched),
                   **(child or {}))
    c = r.get("child", {})
    peak_kb = max(r.get("child_maxrss_kb") or 0, c.get("vm_hwm_kb") or 0)
    before_kb = c.get("rss_before_test_kb") or 0
    queries = c.get("samples_issued")
    d = r.get("detail", {})
    return {
        "ok": r["ok"],
        "error": r["error"],
        "scenario": scenario,
        "batched": batched if scenario == "Offline" else None,
        "server_qps": server_qps if scenario == "Server" else None,
        "n_queries": n_queries,
        "queries": queries,
        "peak_rss_mb": peak_kb / 1024.0,
        "rss_before_mb": before_kb / 1024.0,
        "peak_rss_delta_mb": (peak_kb - before_kb) / 1024.0,
        "bytes_per_query": ((peak_kb - before_kb) * 1024.0 / queries) if queries else None,
        "child_maxrss_kb": r.get("child_maxrss_kb"),
        "child_vm_hwm_kb": c.get("vm_hwm_kb"),
        "test_wall_s": c.get("test_wall_s"),
        "proc_wall_s": r.get("proc_wall_s"),
        "result": d.get("result_validity"),
    }


# ----------------------------------------------------------------------------- main


def _fmt_ns(v: Any) -> str:
    if v is None:
        return "-"
    v = float(v)
    if v >= 1e6:
        return "%.2f ms" % (v / 1e6)
    if v >= 1e3:
        return "%.2f us" % (v / 1e3)
    return "%d ns" % v


def _fmt(v: Any, spec: str = "%.0f") -> str:
    return "-" if v is None else spec % v


def _fmt_phases(r: Dict[str, Any]) -> str:
    return "generate %s s, issue %s s, post %s s; child cpu %s s, peak RSS %s MB, " \
           "loadavg %s" % (
               _fmt(r.get("generate_s"), "%.2f"), _fmt(r.get("issue_s"), "%.2f"),
               _fmt(r.get("post_s"), "%.2f"), _fmt(r.get("test_cpu_s"), "%.2f"),
               _fmt((r.get("child_maxrss_kb") or 0) / 1024.0, "%.0f"),
               _fmt(r.get("loadavg_1m_before"), "%.2f"))


def _main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (about 30 s)")
    ap.add_argument("--json", metavar="FILE", help="also write all figures as JSON")
    args = ap.parse_args(argv)
    try:
        import importlib.metadata as md
        ver = md.version("mlcommons-loadgen")
    except Exception:  # pragma: no cover
        ver = "?"
    print("mlcommons-loadgen %s, python %s, %d cpus" % (
        ver, sys.version.split()[0], os.cpu_count() or 0))
    q = args.quick
    allres: Dict[str, Any] = {}

    def timed(name, fn, *a, **kw):
        t = time.perf_counter()
        r = fn(*a, **kw)
        r["_call_s"] = time.perf_counter() - t
        allres[name] = r
        if r.get("error"):
            print("  !! %s: %s" % (name, r["error"]))
        return r

    print("\n== server_run (instant SUT, one QuerySamplesComplete per issue call)")
    srv_cases = ([(20000, 2, 10), (100000, 2, 10), (1000, 2, 1)] if q else
                 [(20000, 5, 10), (100000, 5, 10), (125000, 5, 10), (150000, 5, 10),
                  (1000, 5, 1), (5000, 5, 1)])
    for qps, dur, bound in srv_cases:
        r = timed("server_run_%d_%gms" % (qps, bound), server_run, qps, dur, bound)
        print("  target %7d qps %2gs bound %4g ms: %-7s sched %9s compl %9s  "
              "p50 %9s p90 %9s p99 %9s  n=%s  %.1fs" % (
                  qps, dur, bound, r["result"], _fmt(r["scheduled_qps"]),
                  _fmt(r["completed_qps"]), _fmt_ns(r.get("p50_ns")),
                  _fmt_ns(r.get("p90_ns")), _fmt_ns(r.get("p99_ns")),
                  r["query_count"], r["_call_s"]))
        print("      phases: %s" % _fmt_phases(r))
    r = timed("server_run_coalesce", server_run, 100000, 2, 10, batch=True)
    print("  target  100000 qps  2s bound   10 ms coalesce: %-7s compl %s p99 %s "
          "issue calls %s for %s samples (max %s/call)  %.1fs" % (
              r["result"], _fmt(r["completed_qps"]), _fmt_ns(r.get("p99_ns")),
              r["issue_calls"], r["samples_issued"], r["max_samples_per_issue"],
              r["_call_s"]))
    print("      phases: %s" % _fmt_phases(r))

    print("\n== server_max_valid_qps (geometric bisection)")
    mv_cases = ([(10, dict(duration_s=1, rel_precision=0.25, max_probes=5)),
                 (1, dict(duration_s=2, lo=300, hi=30000, rel_precision=0.5,
                          max_probes=4))] if q else
                [(10, dict(duration_s=5)), (1, dict(duration_s=5, lo=200))])
    for bound, kw in mv_cases:
        r = timed("server_max_valid_qps_%gms" % bound, server_max_valid_qps, bound, **kw)
        print("  bound %g ms, %gs probes: max valid %s qps, min invalid %s qps, "
              "%d probes, %.1fs" % (
                  bound, kw.get("duration_s", 5), _fmt(r["max_valid_qps"]),
                  _fmt(r["min_invalid_qps"]), r["n_probes"], r["total_s"]))
        for p in r["probes"]:
            why = ""
            if not p["valid"]:
                why = ", ".join(n for n, k in (("latency", "perf_constraints_met"),
                                               ("early-stopping", "early_stopping_met"),
                                               ("min-duration", "min_duration_met"))
                                if p.get(k) is False) or (p.get("error") or "?")
            print("      %9.0f qps  %-7s p99 %-10s n=%-7s %s" % (
                p["qps"], p["result"], _fmt_ns(p["p99_ns"]), p["query_count"], why))

    print("\n== offline_run (instant SUT)")
    n_off = 200_000 if q else 1_000_000
    for batched in (True, False):
        r = timed("offline_run_%s" % ("batched" if batched else "per_sample"),
                  offline_run, n_off, 0.1, batched=batched)
        print("  %d samples, %s: %s samples/s (log), %s samples/s (wall), %s, "
              "test %.2fs, call %.1fs" % (
                  n_off, "one complete call" if batched else "one call per sample",
                  _fmt(r["samples_per_s"]), _fmt(r["samples_per_s_wall"]),
                  r["result"], r["test_wall_s"] or -1, r["_call_s"]))
        print("      phases: %s" % _fmt_phases(r))

    print("\n== single_stream_run (empty SUT)")
    r = timed("single_stream_run", single_stream_run, 2 if q else 5)
    print("  p50 %s p90 %s p99 %s (early-stopping p90 %s), %s queries, %s q/s, %s, "
          "%.1fs" % (_fmt_ns(r.get("p50_ns")), _fmt_ns(r.get("p90_ns")),
                     _fmt_ns(r.get("p99_ns")), _fmt_ns(r.get("p90_early_stopping_ns")),
                     r["query_count"], _fmt(r["queries_per_s"]), r["result"],
                     r["_call_s"]))
    print("      phases: %s" % _fmt_phases(r))

    print("\n== peak_rss_for_queries")
    for n, scen, bat in ([(100_000, "Server", True), (100_000, "Offline", True)] if q else
                         [(1_000_000, "Server", True), (1_000_000, "Offline", True),
                          (1_000_000, "Offline", False)]):
        r = timed("peak_rss_%s_%d%s" % (scen, n, "" if bat else "_per_sample"),
                  peak_rss_for_queries, n, scen, batched=bat)
        scen = scen if bat else scen + "/1"
        print("  %-9s %8d queries: peak RSS %.1f MB (%.1f MB before test, +%.1f MB, "
              "%s B/query), test %.2fs, call %.1fs" % (
                  scen, r["queries"] or 0, r["peak_rss_mb"], r["rss_before_mb"],
                  r["peak_rss_delta_mb"], _fmt(r["bytes_per_query"]),
                  r["test_wall_s"] or -1, r["_call_s"]))

    if args.json:
        with open(args.json, "w") as f:
            json.dump(allres, f, indent=1, default=str)
        print("\nwrote %s" % args.json)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child_main(sys.argv[2]))
    sys.exit(_main())
