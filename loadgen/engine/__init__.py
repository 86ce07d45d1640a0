"""The Python face of the native issue engine: settings (:mod:`.settings`), trace loading
(:mod:`.trace`), the engine and its result (:mod:`.engine`), and the drivers that feed
Python SUTs (:mod:`.dispatch`)."""

from loadgen.engine.engine import Engine, RunResult, run
from loadgen.engine.settings import EngineSettings, io_thread_cpus
from loadgen.engine.trace import load_trace

__all__ = ["Engine", "EngineSettings", "RunResult", "io_thread_cpus", "load_trace", "run"]
