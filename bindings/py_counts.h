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
}

}  // namespace loadgen_bindings
