"""How far a client's reported TTFT and ITL are from the truth: loadgen against NVIDIA AIPerf.

The server is the scripted OpenAI-compatible one (``tests/servers/scripted.py``), started
as ``--ttft-ms 50 --itl-ms 10 --tokens 32``: every streamed chat completion carries 32
tokens, one per Server-Sent Event, the first 50 ms after the kernel received the request,
then one every 10 ms. Its ``GET /stats`` lists each stream's receive time and the time
right before each token's write, on one monotonic clock. That record is the truth:

  truth TTFT = token_write_ns[0] - recv_ns, one value per stream;
  truth ITL  = the differences of consecutive token_write_ns, 31 per stream.

Each run gets a fresh server, so its /stats holds only that run's streams. Both tools keep
64 streams in flight (closed loop) for the same duration (default 10 s, 3 s with
--quick), and each reports TTFT and ITL percentiles:

  loadgen  ``python -m loadgen run --sut openai+http://.../v1/chat/completions --scenario
           concurrency --concurrency 64 --json ...``: ``ttft_ns`` (from each query's
           scheduled time, its predecessor's end, so loadgen's own issue delay counts in;
           its p50/p99 are printed too), ``itl_ns`` (gaps between consecutive tokens, all
           streams), ``counts.completed``.
  aiperf   AIPerf 0.13.0 (PyPI ``aiperf``) in its own venv (default ``.servers/aiperf``):
           ``aiperf profile --endpoint-type chat --streaming --concurrency 64
           --benchmark-duration D``, read from its ``profile_export_aiperf.json``:
           ``time_to_first_token`` and, for ITL, ``inter_chunk_latency`` (the gaps between
           consecutive chunks, all streams: the definition of the truth and of loadgen's
           figure, since each chunk holds one token). AIPerf's headline
           ``inter_token_latency`` is a different quantity, one mean per request
           ((latency - TTFT) / (tokens - 1)); it is recorded in the JSON and printed
           below the table, not compared.

AIPerf offline. AIPerf needs a tokenizer to synthesise prompts. ``--tokenizer builtin``
is tiktoken's o200k_base, whose BPE file tiktoken downloads on first use, and a Hugging
Face name needs the Hub; neither is reachable here. A local tokenizer directory works: this
script writes one (a word-level ``tokenizers`` model over the words of AIPerf's own
Shakespeare corpus, plus the server's "tok", so each streamed token counts as one) and
passes its path. HF_HUB_OFFLINE must stay unset: with it, AIPerf 0.13.0 treats the path
as a Hub repo id and fails. AIPerf does not need /v1/models (its readiness probe is off by
default). ``--no-server-metrics --no-gpu-telemetry`` stop it from polling /metrics and
localhost:9400-9401. Token counts come from the server's usage chunk
(``--use-server-token-count``), as loadgen's do.

Fairness. The same prompts size (64 words; AIPerf ``--isl 64 --isl-stddev 0``) and 32
output tokens (``--osl 32``). loadgen opens its 64 connections before the run starts;
AIPerf connects on its first requests, so it gets ``--warmup-request-count 64`` (a
warm-up phase it finishes before profiling starts), and the first 64 streams of its
server's record are left out of the truth. Both run with OPENBLAS_NUM_THREADS=1
(``bench_engine.child_env``). Each round runs both tools once, in
alternating order. The figures are medians over the rounds (each column separately, so
a median error need not equal median reported - median truth). Errors are reported -
truth in ms; loadgen's target is a p99 TTFT error of at most 2 ms. The machine's 1-minute
load average is recorded before each run.

Usage:
    python bench/bench_stream.py --quick                         # 3 s runs, 1 round, ~20 s
    python bench/bench_stream.py --json /tmp/bench_stream.json   # 10 s runs, 3 rounds, ~1.5 min
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench_engine import child_env, machine_context, med  # bench/ is first on sys.path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo, for tests.servers
from tests.servers.scripted_proc import start_scripted

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

TOOLS = ("loadgen", "aiperf")
TARGET_P99_TTFT_ERROR_MS = 2.0
METRICS = {"ttft_p50": "TTFT p50", "ttft_p99": "TTFT p99", "itl_p50": "ITL p50", "itl_p99": "ITL p99"}
EXTRA = {"loadgen": ("issue_delay_p50", "issue_delay_p99"),  # medians of these are printed too
         "aiperf": ("itl_per_request_mean_p50", "itl_per_request_mean_p99")}

# Run with AIPerf's python: writes a local, offline tokenizer into sys.argv[1], prints
# AIPerf's version.
MAKE_TOKENIZER = r"""
import importlib.metadata, json, pathlib, sys
import aiperf
from tokenizers import Tokenizer, models, pre_tokenizers
corpus = pathlib.Path(aiperf.__file__).parent / "dataset/generator/assets/shakespeare.txt"
words = sorted(set(corpus.read_text().split()) | {"tok"})
tok = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps(
    {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 1 << 20}))
print(importlib.metadata.version("aiperf"))
"""


def run_proc(argv: list[str], timeout_s: float, cwd: str) -> dict[str, Any]:
    """Runs argv to its end in a session of its own (SIGKILL to that process group after
    timeout_s); returns rc, timed_out, wall_s, stdout and stderr."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=out, stderr=err, cwd=cwd, env=child_env(),
                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            p.wait(timeout=timeout_s)
            timed_out = False
        except BaseException as e:  # time-out or Ctrl-C: end our child's group
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            timed_out = True
        out.seek(0)
        err.seek(0)
        return {"rc": p.returncode, "timed_out": timed_out, "wall_s": time.perf_counter() - t0,
                "stdout": out.read().decode("utf-8", "replace"),
                "stderr": err.read().decode("utf-8", "replace")}


def percentile(xs: list[int], p: float) -> float:
    """Nearest-rank percentile of xs."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(len(s) * p / 100) - 1))]


def truth(stats: dict[str, Any], skip: int) -> dict[str, Any]:
    """TTFT and ITL percentiles (ms) of the server's record, streams ordered by receive
    time, the first `skip` left out."""
    streams = sorted(stats["streams"], key=lambda s: s["recv_ns"])[skip:]
    ttft = [s["token_write_ns"][0] - s["recv_ns"] for s in streams if s["token_write_ns"]]
    itl = [b - a for s in streams for a, b in zip(s["token_write_ns"], s["token_write_ns"][1:])]
    out: dict[str, Any] = {"streams": len(streams), "skipped": skip}
    for name, xs in (("ttft", ttft), ("itl", itl)):
        for p in (50, 99):
            out[f"{name}_p{p}"] = percentile(xs, p) / 1e6 if xs else None
    return out


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: str) -> None:
        self.args, self.tmp = args, tmp
        self.aiperf_bin = os.path.join(args.aiperf_venv, "bin", "aiperf")
        self.tokenizer = os.path.join(tmp, "tokenizer")
        self.runs: list[dict[str, Any]] = []

    def prepare_aiperf(self) -> str:
        """Writes the offline tokenizer; returns AIPerf's version."""
        r = run_proc([os.path.join(self.args.aiperf_venv, "bin", "python"), "-c", MAKE_TOKENIZER,
                      self.tokenizer], 120, self.tmp)
        if r["rc"] != 0:
            raise RuntimeError("could not write the tokenizer: " + r["stderr"][-800:])
        return r["stdout"].strip()

    def loadgen(self, url: str, d: str) -> tuple[list[str], Any]:
        a = self.args
        argv = [sys.executable, "-m", "loadgen", "run", "--sut", "openai+" + url + "/v1/chat/completions",
                "--model", "m", "--scenario", "concurrency", "--concurrency", str(a.concurrency),
                "--duration-s", str(a.duration_s), "--json", "--quiet", "--interval-s", "0",
                "--max-issue-delay-ms", "1000"]

        def parse(r: dict[str, Any]) -> dict[str, Any]:
            j = json.loads(r["stdout"])
            return {"ttft_p50": j["ttft_ns"]["p50"] / 1e6, "ttft_p99": j["ttft_ns"]["p99"] / 1e6,
                    "itl_p50": j["itl_ns"]["p50"] / 1e6, "itl_p99": j["itl_ns"]["p99"] / 1e6,
                    "issue_delay_p50": j["issue_delay_ns"]["p50"] / 1e6,
                    "issue_delay_p99": j["issue_delay_ns"]["p99"] / 1e6,
                    "completed": j["counts"]["completed"], "failed": j["counts"]["failed"],
                    "tokens": j["network"]["tokens"]["output_tokens"], "valid": j["valid"],
                    # the streams of its ramp (--ramp-up-s), counted apart like a warm-up
                    "warmup_issued": (j.get("warmup") or {}).get("issued", 0)}
        return argv, parse

    def aiperf(self, url: str, d: str) -> tuple[list[str], Any]:
        a = self.args
        art = os.path.join(d, "artifacts")
        argv = [self.aiperf_bin, "profile", "--model", "m", "--url", url, "--endpoint-type", "chat",
                "--streaming", "--tokenizer", self.tokenizer, "--concurrency", str(a.concurrency),
                "--benchmark-duration", str(a.duration_s), "--benchmark-grace-period", "30",
                "--isl", "64", "--isl-stddev", "0", "--osl", str(a.tokens), "--use-server-token-count",
                "--random-seed", "0", "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry",
                "--output-artifact-dir", art]
        if a.aiperf_warmup:
            argv += ["--warmup-request-count", str(a.aiperf_warmup)]

        def parse(r: dict[str, Any]) -> dict[str, Any]:
            with open(os.path.join(art, "profile_export_aiperf.json")) as f:
                j = json.load(f)
            ttft, icl, itl = j["time_to_first_token"], j["inter_chunk_latency"], j["inter_token_latency"]
            assert ttft["unit"] == icl["unit"] == itl["unit"] == "ms", (ttft["unit"], icl["unit"])
            return {"ttft_p50": ttft["p50"], "ttft_p99": ttft["p99"],
                    "itl_p50": icl["p50"], "itl_p99": icl["p99"],
                    "itl_per_request_mean_p50": itl["p50"], "itl_per_request_mean_p99": itl["p99"],
                    "completed": int(j["completed_request_count"]["avg"]),
                    "failed": int(j.get("error_request_count", {}).get("avg", 0)),
                    "tokens": int(j["output_token_count"]["sum"])}
        return argv, parse

    def run_one(self, tool: str, rnd: int) -> dict[str, Any]:
        """One tool run against a fresh server: reported, truth and error figures."""
        a = self.args
        d = tempfile.mkdtemp(prefix=f"{tool}{rnd}_", dir=self.tmp)
        res: dict[str, Any] = {"tool": tool, "round": rnd, "loadavg_1m_before": os.getloadavg()[0]}
        srv = None
        try:
            srv = start_scripted(d, "--ttft-ms", a.ttft_ms, "--itl-ms", a.itl_ms, "--tokens", a.tokens,
                                 "--max-runtime-s", a.duration_s + 300)
            argv, parse = getattr(self, tool)(srv.url, d)
            res["argv"] = argv
            r = run_proc(argv, a.duration_s + 150, d)
            res.update(rc=r["rc"], wall_s=r["wall_s"], timed_out=r["timed_out"])
            if r["rc"] != 0 or r["timed_out"]:
                raise RuntimeError(f"{tool} exited {r['rc']}{' (timed out)' if r['timed_out'] else ''}: "
                                   f"{(r['stderr'] or r['stdout'])[-800:]}")
            res["reported"] = parse(r)
            res["truth"] = truth(srv.stats(), a.aiperf_warmup if tool == "aiperf" else 0)
        except Exception as e:  # one failed run must not lose the others
            res["error"] = f"{type(e).__name__}: {e}"
        finally:
            if srv is not None:
                srv.stop()
        if "truth" in res:
            res["error_ms"] = {m: res["reported"][m] - res["truth"][m] for m in METRICS}
            rep, tru, err = res["reported"], res["truth"], res["error_ms"]
            print(f"  round {rnd} {tool:7s}: TTFT p50 {rep['ttft_p50']:.2f} ({err['ttft_p50']:+.2f}) "
                  f"p99 {rep['ttft_p99']:.2f} ({err['ttft_p99']:+.2f}) ms, ITL p50 {rep['itl_p50']:.2f} "
                  f"({err['itl_p50']:+.2f}) p99 {rep['itl_p99']:.2f} ({err['itl_p99']:+.2f}) ms; "
                  f"completed {rep['completed']}, server streams {tru['streams']} "
                  f"(loadavg {res['loadavg_1m_before']:.2f}, {res['wall_s']:.0f} s)", flush=True)
        else:
            print(f"  round {rnd} {tool}: FAILED {res['error'][:600]}", flush=True)
        self.runs.append(res)
        return res

    def medians(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for tool in TOOLS:
            ok = [r for r in self.runs if r["tool"] == tool and "error_ms" in r]
            m: dict[str, Any] = {"runs": len(ok)}
            for part in ("reported", "truth", "error_ms"):
                m[part] = {k: med([r[part][k] for r in ok]) for k in METRICS}
            m["completed"] = med([r["reported"]["completed"] for r in ok])
            for k in EXTRA[tool]:
                m[k] = med([r["reported"][k] for r in ok])
            out[tool] = m
        return out


def table(meds: dict[str, dict[str, Any]]) -> str:
    def cell(m: dict[str, Any], k: str) -> str:
        if m["error_ms"][k] is None:
            return "-"
        return f"{m['reported'][k]:.2f} / {m['truth'][k]:.2f} / {m['error_ms'][k]:+.2f}"

    head = ["tool", "completed"] + [f"{label} ms (reported / truth / error)" for label in METRICS.values()]
    rows = [[tool, "-" if m["completed"] is None else f"{m['completed']:.0f}"]
            + [cell(m, k) for k in METRICS] for tool, m in meds.items()]
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(head)) + " |",
             "|" + "|".join("-" * (x + 2) for x in w) + "|"]
    lines += ["| " + " | ".join(r[i].ljust(w[i]) for i in range(len(head))) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 s runs, 1 round")
    ap.add_argument("--duration-s", type=int, default=None, help="seconds per run (default 10, --quick 3)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds, medians of these (default 3, --quick 1)")
    ap.add_argument("--concurrency", type=int, default=64, help="streams in flight (default 64)")
    ap.add_argument("--ttft-ms", type=float, default=50.0, help="server: first token after (default 50)")
    ap.add_argument("--itl-ms", type=float, default=10.0, help="server: between tokens (default 10)")
    ap.add_argument("--tokens", type=int, default=32, help="server: tokens per answer (default 32)")
    ap.add_argument("--aiperf-venv", default=os.path.join(REPO, ".servers", "aiperf"),
                    help="venv with aiperf installed (default .servers/aiperf)")
    ap.add_argument("--aiperf-warmup", type=int, default=None,
                    help="AIPerf warm-up requests, left out of the truth (default: --concurrency)")
    ap.add_argument("--json", metavar="FILE", help="also write every figure here")
    args = ap.parse_args(argv)
    args.duration_s = args.duration_s or (3 if args.quick else 10)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.aiperf_warmup is None:
        args.aiperf_warmup = args.concurrency
    if not os.access(os.path.join(args.aiperf_venv, "bin", "aiperf"), os.X_OK):
        ap.error(f"no aiperf in {args.aiperf_venv}; install it with: python -m venv {args.aiperf_venv} "
                 f"&& {args.aiperf_venv}/bin/pip install aiperf==0.13.0")

    t0 = time.perf_counter()
    ctx = machine_context()
    with tempfile.TemporaryDirectory(prefix="bench_stream_") as tmp:
        bench = Bench(args, tmp)
        ctx["aiperf"] = bench.prepare_aiperf()
        print(f"bench_stream: server ttft {args.ttft_ms:g} ms, itl {args.itl_ms:g} ms, {args.tokens} "
              f"tokens; {args.concurrency} streams, {args.duration_s} s runs, {args.rounds} round(s); "
              f"loadgen {ctx['loadgen']}, aiperf {ctx['aiperf']}; {ctx['cpu_model']}, {ctx['nproc']} "
              f"cpus; git {ctx['git']}; loadavg {' '.join(f'{x:.2f}' for x in ctx['loadavg'])}; "
              f"{ctx['date_utc']}", flush=True)
        for rnd in range(1, args.rounds + 1):
            for tool in TOOLS if rnd % 2 else TOOLS[::-1]:
                bench.run_one(tool, rnd)
    meds = bench.medians()
    lg, peer = meds["loadgen"]["error_ms"]["ttft_p99"], meds["aiperf"]["error_ms"]["ttft_p99"]
    ratio = abs(peer) / abs(lg) if lg and peer is not None else None
    met = None if lg is None else abs(lg) <= TARGET_P99_TTFT_ERROR_MS
    total_s = time.perf_counter() - t0
    print(f"\n== medians of {args.rounds} round(s); times in ms; error = reported - truth "
          f"(truth from each run's server record); {total_s:.0f} s\n")
    print(table(meds))
    print()
    lm, ai = meds["loadgen"], meds["aiperf"]
    if lm.get("issue_delay_p99") is not None:
        print(f"loadgen's TTFT counts from each query's scheduled time (its predecessor's end), so it "
              f"includes the issue delay: p50 {lm['issue_delay_p50']:.2f}, p99 {lm['issue_delay_p99']:.2f} ms.")
    if ai.get("itl_per_request_mean_p50") is not None:
        print(f"AIPerf's ITL column is its inter_chunk_latency; its headline inter_token_latency "
              f"(one mean per request) is p50 {ai['itl_per_request_mean_p50']:.2f}, "
              f"p99 {ai['itl_per_request_mean_p99']:.2f} ms.")
    print("p99 TTFT error, aiperf / loadgen: " + ("-" if ratio is None else f"{ratio:.1f}x"))
    print(f"target: loadgen p99 TTFT error <= {TARGET_P99_TTFT_ERROR_MS:g} ms: "
          + {None: "no figure", True: "met", False: "NOT met"}[met]
          + ("" if lg is None else f" ({lg:+.2f} ms)"))
    failed = [r for r in bench.runs if "error" in r]
    for r in failed:
        print(f"FAILED round {r['round']} {r['tool']}: {r['error'][:600]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": ctx, "total_s": total_s, "medians": meds,
                       "p99_ttft_error_ratio_aiperf_over_loadgen": ratio,
                       "target_p99_ttft_error_ms": TARGET_P99_TTFT_ERROR_MS, "target_met": met,
                       "runs": bench.runs}, f, indent=1, default=str)
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
