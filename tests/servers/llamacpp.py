"""A real OpenAI-compatible LLM server for the tests: llama-cpp-python's
``python -m llama_cpp.server`` on 127.0.0.1, serving a tiny random llama model on the CPU.

It lives in a virtual environment of its own, ``<repo>/.servers/llamacpp``, made by
``tests/servers/install_llamacpp.sh`` together with the model (``tiny-llama.gguf``, written
by ``tiny_llama_gguf.py``; see there for what makes its lengths exact). The install compiles
llama.cpp (about 5 minutes on 2 busy cores), so the tests build it only when servers are
required (``LOADGEN_REQUIRE_SERVERS=1``, as in CI) or asked for (``LOADGEN_TEST_REAL_LLM=1``),
and an install that fails then fails the test; otherwise they use an install that is
already there, or are skipped.

The server is started with ``--interrupt_requests False``: by default it ends a stream
early (with ``[DONE]``) as soon as another request waits for the model, which would cut
every stream short under concurrency. It generates for one request at a time; the others
wait for it.

What it did is read back from its own log (it runs with ``--verbose``, the default):

- one uvicorn access line per answered request, ``"POST /v1/completions HTTP/1.1" 200``;
- one block of llama.cpp timings per generation, whose ``eval time = ... / N runs`` is the
  number of tokens decoded after the prompt: every generated token but the last one
  (which ends the request at ``max_tokens`` without being decoded), or every generated
  token when the request ended at EOS (the EOS token is not output and not decoded); but
  never less than 1 (llama.cpp prints at least 1 run, also for an answer of 0 tokens);
- for each generation but the server's first, ``Llama.generate: P prefix-match hit,
  remaining R prompt tokens to eval``: the prompt is P + R tokens, BOS included.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator, List, Optional

from .procs import REPO, ServerProcess, ServerUnavailable, free_port, install_server, require_servers

__all__ = ["INSTALL_HINT", "MODEL_NAME", "OPT_IN_ENV", "VENV_ENV", "LlamaCppServer", "find_llamacpp",
           "running_llamacpp", "start_llamacpp"]

VENV_ENV = "LOADGEN_TEST_LLAMACPP_VENV"
OPT_IN_ENV = "LOADGEN_TEST_REAL_LLM"
MODEL_FILE = "tiny-llama.gguf"
MODEL_NAME = "tiny-llama"
"""The model's name in /v1/models (the server's --model_alias)."""
INSTALL_HINT = (f"build it with `bash tests/servers/install_llamacpp.sh .servers/llamacpp` or set {OPT_IN_ENV}=1 "
                "(compiles llama.cpp: about 5 minutes); a failed install says why in .servers/llamacpp.install.log")

_ACCESS = re.compile(r'"POST (\S+) HTTP/1\.1" (\d{3})')
_EVAL_RUNS = re.compile(r"^llama_perf_context_print:\s+eval time =.*/\s*(\d+) runs", re.M)
_PROMPT = re.compile(r"^Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval", re.M)


def _opted_in() -> bool:
    """Whether a missing server is built (and must build): LOADGEN_TEST_REAL_LLM or
    LOADGEN_REQUIRE_SERVERS is set."""
    return os.environ.get(OPT_IN_ENV, "") not in ("", "0") or require_servers()


def _installed(dest: str) -> bool:
    return os.path.isfile(os.path.join(dest, "bin", "python")) and os.path.isfile(os.path.join(dest, MODEL_FILE))


def find_llamacpp() -> Optional[str]:
    """The server's virtual environment (holding the model): $LOADGEN_TEST_LLAMACPP_VENV,
    else ``<repo>/.servers/llamacpp`` when it is installed or LOADGEN_TEST_REAL_LLM or
    LOADGEN_REQUIRE_SERVERS is set (the install script runs then: it returns at once when
    nothing changed); None otherwise, or when installing failed."""
    venv = os.environ.get(VENV_ENV)
    if venv:
        return venv
    dest = os.path.join(REPO, ".servers", "llamacpp")
    if not (_opted_in() or _installed(dest)):
        return None
    return install_server("llamacpp", timeout_s=1800.0)


class LlamaCppServer:
    """A started ``llama_cpp.server``; stop() (or the with block) ends it by its PID."""

    def __init__(self, process: ServerProcess, port: int) -> None:
        self.process = process
        self.pid = process.pid
        self.url = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        with open(self.process.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def answered(self, path: str, status: int = 200) -> int:
        """How many POST requests to ``path`` the server answered with ``status``."""
        return sum(1 for p, s in _ACCESS.findall(self.log()) if p == path and int(s) == status)

    def eval_runs(self) -> List[int]:
        """Tokens decoded after the prompt, one entry per generation so far, in order."""
        return [int(n) for n in _EVAL_RUNS.findall(self.log())]

    def prompt_lengths(self) -> List[int]:
        """The prompt's tokens (BOS included) of each generation so far that reused a part
        of the one before (all but the server's first, unless a prompt came twice in a
        row), in order."""
        return [int(p) + int(r) for p, r in _PROMPT.findall(self.log())]

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> LlamaCppServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_llamacpp(workdir: str, *, timeout_s: float = 60.0) -> LlamaCppServer:
    """Starts the server on a free port of 127.0.0.1, its log in ``workdir``; returns once
    GET /v1/models answers 200.

    Raises:
        ServerUnavailable: not installed (find_llamacpp() is None).
        RuntimeError: it exited or was not ready within timeout_s (it is stopped then).
    """
    venv = find_llamacpp()
    if venv is None:
        raise ServerUnavailable(f"llama-cpp-python is not installed: {INSTALL_HINT}")
    python = Path(venv) / "bin" / "python"
    model = Path(venv) / MODEL_FILE
    for needed in (python, model):
        if not needed.is_file():
            raise ServerUnavailable(f"{needed} does not exist: {INSTALL_HINT}")
    port = free_port()
    process = ServerProcess([str(python), "-m", "llama_cpp.server", "--model", str(model),
                             "--model_alias", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
                             "--n_ctx", "2048", "--n_threads", "1", "--n_threads_batch", "1",
                             "--interrupt_requests", "False", "--verbose", "True"],
                            os.path.join(workdir, "llamacpp.log"), cwd=workdir,
                            env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    server = LlamaCppServer(process, port)
    try:
        process.wait_http_ok(f"{server.url}/v1/models", timeout_s)
    except BaseException:
        process.stop()
        raise
    return server


def running_llamacpp(workdir: str) -> Iterator[LlamaCppServer]:
    """A pytest fixture's body: the server started in ``workdir``, stopped afterwards. The
    test is skipped when the server is not installed and neither LOADGEN_TEST_REAL_LLM nor
    LOADGEN_REQUIRE_SERVERS is set; with either, an install that fails fails the test. Use
    as ``yield from running_llamacpp(...)``."""
    import pytest

    if find_llamacpp() is None:
        if _opted_in():
            pytest.fail(f"llama-cpp-python could not be installed: {INSTALL_HINT}")
        pytest.skip(f"llama-cpp-python is not installed: {INSTALL_HINT}")
    server = start_llamacpp(workdir)
    try:
        yield server
    finally:
        server.stop()
