"""Issue lateness on a busy machine: loadgen and perf_analyzer, idle and with competing CPU work.

loadgen is run in pods on shared nodes, where other work takes CPU from it. This measures
how late each tool sends its requests against its own schedule when the machine is idle
and when it is not, both tools sending the same constant-rate load to Triton's add_one
model (tests/servers/triton.py: Python backend, FP32 [1, 16]) over HTTP and gRPC.

States (--states):

  idle    nothing started here besides Triton and the client (other work on the machine
          is measured, not prevented: see "others" below).
  busy    one busy loop per core at normal priority, unpinned (``python3 -c 'while True:
          pass'``, as ../shared/tools/contend does), started before the client and ended
          by its PID after it.
  stress  ``stress-ng --cpu N`` (N: the core count), likewise; the state is skipped, with
          a note, when stress-ng is not installed.

The competing work runs under ``timeout`` (the run's limit), so it ends even if this
process dies; its CPU time (os.wait4's rusage) over its wall time is the "competing" figure,
in cores. Nothing is pinned, as in a pod on a shared node: the client, Triton and the
competing work share the cores as the scheduler sees fit. --pin takes bench_http.py's
triton layout instead (Triton's threads and this process on --server-cpu, each client on
--client-cpu, the competing work still unpinned); the scheduler then often leaves both busy
loops on one core (about 0.75 cores of competing work on 2 cores, against about 1.5
unpinned), so that the contention differs between the two tools' cores.

Each (protocol, rate, state) runs --rounds times, loadgen then perf_analyzer each round
(rounds outermost, so that a drift of the machine is spread over every cell). Between
runs Triton is let drain (its inference count stops moving).

  loadgen        ``loadgen run --scenario constant --target-qps R --duration-s D`` (HTTP:
                 the native client with bench_http.py's JSON body; gRPC: the native
                 client). Lateness: its result document's issue delay (issued - scheduled,
                 every query), p50, p99 and max. Achieved rate: queries issued over the
                 issuing time. Also kept: ``valid``, ``invalid_reasons``, and, when the
                 document has them, ``diagnosis.cause`` and ``warnings``.
  perf_analyzer  ``--request-rate-range R --request-distribution constant --async`` with
                 three measurement windows of D/3 s (bench/triton_peers.py) and
                 ``--profile-export-file``. Lateness from its own per-request send
                 timestamps (those inside the measurement windows): its schedule is the
                 grid t0 + i/R over the sends in time order, with t0 the offset that makes
                 the earliest send on time (min over i of ts_i - i/R); lateness_i = ts_i -
                 (t0 + i/R). Its true t0 can only be earlier, and matching the sorted sends
                 to the slots in order is the matching with the least lateness, so the
                 figure is a lower bound on its true lateness. Achieved rate: sends over
                 the span of their timestamps.

Both: the client's CPU time (os.wait4's rusage of its process tree, start-up included),
Triton's CPU share, and "others": the cores the rest of the machine used meanwhile
(/proc/stat less the client and Triton; it includes the competing work, and is rough on a
VM, whose tick accounting can lose time).

The table, per (protocol, rate, state): medians over the rounds of loadgen's issue-delay
p99 and perf_analyzer's send-lateness p99, as median [min-max] (n), their ratio (loadgen
/ perf_analyzer, of the medians; below 1 is better), the per-round ratios' spread, p50 and
max, achieved rates, loadgen valid k of n, client CPU and the competing work's cores. --json writes every run.

Usage:
    bash tests/servers/install_perf_analyzer.sh .servers/perf_analyzer
    python bench/bench_contention.py                 # HTTP and gRPC, 2000 and 5000/s, 3 states, 3 rounds
    python bench/bench_contention.py --rounds 1 --duration-s 5 --rates 2000 --protocols http --states idle,busy
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterable, Optional

from bench_engine import fmt_ns, fmt_qps, fmt_ratio, machine_context, med, ratio, spread
from bench_http import TRITON_BODY, Bench, parse_loadgen_result, pin_tree, process_tree
from triton_peers import INSTALL_HINT, find_perf_analyzer, parse_perf_analyzer, perf_analyzer_argv
from triton_peers import cores as _cores

STATES = ("idle", "busy", "stress")
PROTOCOLS = ("http", "grpc")
LEAD_S = 1.0  # competing work runs this long before the client starts


# ============================================================ pure parts

def percentile(sorted_values: list, q: float) -> Any:
    """The nearest-rank q-quantile (0 < q <= 1) of an ascending list: the smallest value
    with at least q of the values at or below it. None for an empty list."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def grid_lateness(send_ns: Iterable[int], rate_qps: float) -> dict[str, Any]:
    """How late sends were against a constant-rate grid t0 + i/rate whose t0 is unknown.

    The sends, in time order, are matched to the grid's slots in order, and t0 is the offset
    that puts the earliest of them on time (min over i of ts_i - i/rate), so that every
    lateness is >= 0 and the least is 0. A true schedule can only have started earlier,
    and the in-order matching is the one with the least lateness: a lower bound.

    Returns n, p50_ns, p99_ns, max_ns (nearest rank) and sent_qps (sends over the span
    of their times; None under two sends)."""
    ts = sorted(int(t) for t in send_ns)
    if not ts:
        return {"n": 0, "p50_ns": None, "p99_ns": None, "max_ns": None, "sent_qps": None}
    period_ns = 1e9 / rate_qps
    # From the first send, in integers first: ns since the epoch (perf_analyzer's clock) are
    # past a double's 53 bits, and would be rounded to 256 ns.
    rel = [t - ts[0] for t in ts]
    t0 = min(t - i * period_ns for i, t in enumerate(rel))
    late = sorted(t - (t0 + i * period_ns) for i, t in enumerate(rel))
    span_ns = rel[-1]
    return {"n": len(ts), "p50_ns": percentile(late, 0.50), "p99_ns": percentile(late, 0.99),
            "max_ns": late[-1], "sent_qps": (len(ts) - 1) * 1e9 / span_ns if span_ns > 0 else None}


def export_send_times(doc: dict[str, Any]) -> list[int]:
    """The send timestamps (ns) of a perf_analyzer profile export's requests, those inside
    the measurement windows of the run (from the first of its window_boundaries to the
    last) when it gives them. A run at one rate is one experiment; with several, the last
    (the run's load) is taken."""
    experiments = doc.get("experiments") or []
    if not experiments:
        raise ValueError("the profile export has no experiments")
    exp = experiments[-1]
    ts = [int(r["timestamp"]) for r in exp.get("requests") or []]
    bounds = exp.get("window_boundaries") or []
    if len(bounds) >= 2:
        ts = [t for t in ts if bounds[0] <= t <= bounds[-1]]
    return ts


def perf_analyzer_lateness(path: str, rate_qps: float) -> dict[str, Any]:
    """grid_lateness of the sends in perf_analyzer's export at path (as send_* keys)."""
    with open(path) as f:
        doc = json.load(f)
    g = grid_lateness(export_send_times(doc), rate_qps)
    return {"sends": g["n"], "late_p50_ns": g["p50_ns"], "late_p99_ns": g["p99_ns"],
            "late_max_ns": g["max_ns"], "achieved_qps": g["sent_qps"]}


def loadgen_fields(d: dict[str, Any]) -> dict[str, Any]:
    """What the table and the raw rows keep of a loadgen result document: bench_http's
    figures, the issue delay as lateness, the achieved send rate (issued over the issuing
    time), and the verdict with its reasons, diagnosis and warnings when present."""
    delay = d.get("issue_delay_ns") or {}
    issued = (d.get("counts") or {}).get("issued")
    dur = d.get("issue_duration_s")
    return {**parse_loadgen_result(d),
            "sends": issued, "late_p50_ns": delay.get("p50"), "late_p99_ns": delay.get("p99"),
            "late_max_ns": delay.get("max"),
            "achieved_qps": issued / dur if issued and dur else None,
            "diagnosis_cause": (d.get("diagnosis") or {}).get("cause"),
            "warnings": d.get("warnings") or []}


def cell_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (protocol, rate, state) of the runs, in their first-seen order: each
    tool's figures over the rounds, loadgen / perf_analyzer of the medians of the p99s,
    and the ratio in each round that has both."""
    keys: list[tuple] = []
    for r in runs:
        k = (r["proto"], r["rate"], r["state"])
        if k not in keys:
            keys.append(k)
    rows = []
    for proto, rate, state in keys:
        cell = [r for r in runs if (r["proto"], r["rate"], r["state"]) == (proto, rate, state)
                and r.get("ok") is not None]
        by = {t: [r for r in cell if r["tool"] == t] for t in ("loadgen", "perf_analyzer")}
        row: dict[str, Any] = {"proto": proto, "rate": rate, "state": state}
        for tool, rs in by.items():
            for key in ("late_p50_ns", "late_p99_ns", "late_max_ns", "achieved_qps", "cpu_s",
                        "others_cores", "competing_cores"):
                row[f"{tool}_{key}"] = [r.get(key) for r in rs]
        lg = by["loadgen"]
        row["loadgen_valid"] = sum(1 for r in lg if r.get("valid"))
        row["loadgen_runs"] = len(lg)
        row["ratio_p99"] = ratio(med(row["loadgen_late_p99_ns"]), med(row["perf_analyzer_late_p99_ns"]))
        pa_by_round = {r["round"]: r.get("late_p99_ns") for r in by["perf_analyzer"]}
        row["round_ratios"] = [ratio(r.get("late_p99_ns"), pa_by_round.get(r["round"])) for r in lg
                               if r["round"] in pa_by_round]
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as a Markdown table."""
    lines = ["| protocol | rate | state | loadgen issue delay p99 | perf_analyzer send lateness p99 "
             "(lower bound) | loadgen / perf_analyzer | per round | p50: loadgen, perf_analyzer "
             "| max: loadgen, perf_analyzer | sent/s: loadgen, perf_analyzer | loadgen valid "
             "| client CPU s: loadgen, perf_analyzer | competing work, cores: loadgen's runs, "
             "perf_analyzer's |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def both(key: str, f: Any) -> str:
        return f"{f(med(r[f'loadgen_{key}']))}, {f(med(r[f'perf_analyzer_{key}']))}"

    for r in rows:
        rr = [x for x in r["round_ratios"] if x is not None]
        per_round = "-" if not rr else (fmt_ratio(rr[0]) if len(rr) == 1
                                        else f"{fmt_ratio(min(rr))}-{fmt_ratio(max(rr))}")
        lines.append(
            f"| {r['proto']} | {r['rate']:g}/s | {r['state']} | {spread(r['loadgen_late_p99_ns'], fmt_ns)} "
            f"| {spread(r['perf_analyzer_late_p99_ns'], fmt_ns)} | **{fmt_ratio(r['ratio_p99'])}** "
            f"| {per_round} | {both('late_p50_ns', fmt_ns)} | {both('late_max_ns', fmt_ns)} "
            f"| {both('achieved_qps', fmt_qps)} | {r['loadgen_valid']} of {r['loadgen_runs']} "
            f"| {both('cpu_s', _s)} | {both('competing_cores', _cores)} |")
    return lines


def _s(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}"


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


# ============================================================ competing work

def competing_argvs(state: str, n: int, limit_s: float) -> list[list[str]]:
    """The processes of a state's competing work, each ending by itself after limit_s."""
    limit = ["timeout", f"{limit_s:.0f}"]
    if state == "busy":
        return [limit + [sys.executable, "-c", "while True: pass"] for _ in range(n)]
    if state == "stress":
        return [limit + ["stress-ng", "--cpu", str(n), "--quiet"]]
    return []


class Competition:
    """The competing work of a state, started on entry (LEAD_S before the client) and ended
    on exit: each process leads a session of its own, ended by its id (SIGTERM, then
    SIGKILL after 5 s). Then cores is the CPU time it got (its process trees, os.wait4)
    over its wall time; None without competing work."""

    def __init__(self, state: str, n: int, limit_s: float) -> None:
        self.argvs = competing_argvs(state, n, limit_s)
        self.procs: list[subprocess.Popen] = []
        self.cores: Optional[float] = None
        self._t0 = 0.0
        self._cpu_s = 0.0

    def __enter__(self) -> "Competition":
        self._t0 = time.perf_counter()
        for argv in self.argvs:
            self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL, start_new_session=True))
        if self.procs:
            time.sleep(LEAD_S)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in self.procs:
                if p.returncode is None:
                    try:
                        os.killpg(p.pid, sig)  # our own child's session
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + 5
            while any(p.returncode is None for p in self.procs) and time.monotonic() < deadline:
                time.sleep(0.05)
                self._reap(os.WNOHANG)
        self._reap(0)
        if self.procs:
            self.cores = self._cpu_s / (time.perf_counter() - self._t0)

    def _reap(self, flags: int) -> None:
        """Reaps the processes that ended (all, with flags 0), adding up their CPU."""
        for p in self.procs:
            if p.returncode is None:
                pid, status, ru = os.wait4(p.pid, flags)
                if pid:
                    p.returncode = os.waitstatus_to_exitcode(status)
                    self._cpu_s += ru.ru_utime + ru.ru_stime


def wait_drained(count: Any, timeout_s: float = 30.0) -> None:
    """Waits until count() (Triton's inference count) stays put for 0.5 s, at most timeout_s."""
    deadline = time.monotonic() + timeout_s
    last = count()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = count()
        if now == last:
            return
        last = now


# ============================================================ the sitting

def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--rates", default="2000,5000", help="constant arrival rates, req/s (default 2000,5000)")
    ap.add_argument("--protocols", default="http,grpc", help="http, grpc or both (default http,grpc)")
    ap.add_argument("--states", default=",".join(STATES), help="idle, busy, stress (default all three)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of loadgen then perf_analyzer per cell (default 3)")
    ap.add_argument("--duration-s", type=float, default=10.0, help="seconds each run sends for (default 10)")
    ap.add_argument("--perf-analyzer", metavar="PATH", default=None,
                    help="perf_analyzer to run (default .servers/perf_analyzer/perf_analyzer; "
                         "without it loadgen runs alone)")
    ap.add_argument("--pin", action="store_true",
                    help="pin each client to --client-cpu, Triton and this process to --server-cpu "
                         "(default: nothing pinned)")
    ap.add_argument("--client-cpu", type=int, default=0, help="with --pin: core of every client (default 0)")
    ap.add_argument("--server-cpu", type=int, default=1,
                    help="with --pin: core of Triton and of this process (default 1)")
    ap.add_argument("--json", metavar="FILE", help="also write every run and row here")
    a = ap.parse_args(argv)
    rates = [float(x) for x in _csv(a.rates)]
    protocols = _csv(a.protocols)
    states = _csv(a.states)
    bad = [p for p in protocols if p not in PROTOCOLS] + [s for s in states if s not in STATES]
    if bad or not rates or min(rates) <= 0 or a.rounds < 1 or a.duration_s <= 0:
        ap.error(f"bad --protocols/--states/--rates/--rounds/--duration-s ({bad or 'a value out of range'})")
    notes = []
    if "stress" in states and shutil.which("stress-ng") is None:
        states.remove("stress")
        notes.append("stress-ng is not installed: the stress state was skipped.")
    pa = find_perf_analyzer(a.perf_analyzer)
    if pa is None:
        notes.append(f"perf_analyzer is not installed ({INSTALL_HINT}): loadgen ran alone.")
    ncores = os.cpu_count() or 1
    # bench_http's Bench runs and measures each client; no run is redone for other work.
    a.retries, a.max_others = 0, float("inf")
    if a.pin:
        os.sched_setaffinity(0, {a.server_cpu})
    ctx = machine_context()
    t_start = time.perf_counter()
    print(f"bench_contention: {protocols} at {[f'{r:g}' for r in rates]}/s, states {states}, "
          f"{a.rounds} round(s) of {a.duration_s:g} s; "
          + (f"client cpu {a.client_cpu}, server cpu {a.server_cpu}" if a.pin else "nothing pinned")
          + f"; {ctx['cpu_model']}, {ctx['nproc']} cpus; git {ctx['git']}; "
          f"perf_analyzer {pa or '-'}; {ctx['date_utc']}", flush=True)
    for n in notes:
        print("   " + n)
    from tests.servers.triton import start_triton  # bench_http put the repository on sys.path

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_contention_") as tmp:
        bench = Bench(a, tmp)
        if not a.pin:
            bench.pin = []
        body = os.path.join(tmp, "add_one.jsonl")
        with open(body, "w") as f:
            f.write(TRITON_BODY + "\n")
        srv = start_triton(os.path.join(tmp, "triton"), timeout_s=180)
        try:
            if a.pin:
                threads = pin_tree(srv.pid, {a.server_cpu})
                print(f"   triton: pinned {threads} threads of {len(process_tree(srv.pid))} processes "
                      f"to cpu {a.server_cpu}", flush=True)
            suts = {"http": (f"{srv.http_url}/v2/models/add_one/infer", ["--payload", body]),
                    "grpc": (f"grpc://{srv.grpc_target}/add_one", [])}
            targets = {"http": srv.http_url.split("//", 1)[1], "grpc": srv.grpc_target}
            count = lambda: {"inferences": srv.inference_count()}  # noqa: E731
            for proto in protocols:  # warm-up, not recorded
                sut, extra = suts[proto]
                bench.measure("loadgen", bench.loadgen(sut, *extra, "--scenario", "constant", "--target-qps",
                                                       "1000", "--duration-s", "1"),
                              lambda text: loadgen_fields(json.loads(text)), case="warm-up", proto=proto)
            limit_s = a.duration_s + 120
            d = f"{a.duration_s:g}"
            for rnd in range(1, a.rounds + 1):
                for state in states:
                    for proto in protocols:
                        for rate in rates:
                            sut, extra = suts[proto]
                            tags = {"proto": proto, "rate": rate, "state": state, "round": rnd}
                            wait_drained(srv.inference_count)
                            with Competition(state, ncores, limit_s) as comp:
                                runs.append(bench.measure(
                                    "loadgen", bench.loadgen(sut, *extra, "--scenario", "constant",
                                                             "--target-qps", f"{rate:g}", "--duration-s", d),
                                    lambda text: loadgen_fields(json.loads(text)), srv.pid, count, **tags))
                            _show(runs[-1], comp.cores)
                            if not pa:
                                continue
                            export = os.path.join(tmp, "export.json")
                            pa_argv = perf_analyzer_argv(pa, proto, targets[proto], a.duration_s, rate=rate)
                            pa_argv[pa_argv.index("--request-distribution") + 1] = "constant"
                            pa_argv += ["--profile-export-file", export]
                            wait_drained(srv.inference_count)
                            try:
                                with Competition(state, ncores, limit_s) as comp:
                                    runs.append(bench.measure(
                                        "perf_analyzer", pa_argv,
                                        lambda text, path=export, r=rate: {**parse_perf_analyzer(text),
                                                                         **perf_analyzer_lateness(path, r)},
                                        srv.pid, count, **tags))
                            finally:
                                if os.path.exists(export):
                                    os.remove(export)  # some 1 KB per request
                            _show(runs[-1], comp.cores)
        finally:
            srv.stop()
    total_s = time.perf_counter() - t_start
    rows = cell_rows(runs)
    print(f"\n== issue lateness, medians of {a.rounds} round(s) as median [min-max] (n); "
          f"{total_s / 60:.1f} min in all\n")
    print("\n".join(table(rows)))
    builds = sorted({r["core_build"] for r in runs if r.get("core_build")})
    if len(builds) > 1:
        notes.append("loadgen's extension was rebuilt during the sitting (builds of "
                     + ", ".join(builds) + " UTC: each run's core_build in the JSON).")
    notes.append("perf_analyzer's lateness is a lower bound: its schedule's start is taken as "
                 "the offset that puts its earliest send on time.")
    print("\n" + "\n".join(notes))
    bench.print_errors()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "machine": ctx, "total_s": total_s, "notes": notes,
                       "errors": bench.errors, "rows": rows, "runs": runs}, f, indent=1, default=str)
        print(f"\nwrote {a.json}")
    return 0


def core_build() -> Optional[str]:
    """When loadgen's native extension was last written (UTC), to tell the build each run
    used when the extension is rebuilt during a sitting; None when it is not found."""
    spec = importlib.util.find_spec("loadgen")  # finds the package without importing it
    paths = glob.glob(os.path.join(next(iter(spec.submodule_search_locations)), "_core*.so")) if spec else []
    if not paths:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(os.stat(paths[0]).st_mtime))


def _show(r: dict[str, Any], competing_cores: Optional[float]) -> None:
    """Keeps the competing work's cores, the time and the extension's build in the run's
    record; prints a line of lateness figures under Bench.measure's line for the run."""
    r.update(competing_cores=competing_cores, ended_utc=time.strftime("%H:%M:%S", time.gmtime()),
             core_build=core_build())
    if r.get("ok") is None:
        return
    extra = f"; competing work {_cores(competing_cores)} cores" if competing_cores is not None else ""
    if r["tool"] == "loadgen":
        extra += f"; valid {r.get('valid')}" + (f" ({r['diagnosis_cause']})" if r.get("diagnosis_cause") else "")
    print(f"      lateness p50 {fmt_ns(r.get('late_p50_ns'))} p99 {fmt_ns(r.get('late_p99_ns'))} "
          f"max {fmt_ns(r.get('late_max_ns'))}; sent {fmt_qps(r.get('achieved_qps'))}/s{extra}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
