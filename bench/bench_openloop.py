"""Open-loop accuracy of the HTTP clients: Poisson arrivals at a high rate against nginx.

nginx (bench_http's config: one worker on the server core, ``GET /small.json``) answers;
loadgen runs ``--scenario poisson --target-qps RATE`` for --duration-s on the client core,
once per client (``--http-engine native`` and ``asyncio``) in each round, the order
alternating. Figures, from each run's result JSON: the issue delay's p50, p99 and p99.9
(how late loadgen sent each request after its scheduled time: the generator's own
error), the realised rate (queries issued over the issuing time) against the target,
and the client CPU per 1000 requests (os.wait4, the process tree, start-up included).
Goal for the native client at 50k req/s: issue delay p99 under 50 us and the realised
rate within 1% of the target. Medians over the rounds.

Usage:
    python bench/bench_openloop.py                      # 50k req/s, 5 s runs, 3 rounds
    python bench/bench_openloop.py --rate 20000 --rounds 1 --duration-s 2
    python bench/bench_openloop.py --io-threads 1,2 --client-cpu 0,1   # also with 2 I/O threads (client on both cores)
    python bench/bench_openloop.py --spin-us 0,20    # also polling the last 20 us before each arrival
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List

from bench_engine import machine_context, med
from bench_http import Nginx, run_proc


def run_one(url: str, tpl: str, client: str, a: argparse.Namespace) -> Dict[str, Any]:
    engine, _, rest = client.partition("/io")
    io, _, spin = rest.partition("/spin")
    argv = ["taskset", "-c", a.client_cpu, sys.executable, "-m", "loadgen", "run", "--sut", url,
            "--request-template", tpl, "--scenario", "poisson", "--target-qps", str(a.rate),
            "--duration-s", str(a.duration_s), "--http-engine", engine, "--max-in-flight", str(a.max_in_flight),
            "--max-issue-delay-ms", "1000", "--interval-s", "0", "--json", "--quiet", "--no-html"]
    if io:
        argv += ["--io-threads", io]
    if spin:
        argv += ["--spin-us", spin]
    r = run_proc(argv, a.duration_s + 60)
    if r["rc"] not in (0, 1):
        return {"engine": client, "error": r["stderr"][-500:]}
    d = json.loads(r["stdout"])
    c, delay = d["counts"], d["issue_delay_ns"]
    issued_rate = c["issued"] / d["issue_duration_s"] if d["issue_duration_s"] else 0.0
    return {"engine": client, "issued": c["issued"], "completed": c["completed"], "failed": c["failed"],
            "delay_p50_us": delay["p50"] / 1e3, "delay_p99_us": delay["p99"] / 1e3,
            "delay_p999_us": delay["p99.9"] / 1e3, "rate": issued_rate,
            "rate_error": issued_rate / a.rate - 1.0, "cap_waits": c["cap_waits"],
            "cpu_ms_per_1k": 1e6 * r["cpu_s"] / max(c["completed"], 1), "valid": d["valid"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=50000)
    ap.add_argument("--duration-s", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-in-flight", type=int, default=256)
    ap.add_argument("--client-cpu", default="0", help="the client's CPUs, as taskset -c takes them (0 or 0,2)")
    ap.add_argument("--io-threads", default="1", help="the native client's --io-threads values to run, comma-separated "
                    "(each is one client: native/ioN; 1 is plain native)")
    ap.add_argument("--spin-us", default="0", help="loadgen's --spin-us values to run the native client with, "
                    "comma-separated (each is one client: native/ioN/spinS; within it of each arrival the issue "
                    "thread spins rather than sleeps, at least 20 us)")
    ap.add_argument("--server-cpu", type=int, default=1)
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    ctx = machine_context()
    clients = [f"native/io{n}" + (f"/spin{sp}" if sp != "0" else "") if n != "1" or sp != "0" else "native"
               for n in a.io_threads.split(",") for sp in a.spin_us.split(",")] + ["asyncio"]
    print(f"bench_openloop: poisson {a.rate}/s, {a.duration_s} s, {a.rounds} round(s); {ctx['cpu_model']}; "
          f"git {ctx['git']}; {ctx['date_utc']}", flush=True)
    runs: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_openloop_") as tmp:
        tpl = os.path.join(tmp, "small.json.tpl")
        with open(tpl, "w") as f:
            json.dump({"method": "GET", "path": "/small.json"}, f)
        os.makedirs(os.path.join(tmp, "nginx"))
        srv = Nginx(os.path.join(tmp, "nginx"), a.server_cpu)
        try:
            for rnd in range(a.rounds):  # the order alternates from round to round
                for engine in (clients if rnd % 2 == 0 else clients[::-1]):
                    r = run_one(srv.url, tpl, engine, a)
                    r["round"] = rnd + 1
                    runs.append(r)
                    print(f"   {engine:11s} round={rnd + 1} " + (r["error"] if "error" in r else
                          f"issued {r['issued']} rate {r['rate']:.0f}/s ({100 * r['rate_error']:+.2f}%), "
                          f"issue delay p50 {r['delay_p50_us']:.1f} us p99 {r['delay_p99_us']:.1f} us "
                          f"p99.9 {r['delay_p999_us']:.1f} us, {r['cpu_ms_per_1k']:.1f} ms CPU/1k"), flush=True)
                    time.sleep(0.5)
        finally:
            srv.stop()
    print(f"\n| client | issue delay p50 | p99 | p99.9 | realised rate (target {a.rate}/s) | client CPU per 1000 req |")
    print("|---|---:|---:|---:|---:|---:|")
    for engine in clients:
        rs = [r for r in runs if r["engine"] == engine and "error" not in r]
        if not rs:
            continue
        print(f"| {engine} | {med([r['delay_p50_us'] for r in rs]):.1f} us | {med([r['delay_p99_us'] for r in rs]):.1f} us"
              f" | {med([r['delay_p999_us'] for r in rs]):.1f} us | {med([r['rate'] for r in rs]):,.0f}/s "
              f"({100 * med([r['rate_error'] for r in rs]):+.2f}%) | {med([r['cpu_ms_per_1k'] for r in rs]):.1f} ms |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "machine": ctx, "runs": runs}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
