"""Benchmark: loadgen's native HDR histogram against the `hdrhistogram` package (hdrh).

Run from the repository root:

    python bench/bench_histogram.py              # full run (a few seconds)
    python bench/bench_histogram.py --quick      # smoke run (under a second)
    python bench/bench_histogram.py --json out.json

Every figure is the median over --repeats runs. All cases use the same seeded array of
lognormal latencies in ns (rng.lognormal(mean=13, sigma=1) as int64) and histograms of
range [1, 3.6e12] at 3 significant figures, the configuration of
loadgen._core.time_record_ns.

Cases:
  * record, C++ loop: loadgen._core.time_record_ns(values, 1, single_writer), a recording
    loop entirely in C++ (no Python in the measurement);
  * record_array: time around Histogram.record_array(values) / number of values (a fresh
    histogram per repeat, created outside the timing);
  * record(), Python loop: ours Histogram.record vs hdrh HdrHistogram.record_value, both
    called in the same plain Python loop over a list of ints;
  * thread-safety schemes: time_record_ns for single_writer, atomic_shared and sharded
    with 1 and 2 threads (ns per record per thread);
  * encode / decode of a histogram of --values samples (default 1e6): ours encode() and
    Histogram.decode(), hdrh encode() and HdrHistogram.decode(), plus encoded sizes; both
    decodes (and the cross decodes) must give the same total count.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List

import numpy as np

from loadgen import Histogram, _core
from hdrh.histogram import HdrHistogram

LOWEST = 1
HIGHEST = 3_600_000_000_000  # one hour in ns
DIGITS = 3
SEED = 20240601


# ---------------------------------------------------------------------- helpers


def machine_context() -> Dict[str, str]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return {
        "cpu": cpu,
        "nproc": str(usable),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "hdrhistogram": version("hdrhistogram"),
        "loadgen": version("loadgen"),
        "platform": platform.platform(),
    }


def median_of(samples: List[float]) -> float:
    return float(statistics.median(samples))


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of fn takes, with the garbage collector off."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        if gc_was_enabled:
            gc.enable()


def new_ours() -> Histogram:
    return Histogram(
        lowest_discernible_value=LOWEST,
        highest_trackable_value=HIGHEST,
        significant_figures=DIGITS,
    )


def new_peer() -> HdrHistogram:
    return HdrHistogram(LOWEST, HIGHEST, DIGITS)


def fmt_ns(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.2f} ns"


# ------------------------------------------------------------------- benchmarks


def bench_cxx_modes(values: np.ndarray, repeats: int):
    """time_record_ns for each mode and 1, 2 threads: ns per record per thread.

    Also returns, per mode and thread count, the process CPU time over the wall time of
    each call ("parallelism"): about 2.0 when two threads really ran at once, about 1.0
    when the machine gave them one CPU between them (then 2-thread figures double).
    """
    modes = {
        "single_writer": _core.RecordMode.single_writer,
        "atomic_shared": _core.RecordMode.atomic_shared,
        "sharded": _core.RecordMode.sharded,
    }
    out: Dict[str, Dict[str, List[float]]] = {m: {"1": [], "2": []} for m in modes}
    par: Dict[str, Dict[str, List[float]]] = {m: {"1": [], "2": []} for m in modes}
    for mode in modes.values():
        for threads in (1, 2):
            _core.time_record_ns(values, threads, mode)  # warm-up
    # Repeats are interleaved across the cases, so that a noisy phase of the (shared)
    # machine hits every case alike instead of all the repeats of one.
    for _ in range(repeats):
        for name, mode in modes.items():
            for threads in (1, 2):
                cpu0, wall0 = time.process_time(), time.perf_counter()
                ns = float(_core.time_record_ns(values, threads, mode))
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                out[name][str(threads)].append(ns)
                par[name][str(threads)].append(cpu / wall if wall > 0 else float("nan"))
    return out, par


def bench_record_array(values: np.ndarray, repeats: int) -> List[float]:
    samples = []
    new_ours().record_array(values)  # warm-up
    for _ in range(repeats):
        h = new_ours()
        secs = timed(functools.partial(h.record_array, values))
        if h.total_count != len(values):
            raise RuntimeError(f"record_array recorded {h.total_count} of {len(values)} values")
        samples.append(secs * 1e9 / len(values))
    return samples


def bench_python_loops(values: np.ndarray, repeats: int) -> Dict[str, List[float]]:
    """Ours Histogram.record vs hdrh record_value, in the same plain Python loop."""
    as_list = values.tolist()
    n = len(as_list)

    def run_ours() -> float:
        h = new_ours()
        rec = h.record

        def loop():
            for x in as_list:
                rec(x)

        secs = timed(loop)
        if h.total_count != n:
            raise RuntimeError("Histogram.record lost values")
        return secs * 1e9 / n

    def run_peer() -> float:
        p = new_peer()
        rec = p.record_value

        def loop():
            for x in as_list:
                rec(x)

        secs = timed(loop)
        if p.get_total_count() != n:
            raise RuntimeError("hdrh record_value lost values")
        return secs * 1e9 / n

    run_ours(), run_peer()  # warm-up
    ours, peer = [], []
    for _ in range(repeats):  # interleaved, so drift on a noisy machine hits both
        ours.append(run_ours())
        peer.append(run_peer())
    return {"ours": ours, "peer": peer}


def bench_codec(values: np.ndarray, repeats: int, inner: int) -> Dict[str, object]:
    """Encode/decode of a histogram holding all of `values`; seconds per call."""
    ours = new_ours()
    ours.record_array(values)
    peer = new_peer()
    rec = peer.record_value
    for x in values.tolist():
        rec(x)
    n = len(values)
    if ours.total_count != n or peer.get_total_count() != n:
        raise RuntimeError("codec histograms do not hold every value")

    ours_text = ours.encode()
    peer_text = peer.encode()  # bytes (base64)

    def per_call(fn: Callable[[], object]) -> float:
        def loop():
            for _ in range(inner):
                fn()

        return timed(loop) / inner

    enc_o, enc_p, dec_o, dec_p = [], [], [], []
    per_call(ours.encode), per_call(peer.encode)  # warm-up
    per_call(lambda: Histogram.decode(ours_text)), per_call(lambda: HdrHistogram.decode(peer_text))
    for _ in range(repeats):
        enc_o.append(per_call(ours.encode))
        enc_p.append(per_call(peer.encode))
        dec_o.append(per_call(lambda: Histogram.decode(ours_text)))
        dec_p.append(per_call(lambda: HdrHistogram.decode(peer_text)))

    counts = {
        "ours_decode_ours": Histogram.decode(ours_text).total_count,
        "peer_decode_peer": HdrHistogram.decode(peer_text).get_total_count(),
        # Both speak the V2 format; cross-decoding checks that too.
        "ours_decode_peer": Histogram.decode(peer_text).total_count,
        "peer_decode_ours": HdrHistogram.decode(ours_text).get_total_count(),
    }
    return {
        "samples": n,
        "encode_s": {"ours": enc_o, "peer": enc_p},
        "decode_s": {"ours": dec_o, "peer": dec_p},
        "encoded_bytes": {"ours": len(ours_text), "peer": len(peer_text)},
        "decoded_total_counts": counts,
        "counts_agree": all(c == n for c in counts.values()),
    }


# ------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="runs per figure; the median is reported")
    ap.add_argument("--values", type=int, default=1_000_000, help="values recorded per C++/record_array run and held by the codec histogram")
    ap.add_argument("--python-values", type=int, default=200_000, help="values per Python-loop run (ours record() and hdrh record_value)")
    ap.add_argument("--codec-inner", type=int, default=20, help="encode/decode calls per timed run")
    ap.add_argument("--quick", action="store_true", help="fast smoke run: small sizes, 2 repeats")
    ap.add_argument("--json", metavar="PATH", help="also write every figure and sample as JSON")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 2)
        args.values = min(args.values, 200_000)
        args.python_values = min(args.python_values, 20_000)
        args.codec_inner = min(args.codec_inner, 3)
    if args.repeats < 1 or args.values < 1 or args.python_values < 1 or args.codec_inner < 1:
        ap.error("--repeats, --values, --python-values and --codec-inner must be >= 1")
    args.python_values = min(args.python_values, args.values)

    ctx = machine_context()
    print("HDR histogram benchmark: loadgen vs hdrhistogram (hdrh)")
    print(
        f"machine: CPU {ctx['cpu']}, nproc {ctx['nproc']}, Python {ctx['python']}, "
        f"numpy {ctx['numpy']}, hdrhistogram {ctx['hdrhistogram']}, loadgen {ctx['loadgen']}"
    )
    print(
        f"settings: repeats {args.repeats} (median reported), values {args.values:,}, "
        f"python-loop values {args.python_values:,}, codec calls/run {args.codec_inner}, "
        f"seed {SEED}{', QUICK' if args.quick else ''}"
    )
    sys.stdout.flush()

    rng = np.random.default_rng(SEED)
    values = np.ascontiguousarray(rng.lognormal(mean=13, sigma=1, size=args.values).astype(np.int64))
    py_values = values[: args.python_values]

    t0 = time.perf_counter()
    modes, parallelism = bench_cxx_modes(values, args.repeats)
    rec_array = bench_record_array(values, args.repeats)
    loops = bench_python_loops(py_values, args.repeats)
    codec = bench_codec(values, args.repeats, args.codec_inner)
    elapsed = time.perf_counter() - t0

    med = lambda xs: median_of(xs)  # noqa: E731
    cxx_1 = med(modes["single_writer"]["1"])
    arr = med(rec_array)
    py_ours = med(loops["ours"])
    py_peer = med(loops["peer"])
    enc_o = med(codec["encode_s"]["ours"]) * 1e9
    enc_p = med(codec["encode_s"]["peer"]) * 1e9
    dec_o = med(codec["decode_s"]["ours"]) * 1e9
    dec_p = med(codec["decode_s"]["peer"]) * 1e9
    size_o = codec["encoded_bytes"]["ours"]
    size_p = codec["encoded_bytes"]["peer"]

    # (case, ours, peer or None, unit) ; ratio = peer / ours
    rows = [
        ("record, C++ loop (time_record_ns single_writer, 1 thr) vs hdrh record_value", cxx_1, py_peer, "ns"),
        ("record_array, per value vs hdrh record_value", arr, py_peer, "ns"),
        ("record() in a Python loop vs hdrh record_value", py_ours, py_peer, "ns"),
    ]
    for mode in ("single_writer", "atomic_shared", "sharded"):
        for thr in ("1", "2"):
            rows.append((f"C++ {mode}, {thr} thread{'s' if thr == '2' else ''} (ns/record/thread)", med(modes[mode][thr]), None, "ns"))
    rows += [
        (f"encode() of {codec['samples']:,} samples", enc_o, enc_p, "ns"),
        ("decode() of the encoded text", dec_o, dec_p, "ns"),
        ("encoded size (base64)", float(size_o), float(size_p), "B"),
    ]

    case_w = max(len(r[0]) for r in rows)
    header = f"{'case':<{case_w}}  {'ours':>11}  {'peer (hdrh)':>11}  {'peer/ours':>15}"
    print()
    print(header)
    print("-" * len(header))
    for case, ours_v, peer_v, unit in rows:
        o = fmt_ns(ours_v) if unit == "ns" else f"{int(ours_v):,} B"
        if peer_v is None:
            p, r = "-", "-"
        else:
            p = fmt_ns(peer_v) if unit == "ns" else f"{int(peer_v):,} B"
            ratio = peer_v / ours_v
            if unit != "ns":
                r = f"{ratio:.2f}x"
            elif round(ratio, 2) == 1.0:
                r = "1.00x (par)"
            elif ratio > 1:
                r = f"{ratio:.2f}x faster"
            else:
                r = f"{ratio:.2f}x (slower)"
        print(f"{case:<{case_w}}  {o:>11}  {p:>11}  {r:>15}")

    print()
    print("thread-safety schemes (C++ loop, ns per record per thread; median [min-max]):")
    print(f"  {'mode':<14} {'1 thread':>22} {'2 threads':>22}  2thr/1thr  1thr/single_writer  2thr parallelism")
    for mode in ("single_writer", "atomic_shared", "sharded"):
        s1, s2 = modes[mode]["1"], modes[mode]["2"]
        m1, m2 = med(s1), med(s2)
        c1 = f"{m1:.2f} [{min(s1):.2f}-{max(s1):.2f}]"
        c2 = f"{m2:.2f} [{min(s2):.2f}-{max(s2):.2f}]"
        print(
            f"  {mode:<14} {c1:>22} {c2:>22}  {m2 / m1:8.2f}x  {m1 / cxx_1:16.2f}x  "
            f"{med(parallelism[mode]['2']):16.2f}"
        )
    par2 = med([x for m in modes for x in parallelism[m]["2"]])
    print(
        f"  (parallelism = process CPU time / wall time of the 2-thread calls, median {par2:.2f}: "
        f"~2 means both threads had a CPU,\n   ~1 means they shared one and the 2-thread "
        f"figures are time-sliced, not contention)"
    )

    headline = {
        "cxx_loop_vs_hdrh_record_value": py_peer / cxx_1,
        "record_array_vs_hdrh_record_value": py_peer / arr,
        "python_record_vs_hdrh_record_value": py_peer / py_ours,
        "encode_peer_over_ours": enc_p / enc_o,
        "decode_peer_over_ours": dec_p / dec_o,
    }
    print()
    print("headline (median; peer time / our time):")
    print(f"  record, C++ loop vs hdrh record_value:    {cxx_1:.2f} ns vs {py_peer:.1f} ns  -> {headline['cxx_loop_vs_hdrh_record_value']:.0f}x faster")
    print(f"  record_array vs hdrh record_value:        {arr:.2f} ns vs {py_peer:.1f} ns  -> {headline['record_array_vs_hdrh_record_value']:.0f}x faster")
    print(f"  record() vs record_value, Python loops:   {py_ours:.1f} ns vs {py_peer:.1f} ns  -> {headline['python_record_vs_hdrh_record_value']:.1f}x faster")
    print(f"  encode:                                   {fmt_ns(enc_o)} vs {fmt_ns(enc_p)}  -> {headline['encode_peer_over_ours']:.2f}x")
    print(f"  decode:                                   {fmt_ns(dec_o)} vs {fmt_ns(dec_p)}  -> {headline['decode_peer_over_ours']:.2f}x")
    goal = cxx_1 < 10 and arr < 10 and headline["record_array_vs_hdrh_record_value"] >= 50
    print(
        f"  goal (a few ns per record, >= 50x hdrh record_value): "
        f"{'met' if goal else 'NOT met'}"
    )
    counts = codec["decoded_total_counts"]
    print(
        f"  decoded total counts (ours/ours, hdrh/hdrh, ours/hdrh text, hdrh/ours text): "
        f"{counts['ours_decode_ours']:,}, {counts['peer_decode_peer']:,}, "
        f"{counts['ours_decode_peer']:,}, {counts['peer_decode_ours']:,} "
        f"-> {'agree' if codec['counts_agree'] else 'MISMATCH'}"
    )
    print(f"(benchmarks took {elapsed:.1f} s)")

    if args.json:
        doc = {
            "benchmark": "bench/bench_histogram.py",
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
            "machine": ctx,
            "settings": {
                "repeats": args.repeats,
                "values": args.values,
                "python_values": args.python_values,
                "codec_inner": args.codec_inner,
                "quick": args.quick,
                "seed": SEED,
                "histogram": {"lowest": LOWEST, "highest": HIGHEST, "significant_figures": DIGITS},
            },
            "medians_ns": {
                "record_cxx_loop_single_writer_1": cxx_1,
                "record_array_per_value": arr,
                "record_python_loop_ours": py_ours,
                "record_value_python_loop_hdrh": py_peer,
                "modes_per_record_per_thread": {
                    m: {t: med(s) for t, s in d.items()} for m, d in modes.items()
                },
                "parallelism_cpu_over_wall": {
                    m: {t: med(s) for t, s in d.items()} for m, d in parallelism.items()
                },
                "encode_ours": enc_o,
                "encode_hdrh": enc_p,
                "decode_ours": dec_o,
                "decode_hdrh": dec_p,
            },
            "encoded_bytes": codec["encoded_bytes"],
            "ratios_peer_over_ours": headline,
            "goal_met": goal,
            "decoded_total_counts": counts,
            "counts_agree": codec["counts_agree"],
            "samples": {
                "modes_ns": modes,
                "modes_parallelism": parallelism,
                "record_array_ns": rec_array,
                "python_loop_ns": loops,
                "encode_s": codec["encode_s"],
                "decode_s": codec["decode_s"],
            },
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"wrote {args.json}")

    if not codec["counts_agree"]:
        print("error: decoded total counts disagree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
