#include "sample_selector.h"

#include <string>
#include <utility>

#include "require.h"

namespace loadgen {

using detail::require;

SampleSelector::SampleSelector(int64_t sample_count, SampleOrder order, uint64_t seed)
    : count_(sample_count), order_(order), rng_(seed) {
  require(sample_count >= 1, "sample_count must be >= 1, got " + std::to_string(sample_count));
  if (order == SampleOrder::kShuffled) {
    permutation_.resize(static_cast<size_t>(sample_count));
    position_ = sample_count;  // shuffle on first use
  }
}

int64_t SampleSelector::next() noexcept {
  switch (order_) {
    case SampleOrder::kSequential: {
      const int64_t v = position_;
      position_ = position_ + 1 == count_ ? 0 : position_ + 1;
      return v;
    }
    case SampleOrder::kShuffled:
      if (position_ == count_) {
        for (int64_t i = 0; i < count_; ++i) permutation_[i] = i;
        for (int64_t i = count_ - 1; i > 0; --i) {
          std::swap(permutation_[i], permutation_[rng_.below(static_cast<uint64_t>(i) + 1)]);
        }
        position_ = 0;
      }
      return permutation_[position_++];
    case SampleOrder::kRandom:
      return static_cast<int64_t>(rng_.below(static_cast<uint64_t>(count_)));
  }
  return 0;
}

}  // namespace loadgen
