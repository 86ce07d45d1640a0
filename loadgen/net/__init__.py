"""Network SUTs: clients of real inference servers (KServe v2 over REST and gRPC,
OpenAI-compatible streaming, any JSON API from a template), driven by the engine with the
same scenarios, schedules and measurement rule as in-process SUTs."""

from __future__ import annotations

from typing import Any

__all__ = ["is_network_sut", "net_options", "open_from_options", "pool_size_for"]


def is_network_sut(spec: str) -> bool:
    """Whether a ``--sut`` value names a server (a URL)."""
    return "://" in spec


def net_options(o: Any):
    """The :class:`~loadgen.net.options.NetOptions` of ``loadgen run``'s options ``o``."""
    from loadgen.net.options import NetOptions, parse_header
    from loadgen.net.tensors import parse_input_spec

    import urllib.parse

    try:
        password = urllib.parse.urlsplit(o.sut).password if is_network_sut(o.sut) else None
    except ValueError:
        password = None
    return NetOptions(
        secret_values=(password,) if password else (),
        headers=[parse_header(h) for h in o.header],
        secret_headers=tuple(o.secret_header),
        ca_file=o.ca_file,
        insecure=o.insecure,
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
    )


def pool_size_for(settings: Any) -> int:
    """Connections a load needs: its concurrency (closed loop), else its in-flight cap,
    else 64 for an uncapped open loop."""
    if settings.mode == "closed":
        return settings.concurrency
    if settings.max_in_flight:
        return settings.max_in_flight
    return 64


def open_from_options(o: Any, settings: Any):
    """The prepared network SUT for effective run options ``o`` and engine settings.

    Raises:
        ValueError: bad target or options, or the server was not ready in time.
    """
    from loadgen.net.clients import open_target

    if settings.samples_per_query != 1:
        raise ValueError(f"--sut {o.sut}: a network target sends one sample per request; "
                         f"samples_per_query must be 1 (got {settings.samples_per_query})")
    net = net_options(o)
    try:
        return open_target(o.sut, net, pool_size=pool_size_for(settings),
                           significant_figures=o.significant_figures)
    except ValueError as e:
        raise ValueError(net.redactor().text(str(e))) from None
