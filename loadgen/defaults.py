"""The default of every setting, written once.

``loadgen run``'s option table (:data:`loadgen.options.OPTION_SPECS`) names these as its
defaults, and :class:`loadgen.options.RunOptions`' fields and the help text of ``loadgen
run`` are made from that table; :class:`loadgen.engine.EngineSettings`,
:class:`loadgen.net.NetOptions`, :class:`loadgen.llm.LlmOptions` and the scenarios read
the same names, so that a default changes in one place. A leaf module (it imports
nothing), like :mod:`loadgen.units`, so that every stage of the pipeline may use it
without reaching back up.
"""

from __future__ import annotations

# --------------------------------------------------------------------------- the engine
MODE = "poisson"
BURSTINESS = 1.0  # the gamma shape of Poisson gaps: 1 is the exponential (Poisson) stream
CONCURRENCY = 1
MAX_IN_FLIGHT = 0
SAMPLES_PER_QUERY = 1
SAMPLE_COUNT = 1024
SAMPLE_ORDER = "random"
SEED = 0


def sample_seed_of(seed: int) -> int:
    """The seed of the sample order (and of an OpenAI run's synthetic prompts) when
    ``--sample-seed`` is not given: the base seed + 1, so that the two streams differ."""
    return (seed + 1) % 2**64


SPIN_US = 100.0
NETWORK_SPIN_US = 0.0  # a network target's own jitter is larger than what spinning saves
GRACE_S = 10.0
WARMUP_S = 0.0
GPUS = "all"  # --gpus: sample every GPU NVML sees (within CUDA_VISIBLE_DEVICES)
GPU_SAMPLE_MS = 100.0
WORKERS = 1
START_TOLERANCE_S = 1.0  # a worker starting later than --start-at by more is invalid
MAX_WORKERS = 1 << 16
INTERVAL_S = 1.0
SIGNIFICANT_FIGURES = 3
BATCH_MAX = 4096
HIGHEST_LATENCY_NS = 3_600_000_000_000  # 1 h: the top of the latency histograms' range
MAX_ERROR_MESSAGES = 10  # error messages a run keeps whatever their kinds (and the first of each later kind)
CONSUMER_SPIN_US = 50.0
# The scheduler slice the issue thread and a native client's I/O threads ask the kernel
# for (Linux 6.12+): short enough that they preempt a CPU-bound neighbour when they wake.
SCHED_SLICE_US = 100.0
# --ramp-up-s auto: a closed loop of RAMP_UP_MIN_STREAMS streams or more starts them over
# RAMP_UP_S_PER_STREAM each, at most RAMP_UP_MAX_S; fewer start at once.
RAMP_UP_MIN_STREAMS = 64
RAMP_UP_S_PER_STREAM = 0.001
RAMP_UP_MAX_S = 1.0

# ------------------------------------------------------------------------- the scenarios
SCENARIO = "server"
SUT = "demo"
TARGET_QPS = 1000.0  # server, constant, poisson
LATENCY_BOUND_MS = 10.0  # server
LATENCY_PERCENTILE = 99.0
DURATION_S = 10.0  # the timed scenarios (constant, poisson, concurrency)
MLPERF_MIN_DURATION_S = 10.0
MLPERF_MIN_QUERY_COUNT = 100
SINGLESTREAM_PERCENTILE = 90.0
MULTISTREAM_SAMPLES_PER_QUERY = 8
OFFLINE_EXPECTED_QPS = 10_000.0  # offline: the expected rate that sizes the run
RAMP = "step"
TRACE_UNIT = "ms"

# --------------------------------------------------------------------------- validity
MAX_ERROR_RATE = 0.0
MAX_ISSUE_DELAY_MS = 1.0
MAX_LATENESS_SHARE = 0.1  # a late generator invalidates a run past this share of the p99 latency
MIN_OFFERED_FRACTION = 0.95  # ... or when it offered less than this share of the scheduled load

# ---------------------------------------------------------------------------- network
READY_TIMEOUT_S = 30.0
#: How long the native client's TLS check before a run (one handshake) waits, in seconds.
TLS_CHECK_TIMEOUT_S = 10.0
OPEN_LOOP_CONNECTIONS = 64  # an uncapped open loop
OPEN_LOOP_GRPC_CALLS = 4096  # an uncapped open loop on the native gRPC client: calls in flight at most
CONNECTIONS = 0  # 0: sized from the load (the concurrency, the in-flight cap, or the above)
HTTP_ENGINE = "auto"  # native where it can, else asyncio
GRPC_ENGINE = "auto"  # native where it can, else grpcio (its public API)
IO_THREADS = 1  # a native client's epoll threads
GRPC_CONTENTS = "raw"
MAX_TOKENS = 128
PROMPT_WORDS = 64
DATASET_MIN_INPUT_TOKENS = 0
DATASET_MAX_INPUT_TOKENS = 0  # 0: no limit
SHARED_PREFIX_TOKENS = 0
PREFIX_GROUPS = 1
PREFIX_HIT_RATIO = 1.0
TURNS = 1  # user turns per conversation
IMAGES_PER_REQUEST = 1  # --images: image parts per chat request
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a response body (a stream: each event) past this fails
MAX_SERVER_SERIES = 5000  # --server-metrics-url: series kept; those past it are counted, not kept

# ----------------------------------------------------------------------------- limits
# The ranges every value is checked against where it enters (flags, LOADGEN_* variables,
# the config file, EngineSettings), so that nothing overflows the core's signed 64-bit
# nanoseconds and counts, or asks for memory or a rate the engine cannot give.
MAX_TIME_S = 1e8  # ~3.2 years: any duration, minimum duration, timeout, grace, interval
MIN_DURATION_S = 1e-6  # 1 us: a run or ramp stage; anything shorter rounds to 0 ns
MIN_TIMEOUT_MS = 1e-3  # 1 us: a shorter per-query timeout rounds to 0 ns ("none")
MIN_INTERVAL_S = 1e-3  # 1 ms: a time series of at most 1000 points per second (or 0: none)
MAX_QUERY_COUNT = 10**12  # queries of one run (query_count, min_query_count)
MAX_TARGET_QPS = 1e8  # the engine issues tens of millions of queries per second at most
MAX_IN_FLIGHT_LIMIT = 1 << 24  # the engine's in-flight table holds at most 2**24 slots
MAX_CONCURRENCY = 1 << 20  # closed loop: queries in flight (the table holds twice as many)
MAX_SAMPLES_PER_QUERY = 1 << 23  # 64 MiB of sample indices in one query
MAX_SAMPLE_SLOTS = 1 << 27  # in-flight table slots x samples per query: 1 GiB of indices
MAX_SAMPLE_COUNT = (1 << 63) - 1  # a signed 64-bit index
MAX_SHUFFLED_SAMPLE_COUNT = 1 << 27  # sample_order "shuffled" keeps a permutation: 1 GiB
MAX_CPU = 8191  # the largest CPU number Linux supports (NR_CPUS <= 8192)
MIN_BURSTINESS = 0.01  # --burstiness: the gamma shape of Poisson gaps (1: exponential)
MAX_BURSTINESS = 1000.0
MAX_SPIN_US = 1e6  # 1 s: --spin-us and the dispatcher's spin
MAX_SCHED_SLICE_US = 1e5  # 100 ms: --sched-slice-us
MAX_SUT_DELAY_US = 3.6e9  # 1 h: a native SUT's service time, the latency histograms' range

# Live metrics (--metrics-port): where the server binds, and how long it lingers after a run.
METRICS_ADDR = "127.0.0.1"
METRICS_LINGER_S = 0.0
