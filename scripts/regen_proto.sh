#!/usr/bin/env bash
# Regenerates loadgen/net/kserve_v2_pb2.py and loadgen/net/triton_stats_pb2.py (and their
# .pyi) from loadgen/net/proto/kserve_v2.proto and triton_stats.proto.
#
# The protoc of grpcio-tools 1.66.2 writes code for protobuf 5.27.2, which every protobuf
# runtime from 5.27.2 on imports without a warning (checked on 5.29 and 7.36); a newer
# protoc would raise that floor for every user. The tools are installed in a throwaway
# virtual environment so the project's own environment is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
tools="$(mktemp -d)"
trap 'rm -rf "$tools"' EXIT
python -m venv "$tools"
"$tools/bin/pip" install -q "grpcio-tools==1.66.2"
"$tools/bin/python" -m grpc_tools.protoc --proto_path=loadgen/net/proto \
    --python_out=loadgen/net --pyi_out=loadgen/net \
    loadgen/net/proto/kserve_v2.proto loadgen/net/proto/triton_stats.proto
python - <<'PY'
import loadgen.net.kserve_v2_pb2
import loadgen.net.triton_stats_pb2

for pb in (loadgen.net.kserve_v2_pb2, loadgen.net.triton_stats_pb2):
    print("generated", pb.__file__, "with", len(pb.DESCRIPTOR.message_types_by_name), "messages")
PY
