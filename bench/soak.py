#!/usr/bin/env python3
"""Soak: loadgen's memory and resources stay flat however long it runs.

Two soaks, each a pass/fail with the figures:

``python bench/soak.py`` (the null soak)
    ``run_benchmark`` with the null SUT (the native NullSUT: no Python per query) for
    N = 1e6, 1e7 and 1e8 queries, in offline mode and in closed-loop mode
    (``concurrency``), each N in a fresh child process so that its peak RSS (VmHWM) is
    its own. Prints, per mode and N, the peak RSS, the RSS before the run, the lowest and
    highest RSS seen during the run (sampled each second through ``on_progress``), the
    time and the rate, then the ratio of the peak at the largest N to the peak at the
    smallest. Passes when that ratio is at most ``--max-ratio`` (1.10).

``python bench/soak.py --server`` (the server soak)
    ``run_benchmark`` called ``--runs`` times (1000) in this one process against real
    HTTP servers on 127.0.0.1 (``tests/servers/scripted.py``, started here and ended by
    PID): KServe v2 REST with a Prometheus scrape, OpenAI streaming completions, KServe
    against a server that closes connections and answers 500s, and a target that is not
    listening (the run fails in its readiness wait). After each run (and a
    ``gc.collect()``) it counts open file descriptors (``/proc/self/fd``), threads
    (``threading.active_count()`` and ``Threads`` of ``/proc/self/status``) and RSS.
    The first ``--warmup`` runs (10%) are warm-up; their last figures are the baseline.
    Passes when, after warm-up, fds and threads never exceed the baseline and are back at
    it after the last run, and RSS grew by less than ``--max-rss-growth-mb`` (16 MiB).

``--json PATH`` writes every figure. Exit status: 0 passed, 1 a soak failed.
tests/integration/test_soak.py runs the server soak with 50 short runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_MARK = "SOAK_RESULT "
MODES = {"offline": {"scenario": "offline"}, "closed": {"scenario": "concurrency"}}


# ------------------------------------------------------------------ what a process holds

def status_kb(key: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM), or a count (Threads)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself holds


def resources() -> Dict[str, int]:
    """What this process holds now: fds, threads (Python's and the kernel's), RSS."""
    return {"fds": open_fds(), "py_threads": threading.active_count(), "os_threads": status_kb("Threads"),
            "rss_kb": status_kb("VmRSS")}


# --------------------------------------------------------------------------- null soak

def null_child(spec: Dict[str, Any]) -> Dict[str, Any]:
    """One null-SUT run of ``spec["n"]`` queries in ``spec["mode"]``, in this process."""
    from loadgen.options import RunOptions
    from loadgen.runner import run_benchmark

    kw: Dict[str, Any] = dict(MODES[spec["mode"]])
    if spec["mode"] == "closed":
        kw["concurrency"] = spec["concurrency"]
    options = RunOptions(sut="null", query_count=spec["n"], max_issue_delay_ms=1000.0, **kw)
    # A small warm-up run first: what every run needs (imports, the extension's
    # one-time allocations) is in the RSS before the measured run, not in its growth.
    run_benchmark(RunOptions(sut="null", query_count=1000, max_issue_delay_ms=1000.0, **kw))
    gc.collect()
    rss_before = status_kb("VmRSS")
    samples: List[int] = []
    started = time.perf_counter()
    doc = run_benchmark(options, on_progress=lambda p: samples.append(status_kb("VmRSS")),
                        progress_interval_s=1.0)
    wall_s = time.perf_counter() - started
    return {"mode": spec["mode"], "n": spec["n"], "completed": doc["counts"]["completed"],
            "issued": doc["counts"]["issued"], "failed": doc["counts"]["failed"], "wall_s": wall_s,
            "qps": doc["counts"]["completed"] / wall_s, "rss_before_kb": rss_before,
            "rss_during_kb": samples, "rss_after_kb": status_kb("VmRSS"), "vm_hwm_kb": status_kb("VmHWM")}


def run_null_child(spec: Dict[str, Any], timeout_s: float) -> Dict[str, Any]:
    """:func:`null_child` in a fresh process (this file with --child); its figures."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # numpy's BLAS worker would busy-wait beside the engine
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                          capture_output=True, text=True, timeout=timeout_s, env=env, cwd=REPO)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            result: Dict[str, Any] = json.loads(line[len(RESULT_MARK):])
            return result
    raise RuntimeError(f"soak child {spec} exited {proc.returncode}: {proc.stderr[-2000:]}")


def null_soak(ns: List[int], modes: List[str], concurrency: int, max_ratio: float,
              timeout_s: float) -> Dict[str, Any]:
    print(f"null soak: run_benchmark(sut=null) for N = {', '.join(f'{n:.0e}' for n in ns)}, "
          f"modes {', '.join(modes)} (closed: concurrency {concurrency}); one child process per run")
    print(f"{'mode':<8} {'N':>6} {'peak RSS':>10} {'before':>9} {'during (min-max)':>18} {'time':>8} "
          f"{'queries/s':>10}")
    out: Dict[str, Any] = {"runs": [], "ratios": {}, "passed": True}
    for mode in modes:
        peaks = {}
        for n in ns:
            r = run_null_child({"mode": mode, "n": n, "concurrency": concurrency}, timeout_s)
            out["runs"].append(r)
            assert r["completed"] == n and r["failed"] == 0, r
            during = r["rss_during_kb"] or [r["rss_after_kb"]]
            peaks[n] = r["vm_hwm_kb"]
            print(f"{mode:<8} {n:>6.0e} {r['vm_hwm_kb'] / 1024:>7.1f} MB {r['rss_before_kb'] / 1024:>6.1f} MB "
                  f"{min(during) / 1024:>8.1f}-{max(during) / 1024:.1f} MB {r['wall_s']:>6.1f} s "
                  f"{r['qps'] / 1e6:>8.2f}M", flush=True)
        ratio = peaks[max(ns)] / peaks[min(ns)]
        out["ratios"][mode] = ratio
        ok = ratio <= max_ratio
        out["passed"] &= ok
        print(f"{mode}: peak RSS at N={max(ns):.0e} / at N={min(ns):.0e} = {ratio:.3f} "
              f"({'flat' if ok else 'GROWS'}: limit {max_ratio})")
    return out


# ------------------------------------------------------------------------- server soak

def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def server_soak(runs: int, run_s: float = 0.05, warmup: Optional[int] = None, max_rss_growth_mb: float = 16.0,
                workdir: Optional[str] = None, on_run: Optional[Callable[[int, Dict[str, Any]], None]] = None,
                ) -> Dict[str, Any]:
    """Calls ``run_benchmark`` ``runs`` times in this process against scripted servers;
    returns the figures and ``passed`` (see the module doc)."""
    import tempfile

    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from loadgen.options import RunOptions
    from loadgen.runner import run_benchmark
    from tests.servers.scripted_proc import start_scripted

    warmup = max(3, runs // 10) if warmup is None else warmup
    workdir = workdir or tempfile.mkdtemp(prefix="loadgen-soak-")
    good = start_scripted(workdir, "--ttft-ms", "1", "--itl-ms", "0.2", "--tokens", "4", "--max-runtime-s", "7200")
    try:
        faulty = start_scripted(workdir, "--close-every", "3", "--status-every", "4:500", "--max-runtime-s", "7200")
    except BaseException:
        good.stop()
        raise
    common: Dict[str, Any] = dict(scenario="constant", target_qps=200.0, duration_s=run_s, max_issue_delay_ms=100.0,
                                  grace_s=1.0, timeout_ms=1000.0, ready_timeout_s=5.0)
    kinds: List[tuple] = [
        ("kserve+metrics", RunOptions(sut=f"{good.url}/v2/models/m/infer", input=["INPUT0:FP32:1x16"],
                                      server_metrics_url=f"{good.url}/metrics", interval_s=0.02, **common)),
        ("openai-stream", RunOptions(sut=f"openai+{good.url}/v1/completions", model="m", **common)),
        ("kserve-faults", RunOptions(sut=f"{faulty.url}/v2/models/m/infer", input=["INPUT0:FP32:1x16"], **common)),
        ("not-listening", RunOptions(sut=f"http://127.0.0.1:{_closed_port()}/v2/models/m/infer",
                                     input=["INPUT0:FP32:1x16"], **{**common, "ready_timeout_s": 0.1})),
    ]
    records: List[Dict[str, Any]] = []
    started = time.perf_counter()
    try:
        for i in range(runs):
            kind, options = kinds[i % len(kinds)]
            t0 = time.perf_counter()
            outcome = "ok"
            try:
                doc = run_benchmark(options)
                c = doc["counts"]
                outcome = f"{c['completed']} completed, {c['failed']} failed"
                if kind != "kserve-faults" and (c["completed"] == 0 or c["failed"]):
                    raise RuntimeError(f"run {i} ({kind}): {outcome}; {doc['errors']}")
            except ValueError as e:  # the target that is not listening: refused before the run
                if kind != "not-listening":
                    raise
                outcome = f"refused: {str(e)[:60]}"
            gc.collect()
            record = {"run": i, "kind": kind, "s": time.perf_counter() - t0, "outcome": outcome, **resources()}
            records.append(record)
            if on_run is not None:
                on_run(i, record)
    finally:
        good.stop()
        faulty.stop()
    return judge(records, warmup, max_rss_growth_mb, time.perf_counter() - started)


def judge(records: List[Dict[str, Any]], warmup: int, max_rss_growth_mb: float, wall_s: float) -> Dict[str, Any]:
    """Baseline (after warm-up), worst and last figures, and whether they held."""
    base, after, last = records[warmup - 1], records[warmup:], records[-1]
    out: Dict[str, Any] = {"runs": len(records), "warmup": warmup, "wall_s": wall_s, "baseline": base,
                           "last": last, "max": {}, "problems": []}
    for key in ("fds", "py_threads", "os_threads"):
        out["max"][key] = max(r[key] for r in after)
        if out["max"][key] > base[key] or last[key] != base[key]:
            out["problems"].append(f"{key}: baseline {base[key]}, max {out['max'][key]}, last {last[key]}")
    out["max"]["rss_kb"] = max(r["rss_kb"] for r in after)
    growth_mb = (last["rss_kb"] - base["rss_kb"]) / 1024
    out["rss_growth_mb"] = growth_mb
    # The slope over the runs after warm-up (least squares), KiB per run.
    xs = [r["run"] for r in after]
    ys = [r["rss_kb"] for r in after]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    out["rss_slope_kb_per_run"] = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    if growth_mb >= max_rss_growth_mb:
        out["problems"].append(f"RSS grew {growth_mb:.1f} MB after warm-up (limit {max_rss_growth_mb} MB)")
    out["kinds"] = {}
    for r in records:
        k = out["kinds"].setdefault(r["kind"], {"runs": 0, "total_s": 0.0})
        k["runs"] += 1
        k["total_s"] += r["s"]
        k["mean_s"] = k["total_s"] / k["runs"]
        k["last_outcome"] = r["outcome"]
    out["passed"] = not out["problems"]
    return out


def print_server_soak(res: Dict[str, Any]) -> None:
    b, m, last = res["baseline"], res["max"], res["last"]
    print(f"server soak: {res['runs']} run_benchmark calls in one process, {res['wall_s']:.1f} s "
          f"(warm-up {res['warmup']} runs)")
    print(f"{'':<14} {'baseline':>10} {'max after':>10} {'last':>10}")
    for key in ("fds", "py_threads", "os_threads"):
        print(f"{key:<14} {b[key]:>10} {m[key]:>10} {last[key]:>10}")
    print(f"{'RSS MB':<14} {b['rss_kb'] / 1024:>10.1f} {m['rss_kb'] / 1024:>10.1f} {last['rss_kb'] / 1024:>10.1f}"
          f"   (growth {res['rss_growth_mb']:+.2f} MB, slope {res['rss_slope_kb_per_run']:+.3f} KiB/run)")
    for kind, k in res["kinds"].items():
        print(f"  {kind:<15} {k['runs']:>5} runs, {k['mean_s'] * 1000:6.1f} ms each; last: {k['last_outcome']}")
    print("PASS" if res["passed"] else "FAIL: " + "; ".join(res["problems"]))


# ------------------------------------------------------------------------------- main

def _counts(text: str) -> List[int]:
    return [int(float(x)) for x in text.split(",")]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", action="store_true", help="the server soak instead of the null soak")
    p.add_argument("--queries", type=_counts, default=[10**6, 10**7, 10**8], help="null soak: N list (1e6,1e7,1e8)")
    p.add_argument("--modes", default="offline,closed", help="null soak: offline,closed")
    p.add_argument("--concurrency", type=int, default=8, help="null soak, closed mode: queries in flight (8)")
    p.add_argument("--max-ratio", type=float, default=1.10, help="null soak: peak RSS ratio limit (1.10)")
    p.add_argument("--runs", type=int, default=1000, help="server soak: run_benchmark calls (1000)")
    p.add_argument("--run-s", type=float, default=0.05, help="server soak: duration of each run (0.05 s)")
    p.add_argument("--warmup", type=int, default=None, help="server soak: warm-up runs (10%%, at least 3)")
    p.add_argument("--max-rss-growth-mb", type=float, default=16.0, help="server soak: RSS growth limit (16)")
    p.add_argument("--workdir", help="server soak: where the servers keep their files (default: a new temporary folder)")
    p.add_argument("--json", metavar="PATH", help="write every figure here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(RESULT_MARK + json.dumps(null_child(json.loads(args.child))), flush=True)
        return 0
    import loadgen

    print(f"{dt.datetime.now(dt.timezone.utc):%a %b %d %H:%M:%S UTC %Y}; loadgen {loadgen.__version__}, "
          f"Python {platform.python_version()}, {os.cpu_count()} CPUs")
    if args.server:
        def progress(i: int, r: Dict[str, Any]) -> None:
            if (i + 1) % max(1, args.runs // 10) == 0:
                print(f"  run {i + 1:>5}: fds {r['fds']}, threads {r['py_threads']}/{r['os_threads']}, "
                      f"RSS {r['rss_kb'] / 1024:.1f} MB", flush=True)

        res = server_soak(args.runs, args.run_s, args.warmup, args.max_rss_growth_mb, workdir=args.workdir,
                          on_run=progress)
        print_server_soak(res)
    else:
        res = null_soak(args.queries, args.modes.split(","), args.concurrency, args.max_ratio, timeout_s=1800)
        print("PASS" if res["passed"] else "FAIL")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=2)
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
