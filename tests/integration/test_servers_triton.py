"""Smoke test of the real Triton Inference Server the network tests use (tests/servers/triton.py).

Skipped where Triton is not installed, unless LOADGEN_REQUIRE_SERVERS is set: then it fails
and says how to install it.
"""

import socket
from typing import Iterator

import pytest

from tests.servers.procs import check_add_one_over_rest, require_servers, wait_for_count
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


def test_triton_rest_infer_metadata_count_and_grpc_port(triton: TritonServer) -> None:
    meta = check_add_one_over_rest(triton.http_url, N_REQUESTS)
    assert meta["platform"] == "python"

    assert wait_for_count(triton.inference_count, N_REQUESTS) == N_REQUESTS
    assert triton.failure_count() == 0

    host, port = triton.grpc_target.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5):
        pass
