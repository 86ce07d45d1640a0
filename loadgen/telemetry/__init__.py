"""Telemetry beside a run's latencies, on the engine's clock: the generator host's own
health (:mod:`loadgen.telemetry.host`)."""
