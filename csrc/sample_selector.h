#pragma once
// The sample order: which samples of the sample set each query carries.

#include <cstdint>
#include <vector>

#include "rng.h"

namespace loadgen {

/// How query samples are drawn from the sample set.
enum class SampleOrder {
  kSequential,  ///< 0, 1, ..., n-1, 0, 1, ...
  kShuffled,    ///< a fresh seeded permutation of 0..n-1 for each pass
  kRandom,      ///< independent uniform draws (with replacement), as MLPerf's performance mode
};

/// Draws sample indices in [0, sample_count). Not thread-safe: owned by the issue thread.
class SampleSelector {
 public:
  /// sample_count >= 1. Throws std::invalid_argument otherwise.
  SampleSelector(int64_t sample_count, SampleOrder order, uint64_t seed);
  int64_t next() noexcept;

 private:
  int64_t count_;
  SampleOrder order_;
  Rng rng_;
  int64_t position_ = 0;
  std::vector<int64_t> permutation_;
};

}  // namespace loadgen
