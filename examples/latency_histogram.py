"""Record simulated inference latencies in loadgen's native HDR histogram.

Simulates a model server whose service time is lognormal with occasional slow
outliers, records ten one-second intervals of latencies (ns) with record_array, writes
them as an HdrHistogram interval log, reads the log back, and prints the merged
percentiles. The log is readable by HdrHistogram's own tools and `loadgen hlog`.

    python examples/latency_histogram.py [--output latency.hlog] [--seed 1]
"""

import argparse
import time

import numpy as np

import loadgen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="latency.hlog", help="interval log to write")
    parser.add_argument("--seed", type=int, default=1, help="random seed")
    parser.add_argument("--intervals", type=int, default=10, help="number of 1 s intervals")
    parser.add_argument("--qps", type=int, default=200_000, help="queries per interval")
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    start = time.time()
    total = loadgen.Histogram()
    recorded_ns = 0.0
    with open(args.output, "w", encoding="utf-8") as f:
        log = loadgen.HistogramLogWriter(f)
        log.write_header(start)
        for i in range(args.intervals):
            # 2 ms median service time, and 0.5% of queries stuck behind a 40 ms stall.
            latency_ns = rng.lognormal(mean=np.log(2e6), sigma=0.35, size=args.qps)
            stalled = rng.random(args.qps) < 0.005
            latency_ns[stalled] += rng.uniform(0, 40e6, stalled.sum())
            interval = loadgen.Histogram()
            t0 = time.perf_counter_ns()
            interval.record_array(np.rint(latency_ns).astype(np.int64))
            recorded_ns += time.perf_counter_ns() - t0
            log.write_interval(interval, start_s=float(i), interval_s=1.0)
            total += interval

    merged = loadgen.Histogram()
    for entry in loadgen.read_log(args.output):
        merged += entry.histogram
    assert merged == total, "the log did not round-trip"

    print(f"recorded {total.total_count:,} latencies "
          f"({recorded_ns / total.total_count:.1f} ns per value), log: {args.output}")
    print(f"{'min':>8}: {total.min / 1e6:9.3f} ms")
    for p, v in total.percentiles().items():
        print(f"{'p' + format(p, 'g'):>8}: {v / 1e6:9.3f} ms")
    print(f"{'max':>8}: {total.max / 1e6:9.3f} ms")
    print(f"{'mean':>8}: {total.mean / 1e6:9.3f} ms (stddev {total.stddev / 1e6:.3f} ms)")


if __name__ == "__main__":
    main()
