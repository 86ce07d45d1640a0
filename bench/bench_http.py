"""Benchmark of loadgen's HTTP and gRPC client against wrk, hey (and h2load) and a real Triton.

What is measured (``--cases`` takes these names, comma-separated):

  nginx    nginx, started here from a generated config (``worker_processes 1``, pinned to
           the server core), answers ``GET /small.json`` with a fixed 41-byte JSON body.
           Each tool runs closed loop, as fast as it can, for --duration-s over the same
           number of keep-alive connections (--conns, default 8 and 64): ``wrk -t1 -cN``,
           ``hey -c N -cpus 1`` (N workers, each on one keep-alive connection),
           ``h2load --h1 -t1 -cN`` when installed, and loadgen's concurrency scenario with
           N queries in flight over N connections (generic JSON over HTTP: a request
           template). Why 8 and 64: at 8 an event loop finds few ready sockets per
           wake-up, so each tool's cost per request dominates; at 64 it finds many, the
           batching event loops are built for. One nginx worker serves both.
           Figures: requests/s (the tool's own count of successful responses over its own
           measured duration) and requests per client CPU-second. nginx's stub_status
           gives the connections each run opened (keep-alive held if that is about N: a
           tool may add one or two, a readiness probe or a test connect), and nginx's CPU
           is its busy share of its one core: near 100% means the server, not the client,
           set the rate. The client's user and sys CPU per request are printed as well.
  nginx-tls  the same over HTTPS: nginx with a certificate of a CA made here
           (tests/servers/certs.py; TLS 1.3, sessions resumable), loadgen (the native
           client over TLS, --ca-file) against wrk and ``h2load --h1`` (HTTP/1.1 over TLS;
           Debian's nghttp2-client), which speak TLS and do not verify, all on the same
           OpenSSL. Figures as above, and loadgen's client CPU per request over wrk's and
           over h2load's, with and without loadgen's start-up (goal: at most 1.1x wrk's).
  profile  loadgen alone at the largest --conns against that nginx: once plainly (its
           user/sys split) and once under ``py-spy record --nonblocking --format raw``
           (py-spy on the server core). It prints the 15 functions with the most own time
           (the innermost Python frame of each sample; py-spy charges time in C code and
           in system calls to the Python line that called it, so that line's source is
           shown too), and each thread's share of the samples.
  triton   Triton Inference Server (tests/servers/triton.py, model add_one: Python
           backend, FP32 [1,16]) with all its processes and threads pinned to the server
           core, against three clients on the client core, interleaved in every round:
           loadgen (HTTP and gRPC), wrk (HTTP: a POST from a Lua script, the same JSON
           body as loadgen's) and Triton's perf_analyzer (HTTP with JSON tensors, and
           gRPC; bench/triton_peers.py says how it is run). Closed loop at concurrency 1,
           8 and 32 (wrk: that many connections), and open loop, Poisson arrivals at
           --poisson-qps (3410/s; 0: 70% of loadgen's concurrency-8 rate per protocol):
           loadgen with no in-flight cap, as perf_analyzer has none (HTTP: 64 connections;
           the native gRPC client: up to 4096 calls), twice (with --spin-us 100, the
           issue thread busy-waiting up to 100 us before each arrival, and with --spin-us
           0), and ``perf_analyzer --request-rate-range R --request-distribution poisson
           --async``. Figures: req/s, p50 and p99 latency (each tool's own), client CPU in
           ms per 1000 requests that Triton served during the run, 'steady' (net of the
           tool's start-up, measured by a one-request run of loadgen and of perf_analyzer
           in every round), whether an open loop kept up (loadgen: its validity verdict,
           which includes its p99 issue delay, and no request waiting in the client for a
           free connection or call; perf_analyzer: its send rate and its own
           warning that requests were delayed), and on loadgen's rows the ratios loadgen /
           perf_analyzer of the same round(s): steady CPU, CPU with start-up, req/s.
           perf_analyzer is installed by ``bash tests/servers/install_perf_analyzer.sh
           .servers/perf_analyzer``; without it (or --perf-analyzer PATH) the table falls
           back to a reference figure, labelled as such: about 110 ms of client CPU per
           1000 requests, measured once on this kind of machine.

loadgen's modules' bytecode is cached in a temporary folder (PYTHONPYCACHEPREFIX, with
PYTHONDONTWRITEBYTECODE dropped), as in an installed copy: it is compiled there before
the first run.

How CPU is counted. Every client is a child process started as ``taskset -c CLIENT_CPU
TOOL ...`` (taskset execs the tool, so the child is the tool itself). Its CPU is
ru_utime + ru_stime of the rusage that os.wait4 returns when the child is reaped. On
Linux that covers all its threads and every child it waited for: the whole client
process tree, start-up included. loadgen is a Python process, so it has a fixed start-up
cost (interpreter, imports, connecting, the report). That cost is measured by a one-query
run (--query-count 1) against the same server in every round. The "steady" figures
subtract its median from each run's CPU. The server's CPU is utime + stime from
/proc/PID/stat of its processes, read before and after each run. "others" is the CPU
the rest of the machine used meanwhile, in cores: the busy time of /proc/stat less the
client's and the server's. It is about 0 on a quiet machine; a run during which it
exceeds --max-others (0.25) is run again, once by default (--retries).

Every figure is the median of --rounds rounds, printed as median [min-max] where there
are several. In a round every tool runs once, one after the other (interleaved, the order
rotated each round). This parent process pins itself to the server core, so that its own
work stays off the client core. Every subprocess has a time limit, and every server
started here is ended in a finally block.

Usage:
    bash tests/servers/install_perf_analyzer.sh .servers/perf_analyzer  # the triton case's peer
    python bench/bench_http.py --quick                       # smoke run, ~1 min
    python bench/bench_http.py --json /tmp/bench_http.json   # full run, ~10 min
    python bench/bench_http.py --cases nginx --conns 8,64,256 --rounds 5
    python bench/bench_http.py --cases nginx-tls --rounds 3  # HTTPS: loadgen against wrk and h2load
"""

from __future__ import annotations

import argparse
import collections
import glob
import importlib.util
import json
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from bench_engine import fmt_ns, fmt_qps, fmt_ratio, machine_context, med, ratio, spread
from triton_peers import (INSTALL_HINT, PERF_ANALYZER_MS_PER_1K, find_perf_analyzer,
                          parse_perf_analyzer, perf_analyzer_argv, perf_analyzer_startup_argv,
                          triton_rows, triton_table)
from triton_peers import cores as _cores, ms as _ms, pct as _pct

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo, for tests.servers
from tests.servers.procs import ServerProcess, free_port, http_get

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CASES = ("nginx", "nginx-tls", "profile", "triton")
AIOHTTP_CLIENT = os.path.join(HERE, "aiohttp_client.py")
SMALL_BODY = '{"ok":true,"model":"x","outputs":[1,2,3]}'
TRITON_BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                                      "data": [float(i) for i in range(16)]}]},
                         separators=(",", ":"))
POISSON_FRACTION = 0.7  # of loadgen's concurrency-8 rate, the open loop's with --poisson-qps 0
_UNIT_NS = {"us": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9}
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# ============================================================ processes and CPU

def run_proc(argv: list[str], timeout_s: float, cwd: str | None = None,
             probe_at: tuple[float, ...] = (), probe: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Runs argv to its end (SIGKILL to its process group after timeout_s); returns rc,
    stdout, stderr, wall_s and the CPU of its process tree from os.wait4's rusage. With
    probe, "probes" holds probe(pid) at each probe_at second after the start (while the
    process runs), as (seconds, value)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=out, stderr=err, cwd=cwd, start_new_session=True)
        timed_out = False
        due = list(probe_at) if probe else []
        probes: list[tuple[float, Any]] = []
        while True:
            if due and time.perf_counter() - t0 >= due[0]:
                due.pop(0)
                probes.append((time.perf_counter() - t0, probe(p.pid)))  # type: ignore[misc]
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout_s:
                timed_out = True
                os.killpg(p.pid, signal.SIGKILL)  # our own child's group (new session)
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.02)
        wall_s = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"rc": p.returncode, "timed_out": timed_out, "wall_s": wall_s, "probes": probes,
                "user_s": ru.ru_utime, "sys_s": ru.ru_stime, "cpu_s": ru.ru_utime + ru.ru_stime,
                "stdout": out.read().decode("utf-8", "replace"),
                "stderr": err.read().decode("utf-8", "replace")}


def _ppids() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    out[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants now."""
    ppids = _ppids()
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(c for c, pp in ppids.items() if pp == p)
    return tree


def tree_cpu_s(pid: int) -> float:
    """utime + stime of pid and its living descendants, in seconds."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / _CLK_TCK


def tree_threads(pid: int) -> Iterator[tuple[int, str]]:
    """(process, thread id) of every thread of pid and of its living descendants."""
    for p in process_tree(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            yield p, tid


def tree_runtime_s(pid: int) -> float:
    """CPU time of pid and its living descendants, every thread, from the scheduler's
    nanosecond count (/proc/PID/task/TID/schedstat); /proc/PID/stat counts in 10 ms ticks,
    too coarse for a few seconds' window."""
    total = 0
    for p, tid in tree_threads(pid):
        try:
            with open(f"/proc/{p}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def busy_cpu_s() -> float:
    """CPU-seconds the machine has been busy, all cores (/proc/stat: all but idle, iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _CLK_TCK


def pin_tree(pid: int, cpus: set) -> int:
    """Pins every thread of pid and of its descendants to cpus; returns the thread count."""
    n = 0
    for _, tid in tree_threads(pid):
        try:
            os.sched_setaffinity(int(tid), cpus)
            n += 1
        except OSError:
            pass
    return n


# ==================================================================== parsers

def parse_wrk(text: str) -> dict[str, Any]:
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b", text)
    if not m:
        raise ValueError("no 'N requests in' line")
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    lat = {p: float(v) * _UNIT_NS[u] for p, v, u in
           re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.MULTILINE)}
    bad = int(non2xx.group(1)) if non2xx else 0
    return {"ok": int(m.group(1)) - bad,
            "errors": bad + (sum(map(int, sock.groups())) if sock else 0),
            "duration_s": float(m.group(2)) * _UNIT_NS[m.group(3)] / 1e9,
            "p50_ns": lat.get("50"), "p99_ns": lat.get("99")}


def parse_hey(text: str) -> dict[str, Any]:
    total = re.search(r"Total:\s+([\d.]+) secs", text)
    if not total:
        raise ValueError("no 'Total: S secs' line")
    head, _, err_part = text.partition("Error distribution:")
    codes = re.findall(r"\[(\d{3})\]\s+(\d+) responses", head)
    return {"ok": sum(int(n) for c, n in codes if c.startswith("2")),
            "errors": (sum(int(n) for c, n in codes if not c.startswith("2"))
                       + sum(int(n) for n in re.findall(r"^\s*\[(\d+)\]", err_part, re.MULTILINE))),
            "duration_s": float(total.group(1))}


def parse_h2load(text: str) -> dict[str, Any]:
    fin = re.search(r"finished in ([\d.]+)s", text)
    m = re.search(r"(\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", text)
    if not (fin and m):
        raise ValueError("no 'finished in' / 'succeeded' lines")
    return {"ok": int(m.group(1)), "errors": sum(int(x) for x in m.groups()[1:]),
            "duration_s": float(fin.group(1))}


def parse_loadgen_result(d: dict[str, Any]) -> dict[str, Any]:
    c = d["counts"]
    return {"ok": c["completed"], "errors": c["failed"] + c["timed_out"],
            "duration_s": d["duration_s"], "p50_ns": d["latency_ns"].get("p50"),
            "p99_ns": d["latency_ns"].get("p99"), "valid": d.get("valid"),
            "invalid_reasons": d.get("invalid_reasons"),
            "target_qps": (d.get("throughput") or {}).get("target_qps"),
            "scheduled_qps": (d.get("throughput") or {}).get("scheduled_qps"),
            "issue_delay_p99_ns": (d.get("issue_delay_ns") or {}).get("p99"),
            "queued_in_client": ((d.get("network") or {}).get("native") or {}).get("queued_in_client"),
            "error_messages": (d.get("errors") or {}).get("messages", [])[:3]}


def parse_loadgen(text: str) -> dict[str, Any]:
    return parse_loadgen_result(json.loads(text))


# ====================================================================== servers

NGINX_CONF = """daemon off; master_process on; worker_processes 1;
pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off; keepalive_requests 1000000; keepalive_timeout 65;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  server {{
    listen 127.0.0.1:{port}{tls};
    location = /small.json {{ default_type application/json; return 200 '{body}'; }}
    location = /nginx_status {{ stub_status; }}
  }}{status}
}}
"""
# Over TLS: the certificate, resumable sessions; stub_status on a plain port of its own.
NGINX_TLS = """ ssl;
    ssl_certificate {cert}; ssl_certificate_key {key}; ssl_session_cache shared:tls:1m"""
NGINX_STATUS = """
  server {{ listen 127.0.0.1:{port}; location = /nginx_status {{ stub_status; }} }}"""


class Nginx:
    """nginx with one worker pinned to cpu, serving /small.json from a config in workdir;
    over HTTPS with ``tls`` (certificate and key files; the clients get ``client_args``,
    the CA to verify it with)."""

    def __init__(self, workdir: str, cpu: int, tls: tuple[str, str, str] | None = None) -> None:
        self.port = free_port()
        status_port = free_port() if tls else self.port
        conf = os.path.join(workdir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(d=workdir, port=self.port, body=SMALL_BODY,
                                      tls=NGINX_TLS.format(cert=tls[0], key=tls[1]) if tls else "",
                                      status=NGINX_STATUS.format(port=status_port) if tls else ""))
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/small.json"
        self.status_url = f"http://127.0.0.1:{status_port}/nginx_status"
        self.client_args = ["--ca-file", tls[2]] if tls else []
        self.proc = ServerProcess(["taskset", "-c", str(cpu), "nginx", "-p", workdir, "-c", conf,
                                   "-e", os.path.join(workdir, "error.log")],
                                  os.path.join(workdir, "nginx.out"), cwd=workdir)
        self.pid = self.proc.pid
        try:
            self.proc.wait_http_ok(self.status_url, 20)
        except BaseException:
            self.proc.stop()
            raise

    def status(self) -> dict[str, int]:
        """stub_status's accepted connections and requests so far, less this request's."""
        _, body = http_get(self.status_url, 5.0)
        m = re.search(rb"\n\s*(\d+) (\d+) (\d+)", body)
        return {"accepts": int(m.group(1)) - 1, "requests": int(m.group(3)) - 1} if m else {}

    def stop(self) -> None:
        self.proc.stop()


# ======================================================================== bench

class Bench:
    def __init__(self, args: argparse.Namespace, tmp: str) -> None:
        self.a = args
        self.tmp = tmp
        self.pin = ["taskset", "-c", str(args.client_cpu)]
        self.timeout_s = args.duration_s + 60
        self.results: dict[str, Any] = {}
        self.tables: dict[str, str] = {}
        self.errors: list[str] = []

    # ------------------------------------------------------------ one run
    def measure(self, tool: str, argv: list[str], parse: Callable[[str], dict[str, Any]],
                server_pid: int | None = None,
                server_count: Callable[[], dict[str, int]] | None = None,
                **tags: Any) -> dict[str, Any]:
        """Runs one pinned client; returns its figures ("ok" is None when its output could
        not be read). A run that shared the machine with more than --max-others cores of
        other work is run again, --retries times at most; the record keeps the ones
        discarded."""
        discarded = []
        for attempt in range(self.a.retries + 1):
            rec = self._measure_once(tool, argv, parse, server_pid, server_count, **tags)
            if rec["others_cores"] <= self.a.max_others or attempt == self.a.retries:
                break
            print(f"   (others used {rec['others_cores']:.2f} cores: run again)", flush=True)
            discarded.append(rec)
            time.sleep(3)
        return {**rec, "discarded": discarded} if discarded else rec

    def _measure_once(self, tool: str, argv: list[str], parse: Callable[[str], dict[str, Any]],
                      server_pid: int | None, server_count: Callable[[], dict[str, int]] | None,
                      **tags: Any) -> dict[str, Any]:
        cpu0 = tree_cpu_s(server_pid) if server_pid else 0.0
        cnt0 = server_count() if server_count else None
        busy0 = busy_cpu_s()
        # The run's middle, where every tool is past its start-up and before its end: the
        # client's CPU and the requests the server counted there ("in the run").
        # (Triton's case: the server counts "inferences".)
        window = (1.5, self.a.duration_s - 0.5) if cnt0 and "inferences" in cnt0 and self.a.duration_s >= 3 else ()
        r = run_proc(self.pin + argv, self.timeout_s, cwd=self.tmp, probe_at=window,
                     probe=lambda pid: (tree_runtime_s(pid), server_count()["inferences"]))  # type: ignore[misc]
        busy = busy_cpu_s() - busy0
        server_s = tree_cpu_s(server_pid) - cpu0 if server_pid else 0.0
        rec: dict[str, Any] = {"tool": tool, **tags, "rc": r["rc"], "wall_s": r["wall_s"],
                               "cpu_s": r["cpu_s"], "user_s": r["user_s"], "sys_s": r["sys_s"],
                               "others_cores": (busy - r["cpu_s"] - server_s) / r["wall_s"]}
        if server_pid:
            rec["server_cpu_share"] = server_s / r["wall_s"]
        if server_count:
            cnt1 = server_count()
            rec["server_counts"] = {k: cnt1.get(k, 0) - cnt0[k] for k in cnt0}
            if len(r["probes"]) == 2:
                (_, (c0, n0)), (_, (c1, n1)) = r["probes"]
                rec["window_cpu_ms_per_1k"] = 1e6 * (c1 - c0) / (n1 - n0) if n1 > n0 else None
        try:
            rec.update(parse(r["stdout"]))
        except Exception as e:  # any unreadable output fails this run only
            rec["ok"] = None
            tail = (r["stdout"][-300:] + r["stderr"][-500:]).strip()
            msg = f"{tool} {tags}: {type(e).__name__}: {e}; rc {r['rc']}"
            msg += " (timed out)" if r["timed_out"] else ""
            self.errors.append(f"{msg}; output tail: {tail}")
            print(f"   !! {msg}", flush=True)
            return rec
        ok = rec["ok"]
        rec["qps"] = ok / rec["duration_s"] if rec["duration_s"] else None
        rec["req_per_cpu_s"] = ok / r["cpu_s"] if r["cpu_s"] else None
        rec["cpu_ms_per_1k"] = 1e6 * r["cpu_s"] / ok if ok else None
        if rec.get("errors"):
            self.errors.append(f"{tool} {tags}: {rec['errors']} failed requests")
        print(f"   {tool:13s} {' '.join(f'{k}={v}' for k, v in tags.items()):22s} "
              f"{fmt_qps(rec['qps']):>7s} req/s  cpu {r['cpu_s']:.2f} s "
              f"(user {r['user_s']:.2f}, sys {r['sys_s']:.2f}) in {r['wall_s']:.1f} s"
              + (f"  server cpu {rec['server_cpu_share']:.0%}" if server_pid else "")
              + f"  others {rec['others_cores']:.2f} cores"
              + (f"  p50 {fmt_ns(rec.get('p50_ns'))} p99 {fmt_ns(rec.get('p99_ns'))}"
                 if rec.get("p50_ns") else ""), flush=True)
        return rec

    def guarded(self, name: str, case: Callable[..., None], *args: Any) -> None:
        """Runs one case; a case that fails is reported and the others still run."""
        try:
            case(*args)
        except Exception as e:
            msg = f"case {name} failed: {type(e).__name__}: {str(e)[-1500:]}"
            self.errors.append(msg)
            print("   !! " + msg, flush=True)

    def loadgen(self, sut: str, *extra: str) -> list[str]:
        # The native HTTP client over http:// and https:// (a later --http-engine in extra wins).
        native = ["--http-engine", "native"] if sut.startswith(("http://", "https://")) else []
        return [sys.executable, "-m", "loadgen", "run", "--sut", sut, "--json", "--quiet",
                "--interval-s", "0", *native, *extra]

    def print_errors(self) -> None:
        """The problems the sitting met (the first 20, each cut to 600 characters), if any."""
        if self.errors:
            print(f"\n{len(self.errors)} problem(s):")
            for e in self.errors[:20]:
                print(f"  - {e[:600]}")

    def header(self, what: str) -> dict[str, Any]:
        la = os.getloadavg()
        print(f"\n== {what}\n   loadavg before: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}", flush=True)
        return {"loadavg_before": la}

    # ------------------------------------------------------------ nginx
    def nginx_tools(self, srv: Nginx, tpl: str) -> dict[str, Callable[[int], tuple]]:
        d = self.a.duration_s
        tools: dict[str, Callable[[int], tuple]] = {
            "loadgen": lambda n: (self.loadgen(
                srv.url, "--request-template", tpl, "--scenario", "concurrency",
                "--concurrency", str(n), "--connections", str(n), "--duration-s", str(d), *srv.client_args),
                parse_loadgen),
            "loadgen-asyncio": lambda n: (self.loadgen(
                srv.url, "--request-template", tpl, "--scenario", "concurrency", "--http-engine", "asyncio",
                "--concurrency", str(n), "--connections", str(n), "--duration-s", str(d)),
                parse_loadgen),
            "wrk": lambda n: (["wrk", "-t1", f"-c{n}", f"-d{d}s", "--latency", srv.url], parse_wrk),
            "hey": lambda n: (["hey", "-z", f"{d}s", "-c", str(n), "-cpus", "1", srv.url], parse_hey),
            "h2load": lambda n: (["h2load", "--h1", "-t1", f"-c{n}", "-D", str(d), srv.url],
                                 parse_h2load),
            "aiohttp": lambda n: ([sys.executable, AIOHTTP_CLIENT, srv.url, str(n), str(d)], json.loads),
        }
        for name in list(tools):
            if name == "aiohttp" and importlib.util.find_spec("aiohttp") is None:
                print("   (aiohttp is not installed: skipped)")
                del tools[name]
            elif name not in ("loadgen", "loadgen-asyncio", "aiohttp") and shutil.which(name) is None:
                print(f"   ({name} is not installed: skipped)")
                del tools[name]
        return tools

    def startup_run(self, sut: str, *extra: str, **tags: Any) -> dict[str, Any]:
        """A one-query loadgen run: its CPU is loadgen's fixed cost per process."""
        return self.measure("loadgen", self.loadgen(sut, "--scenario", "concurrency",
                                                    "--concurrency", "1", "--query-count", "1",
                                                    *extra),
                            parse_loadgen, case="startup", **tags)

    def case_nginx(self, srv: Nginx, tpl: str, key: str = "nginx", only: tuple[str, ...] = ()) -> None:
        """The nginx case (``key`` names it in the tables), with the tools in ``only`` (all: empty)."""
        a = self.a
        res = self.header(f"{key}: closed loop at {a.conns} connections, {a.duration_s} s, "
                          f"{a.rounds} round(s); client on cpu {a.client_cpu}, nginx on cpu "
                          f"{a.server_cpu}")
        tools = {k: v for k, v in self.nginx_tools(srv, tpl).items() if not only or k in only}
        names = list(tools)
        runs: list[dict[str, Any]] = []
        startup: list[dict[str, Any]] = []
        for rnd in range(a.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for n in a.conns:
                for tool in order:
                    argv, parse = tools[tool](n)
                    runs.append(self.measure(tool, argv, parse, srv.pid, srv.status,
                                             conns=n, round=rnd + 1))
            startup.append(self.startup_run(srv.url, "--request-template", tpl, *srv.client_args, round=rnd + 1))
        fixed_s = med([s["cpu_s"] for s in startup if s.get("ok")])
        rows = []
        for n in a.conns:
            by = {t: [r for r in runs if r["tool"] == t and r["conns"] == n and r.get("ok")]
                  for t in names}
            lg = by["loadgen"]
            lg_qps = med([r["qps"] for r in lg])
            lg_rpc = med([r["req_per_cpu_s"] for r in lg])
            for t in names:
                rs = by[t]
                rows.append({
                    "conns": n, "tool": t, "qps": [r["qps"] for r in rs],
                    "req_per_cpu_s": [r["req_per_cpu_s"] for r in rs],
                    "client_cpu_share": med([r["cpu_s"] / r["wall_s"] for r in rs]),
                    "user_us_per_req": med([1e6 * r["user_s"] / r["ok"] for r in rs if r["ok"]]),
                    "sys_us_per_req": med([1e6 * r["sys_s"] / r["ok"] for r in rs if r["ok"]]),
                    "server_cpu_share": med([r["server_cpu_share"] for r in rs]),
                    "others_cores": med([r["others_cores"] for r in rs]),
                    "conns_opened": med([r["server_counts"].get("accepts") for r in rs]),
                    "loadgen_over_tool_qps": ratio(lg_qps, med([r["qps"] for r in rs])),
                    "loadgen_over_tool_req_per_cpu_s":
                        ratio(lg_rpc, med([r["req_per_cpu_s"] for r in rs])),
                })
            if fixed_s is not None and lg:
                next(r for r in rows if r["tool"] == "loadgen" and r["conns"] == n)[
                    "steady_req_per_cpu_s"] = med([r["ok"] / (r["cpu_s"] - fixed_s) for r in lg])
        lines = [("| conns | tool | req/s | req per client CPU-s | client user + sys per req "
                  "| client CPU/wall | nginx CPU | others | conns opened | loadgen / tool, req/s "
                  "| loadgen / tool, req per CPU-s |"),
                 "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(
                f"| {r['conns']} | {r['tool']} | {spread(r['qps'], fmt_qps)} | "
                f"{spread(r['req_per_cpu_s'], fmt_qps)} | {_us(r['user_us_per_req'])} + "
                f"{_us(r['sys_us_per_req'])} | {_pct(r['client_cpu_share'])} | "
                f"{_pct(r['server_cpu_share'])} | {_cores(r['others_cores'])} | "
                f"{_num(r['conns_opened'])} | "
                f"{'-' if r['tool'] == 'loadgen' else fmt_ratio(r['loadgen_over_tool_qps'])} | "
                f"{'-' if r['tool'] == 'loadgen' else fmt_ratio(r['loadgen_over_tool_req_per_cpu_s'])} |")
        notes = []
        if fixed_s is not None:
            notes.append(f"loadgen's start-up cost: {fixed_s * 1e3:.0f} ms of CPU per process "
                         f"(median of {len(startup)} one-query runs), included above; net of "
                         "it, loadgen does " + ", ".join(
                             f"{fmt_qps(r.get('steady_req_per_cpu_s'))} req/CPU-s at {r['conns']}"
                             for r in rows if r["tool"] == "loadgen") + ".")
        for peer in ("wrk", "h2load"):
            for n in a.conns if peer in names else ():
                lg = next(r for r in rows if r["tool"] == "loadgen" and r["conns"] == n)
                other = med(next(r for r in rows if r["tool"] == peer and r["conns"] == n)["req_per_cpu_s"])
                notes.append(f"loadgen / {peer}, client CPU per request at {n} connections: "
                             f"{fmt_ratio(ratio(other, med(lg['req_per_cpu_s'])))} with loadgen's start-up, "
                             f"{fmt_ratio(ratio(other, lg.get('steady_req_per_cpu_s')))} net of it.")
        self.tables[key] = "\n".join(lines + [""] + notes)
        res.update(runs=runs, startup_runs=startup, startup_cpu_s=fixed_s, rows=rows)
        self.results[key] = res

    # ------------------------------------------------------------ profile
    def case_profile(self, srv: Nginx, tpl: str) -> None:
        a = self.a
        n = max(a.conns)
        res = self.header(f"profile: loadgen at {n} connections, {a.duration_s} s, plain and "
                          f"under py-spy ({a.profile_rate} Hz, nonblocking, on cpu {a.server_cpu})")
        if shutil.which("py-spy") is None:
            print("   py-spy is not installed (pip install py-spy): skipped")
            res["skipped"] = "py-spy not installed"
            self.results["profile"] = res
            return
        args = ["--request-template", tpl, "--scenario", "concurrency", "--concurrency", str(n),
                "--connections", str(n), "--duration-s", str(a.duration_s)]
        plain = self.measure("loadgen", self.loadgen(srv.url, *args), parse_loadgen,
                             srv.pid, srv.status, conns=n, case="plain")
        raw = os.path.join(self.tmp, "pyspy.txt")
        outdir = os.path.join(self.tmp, "profiled")
        argv = (["taskset", "-c", str(a.server_cpu), "py-spy", "record", "--nonblocking",
                 "--threads", "--full-filenames", "-r", str(a.profile_rate), "--format", "raw",
                 "-o", raw, "--"] + self.pin
                + [sys.executable, "-m", "loadgen", "run", "--sut", srv.url, "--quiet",
                   "--interval-s", "0", "--output", outdir, *args])
        sources = _package_sources()  # the code the child loads, in case the tree is edited
        r = run_proc(argv, self.timeout_s + 30, cwd=self.tmp)
        if r["rc"] not in (0, 1) or not os.path.exists(raw):
            msg = f"py-spy run failed (rc {r['rc']}): {(r['stdout'] + r['stderr'])[-500:]}"
            self.errors.append(msg)
            print("   !! " + msg)
            res.update(plain=plain, error=msg)
            self.results["profile"] = res
            return
        with open(os.path.join(outdir, "result.json")) as f:
            profiled = parse_loadgen_result(json.load(f))
        prof = summarize_pyspy(raw, a.profile_rate, r["wall_s"], sources)
        lines = []
        if plain.get("ok"):
            lines.append(
                f"loadgen alone, {n} conns, {a.duration_s} s: {fmt_qps(plain['qps'])} req/s, "
                f"{plain['cpu_s'] / plain['wall_s']:.2f} CPU-s per wall-s, "
                f"{plain['sys_s'] / plain['cpu_s']:.0%} of its CPU in the kernel (sys), "
                f"{1e6 * plain['user_s'] / plain['ok']:.1f} us user + "
                f"{1e6 * plain['sys_s'] / plain['ok']:.1f} us sys per request; "
                f"nginx CPU {_pct(plain['server_cpu_share'])}")
        lines.append(f"under py-spy: {fmt_qps(profiled['ok'] / profiled['duration_s'])} req/s; "
                     f"{prof['samples']} samples; active share of each thread (samples / "
                     f"({a.profile_rate} Hz x {r['wall_s']:.1f} s)): "
                     + ", ".join(f"{t} {s:.0%}" for t, s in prof["thread_active_share"].items()))
        lines.append("own time, top 15 (C code and system calls are charged to the Python "
                     "line that called them):")
        lines.append("| share | function | hottest line | source |")
        lines.append("|---:|---|---|---|")
        for f in prof["top"]:
            lines.append(f"| {f['share']:.1%} | {f['function']} | {f['line']} | "
                         f"`{f['source']}` |")
        self.tables["profile"] = "\n".join(lines)
        res.update(plain=plain, profiled=profiled, pyspy=prof, pyspy_wall_s=r["wall_s"])
        self.results["profile"] = res

    # ------------------------------------------------------------ triton
    def case_triton(self) -> None:
        from tests.servers.triton import start_triton

        a = self.a
        pa = find_perf_analyzer(a.perf_analyzer)
        res = self.header(
            f"triton: add_one, HTTP and gRPC, concurrency {a.triton_conc}, Poisson at "
            + (f"{a.poisson_qps:g}/s" if a.poisson_qps else f"{POISSON_FRACTION:.0%} of concurrency-8")
            + f"; {a.duration_s} s, {a.rounds} round(s); perf_analyzer: "
            + (pa or f"not installed ({INSTALL_HINT}): compared with its reference figure"))
        body = os.path.join(self.tmp, "add_one.jsonl")
        lua = os.path.join(self.tmp, "add_one.lua")
        with open(body, "w") as f:
            f.write(TRITON_BODY + "\n")
        with open(lua, "w") as f:
            f.write(f"wrk.method = \"POST\"\nwrk.body = '{TRITON_BODY}'\n"
                    "wrk.headers[\"Content-Type\"] = \"application/json\"\n")
        t0 = time.perf_counter()
        srv = start_triton(os.path.join(self.tmp, "triton"), timeout_s=180)
        try:
            threads = pin_tree(srv.pid, {a.server_cpu})
            print(f"   triton up in {time.perf_counter() - t0:.0f} s; pinned {threads} threads "
                  f"of {len(process_tree(srv.pid))} processes to cpu {a.server_cpu}")
            http_sut = f"{srv.http_url}/v2/models/add_one/infer"
            grpc_sut = f"grpc://{srv.grpc_target}/add_one"
            http_infer = f"{srv.http_url}/v2/models/add_one/infer"
            protos = {"http": (http_sut, ["--payload", body]), "grpc": (grpc_sut, [])}
            targets = {"http": srv.http_url.split("//", 1)[1], "grpc": srv.grpc_target}

            def count() -> dict[str, int]:
                return {"inferences": srv.inference_count()}

            d = str(a.duration_s)
            for sut, extra in protos.values():  # warm-up, not recorded
                run_proc(self.pin + self.loadgen(sut, *extra, "--scenario", "concurrency",
                                                 "--concurrency", "8", "--duration-s", "1"),
                         self.timeout_s, cwd=self.tmp)
            runs: list[dict[str, Any]] = []
            startup: list[dict[str, Any]] = []

            def closed(tool: str, proto: str, c: int, rnd: int) -> None:
                if tool == "wrk":
                    argv, parse = (["wrk", "-t1", f"-c{c}", f"-d{d}s", "--latency", "-s", lua,
                                    http_infer], parse_wrk)
                elif tool == "perf_analyzer":
                    argv, parse = (perf_analyzer_argv(pa, proto, targets[proto], a.duration_s,
                                                      concurrency=c), parse_perf_analyzer)
                else:
                    sut, extra = protos[proto]
                    argv, parse = (self.loadgen(sut, *extra, "--scenario", "concurrency",
                                                "--concurrency", str(c), "--duration-s", d),
                                   parse_loadgen)
                runs.append(self.measure(tool, argv, parse, srv.pid, count, proto=proto,
                                         load=f"c{c}", round=rnd + 1))

            def open_loop(tool: str, spin: str, proto: str, rate: int, rnd: int) -> None:
                if tool == "perf_analyzer":
                    argv, parse = (perf_analyzer_argv(pa, proto, targets[proto], a.duration_s,
                                                      rate=rate), parse_perf_analyzer)
                else:
                    sut, extra = protos[proto]
                    argv, parse = (self.loadgen(sut, *extra, "--scenario", "poisson", "--target-qps",
                                                str(rate), "--spin-us", spin, "--duration-s", d),
                                   parse_loadgen)
                runs.append(self.measure(tool, argv, parse, srv.pid, count, proto=proto,
                                         load=_poisson_label(rate, spin, tool), mode="open",
                                         round=rnd + 1))

            combos = [("loadgen", "http"), ("wrk", "http"), ("loadgen", "grpc")]
            if shutil.which("wrk") is None:
                combos.remove(("wrk", "http"))
            if pa:
                combos += [("perf_analyzer", "http"), ("perf_analyzer", "grpc")]
            for rnd in range(a.rounds):
                k = rnd % len(combos)
                for c in a.triton_conc:
                    for tool, proto in combos[k:] + combos[:k]:
                        closed(tool, proto, c, rnd)
                for proto, (sut, extra) in protos.items():
                    startup.append(self.startup_run(sut, *extra, proto=proto, round=rnd + 1))
                    if pa:
                        startup.append(self.measure(
                            "perf_analyzer", perf_analyzer_startup_argv(pa, proto, targets[proto]),
                            parse_perf_analyzer, case="startup", proto=proto, round=rnd + 1))
            rates = {}
            for proto in protos:
                c8 = med([r["qps"] for r in runs if r["tool"] == "loadgen" and r.get("ok")
                          and r["proto"] == proto and r["load"] == "c8"])
                rates[proto] = (round(a.poisson_qps) if a.poisson_qps else
                                round(POISSON_FRACTION * c8) if c8 else None)
            print(f"   Poisson rates: {rates}")
            variants = [("loadgen", "100"), ("loadgen", "0")] + ([("perf_analyzer", "")] if pa else [])
            for rnd in range(a.rounds):
                k = rnd % len(variants)
                for proto in protos:
                    for tool, spin in (variants[k:] + variants[:k]) if rates[proto] else []:
                        open_loop(tool, spin, proto, rates[proto], rnd)
        finally:
            srv.stop()
        fixed = {(tool, p): med([s["cpu_s"] for s in startup if s.get("ok") and s["proto"] == p
                                 and s["tool"] == tool])
                 for tool in ("loadgen", "perf_analyzer") for p in protos}
        loads = {p: [f"c{c}" for c in a.triton_conc]
                 + [_poisson_label(rates[p], spin, tool) for tool, spin in variants] for p in protos}
        rows = triton_rows(runs, fixed, loads, measured=pa is not None)
        notes = ["client CPU per 1000 requests Triton served during the run (its statistics "
                 "API: what a tool sends outside its own count counts too); start-up cost per "
                 "process, taken off in 'steady' (wrk's, a few ms, is not): " + "; ".join(
                     f"{tool} {p} {_ms(v and v * 1e3)}" for (tool, p), v in fixed.items()
                     if v is not None) + "."]
        if pa:
            notes.append("perf_analyzer: closed loop in its default synchronous mode, open loop "
                         "with --async; 'kept up' counts the rounds without its 'not able to "
                         "keep up' warning (loadgen: rounds it judged valid).")
        invalid = [f"{r['proto']} {r['load']}" for r in rows
                   if r["tool"] == "loadgen" and False in r["valid"]]
        if invalid:
            notes.append("loadgen marked INVALID in some rounds (see the JSON for why): "
                         + ", ".join(invalid))
        self.tables["triton"] = "\n".join(triton_table(rows, pa is not None) + [""] + notes)
        res.update(runs=runs, startup_runs=startup, poisson_qps=rates, rows=rows,
                   triton_log=srv.log_path, perf_analyzer=pa,
                   startup_cpu_s={p: fixed[("loadgen", p)] for p in protos},
                   perf_analyzer_startup_cpu_s={p: fixed[("perf_analyzer", p)] for p in protos})
        self.results["triton"] = res


def _package_sources() -> dict[str, list[str]]:
    """The lines of every .py file of the loadgen package, by absolute path."""
    spec = importlib.util.find_spec("loadgen")
    root = next(iter(spec.submodule_search_locations)) if spec else None
    out = {}
    for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True) if root else []:
        with open(path, errors="replace") as f:
            out[os.path.abspath(path)] = f.read().splitlines()
    return out


def summarize_pyspy(path: str, rate: float, wall_s: float,
                    sources: dict[str, list[str]] | None = None,
                    top: int = 15) -> dict[str, Any]:
    """Own time per function from py-spy's raw output (one 'frame;frame;... count' line per
    distinct stack, outermost first, the first frame naming the thread with --threads).
    Source lines come from sources where it has the file, else from the file now."""
    own: collections.Counter = collections.Counter()  # (function, file) -> samples
    at_line: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    threads: collections.Counter = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not n.isdigit():
                continue
            frames = stack.split(";")
            total += int(n)
            threads[re.sub(r"^thread \(\w+\): ", "", frames[0])] += int(n)
            m = re.match(r"^(.*) \((.*):(\d+)\)$", frames[-1]) if len(frames) > 1 else None
            key = (m.group(1), _short(m.group(2))) if m else ("(no Python frame)", "")
            own[key] += int(n)
            if m:
                at_line[key][(m.group(2), int(m.group(3)))] += int(n)
    rows = []
    for key, n in own.most_common(top):
        src, where = "", ""
        if at_line[key]:
            (file, lineno), _ = at_line[key].most_common(1)[0]
            text = (sources or {}).get(file)
            src = (text[lineno - 1] if text and lineno <= len(text)
                   else linecache.getline(file, lineno)).strip().replace("|", "\\|")
            where = f"{_short(file)}:{lineno}"
        rows.append({"function": key[0], "file": key[1], "samples": n,
                     "share": n / total if total else 0.0, "line": where, "source": src})
    expected = rate * wall_s
    return {"samples": total, "top": rows, "threads": dict(threads),
            "thread_active_share": {t: c / expected for t, c in threads.most_common()}}


def _short(path: str) -> str:
    """A source path relative to the repository, site-packages or the standard library."""
    if path.startswith(REPO + os.sep):
        return os.path.relpath(path, REPO)
    for mark in ("site-packages/", "/lib/python3"):
        i = path.find(mark)
        if i >= 0:
            tail = path[i + len(mark):]
            return tail if mark == "site-packages/" else tail.split("/", 1)[-1]
    return path


def _poisson_label(rate: int | None, spin_us: str, tool: str = "loadgen") -> str:
    """loadgen's open-loop runs carry their --spin-us; perf_analyzer's have none."""
    return f"poisson {rate}/s" + (f", spin {spin_us} us" if tool == "loadgen" else "")


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} us"


def _csv_ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def run_nginx_tls(bench: Bench, tmp: str) -> None:
    """The nginx-tls case: nginx over HTTPS with a CA made here; loadgen against wrk."""
    from tests.servers.certs import make_certs

    certs = make_certs(Path(tmp) / "certs")
    tpl = os.path.join(tmp, "small-tls.json.tpl")
    with open(tpl, "w") as f:
        json.dump({"method": "GET", "path": "/small.json"}, f)
    os.makedirs(os.path.join(tmp, "nginx-tls"))
    srv = Nginx(os.path.join(tmp, "nginx-tls"), bench.a.server_cpu, tls=(*certs.good, certs.ca))
    try:
        bench.case_nginx(srv, tpl, key="nginx-tls", only=("loadgen", "wrk", "h2load"))
    finally:
        srv.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 2 s runs, 1 round (default 5 s, 3 rounds)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--duration-s", type=int, default=None, help="seconds per run")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (medians of these)")
    ap.add_argument("--conns", type=_csv_ints, default=[8, 64],
                    help="nginx: connections of every tool (default 8,64)")
    ap.add_argument("--triton-conc", type=_csv_ints, default=[1, 8, 32],
                    help="triton: closed-loop concurrencies (default 1,8,32; 8 sets the Poisson rate)")
    ap.add_argument("--poisson-qps", type=float, default=3410.0,
                    help="triton: open-loop Poisson rate of loadgen and perf_analyzer (default "
                         f"3410; 0: {POISSON_FRACTION * 100:.0f}%% of loadgen's concurrency-8 rate)")
    ap.add_argument("--perf-analyzer", metavar="PATH", default=None,
                    help="triton: perf_analyzer to run beside loadgen (default "
                         ".servers/perf_analyzer/perf_analyzer; when absent the table compares "
                         f"with a reference figure, {PERF_ANALYZER_MS_PER_1K:.0f} ms per 1000 requests)")
    ap.add_argument("--client-cpu", type=int, default=0, help="core of every client")
    ap.add_argument("--server-cpu", type=int, default=1, help="core of the servers (and of this process)")
    ap.add_argument("--max-others", type=float, default=0.25,
                    help="run again a run during which other work used more cores than this")
    ap.add_argument("--retries", type=int, default=1, help="at most this many times")
    ap.add_argument("--profile-rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--json", metavar="FILE", help="also write every figure here")
    args = ap.parse_args(argv)
    if args.duration_s is None:
        args.duration_s = 2 if args.quick else 5
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    if "triton" in cases and 8 not in args.triton_conc:
        args.triton_conc.append(8)

    os.sched_setaffinity(0, {args.server_cpu})
    t0 = time.perf_counter()
    # loadgen runs as an installed copy does: with its modules' bytecode cached (pip
    # compiles it at install). Without a cache every start compiles some 90 modules
    # (about 0.15 s of CPU), which is not the tool's cost.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    pycache = tempfile.TemporaryDirectory(prefix="bench_http_pycache_")
    os.environ.setdefault("PYTHONPYCACHEPREFIX", pycache.name)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(REPO, "loadgen")], check=False,
                   capture_output=True, timeout=300)
    ctx = machine_context()
    print(f"bench_http: {', '.join(cases)}; {args.duration_s} s runs, {args.rounds} round(s); "
          f"client cpu {args.client_cpu}, server cpu {args.server_cpu}; {ctx['cpu_model']}, "
          f"{ctx['nproc']} cpus; loadgen {ctx['loadgen']}, git {ctx['git']}; "
          f"loadavg {' '.join(f'{x:.2f}' for x in ctx['loadavg'])}; {ctx['date_utc']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_http_") as tmp:
        bench = Bench(args, tmp)
        if "nginx" in cases or "profile" in cases:
            tpl = os.path.join(tmp, "small.json.tpl")
            with open(tpl, "w") as f:
                json.dump({"method": "GET", "path": "/small.json"}, f)
            os.makedirs(os.path.join(tmp, "nginx"))
            srv = Nginx(os.path.join(tmp, "nginx"), args.server_cpu)
            try:
                if "nginx" in cases:
                    bench.guarded("nginx", bench.case_nginx, srv, tpl)
                if "profile" in cases:
                    bench.guarded("profile", bench.case_profile, srv, tpl)
            finally:
                srv.stop()
        if "nginx-tls" in cases:
            bench.guarded("nginx-tls", run_nginx_tls, bench, tmp)
        if "triton" in cases:
            bench.guarded("triton", bench.case_triton)
    total_s = time.perf_counter() - t0
    print(f"\n== summary ({total_s:.0f} s; medians of {args.rounds} round(s), "
          f"[min-max] where several)")
    for name, table in bench.tables.items():
        print(f"\n### {name}\n\n{table}")
    bench.print_errors()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": ctx, "total_s": total_s,
                       "cases": bench.results, "tables": bench.tables, "errors": bench.errors},
                      f, indent=1, default=str)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
