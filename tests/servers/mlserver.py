"""A real Seldon MLServer for the network tests: KServe v2 over REST and gRPC on 127.0.0.1.

MLServer lives in a virtual environment of its own (``tests/servers/install_mlserver.sh DEST``), so
that its pins (pydantic, fastapi, protobuf, grpcio) never touch the test environment; the
tests only start its ``mlserver`` command and talk to it over the network.

It serves the models in ``mlserver_models/`` beside this file, both run by the custom
runtime ``add_one_runtime.AddOneRuntime`` (OUTPUT0 = INPUT0 + 1, FP32, shape [N, 16]):

- ``add_one`` declares its inputs and outputs, so its metadata lists them;
- ``add_one_nometa`` declares none: its metadata has ``"inputs": []`` and
  ``"outputs": []``, and a client must be given the input spec explicitly.

The server runs with ``parallel_workers`` 0: inference runs in the server process itself,
which starts in about a second and keeps every metric in one registry (no worker pool, no
multiprocess metric files), so the counts read back are exact as soon as a response is out.

Counting requests (``MLServer.inference_count``) reads MLServer's own Prometheus metrics:

- ``model_infer_request_success_total{model, version}``: MLServer's data plane counts every
  successful inference there, for REST and gRPC alike (a stream counts once). For a model
  without versions the ``version`` label tells the protocol apart: the REST route passes
  no version (label ``"None"``), gRPC passes the request's empty ``model_version`` (label
  ``""``).
- By protocol, for all models together (MLServer labels them by route, not by model):
  ``rest_server_requests_total{app_name="mlserver", method="POST",
  path="/v2/models/{model_name}/infer", status_code}`` from starlette_exporter, and
  ``grpc_server_handled_total{grpc_service="inference.GRPCInferenceService",
  grpc_method="ModelInfer", grpc_type="UNARY", grpc_code}`` from py-grpc-prometheus
  (also ``grpc_server_started_total`` without ``grpc_code``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import Dict, Iterator, List, Optional, Tuple, Type

from .procs import ServerProcess, ServerUnavailable, free_port, http_get, install_server, require_servers

__all__ = ["INSTALL_HINT", "MODELS", "VENV_ENV", "MLServer", "find_mlserver", "parse_prometheus",
           "start_mlserver"]

REPO = Path(__file__).resolve().parents[2]
MODELS_DIR = Path(__file__).resolve().with_name("mlserver_models")
MODELS: Tuple[str, ...] = ("add_one", "add_one_nometa")
"""The models served, each ready before start_mlserver returns."""

VENV_ENV = "LOADGEN_TEST_MLSERVER_VENV"
INSTALL_HINT = ("installing it with `tests/servers/install_mlserver.sh .servers/mlserver` failed; see "
                ".servers/mlserver.install.log")

# The model_infer_request_success_total `version` label of an unversioned model, by the
# protocol the request came in on (see the module's docstring).
_VERSION_LABEL = {"rest": "None", "grpc": ""}

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

Sample = Tuple[str, Dict[str, str], float]


def find_mlserver() -> Optional[str]:
    """The MLServer virtual environment: $LOADGEN_TEST_MLSERVER_VENV, else
    ``<repo>/.servers/mlserver``, installed there on first use; None when that failed."""
    venv = os.environ.get(VENV_ENV)
    if venv:
        return venv
    return install_server("mlserver")


def parse_prometheus(text: str) -> List[Sample]:
    """(name, labels, value) of every sample in a Prometheus text exposition."""
    samples: List[Sample] = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                  for k, v in _LABEL.findall(m.group(2) or "")}
        samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def _tcp_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


class MLServer:
    """A started MLServer; stop() (or the with block) ends it and its process group.

    Args:
        process: the ``mlserver start`` process.
        http_port, grpc_port, metrics_port: where it listens on ``host``.
        host: the address it listens on (127.0.0.1, or one a test made itself).
    """

    def __init__(self, process: ServerProcess, http_port: int, grpc_port: int,
                 metrics_port: int, host: str = "127.0.0.1") -> None:
        self.process = process
        self.pid = process.pid
        self.host = host
        self.http_url = f"http://{host}:{http_port}"
        self.grpc_target = f"{host}:{grpc_port}"
        self.metrics_url = f"http://{host}:{metrics_port}/metrics"

    def metric_samples(self) -> List[Sample]:
        """Every sample of the metrics endpoint now; RuntimeError if it does not answer."""
        status, body = http_get(self.metrics_url, 5.0)
        if status != 200:
            raise RuntimeError(f"{self.metrics_url} answered {status}; log tail:\n"
                               f"{self.process.log_tail()}")
        return parse_prometheus(body.decode("utf-8", "replace"))

    def inference_count(self, model: str = "add_one", protocol: Optional[str] = None) -> int:
        """MLServer's count of successful inference requests for an unversioned model.

        Args:
            model: the model's name.
            protocol: None for REST and gRPC together, "rest" or "grpc" for one of them
                (told apart by the ``version`` label, see the module's docstring).
        """
        if protocol is not None and protocol not in _VERSION_LABEL:
            raise ValueError(f"protocol must be None, 'rest' or 'grpc', not {protocol!r}")
        total = 0.0
        for name, labels, value in self.metric_samples():
            if name != "model_infer_request_success_total" or labels.get("model") != model:
                continue
            if protocol is None or labels.get("version") == _VERSION_LABEL[protocol]:
                total += value
        return int(total)

    def stop(self) -> None:
        """SIGTERM (MLServer shuts down gracefully), SIGKILL after a grace period."""
        self.process.stop()

    def kill(self) -> None:
        """SIGKILL, now."""
        self.process.kill()

    def __enter__(self) -> MLServer:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.stop()


def start_mlserver(workdir: str, *, timeout_s: float = 120, host: str = "127.0.0.1") -> MLServer:
    """Starts MLServer on free ports of ``host`` (127.0.0.1, or an address the test made
    itself, such as a bridge into its network namespaces) with the models of
    ``mlserver_models/``.

    The models and a settings.json are written under ``workdir``, which is also the
    server's working directory and holds its log (``mlserver.log``). Returns once REST
    says the server and every model are ready, the metrics endpoint answers and the gRPC
    port accepts connections.

    Raises:
        ServerUnavailable: MLServer is not installed (find_mlserver() is None).
        RuntimeError: it exited or was not ready within timeout_s (it is stopped then).
    """
    venv = find_mlserver()
    if venv is None:
        raise ServerUnavailable(f"MLServer is not installed: {INSTALL_HINT} "
                                f"(or set {VENV_ENV} to its virtual environment)")
    executable = Path(venv) / "bin" / "mlserver"
    if not executable.is_file():
        raise ServerUnavailable(f"{executable} does not exist: {INSTALL_HINT}")

    repo = Path(workdir) / "mlserver_models"
    shutil.copytree(MODELS_DIR, repo, ignore=shutil.ignore_patterns("__pycache__"))
    ports: List[int] = []
    while len(ports) < 3:
        port = free_port()
        if port not in ports:
            ports.append(port)
    http_port, grpc_port, metrics_port = ports
    settings = {
        "host": host,
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
        "metrics_endpoint": "/metrics",
        "parallel_workers": 0,
        "debug": False,
    }
    (repo / "settings.json").write_text(json.dumps(settings, indent=2))

    process = ServerProcess([str(executable), "start", str(repo)],
                            str(Path(workdir) / "mlserver.log"), cwd=workdir)
    server = MLServer(process, http_port, grpc_port, metrics_port, host)
    try:
        deadline = time.monotonic() + timeout_s
        for url in [f"{server.http_url}/v2/health/ready",
                    *(f"{server.http_url}/v2/models/{m}/ready" for m in MODELS),
                    server.metrics_url]:
            process.wait_http_ok(url, max(0.0, deadline - time.monotonic()))
        while not _tcp_open(grpc_port, host):
            if not process.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"MLServer's gRPC port {grpc_port} did not open within "
                                   f"{timeout_s:g} s; log tail:\n{process.log_tail()}")
            time.sleep(0.1)
    except BaseException:
        process.stop()
        raise
    return server


def running_mlserver(workdir: str) -> Iterator[MLServer]:
    """A pytest fixture's body: MLServer started in ``workdir`` on 127.0.0.1, stopped
    afterwards; the test skipped when MLServer cannot be installed (failed instead when
    servers are required, as in CI). Use as ``yield from running_mlserver(...)``."""
    import pytest

    if find_mlserver() is None:
        if require_servers():
            pytest.fail(f"MLServer is not installed: {INSTALL_HINT}")
        pytest.skip(f"MLServer is not installed: {INSTALL_HINT}")
    server = start_mlserver(workdir)
    try:
        yield server
    finally:
        server.stop()
