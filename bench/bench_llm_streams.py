"""How many concurrent LLM streams one client core sustains: loadgen against AIPerf and GuideLLM.

The server (--server) streams OpenAI chat completions with ``--ttft-ms 50 --itl-ms 10
--tokens 256``: each chat completion streams 256 tokens, the first 50 ms after the kernel
received the request, then one every 10 ms (100 tokens/s per stream). Its ``GET /stats``
holds, per stream, the receive time and the time right before each event's write, on
one monotonic clock (CLOCK_MONOTONIC, Python's time.monotonic_ns()): that record is the
truth (see ``bench_stream.py`` for the definitions; truth TTFT = first write - receive).
``native`` (the default where g++ builds it) is ``tests/servers/truth_server.cc``: C++,
one thread, epoll and a timer heap, built on first use into ``.servers/truth_server/``,
run at real-time priority --server-rt-priority where permitted (so that a wake-up for a
due write is not held back by other work on its core); its record also holds each
write's lateness. ``python`` is the scripted server (``tests/servers/scripted.py
--selector epoll``), which falls tens of ms to seconds behind at 1000 streams and more.

The ladder. For each level N of --levels (default 250,500,1000,2000,4000) every tool runs
closed loop with N streams in flight for --duration-s (default 10), against a fresh
server, the client pinned to --client-cpu (``taskset``), the server and this script on
--server-cpu. AIPerf and GuideLLM run as several processes: all of them share the one
client core. Per run:

  TTFT p99 error   the tool's reported TTFT p99 - the truth's, in ms;
  completed        the tool's completed requests, and the streams the server finished;
  client CPU       user + sys of the client's process tree (os.wait4), all of it, and
                   "steady": less the tool's fixed cost, measured once per tool by a
                   one-request run against the same kind of server;
  CPU/1k req       steady client CPU (ms) per 1000 requests the tool completed;
  tokens/s         tokens (and events) the server wrote over the run's span, first
                   receive to last write: what the client had to parse;
  server late      p99 and max of (write time - due time) over every event (the native
                   server's own record of it; the Python server's from its write
                   times), and the server's CPU share of its core: how far the server
                   kept its own script.

A tool *sustains* a level when the median over the rounds of its TTFT p99 error is
within 2 ms either way and no round reported a failed request. Its sustained streams are
the highest such level. A tool whose median error exceeds --give-up-ms (20 ms, ten times
the target) at a level is not run at higher levels: its error only grows with the load.

Noise. The machine may be shared: this script sets its niceness to --nice (-10), and
every server and client inherits it, so that other work on their cores does not hold
them back for whole scheduler slices (a few ms, the size of the target). Every tool gets
the same treatment. Niceness is not enough on a busy host: the client's threads still
wait on the run queue behind other users' work for ms at a time, and that wait lands in
the stamps of the tokens it delays (loadgen's result shows it as ``receive_wait_ns``,
from the kernel's receive stamps). --client-rt-priority P runs every tool at SCHED_RR
priority P instead (off by default), ahead of all normal work on the client core.

Tools (each as bench_stream.py runs it, with 256 output tokens and 64-word prompts):
  loadgen   ``loadgen run --scenario concurrency --concurrency N --max-tokens 256``;
            TTFT from each query's scheduled time (its predecessor's end), so its own
            issue delay counts in. Truth: every stream of the server's record.
            It runs the client ``auto`` picks: the native one, the streams read in the
            core. ``loadgen_asyncio`` (only when named in --tools): the same with
            ``--http-engine asyncio``, the streams read in Python.
  aiperf    AIPerf 0.13.0 (``.servers/aiperf``), ``--concurrency N --benchmark-duration
            D --warmup-request-count N``; the first N streams (its warm-up) are left out
            of the truth.
  guidellm  GuideLLM (``.servers/guidellm``, PyPI ``guidellm``), ``guidellm run
            --profile kind=concurrent,streams=N --constraint kind=max_duration,seconds=D
            --data kind=synthetic_text,prompt_tokens=64,output_tokens=256``, offline
            with the local word-level tokenizer (``--tokenizer kind=huggingface_auto,
            model=DIR``), ``validate_backend=false`` (it probes /health, which the
            server does not have) and ``http2=false``. Its JSON lists each request with
            its TTFT and the server's response id, which is ``chatcmpl-<receive ns>``:
            the truth is matched request by request (successful requests, its headline
            set).

Over HTTPS (``loadgen_tls``, ``aiperf_tls``, only when named in --tools; with their plain
twins in the same run, the TLS cost shows as the difference): the server serves TLS with a
certificate of a CA made here (tests/servers/certs.py); loadgen verifies it with
``--ca-file`` (its native client's TLS, in the core), AIPerf with ``SSL_CERT_FILE`` set to
that CA (its aiohttp client's default context reads it). The truth is the same server
record (its writes are the TLS writes). The native truth server speaks no TLS: the TLS
tools, and their plain twins when compared with them, run against the Python server
(``--server python``).

Server setup, the same for every tool at a level. Each event after the first carries
--tokens-per-chunk (16) tokens, the first one token (``--first-chunk-tokens 1``, so TTFT
stays 50 ms): 17 events per stream, ITL between events 160 ms (the Python server costs
about 15 us per event, so 2000 streams of one-token events, 200k events/s, were beyond
it; the setting stays so that figures compare across servers). The Python server runs
``--selector epoll`` (select() stops at 1024 descriptors; epoll's waits round to whole
milliseconds, which shows in "server late" but not in the truth, which is each write's
real time). The client still receives 256 tokens per stream and counts them from the
usage chunk.

Usage:
    python bench/bench_llm_streams.py --quick                      # one level (250), 5 s runs, ~2 min
    python bench/bench_llm_streams.py --json /tmp/streams.json     # the ladder, 3 rounds, ~6 min
    python bench/bench_llm_streams.py --tools loadgen --levels 500,1000,2000 --tokens-per-chunk 1
    python bench/bench_llm_streams.py --tools loadgen --levels 2000 --rounds 1 --profile 2000
    python bench/bench_llm_streams.py --tools loadgen,loadgen_asyncio --levels 1000,2000  # both HTTP clients
    python bench/bench_llm_streams.py --tools loadgen --levels 1000 --server python  # the Python truth server
    python bench/bench_llm_streams.py --tools loadgen,loadgen_tls,aiperf,aiperf_tls --levels 1000 --server python  # TLS and plain
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [HERE, REPO]  # bench/ modules, tests.servers
from bench_engine import child_env, machine_context, med  # noqa: E402
from bench_http import _package_sources, pin_tree, run_proc, summarize_pyspy, tree_cpu_s  # noqa: E402
from bench_stream import MAKE_TOKENIZER, TARGET_P99_TTFT_ERROR_MS, percentile  # noqa: E402
from bench_stream import Bench as StreamBench  # noqa: E402
from bench_stream import truth as stream_truth  # noqa: E402

from tests.servers.scripted_proc import start_scripted  # noqa: E402
from tests.servers.truth_server import TruthServerUnavailable, build_truth_server, start_truth_server  # noqa: E402

TOOLS = ("loadgen", "aiperf", "guidellm")
#: Run only when named in --tools: loadgen on its asyncio HTTP client (--http-engine asyncio);
#: loadgen and AIPerf over HTTPS (the server with a certificate of a CA made here).
EXTRA_TOOLS = ("loadgen_asyncio", "loadgen_tls", "aiperf_tls")
MS = 1_000_000


def server_figures(stats: dict[str, Any], ttft_ms: float, itl_ms: float, skip: int = 0) -> dict[str, Any]:
    """What the server did, from its record: streams begun and finished (the first `skip`
    by receive time, a warm-up, not counted), tokens and events written and their rate
    over the record's span, each event's lateness (write - due: the server's own
    ``write_late_ns`` where its record has it, else from the write times)."""
    streams = sorted(stats["streams"], key=lambda s: s["recv_ns"])
    counted = {id(s) for s in streams[skip:]}
    late: list[int] = []
    tokens = events = finished = 0
    first_recv, last_write = math.inf, -math.inf
    ttft, itl = round(ttft_ms * MS), round(itl_ms * MS)
    for s in streams:
        n, k, first, writes = s["tokens"], s["tokens_per_event"], s["first_event_tokens"], s["token_write_ns"]
        first_recv = min(first_recv, s["recv_ns"])
        if "write_late_ns" in s:
            late += s["write_late_ns"]
        else:
            for i, w in enumerate(writes):
                last = min(n, first + i * k)  # tokens sent once event i is written
                late.append(w - (s["recv_ns"] + ttft + (last - 1) * itl))
        if writes:
            tokens += min(n, first + (len(writes) - 1) * k)
            events += len(writes)
            last_write = max(last_write, writes[-1])
        finished += id(s) in counted and len(writes) == 1 + math.ceil(max(0, n - first) / k)
    span_s = (last_write - first_recv) / 1e9 if events else 0.0
    return {"streams": len(streams) - min(skip, len(streams)), "finished": finished, "tokens": tokens, "events": events,
            "span_s": span_s, "tokens_per_s": tokens / span_s if span_s > 0 else None,
            "events_per_s": events / span_s if span_s > 0 else None,
            "late_p50_ms": percentile(late, 50) / MS if late else None,
            "late_p99_ms": percentile(late, 99) / MS if late else None,
            "late_max_ms": max(late) / MS if late else None}


def matched_truth(stats: dict[str, Any], ttft_ms_by_id: dict[str, float]) -> dict[str, Any]:
    """Reported and true TTFT percentiles over the same requests, matched by the server's
    response id (``chatcmpl-<recv_ns>``); requests the server has no record of are counted."""
    by_id = {f"chatcmpl-{s['recv_ns']}": s for s in stats["streams"] if s["token_write_ns"]}
    rep, tru = [], []
    for rid, ms in ttft_ms_by_id.items():
        s = by_id.get(rid)
        if s is not None:
            rep.append(ms)
            tru.append((s["token_write_ns"][0] - s["recv_ns"]) / MS)
    out: dict[str, Any] = {"streams": len(tru), "unmatched": len(ttft_ms_by_id) - len(tru)}
    for p in (50, 99):
        out[f"reported_p{p}"] = percentile(rep, p) if rep else None
        out[f"ttft_p{p}"] = percentile(tru, p) if tru else None
    return out


class Ladder(StreamBench):
    """The tools' command lines and parsers (loadgen's and AIPerf's from bench_stream.py),
    and the runs of the ladder."""

    def __init__(self, args: argparse.Namespace, tmp: str) -> None:
        super().__init__(args, tmp)
        self.guidellm_bin = os.path.join(args.guidellm_venv, "bin", "guidellm")
        self.pin = ["taskset", "-c", str(args.client_cpu)]
        if args.client_rt_priority:  # every tool, and each of its processes, at this SCHED_RR priority
            self.pin = ["chrt", "-r", str(args.client_rt_priority), *self.pin]
        self.fixed_cpu_s: dict[str, float | None] = {}
        self.rows: list[dict[str, Any]] = []
        self._certs: Any = None  # made when a TLS tool first runs

    def certs(self) -> Any:
        """The CA and the server's certificate of the TLS tools (tests/servers/certs.py)."""
        if self._certs is None:
            from pathlib import Path

            from tests.servers.certs import make_certs

            self._certs = make_certs(Path(self.tmp) / "certs")
            # This script's own GET /stats of a TLS server verifies it against the CA too.
            os.environ["SSL_CERT_FILE"] = self._certs.ca
        return self._certs

    def prepare_tokenizer(self, python: str) -> str:
        r = run_proc([python, "-c", MAKE_TOKENIZER, self.tokenizer], 180, cwd=self.tmp)
        if r["rc"] != 0:
            raise RuntimeError("could not write the tokenizer: " + r["stderr"][-800:])
        return r["stdout"].strip()

    # -- command lines: (argv, parse(result) -> reported figures)
    def tool_loadgen(self, url: str, d: str, startup: bool) -> tuple[list[str], Callable]:
        argv, parse = self.loadgen(url, d)
        # This tree's loadgen when it is built in place; else the installed one (a
        # non-editable install leaves the tree without its extension).
        built_here = bool(glob.glob(os.path.join(REPO, "loadgen", "_core*.so")))
        argv = [*(["env", f"PYTHONPATH={REPO}"] if built_here else []), *argv, "--max-tokens", str(self.args.tokens)]
        if startup:
            argv += ["--query-count", "1"]
        def parse_run(r: dict[str, Any], stats: dict[str, Any] | None) -> dict[str, Any]:
            res = parse(r)
            res["invalid_reasons"] = json.loads(r["stdout"]).get("invalid_reasons") or []
            return res
        return argv, parse_run

    def tool_loadgen_asyncio(self, url: str, d: str, startup: bool) -> tuple[list[str], Callable]:
        argv, parse = self.tool_loadgen(url, d, startup)
        return argv + ["--http-engine", "asyncio"], parse

    def tool_loadgen_tls(self, url: str, d: str, startup: bool) -> tuple[list[str], Callable]:
        argv, parse = self.tool_loadgen(url, d, startup)
        return argv + ["--ca-file", self.certs().ca], parse

    def tool_aiperf_tls(self, url: str, d: str, startup: bool) -> tuple[list[str], Callable]:
        argv, parse = self.tool_aiperf(url, d, startup)
        return ["env", f"SSL_CERT_FILE={self.certs().ca}", *argv], parse

    def tool_aiperf(self, url: str, d: str, startup: bool) -> tuple[list[str], Callable]:
        argv, parse = self.aiperf(url, d)
        if startup:  # one request instead of a duration (and its grace period), no warm-up
            i = argv.index("--benchmark-duration")
            argv[i:i + 2] = ["--request-count", "1"]
            i = argv.index("--benchmark-grace-period")
            del argv[i:i + 2]
            argv[argv.index("--concurrency") + 1] = "1"
            if "--warmup-request-count" in argv:
                i = argv.index("--warmup-request-count")
                del argv[i:i + 2]
        return argv, lambda r, stats: parse(r)

    def tool_guidellm(self, url: str, d: str, startup: bool) -> tuple[list[str], Callable]:
        a = self.args
        out = os.path.join(d, "guidellm.json")
        stop = "kind=max_requests,count=1" if startup else f"kind=max_duration,seconds={a.duration_s}"
        argv = [self.guidellm_bin, "run",
                "--backend", f"kind=openai_http,target={url},model=m,request_format=/v1/chat/completions,"
                             "validate_backend=false,http2=false",
                "--profile", f"kind=concurrent,streams={1 if startup else a.concurrency}",
                "--constraint", stop,
                "--data", f"kind=synthetic_text,prompt_tokens=64,output_tokens={a.tokens}",
                "--tokenizer", f"kind=huggingface_auto,model={self.tokenizer}",
                "--output", f"kind=json,path={out}", "--disable-console"]

        def parse(r: dict[str, Any], stats: dict[str, Any] | None) -> dict[str, Any]:
            with open(out) as f:
                bench = json.load(f)["benchmarks"][0]
            reqs = bench["requests"]
            ok = reqs.get("successful") or []
            ttft = {q["response_id"]: q["time_to_first_token_ms"] for q in ok
                    if q.get("response_id") and q.get("time_to_first_token_ms") is not None}
            totals = bench["metrics"]["request_totals"]
            res = {"completed": int(totals["successful"]), "failed": int(totals["errored"]),
                   "incomplete": int(totals["incomplete"]), "listed": len(ok),
                   "tokens": sum(int(q.get("output_tokens") or 0) for q in ok)}
            if stats is not None:
                res["matched"] = matched_truth(stats, ttft)
                res["ttft_p50"], res["ttft_p99"] = res["matched"]["reported_p50"], res["matched"]["reported_p99"]
            return res
        return argv, parse

    # -- runs
    def start_server(self, d: str, tls: bool = False) -> Any:
        """A fresh server of --server's kind on the server core, with the ladder's script
        (with ``tls``: the Python server with the CA's certificate; the native one has no TLS)."""
        a = self.args
        script = ("--ttft-ms", a.ttft_ms, "--itl-ms", a.itl_ms, "--tokens", a.tokens, "--tokens-per-chunk",
                  a.tokens_per_chunk, "--first-chunk-tokens", 1, "--max-runtime-s", a.duration_s + 600)
        if a.server == "native" and not tls:
            srv = start_truth_server(d, *script, "--cpu", a.server_cpu, "--realtime-priority", a.server_rt_priority)
        else:
            pem = ("--tls-cert", self.certs().good[0], "--tls-key", self.certs().good[1]) if tls else ()
            srv = start_scripted(d, *script, "--selector", "epoll", *pem)
        pin_tree(srv.pid, {a.server_cpu})
        return srv

    def profile(self, level: int, rate: int = 250) -> dict[str, Any]:
        """loadgen at `level` streams under ``py-spy record --nonblocking`` (py-spy on the
        server core): each thread's active share and the functions with the most own time."""
        a = self.args
        a.concurrency = level
        d = tempfile.mkdtemp(prefix=f"profile{level}_", dir=self.tmp)
        raw = os.path.join(d, "pyspy.txt")
        srv = self.start_server(d)
        try:
            argv, parse = self.tool_loadgen(srv.url, d, False)
            out = os.path.join(d, "out")  # py-spy keeps the child's stdout: the result from its file
            r = run_proc(["py-spy", "record", "--nonblocking", "--threads", "--full-filenames", "-r", str(rate),
                          "--format", "raw", "-o", raw, "--"] + self.pin + argv + ["--output", out],
                         a.duration_s + a.run_slack_s, cwd=d)
        finally:
            srv.stop()
        result = os.path.join(out, "result.json")
        if r["rc"] not in (0, 1) or not os.path.exists(raw) or not os.path.exists(result):
            print(f"\nprofile: py-spy run failed (rc {r['rc']}): {(r['stdout'] + r['stderr'])[-500:]}")
            return {"error": f"py-spy run failed (rc {r['rc']}): {(r['stdout'] + r['stderr'])[-500:]}"}
        prof = summarize_pyspy(raw, rate, r["wall_s"], _package_sources())
        with open(result) as f:
            rep = parse({**r, "stdout": f.read()}, None)
        print(f"\nprofile: loadgen at {level} streams under py-spy ({rate} Hz, non-blocking): TTFT p99 "
              f"{rep['ttft_p99']:.2f} ms, issue delay p99 {rep['issue_delay_p99']:.2f} ms; {prof['samples']} samples; "
              "active share of each thread: " + ", ".join(f"{t} {x:.0%}" for t, x in prof["thread_active_share"].items()))
        for f in prof["top"]:
            print(f"  {f['share']:6.1%}  {f['function']}  {f['line']}  {f['source']}")
        return {"level": level, "reported": rep, "pyspy": prof}

    def measure_fixed(self, tool: str) -> None:
        """The tool's fixed CPU cost (start-up, imports, the report): one request."""
        d = tempfile.mkdtemp(prefix=f"{tool}_startup_", dir=self.tmp)
        srv = self.start_server(d, tool.endswith("_tls"))
        try:
            argv, _ = getattr(self, "tool_" + tool)(srv.url, d, True)
            r = run_proc(self.pin + argv, 180, cwd=d)
        finally:
            srv.stop()
        ok = r["rc"] == 0 and not r["timed_out"]
        self.fixed_cpu_s[tool] = r["cpu_s"] if ok else None
        print(f"  {tool}: fixed cost {r['cpu_s']:.2f} CPU-s over {r['wall_s']:.1f} s (one request"
              + ("" if ok else f"; FAILED rc {r['rc']}: {(r['stderr'] or r['stdout'])[-300:]}") + ")", flush=True)

    def run_level(self, tool: str, level: int, rnd: int) -> dict[str, Any]:
        a = self.args
        a.concurrency = level
        a.aiperf_warmup = level
        d = tempfile.mkdtemp(prefix=f"{tool}{level}_{rnd}_", dir=self.tmp)
        row: dict[str, Any] = {"tool": tool, "level": level, "round": rnd, "loadavg_1m_before": os.getloadavg()[0]}
        srv = None
        try:
            srv = self.start_server(d, tool.endswith("_tls"))
            argv, parse = getattr(self, "tool_" + tool)(srv.url, d, False)
            row["argv"] = argv
            server_cpu0 = tree_cpu_s(srv.pid)
            r = run_proc(self.pin + argv, a.duration_s + a.run_slack_s, cwd=d)
            row["server_cpu_share"] = (tree_cpu_s(srv.pid) - server_cpu0) / r["wall_s"]
            row.update(rc=r["rc"], wall_s=r["wall_s"], timed_out=r["timed_out"], cpu_s=r["cpu_s"],
                       user_s=r["user_s"], sys_s=r["sys_s"])
            # loadgen exits 1 for a run it judged invalid (its JSON says why): still measured
            if (r["rc"] != 0 and not (tool.startswith("loadgen") and r["rc"] == 1)) or r["timed_out"]:
                raise RuntimeError(f"{tool} exited {r['rc']}{' (timed out)' if r['timed_out'] else ''}: "
                                   f"{(r['stderr'] or r['stdout'])[-600:]}")
            stats = srv.stats(timeout_s=60)
            row["reported"] = parse(r, stats)
            aiperf = tool.startswith("aiperf")
            row["server"] = server_figures(stats, a.ttft_ms, a.itl_ms, level if aiperf else 0)
            if tool == "guidellm":
                row["truth"] = row["reported"]["matched"]
            else:
                # Each tool's warm-up is left out of the truth: AIPerf's first N requests,
                # loadgen's ramp (the streams it counted apart).
                skip = level if aiperf else row["reported"].get("warmup_issued", 0)
                row["truth"] = stream_truth(stats, skip)
        except Exception as e:  # one failed run must not lose the others
            row["error"] = f"{type(e).__name__}: {e}"
        finally:
            if srv is not None:
                srv.stop()
        self.judge(row)
        self.rows.append(row)
        return row

    def judge(self, row: dict[str, Any]) -> None:
        """Adds the derived figures and the verdict to a run's row; prints it."""
        if "error" in row or row["reported"].get("ttft_p99") is None or row["truth"].get("ttft_p99") is None:
            row["sustained"] = False
            print(f"  {row['tool']:8s} {row['level']:5d}: FAILED {row.get('error', 'no TTFT figure')[:600]}", flush=True)
            return
        rep, tru, srv = row["reported"], row["truth"], row["server"]
        row["ttft_p99_error_ms"] = rep["ttft_p99"] - tru["ttft_p99"]
        row["ttft_p50_error_ms"] = rep["ttft_p50"] - tru["ttft_p50"]
        fixed = self.fixed_cpu_s.get(row["tool"])
        # None when the run cost less than the one-request run (start-up varies by some 0.1 s)
        row["steady_cpu_s"] = None if fixed is None or row["cpu_s"] <= fixed else row["cpu_s"] - fixed
        done = rep["completed"]
        row["cpu_ms_per_1k"] = (1e6 * row["steady_cpu_s"] / done if done and row["steady_cpu_s"] is not None
                                else None)
        row["sustained"] = abs(row["ttft_p99_error_ms"]) <= TARGET_P99_TTFT_ERROR_MS and not rep.get("failed")
        print(f"  {row['tool']:8s} {row['level']:5d}: TTFT p99 {rep['ttft_p99']:.2f} truth {tru['ttft_p99']:.2f} "
              f"error {row['ttft_p99_error_ms']:+.2f} ms (p50 {row['ttft_p50_error_ms']:+.2f}); completed {done} "
              f"(server finished {srv['finished']}), failed {rep.get('failed', 0)}; client CPU {row['cpu_s']:.1f} s"
              f" ({_num(row['cpu_ms_per_1k'], '.0f')} ms/1k req steady); {_num(srv['tokens_per_s'], ',.0f')} "
              f"tokens/s, server late p99 {_num(srv['late_p99_ms'], '.2f')} max {_num(srv['late_max_ms'], '.2f')} ms, "
              f"server CPU "
              f"{row['server_cpu_share']:.0%}; {'ok' if row['sustained'] else 'MISSED'} "
              f"(loadavg {row['loadavg_1m_before']:.2f}, {row['wall_s']:.0f} s)", flush=True)


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def level_sustained(runs: list[dict[str, Any]]) -> bool:
    """A tool sustains a level when every round ran and reported no failed request, and
    the median of the rounds' TTFT p99 errors is within the target."""
    if not runs or any("ttft_p99_error_ms" not in r or r["reported"].get("failed") for r in runs):
        return False
    return abs(med([r["ttft_p99_error_ms"] for r in runs]) or 0.0) <= TARGET_P99_TTFT_ERROR_MS


def summarize(rows: list[dict[str, Any]], tools: list[str], levels: list[int]) -> dict[str, Any]:
    """Medians over rounds per (tool, level), each tool's sustained level and the ratios."""
    cells: dict[str, dict[int, dict[str, Any]]] = {t: {} for t in tools}
    keys = ("ttft_p99_error_ms", "ttft_p50_error_ms", "cpu_s", "steady_cpu_s", "cpu_ms_per_1k", "server_cpu_share")
    for t in tools:
        for n in levels:
            rs = [r for r in rows if r["tool"] == t and r["level"] == n]
            if not rs:
                continue
            ok = [r for r in rs if "ttft_p99_error_ms" in r]
            c: dict[str, Any] = {"runs": len(rs), "ok_runs": len(ok)}
            for k in keys:
                c[k] = med([r.get(k) for r in ok])
            c["sustained"] = level_sustained(rs)
            for part, names in (("reported", ("ttft_p99", "completed", "failed")), ("truth", ("ttft_p99",)),
                                ("server", ("finished", "tokens_per_s", "events_per_s", "late_p99_ms",
                                            "late_max_ms"))):
                for k in names:
                    c[f"{part}_{k}"] = med([r[part].get(k) for r in ok])
            cells[t][n] = c
    sustained = {t: max([n for n, c in cells[t].items() if c["sustained"]], default=None) for t in tools}
    ratios: dict[str, Any] = {}
    lg = sustained.get("loadgen")
    for t in tools:
        if t == "loadgen" or "loadgen" not in tools:
            continue
        both = [n for n in levels if n in cells["loadgen"] and n in cells[t]
                and cells["loadgen"][n]["cpu_ms_per_1k"] and cells[t][n]["cpu_ms_per_1k"]]
        ratios[t] = {"sustained_streams": (lg / sustained[t]) if lg and sustained[t] else None,
                     "cpu_per_1k_by_level": {n: cells[t][n]["cpu_ms_per_1k"] / cells["loadgen"][n]["cpu_ms_per_1k"]
                                             for n in both}}
    return {"cells": cells, "sustained": sustained, "ratios": ratios}


def table(summary: dict[str, Any]) -> str:
    head = ["streams", "tool", "TTFT p99 ms (reported / truth / error)", "p50 error ms", "completed / server",
            "client CPU s", "CPU ms per 1k req", "tokens/s (events/s)", "server late p99 / max ms", "server CPU",
            "within 2 ms"]
    rows = []
    for t, by_level in summary["cells"].items():
        for n, c in by_level.items():
            if not c["ok_runs"]:
                rows.append([str(n), t, "failed", "-", "-", _num(c["cpu_s"], ".1f"), "-", "-", "-", "-", "no"])
                continue
            rows.append([
                str(n), t, f"{c['reported_ttft_p99']:.2f} / {c['truth_ttft_p99']:.2f} / {c['ttft_p99_error_ms']:+.2f}",
                f"{c['ttft_p50_error_ms']:+.2f}", f"{c['reported_completed']:.0f} / {c['server_finished']:.0f}"
                + (f" ({c['reported_failed']:.0f} failed)" if c["reported_failed"] else ""),
                _num(c["cpu_s"], ".1f"), _num(c["cpu_ms_per_1k"], ",.0f"),
                f"{_num(c['server_tokens_per_s'], ',.0f')} ({_num(c['server_events_per_s'], ',.0f')})",
                f"{_num(c['server_late_p99_ms'], '.2f')} / {_num(c['server_late_max_ms'], '.2f')}",
                _num(c["server_cpu_share"], ".0%"),
                "yes" if c["sustained"] else "no"])
    rows.sort(key=lambda r: (int(r[0]), list(summary["cells"]).index(r[1])))
    w = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    out = ["| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(head)) + " |",
           "|" + "|".join("-" * (x + 2) for x in w) + "|"]
    out += ["| " + " | ".join(r[i].ljust(w[i]) for i in range(len(head))) + " |" for r in rows]
    return "\n".join(out)


def _ints(text: str) -> list[int]:
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not xs or min(xs) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more positive integers")
    return sorted(set(xs))


def choose_server(ap: argparse.ArgumentParser, asked: str | None) -> tuple[str, str]:
    """--server's kind, built when native, and a note for the header: native where it
    builds (else python, saying why), or the kind asked for (an error when native cannot
    be built)."""
    if asked == "python":
        return "python", ""
    try:
        build_truth_server()
        return "native", ""
    except TruthServerUnavailable as e:
        if asked == "native":
            ap.error(f"--server native: {e}")
        return "python", f" (the native server did not build: {str(e)[:300]})"


def rt_priority(ap: argparse.ArgumentParser, flag: str, asked: int | None, default: int) -> int:
    """A real-time priority option: `default` when not given (0 where this user may not
    set one; each is tried in a child process), else the one asked for; an error when it
    is out of range or not permitted. 0 is the normal scheduler."""
    if asked is not None and not 0 <= asked <= 99:
        ap.error(f"{flag} {asked}: give 0 (the normal scheduler) to 99")
    want = default if asked is None else asked
    if want == 0:
        return 0
    probe = [sys.executable, "-c", "import os, sys; os.sched_setscheduler(0, os.SCHED_FIFO, "
             "os.sched_param(int(sys.argv[1])))", str(want)]
    if run_proc(probe, 60)["rc"] == 0:
        return want
    if asked is not None:
        ap.error(f"{flag} {asked}: real-time scheduling is not permitted here; give 0")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: one level (250), 5 s runs")
    ap.add_argument("--levels", type=_ints, default=None, help="streams in flight per level (default "
                    "250,500,1000,2000,4000; --quick 250)")
    ap.add_argument("--tools", default=",".join(TOOLS),
                    help=f"comma-separated, of {', '.join(TOOLS + EXTRA_TOOLS)} (default {','.join(TOOLS)}); "
                         "loadgen_asyncio is loadgen with --http-engine asyncio")
    ap.add_argument("--duration-s", type=int, default=None, help="seconds per run (default 10, --quick 5)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds; medians of these (default 3, --quick 1)")
    ap.add_argument("--give-up-ms", type=float, default=20.0,
                    help="a tool whose median TTFT p99 error exceeds this at a level is not run higher "
                         "(default 20; 0: never)")
    ap.add_argument("--nice", type=int, default=-10,
                    help="niceness of the clients and the server (default -10; needs the privilege to lower it)")
    ap.add_argument("--ttft-ms", type=float, default=50.0, help="server: first token after (default 50)")
    ap.add_argument("--itl-ms", type=float, default=10.0, help="server: between tokens (default 10)")
    ap.add_argument("--tokens", type=int, default=256, help="server: tokens per answer (default 256)")
    ap.add_argument("--tokens-per-chunk", type=int, default=16,
                    help="server: tokens per event after the first (default 16)")
    ap.add_argument("--server", choices=("native", "python"), default=None,
                    help="the truth server: native (tests/servers/truth_server.cc, built with g++ on first use) "
                         "or python (tests/servers/scripted.py); default native where it builds")
    ap.add_argument("--server-rt-priority", type=int, default=None, metavar="P",
                    help="native server: SCHED_FIFO priority 1-99, 0 for the normal scheduler (default 1 where "
                         "permitted, else 0)")
    ap.add_argument("--client-rt-priority", type=int, default=0, metavar="P",
                    help="run every client at SCHED_RR priority P (1-99; needs the privilege), ahead of other "
                         "work on its core; default 0: the normal scheduler at --nice")
    ap.add_argument("--client-cpu", type=int, default=0, help="the client's core (default 0)")
    ap.add_argument("--server-cpu", type=int, default=1, help="the server's and this script's core (default 1)")
    ap.add_argument("--run-slack-s", type=int, default=90,
                    help="a run is killed after --duration-s plus this (default 90: start-up, warm-up, report)")
    ap.add_argument("--aiperf-venv", default=os.path.join(REPO, ".servers", "aiperf"),
                    help="venv with aiperf 0.13.0 (default .servers/aiperf)")
    ap.add_argument("--guidellm-venv", default=os.path.join(REPO, ".servers", "guidellm"),
                    help="venv with guidellm (default .servers/guidellm)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the ladder, loadgen at N streams once more under py-spy (needs py-spy)")
    ap.add_argument("--json", metavar="FILE", help="also write every figure here")
    args = ap.parse_args(argv)
    args.levels = args.levels or ([250] if args.quick else [250, 500, 1000, 2000, 4000])
    args.duration_s = args.duration_s or (5 if args.quick else 10)
    args.rounds = args.rounds or (1 if args.quick else 3)
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    if not tools or set(tools) - set(TOOLS + EXTRA_TOOLS):
        ap.error(f"--tools: {args.tools!r}; choose from {', '.join(TOOLS + EXTRA_TOOLS)}")
    if args.duration_s < 1 or args.rounds < 1 or args.tokens < 1 or args.tokens_per_chunk < 1:
        ap.error("--duration-s, --rounds, --tokens and --tokens-per-chunk must be positive")
    cpus = os.sched_getaffinity(0)
    if args.client_cpu == args.server_cpu or not {args.client_cpu, args.server_cpu} <= cpus:
        ap.error(f"--client-cpu {args.client_cpu} and --server-cpu {args.server_cpu} must be two different "
                 f"cores of {sorted(cpus)}")
    for tool, venv, pkg in (("aiperf", args.aiperf_venv, "aiperf==0.13.0"), ("guidellm", args.guidellm_venv,
                                                                               "guidellm==0.8.1")):
        if tool in tools and not os.access(os.path.join(venv, "bin", tool), os.X_OK):
            ap.error(f"no {tool} in {venv}; install it with: python -m venv {venv} && {venv}/bin/pip install {pkg}"
                     f" (or leave it out: --tools)")
    args.server, server_note = choose_server(ap, args.server)
    args.server_rt_priority = rt_priority(ap, "--server-rt-priority", args.server_rt_priority, 1)
    args.client_rt_priority = rt_priority(ap, "--client-rt-priority", args.client_rt_priority, 0)
    if args.profile and shutil.which("py-spy") is None:
        ap.error("--profile needs py-spy (pip install py-spy)")
    if "aiperf_tls" in tools and not os.access(os.path.join(args.aiperf_venv, "bin", "aiperf"), os.X_OK):
        ap.error(f"no aiperf in {args.aiperf_venv}; install it with: python -m venv {args.aiperf_venv} && "
                 f"{args.aiperf_venv}/bin/pip install aiperf==0.13.0 (or leave it out: --tools)")
    if "guidellm" in tools and "aiperf" not in tools and not os.access(
            os.path.join(args.aiperf_venv, "bin", "python"), os.X_OK):
        ap.error(f"guidellm's tokenizer is written from AIPerf's corpus: it needs {args.aiperf_venv} too")
    args.concurrency, args.aiperf_warmup = args.levels[0], args.levels[0]  # set per run
    os.environ.update(child_env())  # every child: OPENBLAS_NUM_THREADS=1
    os.sched_setaffinity(0, {args.server_cpu})  # this script's own work stays off the client core
    try:  # inherited by every server and client started from here
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    except PermissionError:
        ap.error(f"--nice {args.nice}: not permitted here; give --nice 0 (or a value no lower than now)")

    t0 = time.perf_counter()
    ctx = machine_context()
    with tempfile.TemporaryDirectory(prefix="bench_llm_streams_") as tmp:
        ladder = Ladder(args, tmp)
        if {"aiperf", "aiperf_tls", "guidellm"} & set(tools):  # all read the same local tokenizer
            ctx["aiperf"] = ladder.prepare_tokenizer(os.path.join(args.aiperf_venv, "bin", "python"))
        if "guidellm" in tools:
            r = run_proc([os.path.join(args.guidellm_venv, "bin", "python"), "-c",
                          "import importlib.metadata as m; print(m.version('guidellm'))"], 60)
            ctx["guidellm"] = r["stdout"].strip()
        print(f"bench_llm_streams: server ttft {args.ttft_ms:g} ms, itl {args.itl_ms:g} ms, {args.tokens} tokens, "
              f"{args.tokens_per_chunk} per event after a 1-token first; levels {args.levels}; {args.duration_s} s "
              f"runs, {args.rounds} round(s); client cpu {args.client_cpu}, server cpu {args.server_cpu}; "
              f"server {args.server}{server_note}"
              + (f" (SCHED_FIFO {args.server_rt_priority})" if args.server == "native" and args.server_rt_priority
                 else "") + (f"; clients at SCHED_RR {args.client_rt_priority}" if args.client_rt_priority else "")
              + "; "
              + ", ".join(f"{t} {ctx.get(t.split('_')[0], '?')}" for t in tools)
              + f"; {ctx['cpu_model']}, {ctx['nproc']} cpus; git {ctx['git']}; loadavg "
              f"{' '.join(f'{x:.2f}' for x in ctx['loadavg'])}; {ctx['date_utc']}", flush=True)
        for tool in tools:
            ladder.measure_fixed(tool)
        gave_up: set[str] = set()
        for n in args.levels:
            for rnd in range(1, args.rounds + 1):
                order = tools[(n + rnd) % len(tools):] + tools[:(n + rnd) % len(tools)]
                for tool in order:
                    if tool in gave_up:
                        continue
                    ladder.run_level(tool, n, rnd)
            for tool in tools:
                done = [r for r in ladder.rows if r["tool"] == tool and r["level"] == n]
                err = med([r.get("ttft_p99_error_ms") for r in done])
                if done and args.give_up_ms and (err is None or abs(err) > args.give_up_ms):
                    gave_up.add(tool)
                    print(f"  {tool}: median TTFT p99 error {_num(err, '+.1f')} ms at {n} streams; "
                          f"not run at higher levels", flush=True)
        profile = ladder.profile(args.profile) if args.profile else None
    summary = summarize(ladder.rows, tools, args.levels)
    total_s = time.perf_counter() - t0
    print(f"\n== {args.rounds} round(s), medians where more; error = reported - truth (the server's record); "
          f"client CPU = user + sys of its process tree; {total_s:.0f} s\n")
    print(table(summary))
    print()
    print("fixed cost (one request, CPU-s): " + ", ".join(f"{t} {_num(v, '.2f')}" for t, v in ladder.fixed_cpu_s.items()))
    for t, n in summary["sustained"].items():
        print(f"sustained (|TTFT p99 error| <= {TARGET_P99_TTFT_ERROR_MS:g} ms, no failures): {t} "
              + (f"{n} streams" if n else "no level run was within the target"))
    for t, r in summary["ratios"].items():
        cpu = ", ".join(f"{n}: {x:.1f}x" for n, x in r["cpu_per_1k_by_level"].items()) or "-"
        streams = (_num(r["sustained_streams"], ".1f") + "x" if r["sustained_streams"] else
                   f"- (loadgen {_num(summary['sustained'].get('loadgen'), 'd')}, {t} "
                   f"{_num(summary['sustained'][t], 'd')})")
        print(f"loadgen vs {t}: sustained streams {streams}; {t}'s CPU per 1000 requests over loadgen's, "
              f"by level: {cpu}")
    for base in ("loadgen", "aiperf"):  # TLS and plain in the same run: the TLS cost in TTFT error
        cells = summary["cells"]
        if base in cells and base + "_tls" in cells:
            by = [f"{n}: {_num(cells[base + '_tls'][n]['ttft_p99_error_ms'], '+.2f')} ms over TLS, "
                  f"{_num(cells[base][n]['ttft_p99_error_ms'], '+.2f')} ms plain"
                  for n in args.levels if n in cells[base] and n in cells[base + "_tls"]]
            print(f"{base}: TTFT p99 error by level, " + "; ".join(by))
    failed = [r for r in ladder.rows if "error" in r]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": ctx, "total_s": total_s, "fixed_cpu_s": ladder.fixed_cpu_s,
                       "summary": summary, "profile": profile, "target_p99_ttft_error_ms": TARGET_P99_TTFT_ERROR_MS,
                       "runs": ladder.rows}, f, indent=1, default=str)
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
