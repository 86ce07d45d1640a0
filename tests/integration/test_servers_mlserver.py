"""Smoke test of the real MLServer the network tests use (tests/servers/mlserver.py).

Skipped where MLServer is not installed, unless LOADGEN_REQUIRE_SERVERS is set: then it
fails and says how to install it.
"""

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.servers.mlserver import MLServer, find_mlserver, running_mlserver
from tests.servers.procs import check_add_one_over_rest, get_json, wait_for_count

pytestmark = pytest.mark.integration

N_REQUESTS = 5

# A KServe v2 gRPC client run by the MLServer environment's own Python, with the stubs
# MLServer ships: the test environment needs no gRPC package. One request with typed
# contents, one with raw_input_contents; MLServer answers each in the same form.
GRPC_CLIENT = """
import sys
import grpc
import numpy as np
from mlserver.grpc import dataplane_pb2 as pb, dataplane_pb2_grpc as pb_grpc

x = np.arange(16, dtype=np.float32) / 4
Tensor = pb.ModelInferRequest.InferInputTensor
with grpc.insecure_channel(sys.argv[1]) as channel:
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    typed = stub.ModelInfer(pb.ModelInferRequest(model_name="add_one", inputs=[Tensor(
        name="INPUT0", datatype="FP32", shape=[1, 16],
        contents=pb.InferTensorContents(fp32_contents=x.tolist()))]), timeout=10)
    raw = stub.ModelInfer(pb.ModelInferRequest(
        model_name="add_one", inputs=[Tensor(name="INPUT0", datatype="FP32", shape=[1, 16])],
        raw_input_contents=[x.tobytes()]), timeout=10)
for reply in (typed, raw):
    [output] = reply.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("OUTPUT0", "FP32", [1, 16])
assert not typed.raw_output_contents
assert list(typed.outputs[0].contents.fp32_contents) == (x + 1).tolist()
assert not raw.outputs[0].contents.fp32_contents
assert np.frombuffer(raw.raw_output_contents[0], np.float32).tolist() == (x + 1).tolist()
print("ok")
"""


@pytest.fixture
def mlserver(tmp_path) -> Iterator[MLServer]:
    yield from running_mlserver(str(tmp_path))


def test_mlserver_rest_infer_metadata_and_count(mlserver: MLServer) -> None:
    check_add_one_over_rest(mlserver.http_url, N_REQUESTS)
    nometa = get_json(f"{mlserver.http_url}/v2/models/add_one_nometa")
    assert nometa["name"] == "add_one_nometa"
    assert nometa["inputs"] == [] and nometa["outputs"] == []

    assert wait_for_count(lambda: mlserver.inference_count(model="add_one"), N_REQUESTS) == N_REQUESTS
    assert mlserver.inference_count("add_one", protocol="rest") == N_REQUESTS
    assert mlserver.inference_count("add_one", protocol="grpc") == 0
    assert mlserver.inference_count("add_one_nometa") == 0


def test_mlserver_grpc_infer_and_count(mlserver: MLServer) -> None:
    python = Path(str(find_mlserver())) / "bin" / "python"
    done = subprocess.run([str(python), "-c", GRPC_CLIENT, mlserver.grpc_target],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert wait_for_count(lambda: mlserver.inference_count(model="add_one"), 2) == 2
    assert mlserver.inference_count("add_one", protocol="grpc") == 2
    assert mlserver.inference_count("add_one", protocol="rest") == 0
