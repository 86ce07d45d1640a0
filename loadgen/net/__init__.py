"""Network SUTs: clients of real inference servers (KServe v2 over REST and gRPC,
OpenAI-compatible streaming, any JSON API from a template), driven by the engine with the
same scenarios, schedules and measurement rule as in-process SUTs."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Union

from loadgen import defaults
from loadgen.sut.spec import is_network_sut

if TYPE_CHECKING:  # the clients are imported when a target is opened
    from loadgen.net.base import NetworkSUT
    from loadgen.net.native import NativeClientSUT
    from loadgen.net.options import NetOptions

__all__ = ["is_network_sut", "net_options", "open_from_options", "open_target", "pool_size_for"]


def net_options(o: Any):
    """The :class:`~loadgen.net.options.NetOptions` of ``loadgen run``'s options ``o``."""
    from loadgen.net.options import NetOptions, parse_header
    from loadgen.net.tensors import parse_input_spec

    from loadgen.net.targets import url_secrets
    from loadgen.storage import storage_secrets

    # The passwords and secret query values of the --sut and --server-metrics-url URLs, and
    # secret --storage-option values, are redacted from everything, also where a server
    # echoes them bare.
    secrets = (url_secrets(o.sut if is_network_sut(o.sut) else None)
               + url_secrets(getattr(o, "server_metrics_url", None))
               + storage_secrets(getattr(o, "storage_option", None) or ()))
    return NetOptions(
        secret_values=tuple(secrets),
        headers=[parse_header(h) for h in o.header],
        secret_headers=tuple(o.secret_header),
        ca_file=o.ca_file,
        insecure=o.insecure,
        http_engine=o.http_engine,
        grpc_engine=o.grpc_engine,
        io_threads=o.io_threads,
        timeout_ms=o.timeout_ms,
        connections=o.connections,
        ready_timeout_s=o.ready_timeout_s,
        check_responses=not o.no_response_check,
        payload=o.payload,
        inputs=tuple(parse_input_spec(s) for s in o.input),
        request_template=o.request_template,
        grpc_contents=o.grpc_contents,
        model=o.model,
        max_tokens=o.max_tokens,
        prompt_words=o.prompt_words,
        sample_count=o.sample_count,
        seed=o.seed,
        max_response_bytes=o.max_response_bytes,
        llm=_llm_options(o),
    )


def _llm_options(o: Any):
    """The :class:`~loadgen.llm.LlmOptions` of run options ``o``; prompts are drawn with
    the run's sample seed (``--sample-seed``, default ``--seed`` + 1)."""
    from loadgen.llm.workload import LlmOptions

    seed = o.sample_seed if o.sample_seed is not None else defaults.sample_seed_of(o.seed)
    return LlmOptions(
        max_tokens=o.max_tokens, prompt_words=o.prompt_words, sample_count=o.sample_count, seed=seed,
        dataset=o.dataset, dataset_min_input_tokens=o.dataset_min_input_tokens,
        dataset_max_input_tokens=o.dataset_max_input_tokens, input_tokens=o.input_tokens,
        output_tokens=o.output_tokens, shared_prefix_tokens=o.shared_prefix_tokens, prefix_groups=o.prefix_groups,
        prefix_hit_ratio=o.prefix_hit_ratio,
        tokenizer=o.tokenizer, ignore_eos=o.ignore_eos, extra_body=o.extra_body, stream=not o.no_stream,
        turns=o.turns, think_time_ms=o.think_time_ms, tools=o.tools,
        tool_choice=o.tool_choice, images=o.images, images_per_request=o.images_per_request)


def pool_size_for(settings: Any) -> int:
    """Connections a load needs: its concurrency (closed loop), else its in-flight cap,
    else 64 for an uncapped open loop."""
    if settings.mode == "closed":
        return settings.concurrency
    if settings.max_in_flight:
        return settings.max_in_flight
    return defaults.OPEN_LOOP_CONNECTIONS


def open_from_options(o: Any, settings: Any):
    """The prepared network SUT for effective run options ``o`` and engine settings.

    Raises:
        ValueError: bad target or options, or the server was not ready in time.
    """
    if settings.samples_per_query != 1:
        raise ValueError(f"--sut {o.sut}: a network target sends one sample per request; "
                         f"samples_per_query must be 1 (got {settings.samples_per_query})")
    net = net_options(o)
    if getattr(o, "turns", 1) > 1 and (settings.mode not in ("closed", "poisson", "constant", "stages", "trace")
                                       or settings.inline_dispatch):
        raise ValueError(f"--turns {o.turns}: conversations start in a closed loop (--scenario concurrency) or at "
                         "the arrivals of constant, poisson, ramp or trace; not with --scenario "
                         f"{o.scenario}" + (" and --inline-dispatch" if settings.inline_dispatch else ""))
    try:
        return open_target(o.sut, net, pool_size=pool_size_for(settings),
                           significant_figures=o.significant_figures,
                           uncapped=settings.mode != "closed" and not settings.max_in_flight)
    except ValueError as e:
        raise ValueError(net.redactor().text(str(e))) from None


def open_target(url: str, net: "NetOptions", *, pool_size: int, significant_figures: int = 3,
                uncapped: bool = False) -> "Union[NetworkSUT, NativeClientSUT]":
    """The prepared network SUT for a ``--sut`` URL: ready server, serialized requests.

    Args:
        url: the ``--sut`` value.
        net: the client options.
        pool_size: connections (HTTP) to open when ``net.connections`` is 0: the load's
            concurrency or in-flight cap.
        uncapped: the load is an open loop with no in-flight cap: the native gRPC client
            then keeps up to ``OPEN_LOOP_GRPC_CALLS`` calls in flight (HTTP/2 streams cost
            little), not ``pool_size``.

    Raises:
        ValueError: bad URL or options, server not ready in time, payload that does not fit.
    """
    sut = _open_target(url, net, pool_size, significant_figures, uncapped)
    target = sut.inner.target if hasattr(sut, "inner") else sut.target
    if target.tls and net.insecure:  # said once the run is to go ahead, as its result says it (tls_verified)
        print(f"warning: --insecure: the TLS certificate of {target.host} is not verified", file=sys.stderr,
              flush=True)
    return sut


def _open_target(url: str, net: "NetOptions", pool_size: int, significant_figures: int,
                 uncapped: bool) -> "Union[NetworkSUT, NativeClientSUT]":
    from loadgen.net.targets import parse_target

    target = parse_target(url, template=bool(net.request_template))
    if net.llm is not None and net.llm.images and (target.kind != "openai" or target.endpoint != "chat"):
        raise ValueError(f"--images {net.llm.images}: images go in chat messages; {url} is not an OpenAI "
                         "/v1/chat/completions target")
    if net.request_template and target.kind != "template":
        raise ValueError(f"--request-template applies to http(s) URLs, not {target.kind} targets")
    # The protocol's module is imported when its target is used (gRPC's needs protobuf).
    sut: NetworkSUT
    if target.kind == "kserve_http":
        from loadgen.net.kserve_http import KServeHttpSUT

        sut = KServeHttpSUT(target, net, pool_size)
    elif target.kind == "template":
        from loadgen.net.template_http import TemplateHttpSUT

        sut = TemplateHttpSUT(target, net, pool_size)
    elif target.kind == "openai":
        if net.llm is not None and net.llm.turns > 1:
            from loadgen.net.openai_turns import ConversationSUT

            sut = ConversationSUT(target, net, pool_size, significant_figures)
        else:
            from loadgen.net.openai_stream import OpenAISUT

            sut = OpenAISUT(target, net, pool_size, significant_figures)
    from loadgen.net.native import check_tls, http_refusal, native_sut

    refused = http_refusal(target, net)
    if net.http_engine == "native" and refused:  # said before the server is asked anything
        hint = "--grpc-engine to choose the gRPC client" if target.kind == "kserve_grpc" else "--http-engine asyncio (or auto)"
        raise ValueError(f"--http-engine native: {refused}; use {hint}")
    if target.kind == "kserve_grpc":
        return _grpc_sut(target, net, pool_size, uncapped)
    # auto: the native client wherever it runs the target.
    native = net.http_engine in ("native", "auto") and not refused
    if native and target.tls:  # its own handshake, checked before the server is asked anything
        check_tls(target, net, "http1")
    sut.prepare()
    if native:
        return native_sut(sut, net.io_threads)
    return sut


#: ``grpc_engine`` values that now mean "grpcio" (once two clients on grpcio).
GRPC_ENGINE_ALIASES = ("callback", "asyncio")
_alias_noted = False


def _grpc_sut(target: Any, net: Any, pool_size: int, uncapped: bool = False) -> Any:
    """The KServe gRPC client ``net.grpc_engine`` asks for, prepared: native (the core's
    network client over gRPC; auto where this build has it, and for grpcs:// where it also has
    TLS) or grpcio (grpcio's public API; auto elsewhere: a build without the native client,
    or grpcs:// in a build without OpenSSL). "callback" and "asyncio" mean grpcio, with a note on stderr (once a process)."""
    global _alias_noted
    engine = net.grpc_engine
    if engine not in ("auto", "native", "grpcio", *GRPC_ENGINE_ALIASES):
        raise ValueError(f"grpc_engine must be 'auto', 'native' or 'grpcio' ('callback' and 'asyncio' mean 'grpcio'), "
                         f"got {engine!r}")
    if engine in GRPC_ENGINE_ALIASES:
        if not _alias_noted:
            print(f"note: --grpc-engine {engine} now means grpcio (the one gRPC client on grpcio)", file=sys.stderr,
                  flush=True)
            _alias_noted = True
        engine = "grpcio"
    from loadgen.net.kserve_grpc import KServeGrpcSUT
    from loadgen.net.native import NativeGrpcSUT, check_tls, grpc_refusal

    refused = grpc_refusal(target)
    if engine == "native" and refused:  # said before the server is asked anything
        raise ValueError(f"--grpc-engine native: {refused}; use --grpc-engine grpcio (or auto)")
    native = engine == "native" or (engine == "auto" and refused is None)
    # Natively, the readiness and metadata calls are the core's too: the run's TLS settings
    # (--insecure included), no grpcio channel.
    sut = KServeGrpcSUT(target, net, pool_size, native_calls=native)
    if native and target.tls:  # its own handshake, checked before the server is asked anything
        check_tls(target, net, "grpc")
    sut.prepare()
    if not native:
        return sut
    # The engine sets no cap: nor does the client, short of a backlog this deep.
    calls = max(sut.in_flight, defaults.OPEN_LOOP_GRPC_CALLS) if uncapped else sut.in_flight
    return NativeGrpcSUT(sut, net.io_threads, max_calls=calls)
