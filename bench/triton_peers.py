"""Triton's perf_analyzer as a peer of loadgen in bench_http.py's triton case: where it is,
the command lines it runs, what its report says, and the case's rows and table.

perf_analyzer is installed by ``bash tests/servers/install_perf_analyzer.sh
.servers/perf_analyzer``; ``.servers/perf_analyzer/perf_analyzer`` runs it. It measures in
windows until three in a row agree; here a run of D seconds is three windows of D/3 s
whose agreement is not asked for (``--stability-percentage 1000 --max-trials 3``), so it
lasts about D seconds like the other tools' runs. Closed loop is its default synchronous
mode (one thread per request in flight); open loop adds ``--async``, without which its
four sending threads (``--max-threads``' default for a request rate) each wait for a
response before the next send, and the run is no open loop at all. Over HTTP it sends
and asks for JSON tensors, the body loadgen and wrk send.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

from bench_engine import fmt_ns, fmt_qps, fmt_ratio, med, ratio, spread

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PERF_ANALYZER = os.path.join(REPO, ".servers", "perf_analyzer", "perf_analyzer")
INSTALL_HINT = "bash tests/servers/install_perf_analyzer.sh .servers/perf_analyzer"
# perf_analyzer's client CPU per 1000 requests measured once on this kind of machine: the
# figure the table compares with when perf_analyzer is not installed.
PERF_ANALYZER_MS_PER_1K = 110.0
TOOLS = ("loadgen", "wrk", "perf_analyzer")


def find_perf_analyzer(path: Optional[str]) -> Optional[str]:
    """path (default: .servers/perf_analyzer/perf_analyzer) when it is an executable file."""
    path = path or DEFAULT_PERF_ANALYZER
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def perf_analyzer_argv(binary: str, proto: str, target: str, duration_s: float, *,
                       concurrency: Optional[int] = None, rate: Optional[float] = None,
                       model: str = "add_one") -> list[str]:
    """One perf_analyzer run of about duration_s against target ("127.0.0.1:PORT") over
    proto ("http" or "grpc"): closed loop at concurrency, or Poisson arrivals at rate/s."""
    if (concurrency is None) == (rate is None):
        raise ValueError("give concurrency or rate")
    window_ms = max(1, round(duration_s * 1000 / 3))
    argv = [binary, "-m", model, "-i", proto, "-u", target,
            "--measurement-interval", str(window_ms), "--max-trials", "3",
            "--stability-percentage", "1000"]
    if proto == "http":
        argv += ["--input-tensor-format", "json", "--output-tensor-format", "json"]
    if concurrency is not None:
        return argv + ["--concurrency-range", str(concurrency)]
    return argv + ["--request-rate-range", f"{rate:g}", "--request-distribution", "poisson",
                   "--async"]


def perf_analyzer_startup_argv(binary: str, proto: str, target: str,
                               model: str = "add_one") -> list[str]:
    """A one-request run: its CPU is perf_analyzer's fixed cost per process."""
    argv = [binary, "-m", model, "-i", proto, "-u", target, "--concurrency-range", "1",
            "--request-count", "1"]
    return argv + (["--input-tensor-format", "json", "--output-tensor-format", "json"]
                   if proto == "http" else [])


def parse_perf_analyzer(text: str) -> dict[str, Any]:
    """The client figures of a perf_analyzer report (one load level): its request count
    and throughput over its measurement windows, p50 and p99 latency, and for a request
    rate the rate asked for, the rate it sent at and the share of requests it sent late
    (its own "not able to keep up" warning; 0 without it)."""
    count = re.search(r"^\s*Request count: (\d+)\s*$", text, re.MULTILINE)
    tput = re.search(r"^\s*Throughput: ([\d.]+) infer/sec", text, re.MULTILINE)
    if not (count and tput):
        raise ValueError("no 'Request count' / 'Throughput' lines")
    ok, qps = int(count.group(1)), float(tput.group(1))
    lat = {p: int(v) * 1000 for p, v in
           re.findall(r"^\s*p(50|99) latency: (\d+) usec", text, re.MULTILINE)}
    out: dict[str, Any] = {"ok": ok, "errors": 0, "duration_s": ok / qps if qps else 0.0,
                           "p50_ns": lat.get("50"), "p99_ns": lat.get("99")}
    target = re.search(r"^Request Rate: ([\d.]+) inference requests per second", text, re.MULTILINE)
    if target:
        sent = re.search(r"Avg send request rate: ([\d.]+) infer/sec", text)
        late = re.search(r"not able to keep up with the desired request rate\. ([\d.]+)% of the "
                         r"requests were delayed", text)
        out.update(target_qps=float(target.group(1)),
                   sent_qps=float(sent.group(1)) if sent else None,
                   delayed_share=float(late.group(1)) / 100 if late else 0.0)
    return out


def open_loop_kept_up(r: dict[str, Any]) -> Optional[bool]:
    """Whether an open-loop run kept to its schedule by the tool's own account: loadgen's
    verdict (valid: among others, its p99 issue delay within --max-issue-delay-ms) with no
    request that waited in the client for a free connection or call, or no "not able to
    keep up" warning from perf_analyzer. None unless tagged mode="open"."""
    if r.get("mode") != "open":
        return None
    if r["tool"] == "perf_analyzer":
        return None if r.get("delayed_share") is None else r["delayed_share"] == 0.0
    return None if r.get("valid") is None else bool(r["valid"]) and not r.get("queued_in_client")


def base_load(load: str) -> str:
    """The load a row is compared on: a Poisson label without loadgen's spin setting."""
    return load.split(", spin ")[0]


def triton_rows(runs: list[dict[str, Any]], startup_cpu_s: dict[tuple, Optional[float]],
                loads: dict[str, list[str]], measured: bool) -> list[dict[str, Any]]:
    """One row per protocol, load and tool from the case's runs. CPU per 1000 requests
    divides by the requests Triton served during the run (its statistics), which counts
    what a tool sent outside its own count too. 'steady' is net of the tool's start-up
    (startup_cpu_s by (tool, protocol); wrk's is a few ms and is not taken off). Each
    loadgen row is compared with perf_analyzer's row at the same protocol and load when
    measured, else with PERF_ANALYZER_MS_PER_1K."""
    rows = []
    for proto, proto_loads in loads.items():
        for load in proto_loads:
            for tool in TOOLS:
                rs = [r for r in runs if r["tool"] == tool and r["proto"] == proto
                      and r["load"] == load and r.get("ok")]
                if not rs:
                    continue
                fixed = 0.0 if tool == "wrk" else startup_cpu_s.get((tool, proto))
                served = [r["server_counts"]["inferences"] or r["ok"] for r in rs]
                steady = None if fixed is None else med([1e6 * (r["cpu_s"] - fixed) / n
                                                         for r, n in zip(rs, served)])
                rows.append({
                    "proto": proto, "load": load, "tool": tool,
                    "qps": [r["qps"] for r in rs], "p50_ns": med([r["p50_ns"] for r in rs]),
                    "p99_ns": med([r["p99_ns"] for r in rs]),
                    "cpu_ms_per_1k": [r["cpu_ms_per_1k"] for r in rs],
                    "served_cpu_ms_per_1k": [1e6 * r["cpu_s"] / n for r, n in zip(rs, served)],
                    "steady_cpu_ms_per_1k": steady,
                    "window_cpu_ms_per_1k": med([r.get("window_cpu_ms_per_1k") for r in rs]),
                    "sent_qps": med([r.get("sent_qps", r.get("scheduled_qps")) for r in rs]),
                    "delayed_share": med([r.get("delayed_share") for r in rs]),
                    "issue_delay_p99_ns": med([r.get("issue_delay_p99_ns") for r in rs]),
                    "queued_in_client": med([r.get("queued_in_client") for r in rs]),
                    "kept_up": [open_loop_kept_up(r) for r in rs],
                    "server_cpu_share": med([r["server_cpu_share"] for r in rs]),
                    "others_cores": med([r["others_cores"] for r in rs]),
                    "server_inferences": med([r["server_counts"]["inferences"] for r in rs]),
                    "client_ok": med([r["ok"] for r in rs]),
                    "valid": [r.get("valid") for r in rs],
                })
    for r in rows:
        pa = next((p for p in rows if p["tool"] == "perf_analyzer" and p["proto"] == r["proto"]
                   and p["load"] == base_load(r["load"])), None)
        pa_steady = pa["steady_cpu_ms_per_1k"] if pa else (None if measured else PERF_ANALYZER_MS_PER_1K)
        r["perf_analyzer_ms_per_1k"] = pa_steady
        r["over_perf_analyzer"] = ratio(r["steady_cpu_ms_per_1k"], pa_steady)
        wrk = next((p for p in rows if p["tool"] == "wrk" and p["proto"] == r["proto"]
                    and p["load"] == base_load(r["load"])), None)
        if wrk and r["tool"] == "loadgen":
            r["over_wrk"] = ratio(r["steady_cpu_ms_per_1k"], wrk["steady_cpu_ms_per_1k"])
            r["over_wrk_in_run"] = ratio(r["window_cpu_ms_per_1k"], wrk["window_cpu_ms_per_1k"])
        if pa:
            r["over_perf_analyzer_in_run"] = ratio(r["window_cpu_ms_per_1k"], pa["window_cpu_ms_per_1k"])
            r["over_perf_analyzer_with_startup"] = ratio(med(r["served_cpu_ms_per_1k"]),
                                                         med(pa["served_cpu_ms_per_1k"]))
            r["over_perf_analyzer_qps"] = ratio(med(r["qps"]), med(pa["qps"]))
    return rows


def triton_table(rows: list[dict[str, Any]], measured: bool) -> list[str]:
    """The case's table, in Markdown, with the loadgen / perf_analyzer ratios on loadgen's
    rows (CPU in the run, steady CPU, CPU with start-up, req/s) and, over HTTP, loadgen /
    wrk (in the run, steady). An open loop's 'sent/s, kept up' is the rate the tool sent at
    and in how many rounds it kept up, with perf_analyzer's share of requests sent late or
    loadgen's p99 issue delay."""
    pa_head = ("loadgen / perf_analyzer: in the run | steady | with start-up | req/s" if measured else
               "perf_analyzer (reference, not measured here) | steady / reference")
    lines = [f"| protocol | load | tool | req/s | p50 | p99 | client CPU ms / 1000 req "
             f"| steady | in the run | open loop: sent/s, kept up | {pa_head} | loadgen / wrk: in the run, "
             f"steady | Triton CPU | others |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|" + "---:|" * (7 if measured else 5)]
    for r in rows:
        kept = [k for k in r["kept_up"] if k is not None]
        open_loop = "-" if not kept else (
            f"{fmt_qps(r['sent_qps'])}, {sum(kept)}/{len(kept)}"
            + (f" ({r['delayed_share']:.0%} late)" if r["delayed_share"] else "")
            + (f" (issue delay p99 {fmt_ns(r['issue_delay_p99_ns'])})"
               if r["issue_delay_p99_ns"] is not None else "")
            + (f" ({r['queued_in_client']:.0f} waited in the client)" if r.get("queued_in_client") else ""))
        if not measured:
            cmp = f"| {ms(PERF_ANALYZER_MS_PER_1K)} | {fmt_ratio(r['over_perf_analyzer'])} |"
        elif r["tool"] == "loadgen":
            cmp = (f"| {fmt_ratio(r.get('over_perf_analyzer_in_run'))} | {fmt_ratio(r['over_perf_analyzer'])} | "
                   f"{fmt_ratio(r.get('over_perf_analyzer_with_startup'))} | "
                   f"{fmt_ratio(r.get('over_perf_analyzer_qps'))} |")
        else:
            cmp = "| - | - | - | - |"
        vs_wrk = (f"{fmt_ratio(r.get('over_wrk_in_run'))}, {fmt_ratio(r.get('over_wrk'))}"
                  if "over_wrk" in r else "-")
        lines.append(
            f"| {r['proto']} | {r['load']} | {r['tool']} | {spread(r['qps'], fmt_qps)} | "
            f"{fmt_ns(r['p50_ns'])} | {fmt_ns(r['p99_ns'])} | "
            f"{spread(r['served_cpu_ms_per_1k'], ms)} | {ms(r['steady_cpu_ms_per_1k'])} | "
            f"{ms(r.get('window_cpu_ms_per_1k'))} | {open_loop} {cmp} {vs_wrk} | {pct(r['server_cpu_share'])} | "
            f"{cores(r['others_cores'])} |")
    return lines


def pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.0%}"


def cores(v: Optional[float]) -> str:
    return "-" if v is None else f"{max(v, 0.0):.2f}"


def ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.1f} ms"
