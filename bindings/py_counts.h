#pragma once
// The recorder's part of a counts dict, shared by the engine's and the MLPerf run's.
#include <pybind11/pybind11.h>

#include "recorder.h"

namespace loadgen_bindings {

/// Adds tokens, out_of_range, out_of_range_min_ns, out_of_range_max_ns and
/// first_token_out_of_range to `d`.
inline void put_recorder_counts(pybind11::dict& d, const loadgen::RecorderCounts& c) {
  d["tokens"] = c.tokens;
  d["out_of_range"] = c.out_of_range;
  d["out_of_range_min_ns"] = c.out_of_range_min_ns;
  d["out_of_range_max_ns"] = c.out_of_range_max_ns;
  d["first_token_out_of_range"] = c.first_token_out_of_range;
  d["slo_judged"] = c.slo_judged;
  d["slo_met"] = c.slo_met;
  d["slo_met_latency"] = c.slo_met_latency;
  d["slo_met_ttft"] = c.slo_met_ttft;
  d["slo_met_tpot"] = c.slo_met_tpot;
  d["stream_rate_milli_sum"] = c.stream_rate_milli_sum;
  d["stream_rate_count"] = c.stream_rate_count;
}

}  // namespace loadgen_bindings
