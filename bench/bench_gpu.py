"""The GPU sampler (loadgen.telemetry.gpu): its cost, and a check on a real GPU.

Benchmark (default): what sampling costs.

  overhead     CPU seconds the sampler thread uses per second of sampling (its own
               thread CPU time, time.thread_time() inside the thread), with the scripted
               FakeBackend (8 GPUs by default) and, where a driver is present, with NVML.
  issue_delay  the engine at 100k QPS Poisson, NullSUT, spin_us=1000, issue thread
               pinned (as bench_engine.py's issue_delay case), with and without a
               sampler thread running beside it, in interleaved rounds (the order
               alternates). Prints the medians of the issue delay p50, p99 and p99.9 of
               each side and their ratio (on / off): the target is no measurable change.

Check (--check): for a machine with an NVIDIA GPU (scripts/gpu_check.sh installs what is
missing and calls this). A loadgen run (closed loop, one query in flight) with an
in-process Python SUT that multiplies 8192x8192 fp16 matrices on the GPU per query
(CuPy, else PyTorch), with the sampler driven around Engine.run() exactly as a run does:
start, mark("start"), run, mark("issue_end"), mark("end"), report. It checks:
utilization > 80% on the busiest GPU, energy > 0 and energy per query reported, power
within the board's limit, the sampler's CPU < 1% of a core, the energy counter against
mean power x time, the number of samples, and the per-interval series. One PASS or FAIL
line per check, then "GPU CHECK: PASS" or "GPU CHECK: FAIL"; the report is written to
--out as gpu_check.json. --fake runs the same check with the FakeBackend and numpy work
on the CPU (to test the check itself on a machine without a GPU).

Exit codes: 0 passed; 1 a check failed; 3 no NVIDIA GPU/driver; 4 setup failed.

Usage:
    python bench/bench_gpu.py                 # overhead + issue delay, ~1.5 min
    python bench/bench_gpu.py --quick         # ~20 s
    python bench/bench_gpu.py --check --duration-s 60 --out gpu-check
    python bench/bench_gpu.py --check --fake --duration-s 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
try:
    import loadgen  # the installed package (or PYTHONPATH's)
except ImportError:  # a source tree built in place (scripts/gpu_check.sh does that)
    sys.path.insert(0, REPO)
    import loadgen
from loadgen.telemetry import FakeBackend, FakeDevice, GpuSampler, NvmlBackend, parse_gpus  # noqa: E402
from loadgen.telemetry.gpu_backend import GpuBackend, GpuError  # noqa: E402

EXIT_PASS, EXIT_FAIL, EXIT_NO_GPU, EXIT_SETUP = 0, 1, 3, 4


def fake_devices(n: int, util: float = 95.0) -> List[FakeDevice]:
    """n scripted GPUs: utilization around ``util``, 450 W against a 700 W limit."""
    return [FakeDevice(f"GPU-fake{i:04d}-0000-0000-0000-000000000000", name="Fake H200",
                       utilization_pct=(util - 2, util, util + 2 if util <= 98 else util),
                       power_w=450.0, power_readings_w=(440.0, 450.0, 460.0), power_limit_w=700.0,
                       memory_used=(40 << 30, 41 << 30)) for i in range(n)]


# ================================================================= overhead

def measure_overhead(backend: GpuBackend, seconds: float, sample_ms: float) -> Dict[str, Any]:
    """Runs a sampler for ``seconds`` and returns its thread's CPU per wall second."""
    s = GpuSampler("all", sample_ms, backend=backend)
    s.start()
    if s.status == "unavailable":
        return {"skipped": s.report()["reason"]}
    s.mark("start")
    time.sleep(seconds)
    s.mark("end")
    r = s.report()
    ov = r["sampler"]
    ticks = max((d["samples"] for d in r["devices"]), default=0)
    return {"devices": len(r["devices"]), "ticks": ticks, "thread_cpu_s": ov["thread_cpu_s"],
            "wall_s": ov["wall_s"], "cpu_s_per_s": ov["thread_cpu_s"] / ov["wall_s"],
            "cpu_us_per_tick": 1e6 * ov["thread_cpu_s"] / max(ticks, 1)}


def issue_delay_round(with_sampler: bool, seed: int, duration_s: float, n_gpus: int,
                      sample_ms: float) -> Dict[str, Any]:
    """One engine run at 100k QPS (NullSUT), with or without a sampler beside it."""
    aff = sorted(os.sched_getaffinity(0))
    pin = [1] if 1 in aff else aff[-1:]
    settings = loadgen.EngineSettings(mode="poisson", target_qps=100000.0, duration_s=duration_s,
                                      spin_us=1000.0, pin_cpus=pin, schedule_seed=seed, interval_s=0)
    sampler = None
    if with_sampler:
        sampler = GpuSampler("all", sample_ms, backend=FakeBackend(fake_devices(n_gpus)), avoid_cpus=pin)
        sampler.start()
    try:
        r = loadgen.Engine(settings, loadgen.NullSUT()).run()
    finally:
        ticks = 0
        if sampler is not None:
            rep = sampler.report()
            ticks = max((d["samples"] for d in rep["devices"]), default=0)
    d = r.issue_delay
    return {"sampler": with_sampler, "p50": d.value_at_percentile(50), "p99": d.value_at_percentile(99),
            "p999": d.value_at_percentile(99.9), "max": d.max, "issued": r.counts["issued"],
            "sampler_ticks": ticks}


def bench_main(args: argparse.Namespace) -> int:
    seconds = 3.0 if args.quick else 10.0
    rounds = args.rounds or (2 if args.quick else 5)
    run_s = 1.0 if args.quick else 3.0
    out: Dict[str, Any] = {"machine": _machine()}
    print("bench_gpu: %s" % out["machine"], flush=True)
    for name, backend in (("fake", FakeBackend(fake_devices(args.gpus_fake))), ("nvml", NvmlBackend())):
        o = measure_overhead(backend, seconds, args.sample_ms)
        out["overhead_" + name] = o
        if "skipped" in o:
            print("overhead %-4s: skipped (%s)" % (name, o["skipped"]), flush=True)
        else:
            print("overhead %-4s: %d GPUs at %g ms, %d ticks in %.1f s: %.3f ms CPU per s (%.3f%% of a core), "
                  "%.0f us per tick" % (name, o["devices"], args.sample_ms, o["ticks"], o["wall_s"],
                                        1e3 * o["cpu_s_per_s"], 100 * o["cpu_s_per_s"], o["cpu_us_per_tick"]),
                  flush=True)
    runs: List[Dict[str, Any]] = []
    for i in range(rounds):
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            r = issue_delay_round(on, i, run_s, args.gpus_fake, args.sample_ms)
            runs.append(r)
            print("  round %d sampler %-3s: issue delay p50 %6d ns p99 %7d ns p99.9 %8d ns max %9d ns, "
                  "%d issued, %d sampler ticks" % (i + 1, "on" if on else "off", r["p50"], r["p99"], r["p999"],
                                                   r["max"], r["issued"], r["sampler_ticks"]), flush=True)
    summary = {}
    for key in ("p50", "p99", "p999"):
        off = statistics.median(r[key] for r in runs if not r["sampler"])
        on = statistics.median(r[key] for r in runs if r["sampler"])
        summary[key] = {"off_ns": off, "on_ns": on, "ratio_on_off": on / off if off else None}
        print("issue delay %-5s median of %d: off %8.0f ns, on %8.0f ns, on/off %.2f"
              % (key, rounds, off, on, on / off if off else float("nan")), flush=True)
    out["issue_delay"] = {"rounds": rounds, "run_s": run_s, "runs": runs, "medians": summary}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print("wrote %s" % args.json)
    return 0


def _machine() -> str:
    import platform
    return "%s, %d CPUs (affinity %d), Python %s, loadgen %s, load %.2f" % (
        platform.processor() or platform.machine(), os.cpu_count() or 0, len(os.sched_getaffinity(0)),
        platform.python_version(), loadgen.__version__, os.getloadavg()[0])


# ==================================================================== check

class MatmulSUT:
    """A batched SUT doing real work per query: ``reps`` matrix products, then a
    synchronisation, then the batch completes."""

    def __init__(self, matmul: Callable[[], None], sync: Callable[[], None], reps: int) -> None:
        self.matmul, self.sync, self.reps = matmul, sync, reps

    def issue(self, batch: Any) -> None:
        for _ in range(len(batch) * self.reps):
            self.matmul()
        self.sync()
        batch.complete()


def make_work(framework: str, n: int) -> Tuple[str, Callable[[], None], Callable[[], None]]:
    """(name, one matmul, synchronise) on the GPU with CuPy or PyTorch (``auto``: CuPy
    first), or on the CPU with numpy (``numpy``, for --fake)."""
    errors = []
    for fw in ([framework] if framework != "auto" else ["cupy", "torch"]):
        try:
            return _work(fw, n)
        except Exception as e:  # try the next framework, report all
            errors.append("%s: %s: %s" % (fw, type(e).__name__, " ".join(str(e).split())[:300]))
    raise RuntimeError("no GPU framework works: " + "; ".join(errors))


def _work(fw: str, n: int) -> Tuple[str, Callable[[], None], Callable[[], None]]:
    if fw == "cupy":
        import cupy as cp
        a, b = cp.ones((n, n), dtype=cp.float16), cp.ones((n, n), dtype=cp.float16)
        c = cp.empty((n, n), dtype=cp.float16)
        mm, sync = (lambda: cp.matmul(a, b, out=c)), cp.cuda.Stream.null.synchronize
    elif fw == "torch":
        import torch
        a = torch.ones((n, n), dtype=torch.float16, device="cuda")
        b, c = torch.ones_like(a), torch.empty_like(a)
        mm, sync = (lambda: torch.matmul(a, b, out=c)), torch.cuda.synchronize
    elif fw == "numpy":
        import numpy as np
        a = np.ones((n, n), dtype=np.float32)
        b, c = np.ones_like(a), np.empty_like(a)
        mm, sync = (lambda: np.matmul(a, b, out=c)), (lambda: None)
    else:
        raise ValueError("unknown framework %r" % fw)
    for _ in range(3):  # warm up: kernels chosen, memory allocated, before sampling starts
        mm()
    sync()
    return fw, mm, sync


def run_check(args: argparse.Namespace) -> Tuple[int, Dict[str, Any]]:
    """The check; returns (exit code, what it measured)."""
    backend: GpuBackend = (FakeBackend(fake_devices(1, args.fake_util)) if args.fake else NvmlBackend())
    if not args.fake:
        try:  # a probe before any install-heavy import: is there a GPU at all?
            backend.init()
            count = backend.device_count()
            backend.shutdown()
        except GpuError as e:
            print("SKIP: no NVIDIA GPU/driver: %s" % e)
            return EXIT_NO_GPU, {"reason": str(e)}
        if not count:
            print("SKIP: no NVIDIA GPU/driver: NVML sees no GPU")
            return EXIT_NO_GPU, {"reason": "NVML sees no GPU"}
    n = 64 if args.fake else args.n
    try:
        fw, mm, sync = make_work("numpy" if args.fake else args.framework, n)
    except Exception as e:  # any framework failure is a setup failure
        print("FAIL setup: %s" % e)
        return EXIT_SETUP, {"reason": str(e)}
    print("work: %s, %dx%d matrix products x %d per query; sampler every %g ms; run %g s"
          % (fw, n, n, args.reps, args.sample_ms, args.duration_s), flush=True)
    sampler = GpuSampler(parse_gpus(args.gpus, os.environ), args.sample_ms, backend=backend)
    sampler.start()
    if sampler.status == "unavailable":
        reason = sampler.report()["reason"]
        print("SKIP: no NVIDIA GPU/driver: %s" % reason)
        return EXIT_NO_GPU, {"reason": reason}
    settings = loadgen.EngineSettings(mode="closed", concurrency=1, duration_s=args.duration_s, interval_s=1.0)
    engine = loadgen.Engine(settings, MatmulSUT(mm, sync, args.reps))
    sampler.mark("start")
    try:
        engine.start()
        engine.wait(args.duration_s + 120)
        sampler.mark("issue_end")
        sampler.mark("end")
    finally:
        engine.close()
        result = engine.result()
        done = result.counts["completed"]
        report = sampler.report(completed_queries=done, completed_samples=done * result.samples_per_query,
                                measure_start_ns=engine.start_ns, interval_ns=1_000_000_000,
                                n_intervals=len(result.timeseries))
    measured = {"framework": fw, "counts": result.counts, "duration_s": result.duration_s,
                "completed_qps": result.completed_qps, "gpu": report}
    checks = evaluate(report, result.duration_s, len(result.timeseries), args.sample_ms)
    failed = [c for c in checks if not c[1]]
    for name, ok, detail in checks:
        print("%s %s: %s" % ("PASS" if ok else "FAIL", name, detail), flush=True)
    measured["checks"] = [{"check": n, "passed": ok, "detail": d} for n, ok, d in checks]
    print("GPU CHECK: %s (%d of %d checks passed; %d queries, %.1f QPS)" % (
        "PASS" if not failed else "FAIL", len(checks) - len(failed), len(checks), done, result.completed_qps))
    return (EXIT_FAIL if failed else EXIT_PASS), measured


def evaluate(report: Dict[str, Any], duration_s: float, n_intervals: int,
             sample_ms: float) -> List[Tuple[str, bool, str]]:
    """The check's verdicts on a ``gpu`` section: (name, passed, detail) each."""
    checks: List[Tuple[str, bool, str]] = []
    devices = report["devices"]
    checks.append(("sampler status", report["status"] == "ok",
                   ("%s %s" % (report["status"], report["reason"])).strip()))
    util = {d["uuid"]: d["utilization_pct"].get("mean") for d in devices}
    busiest = max(devices, key=lambda d: d["utilization_pct"].get("mean") or -1.0) if devices else None
    best = busiest["utilization_pct"].get("mean") if busiest else None
    checks.append(("utilization > 80%", best is not None and best > 80.0,
                   "mean utilization by GPU: %s" % ", ".join("%s %s" % (u[:12], _f(v, "%")) for u, v in util.items())))
    e, epq = report["energy_j_total"], report["energy_per_query_j"]
    checks.append(("energy > 0 and energy per query", bool(e and e > 0 and epq and epq > 0),
                   "energy %s J, %s J per query, %s queries per J"
                   % (_f(e), _f(epq, digits=4), _f(report["queries_per_joule"], digits=4))))
    power_ok, details = bool(devices), []
    for d in devices:
        p, limit = d["power_w"], d["power_limit_w"]
        ok = bool(p.get("n") and limit and 0 < p["mean"] <= limit and p["p99"] <= 1.10 * limit)
        power_ok &= ok
        details.append("%s mean %s W p99 %s W max %s W limit %s W (%s)" % (
            d["uuid"][:12], _f(p.get("mean")), _f(p.get("p99")), _f(p.get("max")), _f(limit), d["power_source"]))
    checks.append(("power within the board's limit", power_ok,
                   "; ".join(details) + " (mean <= limit, p99 <= 1.1 x limit)"))
    cpu = report["sampler"]["cpu_pct_of_core"]
    checks.append(("sampler CPU < 1% of a core", cpu is not None and cpu < 1.0,
                   "%s%% of a core (%s s CPU in %s s)" % (_f(cpu, digits=3), _f(report["sampler"]["thread_cpu_s"],
                                                                                   digits=3),
                                                         _f(report["sampler"]["wall_s"]))))
    gpus = {d.get("parent_uuid", d["uuid"]): d for d in devices}
    expected = sum(d["power_w"].get("mean") or 0.0 for d in gpus.values()) * duration_s
    ratio = e / expected if e and expected else None
    checks.append(("energy counter ~ mean power x time", ratio is not None and 0.75 <= ratio <= 1.33,
                   "%s J counted, %s J from mean power x %.1f s: ratio %s"
                   % (_f(e), _f(expected), duration_s, _f(ratio, digits=3))))
    ticks = min((d["samples"] for d in devices), default=0)
    want = duration_s * 1000.0 / sample_ms
    checks.append(("a sample every sample_ms", ticks >= 0.8 * want,
                   "%d samples per device, >= %.0f expected over the run" % (ticks, want)))
    intervals = report.get("intervals") or []
    full = intervals[:max(len(intervals) - 1, 1)]  # the last interval of a run is partial
    with_util = sum(1 for iv in full if any(v["utilization_pct"] is not None for v in iv.values()))
    checks.append(("per-interval series", len(intervals) == n_intervals and with_util >= 0.8 * len(full),
                   "%d intervals (time series has %d), %d of the %d full ones with utilization"
                   % (len(intervals), n_intervals, with_util, len(full))))
    return checks


def _f(v: Optional[float], unit: str = "", digits: int = 1) -> str:
    return "n/a" if v is None else ("%.*f%s" % (digits, v, unit))


def check_main(args: argparse.Namespace) -> int:
    os.makedirs(args.out, exist_ok=True)
    rc, measured = run_check(args)
    path = os.path.join(args.out, "gpu_check.json")
    with open(path, "w") as f:
        json.dump({"exit_code": rc, **measured}, f, indent=1, default=str)
    print("report: %s" % path)
    return rc


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="benchmark: shorter runs, 2 rounds")
    ap.add_argument("--rounds", type=int, default=0, help="benchmark: issue-delay rounds (default 5)")
    ap.add_argument("--gpus-fake", type=int, default=8, help="benchmark: fake GPUs to sample (default 8)")
    ap.add_argument("--sample-ms", type=float, default=100.0, help="sampling period (default 100)")
    ap.add_argument("--json", metavar="PATH", help="benchmark: also write the figures as JSON")
    ap.add_argument("--check", action="store_true", help="run the GPU check instead of the benchmark")
    ap.add_argument("--fake", action="store_true", help="check: FakeBackend and numpy work (no GPU needed)")
    ap.add_argument("--fake-util", type=float, default=95.0, help="check --fake: the fake GPU's utilization")
    ap.add_argument("--framework", choices=("auto", "cupy", "torch"), default="auto", help="check: GPU library")
    ap.add_argument("--gpus", default="all", help="check: --gpus selection (default all)")
    ap.add_argument("--duration-s", type=float, default=60.0, help="check: run length (default 60)")
    ap.add_argument("--n", type=int, default=8192, help="check: matrix size (default 8192)")
    ap.add_argument("--reps", type=int, default=4, help="check: matrix products per query (default 4)")
    ap.add_argument("--out", default=os.path.join(REPO, "gpu-check"), help="check: folder for gpu_check.json")
    args = ap.parse_args(argv)
    return check_main(args) if args.check else bench_main(args)


if __name__ == "__main__":
    sys.exit(main())
