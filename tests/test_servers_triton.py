"""Smoke test of the real Triton Inference Server the network tests use (tests/servers/triton.py).

Skipped where Triton is not installed, unless LOADGEN_REQUIRE_SERVERS is set: then it fails
and says how to install it.
"""

import socket
import time
from typing import Iterator

import pytest

from tests.servers.procs import get_json, post_json, require_servers
from tests.servers.triton import INSTALL_HINT, TritonServer, find_triton, start_triton

pytestmark = pytest.mark.integration

N_REQUESTS = 5


@pytest.fixture
def triton(tmp_path) -> Iterator[TritonServer]:
    if find_triton() is None:
        if require_servers():
            pytest.fail(f"Triton is not installed: {INSTALL_HINT}")
        pytest.skip(f"Triton is not installed: {INSTALL_HINT}")
    server = start_triton(str(tmp_path))
    try:
        yield server
    finally:
        server.stop()






def wait_count(server: TritonServer, expected: int) -> int:
    """The inference count once it reaches expected, or the last one read after 5 s (the
    backend may record a request's statistics just after its response went out)."""
    deadline = time.monotonic() + 5.0
    count = server.inference_count()
    while count < expected and time.monotonic() < deadline:
        time.sleep(0.05)
        count = server.inference_count()
    return count


def test_triton_rest_infer_metadata_count_and_grpc_port(triton: TritonServer) -> None:
    for i in range(N_REQUESTS):
        data = [float(i * 16 + j) / 4 for j in range(16)]
        reply = post_json(f"{triton.http_url}/v2/models/add_one/infer", {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": data}]})
        assert reply["model_name"] == "add_one"
        [output] = reply["outputs"]
        assert output["name"] == "OUTPUT0"
        assert output["datatype"] == "FP32"
        assert output["shape"] == [1, 16]
        assert output["data"] == [x + 1 for x in data]

    meta = get_json(f"{triton.http_url}/v2/models/add_one")
    assert meta["name"] == "add_one"
    assert meta["platform"] == "python"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}]

    assert wait_count(triton, N_REQUESTS) == N_REQUESTS
    assert triton.failure_count() == 0

    host, port = triton.grpc_target.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5):
        pass
