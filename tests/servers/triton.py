"""A real NVIDIA Triton Inference Server on 127.0.0.1, for the network tests and benchmarks.

The server is the `tritonserver` binary of the nvidia-pytriton wheel, installed in a venv by
`tests/servers/install_triton.sh DEST`. It serves a model repository of Python-backend models kept in
`triton_models/` beside this file (`add_one`: OUTPUT0 = INPUT0 + 1, FP32 [1, 16]).

What the server's environment needs, and why:

- `PATH` starts with the venv's `bin`: the backend stub's embedded interpreter finds its
  prefix by looking `python3` up on PATH, so it then imports numpy from the venv (numpy<2).
- `LD_LIBRARY_PATH` starts with the venv interpreter's LIBDIR: the stub links
  `libpython3.X.so`, which a pyenv (or other non-system) Python keeps there; without it
  the system's libpython of the same version, if any, is loaded instead.
- A backend directory whose `python/` holds the wheel's Python backend and the stub built
  for the venv's Python version; it is made in the workdir with symbolic links.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import shutil
import subprocess
import uuid
from typing import Iterable, NamedTuple, Optional

from .procs import ServerProcess, ServerUnavailable, free_port, http_get, install_server

__all__ = ["INSTALL_HINT", "VENV_ENV", "TritonServer", "find_triton", "start_triton",
           "write_model_repository"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
_MODELS_SRC = os.path.join(_HERE, "triton_models")
VENV_ENV = "LOADGEN_TEST_TRITON_VENV"
INSTALL_HINT = ("installing it with `tests/servers/install_triton.sh .servers/triton` failed; see "
                ".servers/triton.install.log")
# The seconds Triton waits for in-flight requests when told to stop: less than
# ServerProcess.stop's grace (10 s), so a stop normally ends cleanly.
_EXIT_TIMEOUT_S = 5


def find_triton() -> Optional[str]:
    """The venv holding nvidia-pytriton: $LOADGEN_TEST_TRITON_VENV if set (a relative path
    is taken from the repository root), else `<repo>/.servers/triton`, installed there on
    first use; None when that failed."""
    venv = os.environ.get(VENV_ENV)
    if venv:
        return os.path.join(_REPO, venv)
    return install_server("triton")


def write_model_repository(path: str, models: Iterable[str] = ("add_one",)) -> None:
    """Writes a Triton model repository at path (created if missing) with the named models,
    copied from `triton_models/`."""
    os.makedirs(path, exist_ok=True)
    for name in models:
        src = os.path.join(_MODELS_SRC, name)
        if not os.path.isfile(os.path.join(src, "config.pbtxt")):
            raise ValueError(f"no Triton model {name!r} in {_MODELS_SRC}")
        shutil.copytree(src, os.path.join(path, name), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))


class _Install(NamedTuple):
    """Where the pieces of a Triton install in a venv are."""

    tritonserver: str
    python_backend: str  # the wheel's backends/python directory
    stub: str  # the backend stub for the venv's Python version
    bin_dir: str  # the venv's bin, put first on PATH
    lib_dir: str  # the venv interpreter's LIBDIR (libpython), put first on LD_LIBRARY_PATH


@functools.lru_cache(maxsize=None)
def _locate(venv: str) -> _Install:
    """Asks the venv's interpreter where the wheel and libpython are."""
    python = os.path.join(venv, "bin", "python")
    if not os.access(python, os.X_OK):
        raise ServerUnavailable(f"no Triton install in {venv} (no bin/python): {INSTALL_HINT}")
    script = ("import json, sys, sysconfig; print(json.dumps([sysconfig.get_paths()['purelib'], "
              "'%d.%d' % sys.version_info[:2], sysconfig.get_config_var('LIBDIR')]))")
    out = subprocess.run([python, "-c", script], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    purelib, version, lib_dir = json.loads(out)
    dist = os.path.join(purelib, "pytriton", "tritonserver")
    install = _Install(
        tritonserver=os.path.join(dist, "bin", "tritonserver"),
        python_backend=os.path.join(dist, "backends", "python"),
        stub=os.path.join(dist, "python_backend_stubs", version, "triton_python_backend_stub"),
        bin_dir=os.path.join(venv, "bin"),
        lib_dir=lib_dir,
    )
    for path in (install.tritonserver, install.python_backend, install.stub):
        if not os.path.exists(path):
            raise ServerUnavailable(f"incomplete Triton install in {venv} (no {path}): {INSTALL_HINT}")
    return install


def _write_backend_directory(path: str, install: _Install) -> None:
    """Makes path a Triton backend directory whose `python/` links the wheel's Python
    backend files and the stub for the venv's Python version."""
    backend = os.path.join(path, "python")
    os.makedirs(backend, exist_ok=True)
    links = {name: os.path.join(install.python_backend, name)
             for name in os.listdir(install.python_backend) if name != "__pycache__"}
    links["triton_python_backend_stub"] = install.stub
    for name, target in links.items():
        link = os.path.join(backend, name)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(target, link)


def _prepend(path: str, rest: Optional[str]) -> str:
    return path + os.pathsep + rest if rest else path


class TritonServer:
    """A running tritonserver started by start_triton; a context manager that stops it.

    Attributes:
        pid: the server's process id.
        http_url: "http://127.0.0.1:PORT", the KServe v2 HTTP/REST endpoint.
        grpc_target: "127.0.0.1:PORT", the KServe v2 gRPC endpoint.
        metrics_url: "http://127.0.0.1:PORT/metrics", the Prometheus metrics.
        log_path: the file with the server's stdout and stderr.
    """

    def __init__(self, proc: ServerProcess, http_port: int, grpc_port: int, metrics_port: int,
                 shm_prefix: str) -> None:
        self._proc = proc
        self._shm_prefix = shm_prefix
        self.pid = proc.pid
        self.http_url = f"http://127.0.0.1:{http_port}"
        self.grpc_target = f"127.0.0.1:{grpc_port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.log_path = proc.log_path

    def stop(self) -> None:
        """Stops the server and its backend stubs (SIGTERM, then SIGKILL), and removes any
        shared-memory region they left behind."""
        self._proc.stop()
        for region in glob.glob(os.path.join("/dev/shm", self._shm_prefix + "*")):
            try:
                os.remove(region)
            except FileNotFoundError:
                pass

    def kill(self) -> None:
        """SIGKILLs the server process alone, now (a server dying mid-run); stop() still
        ends what it leaves."""
        self._proc.kill()

    def _inference_stats(self, model: str) -> list:
        status, body = http_get(f"{self.http_url}/v2/models/{model}/stats", 5.0)
        if status != 200:
            raise RuntimeError(f"GET /v2/models/{model}/stats answered {status}: {body[:200]!r}")
        return [entry["inference_stats"] for entry in json.loads(body)["model_stats"]]

    def inference_count(self, model: str = "add_one") -> int:
        """The server's count of the successful inference requests of model (all versions),
        from Triton's statistics API."""
        return sum(int(s["success"]["count"]) for s in self._inference_stats(model))

    def failure_count(self, model: str = "add_one") -> int:
        """The server's count of the failed inference requests of model (all versions)."""
        return sum(int(s["fail"]["count"]) for s in self._inference_stats(model))

    def __enter__(self) -> "TritonServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_triton(workdir: str, *, models: Iterable[str] = ("add_one",),
                 timeout_s: float = 120, extra_args: Iterable[str] = ()) -> TritonServer:
    """Starts tritonserver serving models on free ports of 127.0.0.1 and waits (at most
    timeout_s) until it reports ready, which with strict readiness means every model loaded.
    ``extra_args`` go to tritonserver after the others (e.g. its gRPC TLS options:
    ``--grpc-use-ssl=true --grpc-server-cert=PEM --grpc-server-key=PEM``).

    workdir receives the model repository, the backend directory and the server's log.
    Raises ServerUnavailable when no install is found, RuntimeError when the server exits
    or is not ready in time (with the log's tail; the server is then stopped).
    """
    venv = find_triton()
    if venv is None:
        raise ServerUnavailable(f"Triton is not installed: {INSTALL_HINT}")
    install = _locate(venv)
    os.makedirs(workdir, exist_ok=True)
    model_repository = os.path.join(workdir, "models")
    backend_directory = os.path.join(workdir, "backends")
    write_model_repository(model_repository, models)
    _write_backend_directory(backend_directory, install)

    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    shm_prefix = f"loadgen_test_{uuid.uuid4().hex[:12]}_"
    argv = [
        install.tritonserver,
        f"--model-repository={model_repository}",
        f"--backend-directory={backend_directory}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        "--http-address=127.0.0.1", f"--http-port={http_port}",
        "--grpc-address=127.0.0.1", f"--grpc-port={grpc_port}",
        "--metrics-address=127.0.0.1", f"--metrics-port={metrics_port}",
        "--allow-metrics=true", "--allow-gpu-metrics=false",
        "--strict-readiness=true",
        f"--exit-timeout-secs={_EXIT_TIMEOUT_S}",
        *extra_args,
    ]
    env = {
        "PATH": _prepend(install.bin_dir, os.environ.get("PATH")),
        "LD_LIBRARY_PATH": _prepend(install.lib_dir, os.environ.get("LD_LIBRARY_PATH")),
    }
    proc = ServerProcess(argv, os.path.join(workdir, "tritonserver.log"), env=env, cwd=workdir)
    server = TritonServer(proc, http_port, grpc_port, metrics_port, shm_prefix)
    try:
        proc.wait_http_ok(f"{server.http_url}/v2/health/ready", timeout_s)
    except BaseException:
        server.stop()
        raise
    return server
