"""KServe v2 gRPC protocol definition (kserve_v2.proto), shipped for reference and for scripts/regen_proto.sh."""
