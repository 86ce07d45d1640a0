"""The default of every setting, written once.

:class:`loadgen.engine.EngineSettings`, :class:`loadgen.options.RunOptions`, the help text
of ``loadgen run`` and the scenarios all read their defaults from here, so that a default
changes in one place. A leaf module (it imports nothing), like :mod:`loadgen.units`, so
that every stage of the pipeline may use it without reaching back up.
"""

from __future__ import annotations

# --------------------------------------------------------------------------- the engine
MODE = "poisson"
CONCURRENCY = 1
MAX_IN_FLIGHT = 0
SAMPLES_PER_QUERY = 1
SAMPLE_COUNT = 1024
SAMPLE_ORDER = "random"
SEED = 0
SPIN_US = 100.0
NETWORK_SPIN_US = 0.0  # a network target's own jitter is larger than what spinning saves
GRACE_S = 10.0
INTERVAL_S = 1.0
SIGNIFICANT_FIGURES = 3
BATCH_MAX = 4096
CONSUMER_SPIN_US = 50.0

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

# ---------------------------------------------------------------------------- network
READY_TIMEOUT_S = 30.0
OPEN_LOOP_CONNECTIONS = 64  # an uncapped open loop
GRPC_CONTENTS = "raw"
MAX_TOKENS = 128
PROMPT_WORDS = 64
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a response body (a stream: each event) past this fails
