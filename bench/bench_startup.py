"""Start-up cost: the CPU of one loadgen process that does (almost) nothing, beside
perf_analyzer's one-request run against the same server.

Cases (``--cases`` takes these names, comma-separated):

  python     ``python -c pass``: the interpreter's own floor (site and .pth files included)
  version    ``python -m loadgen --version``
  help       ``python -m loadgen --help``
  null       a one-request run of the null SUT (no network):
             ``loadgen run --sut null --scenario concurrency --concurrency 1 --query-count 1``
  http       a one-request run against Triton's add_one over KServe v2 HTTP (native client)
  grpc       the same over KServe v2 gRPC
  pa-http    perf_analyzer's one-request run over HTTP (``--request-count 1``), the peer of http
  pa-grpc    the same over gRPC, the peer of grpc

The runs print the result JSON and nothing else (``--json --quiet --interval-s 0``, as
bench_http.py's start-up runs), and each must have completed its one request. Triton
(tests/servers/triton.py) serves the http, grpc and perf_analyzer cases; perf_analyzer
is installed by ``bash tests/servers/install_perf_analyzer.sh .servers/perf_analyzer``
(without it, or with --perf-analyzer PATH, its cases are left out).

How CPU is counted: every case is a child process; its CPU is ru_utime + ru_stime of the
rusage that os.wait4 returns when it is reaped (every thread, start-up and exit
included). loadgen runs as ``sys.executable -m loadgen``, not through a wrapper script.
Its bytecode is cached in a temporary folder (PYTHONPYCACHEPREFIX, with
PYTHONDONTWRITEBYTECODE dropped) and compiled before the first run, as in an installed
copy; --no-bytecode-cache measures a tree whose every start compiles every module.

Each round runs every case once, the order rotated each round; figures are medians
[min-max] of --rounds rounds, and loadgen / perf_analyzer is the ratio of the medians.
The goals checked: --version under 50 ms, a one-request run under 150 ms. With --other
PATH, the loadgen cases also run from another tree (an earlier commit's ``loadgen/``
with its extension built or copied in, first on PYTHONPATH) in the same rounds, as
CASE@other, for a before and after in one sitting.

Usage:
    python bench/bench_startup.py                          # all cases, 9 rounds (~2 min)
    python bench/bench_startup.py --cases python,version,help,null --rounds 21
    python bench/bench_startup.py --json /tmp/startup.json
    git archive OLD loadgen | tar -x -C /tmp/old && cp loadgen/_core*.so /tmp/old/loadgen/
    python bench/bench_startup.py --other /tmp/old          # OLD's figures beside this tree's
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

from bench_engine import fmt_ratio, machine_context, med, ratio, spread
from bench_http import TRITON_BODY, parse_loadgen, run_proc
from triton_peers import INSTALL_HINT, find_perf_analyzer, parse_perf_analyzer, perf_analyzer_startup_argv

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CASES = ("python", "version", "help", "null", "http", "grpc", "pa-http", "pa-grpc")
SERVER_CASES = {"http", "grpc", "pa-http", "pa-grpc"}
LOADGEN_CASES = {"version", "help", "null", "http", "grpc"}
PEERS = {"http": "pa-http", "grpc": "pa-grpc"}  # loadgen case -> perf_analyzer's
GOALS_MS = {"version": 50.0, "null": 150.0, "http": 150.0, "grpc": 150.0}
ONE_REQUEST = ["--scenario", "concurrency", "--concurrency", "1", "--query-count", "1",
               "--json", "--quiet", "--interval-s", "0"]


def loadgen_argv(*args: str) -> List[str]:
    return [sys.executable, "-m", "loadgen", *args]


def check_exit(text: str) -> Dict[str, Any]:
    """A case with no output to read: rc 0 is its success."""
    return {"ok": 1, "errors": 0}


def check_one_request(parse: Callable[[str], Dict[str, Any]]) -> Callable[[str], Dict[str, Any]]:
    """parse, and the run must have completed exactly one request without an error."""
    def check(text: str) -> Dict[str, Any]:
        r = parse(text)
        if r["ok"] != 1 or r["errors"]:
            raise ValueError(f"{r['ok']} request(s) completed, {r['errors']} error(s)")
        return r
    return check


def case_argv(name: str, server: Any, body: str, pa: Optional[str], other: Optional[str] = None) -> List[str]:
    if "@" in name:  # CASE@other: the case with the other tree first on the path
        return ["env", f"PYTHONPATH={other}"] + case_argv(name.split("@")[0], server, body, pa)
    if name == "python":
        return [sys.executable, "-c", "pass"]
    if name == "version":
        return loadgen_argv("--version")
    if name == "help":
        return loadgen_argv("--help")
    if name == "null":
        return loadgen_argv("run", "--sut", "null", *ONE_REQUEST)
    if name == "http":
        return loadgen_argv("run", "--sut", f"{server.http_url}/v2/models/add_one/infer", "--payload", body,
                            "--http-engine", "native", *ONE_REQUEST)
    if name == "grpc":
        return loadgen_argv("run", "--sut", f"grpc://{server.grpc_target}/add_one", *ONE_REQUEST)
    assert pa is not None
    proto = name.split("-", 1)[1]
    target = server.http_url.split("//", 1)[1] if proto == "http" else server.grpc_target
    return perf_analyzer_startup_argv(pa, proto, target)


def case_check(name: str) -> Callable[[str], Dict[str, Any]]:
    name = name.split("@")[0]
    if name in ("null", "http", "grpc"):
        return check_one_request(parse_loadgen)
    if name.startswith("pa-"):
        return check_one_request(parse_perf_analyzer)
    return check_exit


def measure(name: str, argv: List[str], tmp: str, timeout_s: float) -> Dict[str, Any]:
    r = run_proc(argv, timeout_s, cwd=tmp)
    rec: Dict[str, Any] = {"case": name, "rc": r["rc"], "cpu_s": r["cpu_s"], "user_s": r["user_s"],
                           "sys_s": r["sys_s"], "wall_s": r["wall_s"], "ok": False}
    if r["rc"] != 0 or r["timed_out"]:
        rec["error"] = f"rc {r['rc']}{' (timed out)' if r['timed_out'] else ''}: {r['stderr'][-300:]}"
        return rec
    try:
        case_check(name)(r["stdout"])
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        rec["error"] = f"{type(e).__name__}: {e}; stderr: {r['stderr'][-300:]}"
        return rec
    rec["ok"] = True
    return rec


def ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{x * 1000:.1f} ms"


def report(records: List[Dict[str, Any]], cases: List[str]) -> List[str]:
    """The table's lines: per case its median [min-max] CPU, user and sys, and the ratio
    to its perf_analyzer peer; then whether the goals are met."""
    cpu = {c: [r["cpu_s"] for r in records if r["case"] == c and r["ok"]] for c in cases}
    lines = ["| case | CPU (user+sys) | user | sys | wall | / perf_analyzer |", "|---|---:|---:|---:|---:|---:|"]
    for c in cases:
        ok = [r for r in records if r["case"] == c and r["ok"]]
        failed = sum(1 for r in records if r["case"] == c and not r["ok"])
        peer = PEERS.get(c.split("@")[0])
        vs = fmt_ratio(ratio(med(cpu[c]), med(cpu[peer]))) if peer in cpu else "-"
        lines.append(f"| {c}{f' ({failed} failed)' if failed else ''} | {spread(cpu[c], ms)} | "
                     f"{ms(med([r['user_s'] for r in ok]))} | {ms(med([r['sys_s'] for r in ok]))} | "
                     f"{ms(med([r['wall_s'] for r in ok]))} | {vs} |")
    lines.append("")
    for c, goal in GOALS_MS.items():
        m = med(cpu.get(c, []))
        if m is not None:
            lines.append(f"- {c}: {m * 1000:.1f} ms, goal under {goal:.0f} ms: {'met' if m * 1000 < goal else 'NOT met'}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)} (default: all)")
    ap.add_argument("--rounds", type=int, default=9, help="rounds of every case (default 9)")
    ap.add_argument("--perf-analyzer", metavar="PATH",
                    help=f"perf_analyzer to run (default .servers/perf_analyzer/perf_analyzer; {INSTALL_HINT})")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="do not cache loadgen's bytecode: every start compiles every module")
    ap.add_argument("--timeout-s", type=float, default=60.0, help="time limit of each run (default 60)")
    ap.add_argument("--json", metavar="PATH", help="write every run's figures here")
    ap.add_argument("--other", metavar="PATH",
                    help="also run the loadgen cases from this tree (holding loadgen/, built), as CASE@other")
    a = ap.parse_args()
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown or a.rounds < 1:
        ap.error(f"unknown case(s) {unknown}" if unknown else "--rounds must be at least 1")
    if a.other:
        a.other = os.path.abspath(a.other)
        if not os.path.isfile(os.path.join(a.other, "loadgen", "__init__.py")):
            ap.error(f"--other {a.other}: no loadgen/__init__.py there")
        cases += [f"{c}@other" for c in cases if c in LOADGEN_CASES]
    pa = find_perf_analyzer(a.perf_analyzer)
    if pa is None and any(c.startswith("pa-") for c in cases):
        print(f"perf_analyzer not found ({INSTALL_HINT}): its cases are left out")
        cases = [c for c in cases if not c.startswith("pa-")]

    if a.no_bytecode_cache:
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
        os.environ.pop("PYTHONPYCACHEPREFIX", None)
    pycache = None
    if not a.no_bytecode_cache:
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        pycache = tempfile.TemporaryDirectory(prefix="bench_startup_pycache_")
        os.environ["PYTHONPYCACHEPREFIX"] = pycache.name
        sys.pycache_prefix = pycache.name  # compileall writes where the children read
        compileall.compile_dir(os.path.join(REPO, "loadgen"), quiet=1)
    ctx = machine_context()
    print(f"bench_startup: {', '.join(cases)}; {a.rounds} round(s); bytecode "
          f"{'not cached' if a.no_bytecode_cache else 'cached'}; {ctx['cpu_model']}, {ctx['nproc']} cpus; "
          f"loadgen {ctx.get('loadgen')}, git {ctx.get('git')}; loadavg "
          f"{' '.join(f'{x:.2f}' for x in ctx['loadavg'])}; {ctx['date_utc']}", flush=True)

    records: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        body = os.path.join(tmp, "add_one.jsonl")
        with open(body, "w") as f:
            f.write(TRITON_BODY + "\n")
        server = None
        if SERVER_CASES & set(cases):
            sys.path.insert(0, REPO)  # for tests.servers
            from tests.servers.triton import start_triton

            t0 = time.perf_counter()
            server = start_triton(os.path.join(tmp, "triton"), timeout_s=180)
            print(f"   triton up in {time.perf_counter() - t0:.0f} s", flush=True)
        try:
            for name in cases:  # warm-up, not recorded: the server's first request, the page cache
                measure(name, case_argv(name, server, body, pa, a.other), tmp, a.timeout_s)
            for rnd in range(a.rounds):
                k = rnd % len(cases)
                for name in cases[k:] + cases[:k]:
                    rec = measure(name, case_argv(name, server, body, pa, a.other), tmp, a.timeout_s)
                    rec["round"] = rnd + 1
                    records.append(rec)
                    if not rec["ok"]:
                        print(f"   {name} failed: {rec['error']}", flush=True)
        finally:
            if server is not None:
                server.stop()
    lines = report(records, cases)
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"context": ctx, "cases": cases, "rounds": a.rounds, "records": records,
                       "table": lines}, f, indent=1)
    if pycache is not None:
        pycache.cleanup()
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
