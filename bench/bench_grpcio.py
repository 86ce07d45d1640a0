"""Client CPU per 1000 gRPC calls of loadgen's clients on grpcio, against the scripted
KServe v2 gRPC server (tests/servers/grpc_scripted.py) in a process of its own: no
Triton needed, so it runs wherever the tests run.

Each tool is ``NAME=ENGINE`` or ``NAME=ENGINE@TREE``: ``--grpc-engine ENGINE`` of the
loadgen source tree TREE (default: this one; its ``loadgen/_core*.so`` must be there),
which lets a tree from before a change run beside this one. Each run is a child process
(``PYTHONPATH=TREE``) that opens the target (readiness, metadata, requests) and then runs
the engine; its CPU (user + system, all threads, ``os.times``) over the engine's run
divided by the calls it completed is the figure, so start-up and preparation are left
out. Loads: closed loop at each --conc and Poisson at each --rate; each figure is the
median of --rounds runs, the tools taking turns (interleaved rounds).

    python bench/bench_grpcio.py                                   # grpcio and native here
    python bench/bench_grpcio.py --tool grpcio=grpcio --tool before=callback@/tmp/lg-before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def serve() -> int:
    """Serves until stdin closes; prints the target first."""
    sys.path.insert(0, ROOT)
    from tests.servers.grpc_scripted import ScriptedGrpc

    with ScriptedGrpc(threads=16) as srv:
        print(srv.target, flush=True)
        sys.stdin.read()
    return 0


def client(target: str, engine: str, load: str, duration_s: float) -> int:
    """One run in this process (the tree on PYTHONPATH); prints its record as JSON."""
    from loadgen.engine import Engine, EngineSettings
    from loadgen.net import open_target, pool_size_for
    from loadgen.net.options import NetOptions

    closed, value = load.startswith("c"), int(load[1:])
    shape: Dict[str, Any] = dict(mode="closed", concurrency=value) if closed else dict(mode="poisson", target_qps=value)
    settings = EngineSettings(duration_s=duration_s, interval_s=0, grace_s=2.0, **shape)
    sut = open_target(f"grpc://{target}/m", NetOptions(grpc_engine=engine, ready_timeout_s=10.0),
                      pool_size=pool_size_for(settings), uncapped=not closed)
    t0 = os.times()
    res = Engine(settings, sut).run()
    t1 = os.times()
    cpu_s = (t1.user + t1.system) - (t0.user + t0.system)
    done = res.counts["completed"]
    print(json.dumps({"engine": sut.report().get("grpc_engine"), "completed": done, "failed": res.counts["failed"],
                      "qps": done / (t1.elapsed - t0.elapsed), "cpu_ms_per_1k": 1e6 * cpu_s / done if done else None,
                      "issue_p99_us": res.issue_delay.value_at_percentile(99) / 1e3}))
    return 0


def parse_tool(spec: str) -> Tuple[str, str, str]:
    name, _, rest = spec.partition("=")
    engine, _, tree = rest.partition("@")
    if not name or not engine:
        raise argparse.ArgumentTypeError(f"--tool wants NAME=ENGINE[@TREE], got {spec!r}")
    return name, engine, os.path.abspath(tree) if tree else ROOT


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", action="append", type=parse_tool, default=[],
                    help="NAME=ENGINE[@TREE], repeatable (default: grpcio=grpcio, native=native)")
    ap.add_argument("--conc", type=lambda s: [int(x) for x in s.split(",") if x], default=[1, 8],
                    help="closed-loop concurrencies (default 1,8)")
    ap.add_argument("--rate", type=lambda s: [int(x) for x in s.split(",") if x and int(x) > 0], default=[500],
                    help="Poisson rates, calls/s (default 500; 0: none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration-s", type=float, default=4.0)
    ap.add_argument("--json-out", help="write every run's record here")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--client", nargs=3, metavar=("TARGET", "ENGINE", "LOAD"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve:
        return serve()
    if a.client:
        return client(*a.client, a.duration_s)
    tools = a.tool or [parse_tool("grpcio=grpcio"), parse_tool("native=native")]
    loads = [f"c{c}" for c in a.conc] + [f"p{r}" for r in a.rate]
    runs: List[Dict[str, Any]] = []
    server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert server.stdout is not None
        target = server.stdout.readline().strip()
        for load in loads:
            for rnd in range(a.rounds):
                for name, engine, tree in tools[rnd % len(tools):] + tools[:rnd % len(tools)]:
                    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--client", target, engine, load,
                                        "--duration-s", str(a.duration_s)], capture_output=True, text=True,
                                       env=dict(os.environ, PYTHONPATH=tree), cwd=tree, timeout=a.duration_s + 120)
                    if p.returncode:
                        raise SystemExit(f"{name} {load}: exit {p.returncode}\n{p.stderr[-2000:]}")
                    rec = dict(json.loads(p.stdout.strip().splitlines()[-1]), tool=name, load=load, round=rnd)
                    runs.append(rec)
                    print(f"   {name:16s} {load:6s} {rec['qps']:7.0f} calls/s  {rec['cpu_ms_per_1k'] or float('nan'):6.0f}"
                          f" ms CPU / 1000  issue p99 {rec['issue_p99_us']:.0f} us  engine {rec['engine']}", flush=True)
    finally:
        if server.stdin:
            server.stdin.close()
        server.wait(30)
    names = [t[0] for t in tools]
    print("\n| load | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
    for load in loads:
        cells = []
        for name in names:
            v = [r["cpu_ms_per_1k"] for r in runs if r["tool"] == name and r["load"] == load and r["cpu_ms_per_1k"]]
            q = [r["qps"] for r in runs if r["tool"] == name and r["load"] == load]
            cells.append(f"{statistics.median(v):.0f} ms [{min(v):.0f}-{max(v):.0f}] ({statistics.median(q):.0f}/s)"
                         if v else "-")
        print(f"| {load} | " + " | ".join(cells) + " |")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
