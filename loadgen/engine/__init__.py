"""The Python face of the native issue engine: settings, trace loading, the engine and the
drivers that feed Python SUTs."""

from loadgen.engine.engine import Engine, EngineSettings, RunResult, load_trace, run

__all__ = ["Engine", "EngineSettings", "RunResult", "load_trace", "run"]
