"""Client CPU per 1000 gRPC requests against Triton in steady state: loadgen's gRPC
clients (native, the default: HTTP/2 in the core; grpcio, on grpcio's public API) and
Triton's perf_analyzer when it is installed, in the same sitting.

Triton (tests/servers/triton.py, model add_one: Python backend, FP32 [1, 16]) is started
here with all its threads pinned to --server-cpu; each client runs as a child process
pinned to --client-cpu. A loadgen client runs ``loadgen run --sut grpc://...`` with
``--grpc-engine`` native or grpcio. Loads: closed loop at each --conc and
Poisson at each --rate (no in-flight cap unless --max-in-flight, as perf_analyzer has
none); perf_analyzer gets ``--concurrency-range C`` or ``--request-rate-range R
--request-distribution poisson --async`` (without --async its sending threads each wait
for a response, and the run is no open loop) with ``--measurement-interval 3000``.

How it counts: the client's CPU (user + system, all threads, from /proc/PID/stat) and
Triton's own inference count are read --settle-s into the run and again --window-s later;
CPU per 1000 requests is their ratio, so start-up, warm-up and shut-down are left out and
every client is counted the same way. Each figure is the median of --rounds runs, the
clients taking turns; the last column is loadgen's (native) CPU over perf_analyzer's.
loadgen's p99 issue delay and validity are shown beside it.

With --tls, Triton serves gRPC over TLS (``--grpc-use-ssl`` with a certificate of a CA made
here, tests/servers/certs.py), loadgen runs ``grpcs://`` with ``--ca-file`` and
perf_analyzer ``--ssl-grpc-use-ssl --ssl-grpc-root-certifications-file``: both verify the
server's certificate against that CA.

    python bench/bench_grpc.py                      # c1, c8, c32, Poisson 3410; 3 rounds
    python bench/bench_grpc.py --conc 1 --rate 0 --rounds 1 --tools loadgen,perf_analyzer
    python bench/bench_grpc.py --tls --conc 8,32 --rate 0 --tools loadgen,perf_analyzer   # grpcs://
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PERF_ANALYZER = os.path.join(ROOT, ".servers", "perf_analyzer", "perf_analyzer")
TICK = os.sysconf("SC_CLK_TCK")

def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def argv_for(tool: str, grpc_target: str, load: str, duration_s: float, cap: int = 0, ca_file: str = "") -> List[str]:
    """The client's command line; ``ca_file``: the target is TLS, verified against it."""
    closed, value = load.startswith("c"), load[1:]
    if tool == "perf_analyzer":
        shape = (["--concurrency-range", value] if closed else
                 ["--request-rate-range", value, "--request-distribution", "poisson", "--async"])
        tls = ["--ssl-grpc-use-ssl", "--ssl-grpc-root-certifications-file", ca_file] if ca_file else []
        return [PERF_ANALYZER, "-m", "add_one", "-u", grpc_target, "-i", "grpc", "--measurement-interval", "3000",
                *tls, *shape]
    sut = f"{'grpcs' if ca_file else 'grpc'}://{grpc_target}/add_one"
    shape_tls = ["--ca-file", ca_file] if ca_file else []
    engine = tool.partition("-")[2] or "native"
    shape = (["--scenario", "concurrency", "--concurrency", value] if closed else
             ["--scenario", "poisson", "--target-qps", value, *(["--max-in-flight", str(cap)] if cap else [])])
    return [sys.executable, "-m", "loadgen", "run", "--sut", sut, "--grpc-engine", engine, "--json", "--quiet",
            "--interval-s", "0", "--duration-s", str(duration_s), *shape_tls, *shape]


def measure(a: argparse.Namespace, srv: Any, tool: str, load: str) -> Dict[str, Any]:
    duration = a.settle_s + a.window_s + 2.0
    env = dict(os.environ, PYTHONPATH=ROOT)
    argv = argv_for(tool, srv.grpc_target, load, duration, a.max_in_flight, a.ca_file)
    proc = subprocess.Popen(["taskset", "-c", str(a.client_cpu), *argv],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        time.sleep(a.settle_s)
        c0, n0, t0 = cpu_s(proc.pid), srv.inference_count(), time.monotonic()
        time.sleep(a.window_s)
        c1, n1, t1 = cpu_s(proc.pid), srv.inference_count(), time.monotonic()
        if tool == "perf_analyzer":
            proc.terminate()  # it measures until stable; the window has what is needed
        out, err = proc.communicate(timeout=duration + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    n = n1 - n0
    rec: Dict[str, Any] = {"tool": tool, "load": load, "requests": n, "qps": n / (t1 - t0),
                           "cpu_ms_per_1k": 1e6 * (c1 - c0) / n if n else None}
    if tool != "perf_analyzer":
        try:
            d = json.loads(out)
        except ValueError:
            rec["error"] = err[-500:]
            return rec
        if "issue_delay_ns" in d:  # the CLI's result document
            d = {"issue_p99_ns": d["issue_delay_ns"]["p99"], "valid": d["valid"], "failed": d["counts"]["failed"],
                 "engine": d["network"]["grpc_engine"], "calls": d["network"].get("grpc_calls"),
                 "cap_waits": d["counts"].get("cap_waits"), "invalid_reasons": d.get("invalid_reasons") or []}
        rec.update(d)
    return rec


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conc", type=lambda s: [int(x) for x in s.split(",") if x], default=[1, 8, 32],
                    help="closed-loop concurrencies (default 1,8,32)")
    ap.add_argument("--rate", type=lambda s: [int(x) for x in s.split(",") if x and int(x) > 0], default=[3410],
                    help="Poisson rates, req/s (default 3410; 0: none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle-s", type=float, default=2.5)
    ap.add_argument("--window-s", type=float, default=4.0)
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--server-cpu", type=int, default=1)
    ap.add_argument("--max-in-flight", type=int, default=0,
                    help="loadgen's in-flight cap in the Poisson runs (default 0: none, as perf_analyzer has none)")
    ap.add_argument("--tools", default="", help="comma-separated subset of loadgen (native), loadgen-grpcio, perf_analyzer")
    ap.add_argument("--json-out", help="write every run's record here")
    ap.add_argument("--tls", action="store_true", help="gRPC over TLS: grpcs:// (a CA made here; both clients verify)")
    a = ap.parse_args(argv)
    a.ca_file = ""
    from tests.servers.triton import start_triton

    tools = ["loadgen", "loadgen-grpcio"] + (["perf_analyzer"] if os.path.exists(PERF_ANALYZER) else [])
    if a.tools:
        tools = [t for t in tools if t in a.tools.split(",")]
    loads = [f"c{c}" for c in a.conc] + [f"p{r}" for r in a.rate]
    runs: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        extra: List[str] = []
        if a.tls:
            from pathlib import Path

            from tests.servers.certs import make_certs

            certs = make_certs(Path(tmp) / "certs")
            a.ca_file = certs.ca
            extra = ["--grpc-use-ssl=true", f"--grpc-server-cert={certs.good[0]}", f"--grpc-server-key={certs.good[1]}",
                     f"--grpc-root-cert={certs.ca}"]
        print(f"   loadavg before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
              f"{'grpcs:// (TLS)' if a.tls else 'grpc://'}", flush=True)
        srv = start_triton(os.path.join(tmp, "triton"), timeout_s=180, extra_args=extra)
        try:
            pids = [str(srv.pid)] + subprocess.run(["pgrep", "-P", str(srv.pid)], capture_output=True,
                                                   text=True).stdout.split()
            for pid in pids:
                subprocess.run(["taskset", "-a", "-p", "-c", str(a.server_cpu), pid], capture_output=True)
            for load in loads:
                for rnd in range(a.rounds):
                    order = tools[rnd % len(tools):] + tools[:rnd % len(tools)]
                    for tool in order:
                        rec = measure(a, srv, tool, load)
                        runs.append(rec)
                        print(f"   {tool:16s} {load:6s} {rec['qps']:7.0f} req/s  "
                              f"{rec['cpu_ms_per_1k'] or float('nan'):6.0f} ms CPU / 1000"
                              + (f"  issue p99 {rec['issue_p99_ns'] / 1e3:.0f} us valid {rec['valid']}"
                                 f" calls {rec['calls']} cap waits {rec.get('cap_waits')}"
                                 + "".join(f"\n      invalid: {r}" for r in rec.get("invalid_reasons", []))
                                 if "issue_p99_ns" in rec else "") + (f"  {rec['error']}" if "error" in rec else ""),
                              flush=True)
        finally:
            srv.stop()
    ratio = "loadgen" in tools and "perf_analyzer" in tools
    print("\n| load | " + " | ".join(tools) + (" | loadgen / perf_analyzer CPU |" if ratio else " |")
          + "\n|---|" + "---:|" * (len(tools) + ratio))
    for load in loads:
        cells, cpu = [], {}
        for tool in tools:
            v = [r["cpu_ms_per_1k"] for r in runs if r["tool"] == tool and r["load"] == load and r["cpu_ms_per_1k"]]
            q = [r["qps"] for r in runs if r["tool"] == tool and r["load"] == load]
            cpu[tool] = statistics.median(v) if v else None
            cells.append(f"{cpu[tool]:.0f} ms ({statistics.median(q):.0f}/s)" if v else "-")
        if ratio:
            cells.append(f"{cpu['loadgen'] / cpu['perf_analyzer']:.2f}x" if cpu["loadgen"] and cpu["perf_analyzer"]
                         else "-")
        print(f"| {load} | " + " | ".join(cells) + " |")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
