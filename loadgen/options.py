"""The options of ``loadgen run``: one typed structure, its defaults, and where values come from.

Precedence, lowest first: defaults < config file (``--config``, TOML, keys equal the long
flag names) < ``LOADGEN_<FLAG_NAME>`` environment variables < command-line flags. Every
value is converted and checked the same way whatever its source, and an error names the
option and the allowed range.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from loadgen import defaults as D
from loadgen.files import CONFIG_LIMIT_BYTES, InputFileError, read_text
from loadgen.llm.dist import MAX_REQUEST_TOKENS
from loadgen.option_values import (OptionError, bool_value, choice_value, cpu_list_value, dist_value, float_value,
                                  gpus_value, header_list_value, input_list_value, int_value, json_object_value,
                                  label_list_value, model_mix_value, pin_value, price_value, ramp_up_value,
                                  raw_list_value, slo_list_value, storage_list_value, str_list_value, str_value,
                                  think_dist_value, tools_file_value, parse_labels, parse_stages)
from loadgen.units import TIME_UNITS, parse_duration_s, s_to_ms

__all__ = ["OptionError", "RunOptions", "OPTION_SPECS", "SWEEP_TABLE", "parse_labels", "parse_stages",
           "parse_duration_s", "read_config_table", "resolve", "unknown_environment"]


# ------------------------------------------------------------------------------ options

SCENARIO_NAMES = (
    "single-stream", "multi-stream", "server", "offline",
    "constant", "poisson", "concurrency", "ramp", "trace",
)


#: Where an option's help names its default: replaced by the default, written as
#: :func:`format_default` writes it.
DEFAULT_MARK = "{default}"


def format_default(value: Any) -> str:
    """A default as the help text shows it: numbers in their shortest form (``10``,
    ``0.1``), text as it is."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class OptionSpec:
    """One option of ``loadgen run``, declared once: the flag, the ``LOADGEN_*`` variable,
    the config key, the :class:`RunOptions` field and its default all come from here.

    Attributes:
        name: the attribute name; the flag is ``--name-with-dashes``.
        convert: reads and checks a value from any source (its type and range); a number's
            converter carries its unit (:attr:`unit`).
        help_text: the help, where :data:`DEFAULT_MARK` stands for the default
            (:attr:`help` fills it in).
        metavar: the value's name in the help.
        repeatable: the flag may be given several times (a list).
        flag_only: never from the config file or the environment (``--config`` itself).
        default: the value when the option is not given (the :class:`RunOptions` field's);
            None: the scenario or the target decides. A list (a repeatable option's) is
            copied for every RunOptions.
    """

    name: str
    convert: Callable[[Any], Any]
    help_text: str
    metavar: Optional[str] = None
    repeatable: bool = False
    flag_only: bool = False
    default: Any = None

    @property
    def help(self) -> str:
        """The help text, naming the default where :attr:`help_text` marks it."""
        return self.help_text.replace(DEFAULT_MARK, format_default(self.default))

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "LOADGEN_" + self.name.upper()

    @property
    def unit(self) -> str:
        """The unit of the option's values ("s", "ms", "us", "queries/s"; "" for none)."""
        return str(getattr(self.convert, "unit", ""))


_MAX_MS = s_to_ms(D.MAX_TIME_S)

OPTION_SPECS: Tuple[OptionSpec, ...] = (
    OptionSpec("scenario", choice_value(*SCENARIO_NAMES), "what to run (default: {default})", "NAME", default=D.SCENARIO),
    OptionSpec("sut", str_value, "system under test: demo[:workers=N,max_batch=N,service_us=X,per_item_us=X,sigma=X], "
               "null, sleep:<us>, python:MODULE:ATTR (MODULE may be a file path), or a server: "
               "http://HOST:PORT/v2/models/NAME/infer (KServe v2 REST), grpc://HOST:PORT/NAME (KServe v2 "
               "gRPC), openai+http://HOST:PORT/v1/completions, .../v1/chat/completions or .../v1/responses (streaming), "
               "or any http URL with --request-template (default: {default})", "SUT", default=D.SUT),
    OptionSpec("target_qps", float_value(0, D.MAX_TARGET_QPS, lo_open=True, unit="queries/s"), "arrival rate for server, constant, poisson; expected "
               f"rate for offline (default: {D.TARGET_QPS:g} for server/constant/poisson)", "QPS"),
    OptionSpec("latency_bound_ms", float_value(0, _MAX_MS, lo_open=True, unit="ms"), "latency bound at --latency-percentile; required "
               f"for server (default {D.LATENCY_BOUND_MS:g}), optional elsewhere", "MS"),
    OptionSpec("latency_percentile", float_value(0, 100, lo_open=True), "percentile of the metric and the bound "
               f"(default: {D.SINGLESTREAM_PERCENTILE:g} single-stream, {D.LATENCY_PERCENTILE:g} otherwise)", "P"),
    OptionSpec("duration_s", float_value(D.MIN_DURATION_S, D.MAX_TIME_S, unit="s"), f"stop issuing after this long (default: {D.DURATION_S:g} for all "
               "but offline, ramp and trace); on an MLPerf scenario, its minimum duration (with --min-duration-s, "
               "the longer of the two)", "S"),
    OptionSpec("query_count", int_value(1, D.MAX_QUERY_COUNT), "stop after this many queries", "N"),
    OptionSpec("min_duration_s", float_value(0, D.MAX_TIME_S, unit="s"), f"MLPerf scenarios: keep issuing at least this long, and until --min-query-count "
               f"queries (default {D.MLPERF_MIN_DURATION_S:g}; with --duration-s, the longer of the two)", "S"),
    OptionSpec("min_query_count", int_value(0, D.MAX_QUERY_COUNT), f"MLPerf scenarios: keep issuing until this many queries "
               f"(default {D.MLPERF_MIN_QUERY_COUNT})", "N"),
    OptionSpec("samples_per_query", int_value(1, D.MAX_SAMPLES_PER_QUERY, "64 MiB of sample indices per query"), f"samples per query (default: {D.MULTISTREAM_SAMPLES_PER_QUERY} multi-stream, else {D.SAMPLES_PER_QUERY})", "N"),
    OptionSpec("sample_count", int_value(1, D.MAX_SAMPLE_COUNT, "a signed 64-bit index"), "size of the sample set indices are drawn from (default {default})", "N", default=D.SAMPLE_COUNT),
    OptionSpec("sample_order", choice_value("random", "sequential", "shuffled"), "how samples are drawn (default {default})", default=D.SAMPLE_ORDER),
    OptionSpec("concurrency", int_value(1, D.MAX_CONCURRENCY), "concurrency scenario: queries in flight (default {default})", "N", default=D.CONCURRENCY),
    OptionSpec("max_in_flight", int_value(0, D.MAX_IN_FLIGHT_LIMIT, "the in-flight table's size"), "server/constant/poisson/ramp/trace: cap on outstanding queries (0 = none; default {default})", "N", default=D.MAX_IN_FLIGHT),
    OptionSpec("stages", str_value, "ramp: stages like 10s:100,30s:1000 or 20s:100-1000", "STAGES"),
    OptionSpec("ramp", choice_value("step", "linear"), "ramp: 'D:Q' stages hold their rate (step) or ramp to it "
               "from the previous stage's (linear) (default {default})", default=D.RAMP),
    OptionSpec("poisson_arrivals", bool_value, "ramp: Poisson arrivals within stages instead of even spacing", default=False),
    OptionSpec("burstiness", float_value(D.MIN_BURSTINESS, D.MAX_BURSTINESS), "poisson, ramp with --poisson-arrivals: "
               "gamma-distributed gaps of shape B (coefficient of variation 1/sqrt(B)); {default} (default) is Poisson, "
               "< 1 burstier, > 1 smoother", "B", default=D.BURSTINESS),
    OptionSpec("trace", str_value, "trace: file of arrival offsets, one per line, or a .npy of ns", "FILE"),
    OptionSpec("trace_unit", choice_value(*TIME_UNITS), "unit of a text trace (default {default})", default=D.TRACE_UNIT),
    OptionSpec("seed", int_value(0, 2**64 - 1), "base seed; the per-stream seeds default to it (default {default})", "N", default=D.SEED),
    OptionSpec("schedule_seed", int_value(0, 2**64 - 1), "seed of the arrival schedule (default: --seed)", "N"),
    OptionSpec("sample_seed", int_value(0, 2**64 - 1), "seed of the sample order (default: --seed + 1)", "N"),
    OptionSpec("spin_us", float_value(0, D.MAX_SPIN_US, unit="us"), f"issue thread (open loop on a native client: at least 20): spin this long before each scheduled time (default {D.SPIN_US:g}; "
               f"{D.NETWORK_SPIN_US:g} for network targets, whose own jitter is larger than what spinning saves)", "US"),
    OptionSpec("pin_cpus", cpu_list_value, "pin the issue thread to these CPUs, like 2 or 0,2-3", "CPUS", default=[]),
    OptionSpec("gpus", gpus_value, "GPUs to sample with NVML during the run: {default} (default; honours CUDA_VISIBLE_DEVICES and "
               "NVIDIA_VISIBLE_DEVICES), none, indexes like 0,1, or UUIDs; the result's 'gpu' section", "all|none|LIST",
               default=D.GPUS),
    OptionSpec("gpu_sample_ms", float_value(10, 60000, unit="ms"), "GPU sampling period "
               "(default {default}; utilization and power also from the driver's own buffer)", "MS", default=D.GPU_SAMPLE_MS),
    OptionSpec("pin", pin_value, "place loadgen's threads: auto puts the issue thread and the dispatcher on separate "
               "physical cores (on the sampled GPUs' NUMA node), away from an in-process SUT and a native client's "
               "I/O threads; CPUS plans within "
               "those CPUs; the plan goes in the result's 'placement' (see 'loadgen env')", "auto|CPUS"),
    OptionSpec("inline_dispatch", bool_value, "Python SUTs, open loop: issue on the dispatcher thread itself "
               "(one busy thread, no hand-off; steadier tails on small machines)", default=False),
    OptionSpec("timeout_ms", float_value(D.MIN_TIMEOUT_MS, _MAX_MS, unit="ms"), "per-query timeout, measured like latency from the "
               "scheduled time (default: none)", "MS"),
    OptionSpec("grace_s", float_value(0, D.MAX_TIME_S, unit="s"), "wait this long for outstanding queries at the end (default {default})", "S", default=D.GRACE_S),
    OptionSpec("interval_s", float_value(0, D.MAX_TIME_S, unit="s", zero_or_min=D.MIN_INTERVAL_S), "time-series interval (default {default}; 0 = none)", "S", default=D.INTERVAL_S),
    OptionSpec("significant_figures", int_value(1, 5), "histogram precision in decimal digits (default {default})", "N", default=D.SIGNIFICANT_FIGURES),
    OptionSpec("max_error_rate", float_value(0, 1), "invalid when (failed + timed out) / issued exceeds this "
               "(default {default})", "FRACTION", default=D.MAX_ERROR_RATE),
    OptionSpec("max_issue_delay_ms", float_value(0, _MAX_MS, lo_open=True, unit="ms"), "a p99 issue delay above this is "
               "generator lateness: invalid as generator overload when it is also above --max-lateness-share of the "
               "p99 latency or the offered load fell short of the schedule, else a warning (default "
               "{default})", "MS", default=D.MAX_ISSUE_DELAY_MS),
    OptionSpec("max_lateness_share", float_value(0, 1), "the share of the p99 latency that the p99 issue delay may be "
               "before a late generator makes the run invalid (default {default})", "FRACTION",
               default=D.MAX_LATENESS_SHARE),
    OptionSpec("input", input_list_value, "network: a model input NAME:DTYPE:SHAPE (like INPUT0:FP32:1x16), instead "
               "of the model's metadata; one per input (repeatable)", "SPEC", repeatable=True, default=[]),
    OptionSpec("payload", str_value, "network: request data: .npy/.npz of samples (first axis), or .jsonl of request "
               "bodies sent as written (default: synthetic tensors from the metadata, seeded by --seed)", "FILE"),
    OptionSpec("request_template", str_value, "network: JSON file describing requests to any HTTP JSON API "
               "(method, path, headers, body with {{sample}} placeholders, check)", "FILE"),
    OptionSpec("header", header_list_value, "network: extra request header 'Name: value' (repeatable); values of "
               "Authorization, cookies and --secret-header names are redacted from results and logs",
               "HEADER", repeatable=True, default=[]),
    OptionSpec("secret_header", raw_list_value, "network: a further header name whose value is redacted (repeatable)",
               "NAME", repeatable=True, default=[]),
    OptionSpec("ca_file", str_value, "network: CA bundle to verify the server's TLS certificate", "FILE"),
    OptionSpec("insecure", bool_value, "network: do not verify the server's TLS certificate", default=False),
    OptionSpec("connections", int_value(0, 1 << 16), "network: connections (HTTP) or channels (gRPC) to open "
               f"(default {{default}}: the concurrency or --max-in-flight; {D.OPEN_LOOP_CONNECTIONS} for an uncapped open "
               "loop)", "N", default=D.CONNECTIONS),
    OptionSpec("ready_timeout_s", float_value(0, D.MAX_TIME_S, unit="s"), "network: wait this long for the server to be ready before the run; "
               "exit 2 if it is not (default {default})", "S", default=D.READY_TIMEOUT_S),
    OptionSpec("max_response_bytes", int_value(1), "network: fail a request whose response body is larger (a "
               "stream's: each event) as response_too_large and close its connection "
               "(default {default}, 64 MiB)", "BYTES", default=D.MAX_RESPONSE_BYTES),
    OptionSpec("no_response_check", bool_value, "network: do not check responses (by default the status and, for "
               "KServe, the output names, datatypes and shapes are checked)", default=False),
    OptionSpec("http_engine", choice_value("auto", "native", "asyncio"), "network: the HTTP/1.1 client: native (KServe "
               "REST, templates, OpenAI; http:// and https://), asyncio, or auto (native where it can; "
               "default {default})",
               "ENGINE", default=D.HTTP_ENGINE),
    OptionSpec("io_threads", int_value(1, 256), "network, native clients: epoll threads (default {default})", "N",
               default=D.IO_THREADS),
    OptionSpec("grpc_engine", choice_value("auto", "native", "grpcio", "callback", "asyncio"), "gRPC: the client: native "
               "(HTTP/2 in the core; grpc:// and grpcs://), grpcio (grpcio's public API), or auto (native where it "
               "can, else grpcio; default {default}); callback and asyncio mean grpcio", "ENGINE", default=D.GRPC_ENGINE),
    OptionSpec("grpc_contents", choice_value("raw", "typed"), "gRPC: how tensors are sent: raw (raw_input_contents) "
               "or typed (typed contents) (default {default})", default=D.GRPC_CONTENTS),
    OptionSpec("model", model_mix_value, "OpenAI: the model name (default: the first the server lists at /v1/models), "
               "or a mix NAME=WEIGHT,NAME=WEIGHT,... whose requests' models are drawn by weight with the sample "
               "seed; the result's network.models has each model's counts, latency and TTFT", "NAME[=W],..."),
    OptionSpec("max_tokens", int_value(1, MAX_REQUEST_TOKENS, "what servers' 32-bit token counts hold"), "OpenAI: max_tokens of synthetic requests (default {default})", "N", default=D.MAX_TOKENS),
    OptionSpec("prompt_words", int_value(1), "OpenAI: words per synthetic prompt (default {default})", "N", default=D.PROMPT_WORDS),
    OptionSpec("dataset", str_value, "OpenAI: prompts from FILE: JSON lines of {\"prompt\"} or {\"messages\"} (optional "
               "max_tokens), or ShareGPT JSON (see 'LLM workloads')", "FILE"),
    OptionSpec("dataset_min_input_tokens", int_value(0), "OpenAI: --dataset: skip prompts shorter than N input tokens "
               "(default {default})", "N", default=D.DATASET_MIN_INPUT_TOKENS),
    OptionSpec("dataset_max_input_tokens", int_value(0), "OpenAI: --dataset: skip prompts longer than N input tokens "
               "(0 = no limit; default {default})", "N", default=D.DATASET_MAX_INPUT_TOKENS),
    OptionSpec("input_tokens", dist_value, "OpenAI: synthetic prompt lengths: 512, 128:1024, mean=512,sd=128 or "
               "lognormal:mean=512,sd=128 (default: --prompt-words)", "DIST"),
    OptionSpec("output_tokens", dist_value, "OpenAI: max_tokens per request from DIST, like --input-tokens "
               "(default: --max-tokens)", "DIST"),
    OptionSpec("shared_prefix_tokens", int_value(0), "OpenAI: synthetic prompts start with a K-token prefix shared "
               "by their group (default {default})", "K", default=D.SHARED_PREFIX_TOKENS),
    OptionSpec("prefix_groups", int_value(1), "OpenAI: --shared-prefix-tokens: sample i uses group i % G's prefix "
               "(default {default})", "G", default=D.PREFIX_GROUPS),
    OptionSpec("prefix_hit_ratio", float_value(0, 1), "OpenAI: --shared-prefix-tokens: the share of samples that "
               "start with a prefix of the groups' pool, drawn with the sample seed; the others start with a "
               "fresh prefix of K tokens shared with no other (default {default})", "R", default=D.PREFIX_HIT_RATIO),
    OptionSpec("tokenizer", str_value, "OpenAI: a local Hugging Face tokenizer (tokenizer.json, its directory, or a "
               "cached name) for exact prompt lengths", "PATH_OR_NAME"),
    OptionSpec("ignore_eos", bool_value, "OpenAI: send \"ignore_eos\": true and \"min_tokens\" = max_tokens (vLLM) "
               "for exact output lengths", default=False),
    OptionSpec("turns", int_value(1, 1024), "OpenAI chat: N user turns per conversation (a ShareGPT dataset: up to N "
               "human turns each), each sent with the history after the previous reply plus --think-time-ms; "
               "conversations start in the closed loop or at an open loop's arrivals (default {default})", "N",
               default=D.TURNS),
    OptionSpec("think_time_ms", think_dist_value, "OpenAI chat, --turns: milliseconds between a reply and the next "
               "turn, drawn from DIST like --input-tokens (0 allowed; default 0)", "DIST"),
    OptionSpec("images", str_value, "OpenAI chat: each request's user message gets --images-per-request images "
               "from DIR (.png, .jpg, .jpeg, .webp, .gif; read and base64-encoded before the run, drawn with the "
               "sample seed; a conversation's first turn only); llm.images counts what was sent", "DIR"),
    OptionSpec("images_per_request", int_value(1, 64), "OpenAI chat, --images: image parts per request "
               "(default {default})", "N", default=D.IMAGES_PER_REQUEST),
    OptionSpec("extra_body", json_object_value, "OpenAI: JSON object merged into every request body", "JSON"),
    OptionSpec("tools", tools_file_value, "OpenAI chat and responses: every request carries the tools of FILE (an "
               "OpenAI tools array); tool calls are counted, and with --turns their results are fed back "
               "(see 'Tool calls')", "FILE"),
    OptionSpec("tool_choice", str_value, "OpenAI, --tools: the requests' tool_choice: auto, none, required or a "
               "function's name (default auto)", "CHOICE"),
    OptionSpec("no_stream", bool_value, "OpenAI: \"stream\": false; output tokens from the response's usage, no TTFT",
               default=False),
    OptionSpec("server_metrics_url", str_value, "scrape this Prometheus endpoint before, every --interval-s during, "
               "and after the run; the counters' deltas and the gauges' first/last/min/max/mean (per run and "
               "interval) go in the result", "URL"),
    OptionSpec("server_stats_url", str_value, "Triton: read the model's statistics from this HTTP endpoint "
               "(http://HOST:PORT, Triton's HTTP port) when measuring begins and after the run; the server's "
               "queue and compute times per request go in the result's 'server_breakdown' (default: the --sut's "
               "own server when it is Triton, over HTTP or gRPC as the --sut is; none: off)", "URL"),
    OptionSpec("metrics_port", int_value(0, 65535), "serve live Prometheus metrics on this port during the run "
               "(0: a free port, printed; see 'Live metrics' in the README)", "PORT"),
    OptionSpec("metrics_addr", str_value, "the address --metrics-port listens on (default {default}; "
               "0.0.0.0 for every interface, as in a pod)", "ADDR", default=D.METRICS_ADDR),
    OptionSpec("metrics_linger_s", float_value(0, D.MAX_TIME_S, unit="s"), "keep serving the final metrics this long "
               "after the run, for a scraper that comes between two scrapes (default {default})", "S",
               default=D.METRICS_LINGER_S),
    OptionSpec("output", str_value, "write result.json, summary.txt, latency.hlog and results.csv here (checked "
               "before the run; a later run replaces the first three and adds a row to results.csv); a URL "
               "(s3://bucket/prefix, gs://, az://, ...; needs loadgen[s3]) is written locally, then uploaded with "
               "a _SUCCESS marker last", "DIR|URL"),
    OptionSpec("storage_option", storage_list_value, "an fsspec filesystem option for a --output URL, like "
               "endpoint_url=http://127.0.0.1:9000 (repeatable; credentials: the AWS_* environment variables)",
               "KEY=VALUE", repeatable=True, default=[]),
    OptionSpec("record_requests", str_value, "write one record per query (times, latency, status, error, sample, "
               "tokens, a stream's inter-token gaps) to FILE: JSON lines, or Parquet for a .parquet name (needs pyarrow); sweep and "
               "find-peak write FILE's name in each run's folder", "FILE"),
    OptionSpec("no_html", bool_value, "do not write report.html (the HTML report) in --output (run, sweep, merge)",
               default=False),
    OptionSpec("json", bool_value, "print the result JSON on stdout and nothing else there", default=False),
    OptionSpec("quiet", bool_value, "print nothing but errors", default=False),
    OptionSpec("fail_if", str_list_value, "exit 1 when EXPR holds, e.g. 'p99>5ms', 'error_rate>0.01' (repeatable)",
               "EXPR", repeatable=True, default=[]),
    OptionSpec("require", str_list_value, "exit 1 unless EXPR holds, e.g. 'p99<5ms', 'qps>=1000' (repeatable)",
               "EXPR", repeatable=True, default=[]),
    OptionSpec("slo", slo_list_value, "a service level objective NAME<=VALUE with NAME ttft, tpot or latency "
               "and a time unit, like ttft<=200ms (repeatable); the result's 'goodput': requests/s meeting every "
               "one, and the fraction meeting each", "NAME<=VALUE", repeatable=True, default=[]),
    OptionSpec("label", label_list_value, "tag the run with KEY=VALUE (repeatable); labels go in the result's "
               "'labels' and become columns in sweeps and load_results()", "KEY=VALUE", repeatable=True, default=[]),
    OptionSpec("price_per_hour", price_value, "what the server's hardware costs an hour: PRICE (or PRICE/node) for the "
               "node, PRICE/gpu for each GPU the run samples (NVML, --gpus), PRICE/gpu:N for N GPUs; the result's "
               "'cost': per 1,000 queries and per million tokens, in the price's currency", "PRICE[/node|/gpu[:N]]"),
    OptionSpec("warmup_s", float_value(0, D.MAX_TIME_S, unit="s"), "issue at the schedule for this long first without "
               "recording (counted apart, under 'warmup'), for servers that compile or fill caches first "
               "(default {default})", "S", default=D.WARMUP_S),
    OptionSpec("ramp_up_s", ramp_up_value, "concurrency: start the N streams evenly over this long instead of "
               "all at once, so they are not in phase; the ramp's queries are counted apart, under 'warmup' "
               f"(default auto: {s_to_ms(D.RAMP_UP_S_PER_STREAM):g} ms a stream, at most {D.RAMP_UP_MAX_S:g} s, "
               f"from {D.RAMP_UP_MIN_STREAMS} streams; 0 for fewer)", "auto|S"),
    OptionSpec("sched_slice_us", float_value(0, D.MAX_SCHED_SLICE_US, unit="us"), "the scheduler slice the issue thread and the native "
               "clients' I/O threads ask the kernel for (Linux 6.12+, no privilege needed): a short one lets them "
               "preempt busy neighbours when they wake on a shared node; 0 keeps the kernel's default "
               "(default {default})", "US", default=D.SCHED_SLICE_US),
    OptionSpec("workers", int_value(1, D.MAX_WORKERS), "scale-out: the number of workers (pods) sharing this load; "
               "each runs 1/N of the rate or its share of the concurrency (default {default})", "N", default=D.WORKERS),
    OptionSpec("worker_index", int_value(0, D.MAX_WORKERS - 1), "scale-out: this worker's index, 0..N-1 (default: "
               "$JOB_COMPLETION_INDEX, as in a Kubernetes Indexed Job, else 0)", "I"),
    OptionSpec("start_at", float_value(0, 1e11, unit="s"), "scale-out: start issuing at this wall-clock time "
               "(seconds since the epoch) so that workers start together", "EPOCH"),
    OptionSpec("start_tolerance_s", float_value(0, D.MAX_TIME_S, unit="s"), "scale-out: a worker that starts later than "
               "--start-at by more than this is invalid (default {default})", "S", default=D.START_TOLERANCE_S),
    OptionSpec("config", str_value, "TOML file of options (keys are the long flag names)", "FILE", flag_only=True),
)

_SPEC_BY_NAME: Dict[str, OptionSpec] = {s.name: s for s in OPTION_SPECS}


def _default(name: str) -> Any:
    """The default of :class:`RunOptions`' field ``name``: its option's, from
    :data:`OPTION_SPECS` (a list is copied for each instance)."""
    default = _SPEC_BY_NAME[name].default
    if isinstance(default, list):
        return field(default_factory=lambda: list(default))
    return default


@dataclass
class RunOptions:
    """Every option of ``loadgen run``; None means "the scenario's default".

    Each field's default is its option's (:data:`OPTION_SPECS`), written there once.
    """

    scenario: str = _default("scenario")
    sut: str = _default("sut")
    target_qps: Optional[float] = _default("target_qps")
    latency_bound_ms: Optional[float] = _default("latency_bound_ms")
    latency_percentile: Optional[float] = _default("latency_percentile")
    duration_s: Optional[float] = _default("duration_s")
    query_count: Optional[int] = _default("query_count")
    min_duration_s: Optional[float] = _default("min_duration_s")
    min_query_count: Optional[int] = _default("min_query_count")
    samples_per_query: Optional[int] = _default("samples_per_query")
    sample_count: int = _default("sample_count")
    sample_order: str = _default("sample_order")
    concurrency: int = _default("concurrency")
    max_in_flight: int = _default("max_in_flight")
    stages: Optional[str] = _default("stages")
    ramp: str = _default("ramp")
    poisson_arrivals: bool = _default("poisson_arrivals")
    burstiness: float = _default("burstiness")
    trace: Optional[str] = _default("trace")
    trace_unit: str = _default("trace_unit")
    seed: int = _default("seed")
    schedule_seed: Optional[int] = _default("schedule_seed")
    sample_seed: Optional[int] = _default("sample_seed")
    spin_us: Optional[float] = _default("spin_us")
    pin_cpus: List[int] = _default("pin_cpus")
    pin: Optional[str] = _default("pin")
    gpus: str = _default("gpus")
    gpu_sample_ms: float = _default("gpu_sample_ms")
    inline_dispatch: bool = _default("inline_dispatch")
    timeout_ms: Optional[float] = _default("timeout_ms")
    grace_s: float = _default("grace_s")
    interval_s: float = _default("interval_s")
    significant_figures: int = _default("significant_figures")
    max_error_rate: float = _default("max_error_rate")
    max_issue_delay_ms: float = _default("max_issue_delay_ms")
    max_lateness_share: float = _default("max_lateness_share")
    input: List[str] = _default("input")
    payload: Optional[str] = _default("payload")
    request_template: Optional[str] = _default("request_template")
    header: List[str] = _default("header")
    secret_header: List[str] = _default("secret_header")
    ca_file: Optional[str] = _default("ca_file")
    insecure: bool = _default("insecure")
    connections: int = _default("connections")
    ready_timeout_s: float = _default("ready_timeout_s")
    max_response_bytes: int = _default("max_response_bytes")
    no_response_check: bool = _default("no_response_check")
    grpc_contents: str = _default("grpc_contents")
    http_engine: str = _default("http_engine")
    io_threads: int = _default("io_threads")
    grpc_engine: str = _default("grpc_engine")
    model: Optional[str] = _default("model")
    max_tokens: int = _default("max_tokens")
    prompt_words: int = _default("prompt_words")
    dataset: Optional[str] = _default("dataset")
    dataset_min_input_tokens: int = _default("dataset_min_input_tokens")
    dataset_max_input_tokens: int = _default("dataset_max_input_tokens")
    input_tokens: Optional[str] = _default("input_tokens")
    output_tokens: Optional[str] = _default("output_tokens")
    shared_prefix_tokens: int = _default("shared_prefix_tokens")
    prefix_groups: int = _default("prefix_groups")
    prefix_hit_ratio: float = _default("prefix_hit_ratio")
    tokenizer: Optional[str] = _default("tokenizer")
    ignore_eos: bool = _default("ignore_eos")
    turns: int = _default("turns")
    think_time_ms: Optional[str] = _default("think_time_ms")
    images: Optional[str] = _default("images")
    images_per_request: int = _default("images_per_request")
    extra_body: Optional[str] = _default("extra_body")
    tools: Optional[str] = _default("tools")
    tool_choice: Optional[str] = _default("tool_choice")
    no_stream: bool = _default("no_stream")
    server_metrics_url: Optional[str] = _default("server_metrics_url")
    server_stats_url: Optional[str] = _default("server_stats_url")
    metrics_port: Optional[int] = _default("metrics_port")
    metrics_addr: str = _default("metrics_addr")
    metrics_linger_s: float = _default("metrics_linger_s")
    output: Optional[str] = _default("output")
    storage_option: List[str] = _default("storage_option")
    record_requests: Optional[str] = _default("record_requests")
    no_html: bool = _default("no_html")
    json: bool = _default("json")
    quiet: bool = _default("quiet")
    fail_if: List[str] = _default("fail_if")
    require: List[str] = _default("require")
    slo: List[str] = _default("slo")
    label: List[str] = _default("label")
    price_per_hour: Optional[str] = _default("price_per_hour")
    warmup_s: float = _default("warmup_s")
    ramp_up_s: Optional[float] = _default("ramp_up_s")
    sched_slice_us: float = _default("sched_slice_us")
    workers: int = _default("workers")
    worker_index: Optional[int] = _default("worker_index")
    start_at: Optional[float] = _default("start_at")
    start_tolerance_s: float = _default("start_tolerance_s")
    config: Optional[str] = _default("config")

    @property
    def unmeasured_s(self) -> float:
        """How long after the start measuring begins: the warm-up and a closed loop's ramp."""
        return self.warmup_s + (self.ramp_up_s or 0.0)

    def as_dict(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _convert(spec: OptionSpec, value: Any, source: str) -> Any:
    try:
        return spec.convert(value)
    except ValueError as e:
        raise OptionError(f"{spec.flag} ({source}): {e}") from None


#: The config file's table of ``loadgen sweep`` (its points); ``loadgen run`` refuses it.
SWEEP_TABLE = "sweep"


def _load_toml(path: str) -> Dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - older Pythons
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        text = read_text(path, what="--config", limit_bytes=CONFIG_LIMIT_BYTES)
    except InputFileError as e:
        raise OptionError(str(e)) from None
    try:
        data: Dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise OptionError(f"--config: {path} is not valid TOML: {e}") from None
    return data


def read_config_table(path: str, name: str) -> Optional[Dict[str, Any]]:
    """The TOML table ``name`` of the config file ``path`` as read (None when the file has
    none), such as ``loadgen sweep``'s ``[sweep]``; OptionError when it is not a table."""
    table = _load_toml(path).get(name)
    if table is not None and not isinstance(table, dict):
        raise OptionError(f"--config: {path}: {name!r} must be a table ([{name}]), not {type(table).__name__}")
    return table


def _read_config(path: str, tables: Sequence[str] = ()) -> Dict[str, Any]:
    """The run options of a config file; the tables named in ``tables`` are left to
    their command."""
    data = _load_toml(path)
    out: Dict[str, Any] = {}
    for key, value in data.items():
        if key in tables:
            continue
        if key == SWEEP_TABLE:
            raise OptionError(f"--config: {path}: the [{SWEEP_TABLE}] table is read by 'loadgen sweep', which "
                              "runs its points; 'loadgen run' runs one benchmark (use loadgen sweep, or "
                              "remove the table)")
        name = key.replace("-", "_")
        spec = _SPEC_BY_NAME.get(name)
        if spec is not None and spec.flag_only:
            raise OptionError(f"--config: {path}: unknown key {key!r}: it cannot be set in a config file "
                              f"(give {spec.flag} or {spec.env} instead)")
        if spec is None:
            import difflib

            settable = [s.name for s in OPTION_SPECS if not s.flag_only]
            close = difflib.get_close_matches(name, settable, n=1)
            hint = f"; did you mean {close[0].replace('_', '-')!r}?" if close else ""
            raise OptionError(f"--config: {path}: unknown key {key!r}{hint}")
        out[name] = _convert(spec, value, f"config {path}")
    return out


def unknown_environment(environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """Warnings for ``LOADGEN_*`` variables that look like a misspelled option's
    (``LOADGEN_TARGT_QPS``), each with a "did you mean". Other ``LOADGEN_*`` names, far
    from every option's, are left alone: other tools may use the prefix."""
    import difflib

    if environ is None:
        environ = os.environ
    known = {s.env[len("LOADGEN_"):]: s.env for s in OPTION_SPECS}
    known["CONFIG"] = "LOADGEN_CONFIG"
    out = []
    for name in sorted(environ):
        if not name.startswith("LOADGEN_") or name[len("LOADGEN_"):] in known:
            continue
        close = difflib.get_close_matches(name[len("LOADGEN_"):], list(known), n=1, cutoff=0.8)
        if close:
            out.append(f"the environment variable {name} is not an option; did you mean {known[close[0]]}? "
                       "(it is ignored)")
    return out


def resolve(
    flags: Dict[str, Any], environ: Optional[Mapping[str, str]] = None, *, config_tables: Sequence[str] = ()
) -> Tuple[RunOptions, Dict[str, Any]]:
    """Merges defaults < config file < environment < flags.

    Args:
        flags: option name -> raw value, for the flags actually given.
        environ: the environment (default os.environ).
        config_tables: tables of the config file that a command reads itself (``sweep``
            for ``loadgen sweep``), skipped here; any other table is an unknown key.

    Returns:
        The options, and the dict of values the user gave (with their sources merged).

    Raises:
        OptionError: a value is bad; the message names the flag and its source.
    """
    if environ is None:
        environ = os.environ
    given: Dict[str, Any] = {}
    config_path = flags.get("config") or environ.get("LOADGEN_CONFIG")
    if config_path:
        given.update(_read_config(str(config_path), config_tables))
        given["config"] = str(config_path)
    for spec in OPTION_SPECS:
        if spec.flag_only or spec.env not in environ:
            continue
        given[spec.name] = _convert(spec, environ[spec.env], f"environment {spec.env}")
    for name, raw in flags.items():
        spec = _SPEC_BY_NAME[name]
        if spec.repeatable and isinstance(raw, list):
            value: Any = []
            for item in raw:
                value.extend(_convert(spec, item, "flag"))
        else:
            value = _convert(spec, raw, "flag")
        given[name] = value
    if "worker_index" not in given and environ.get("JOB_COMPLETION_INDEX", "").strip():
        spec = _SPEC_BY_NAME["worker_index"]
        given["worker_index"] = _convert(spec, environ["JOB_COMPLETION_INDEX"], "environment JOB_COMPLETION_INDEX")
    options = RunOptions(**given)
    index = options.worker_index or 0
    if index >= options.workers:
        raise OptionError(f"--worker-index {index} is not below --workers {options.workers} "
                          "(workers are numbered 0..N-1)")
    return options, given
