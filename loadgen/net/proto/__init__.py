"""The gRPC protocol definitions loadgen speaks: KServe v2 (kserve_v2.proto) and Triton's statistics
extension (triton_stats.proto), shipped for reference and for scripts/regen_proto.sh."""
