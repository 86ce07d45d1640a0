"""A harness in the MLPerf LoadGen style, run on loadgen.mlperf (or on mlperf_loadgen).

The SUT is a thread that "infers" by squaring each sample's number, in batches of up to
64 samples that take --service-us per sample, and hands the result bytes back, as a real
harness hands back model outputs.

    python examples/mlperf_harness.py                      # Server, performance run
    python examples/mlperf_harness.py --scenario Offline --mode AccuracyOnly
    python examples/mlperf_harness.py --module mlperf_loadgen   # the same on MLPerf's module

Logs go to ./mlperf_logs (mlperf_log_summary.txt, _detail.txt, _accuracy.json).
"""

from __future__ import annotations

import argparse
import importlib
import os
import queue
import threading
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", default="loadgen.mlperf", help="loadgen.mlperf or mlperf_loadgen")
    ap.add_argument("--scenario", default="Server",
                    choices=["SingleStream", "MultiStream", "Server", "Offline"])
    ap.add_argument("--mode", default="PerformanceOnly",
                    choices=["PerformanceOnly", "AccuracyOnly", "SubmissionRun"])
    ap.add_argument("--qps", type=float, default=2000.0, help="Server target QPS")
    ap.add_argument("--service-us", type=float, default=100.0, help="service time per sample")
    ap.add_argument("--outdir", default="mlperf_logs")
    args = ap.parse_args()
    lg = importlib.import_module(args.module)

    dataset = np.arange(1024, dtype=np.int64)      # the QSL: sample i is the number i
    loaded: dict[int, np.int64] = {}
    work: queue.Queue = queue.Queue()

    def worker() -> None:
        while True:
            query = work.get()
            if query is None:
                return
            for start in range(0, len(query), 64):
                batch = query[start : start + 64]
                time.sleep(args.service_us * len(batch) / 1e6)
                outputs = [np.array([loaded[s.index] ** 2], dtype=np.int64) for s in batch]
                responses = [lg.QuerySampleResponse(s.id, out.ctypes.data, out.nbytes)
                             for s, out in zip(batch, outputs)]
                lg.QuerySamplesComplete(responses)  # outputs stay alive until this returns

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()

    def issue_query(query_samples) -> None:
        work.put(list(query_samples))

    def flush_queries() -> None:
        pass

    def load_samples(indices) -> None:
        for i in indices:
            loaded[i] = dataset[i]

    def unload_samples(indices) -> None:
        for i in indices:
            loaded.pop(i, None)

    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, args.scenario)
    settings.mode = getattr(lg.TestMode, args.mode)
    settings.server_target_qps = args.qps
    settings.server_target_latency_ns = 20_000_000
    settings.offline_expected_qps = 12000
    settings.single_stream_expected_latency_ns = 200_000
    settings.multi_stream_expected_latency_ns = 1_000_000
    settings.min_duration_ms = 2000
    settings.min_query_count = 100

    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = args.outdir
    log_settings.enable_trace = False
    os.makedirs(args.outdir, exist_ok=True)

    sut = lg.ConstructSUT(issue_query, flush_queries)
    qsl = lg.ConstructQSL(len(dataset), 256, load_samples, unload_samples)
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
    finally:
        work.put(None)
        thread.join()
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    with open(os.path.join(args.outdir, "mlperf_log_summary.txt")) as f:
        print(f.read())


if __name__ == "__main__":
    main()
