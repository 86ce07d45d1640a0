#include "mlperf/query_generator.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "require.h"

namespace loadgen {
namespace mlperf {
namespace {

using detail::require;

// Shuffled 0, stride, 2*stride, ... below `end` (MLPerf's accuracy-mode draw order).
std::vector<int64_t> strided_shuffle(int64_t end, int64_t stride, Mt19937& rng) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < end; i += stride) v.push_back(i);
  shuffle(v, 0, v.size(), rng);
  return v;
}

}  // namespace

QueryGenerator::QueryGenerator(GeneratorSettings s)
    : s_(std::move(s)), sample_rng_(s_.sample_index_rng_seed), schedule_rng_(s_.schedule_rng_seed) {
  const int64_t n = static_cast<int64_t>(s_.loaded_samples.size());
  require(n >= 1, "the loaded sample set is empty");
  require(s_.sample_distribution_end >= 1 && s_.sample_distribution_end <= n,
          "sample_distribution_end must be in 1..loaded set size");
  require(s_.samples_per_query >= 1, "samples_per_query must be >= 1");
  require(s_.target_duration_ns >= 0 && s_.min_query_count >= 0, "durations and counts must be >= 0");
  require(s_.target_qps > 0 && s_.target_qps < 1e300, "target_qps must be > 0");
  const bool offline = s_.scenario == Scenario::kOffline;
  const bool multi = s_.scenario == Scenario::kMultiStream;

  spq_ = s_.samples_per_query;
  if (s_.accuracy && offline) spq_ = s_.sample_distribution_end;
  gen_duration_ns_ = (s_.scenario == Scenario::kServer ? 1 : 2) * s_.target_duration_ns;
  min_queries_ = s_.min_query_count;
  if (s_.accuracy || s_.performance_issue_unique) {
    gen_duration_ns_ = 0;
    min_queries_ = n / spq_;
  }
  const int64_t stride = multi ? spq_ : 1;
  // MLPerf builds three sample distributions up front, each consuming the sample
  // stream in this order (even those the run never uses), so all three are built.
  if (s_.accuracy) mode_indices_ = strided_shuffle(s_.sample_distribution_end, stride, sample_rng_);
  unique_indices_ = strided_shuffle(s_.sample_distribution_end, stride, sample_rng_);
  equal_issue_ = s_.sample_concatenate_permutation;
  {
    std::vector<int64_t> perm(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
    for (int64_t j = 0; j < min_queries_; j += n) {
      if (equal_issue_ && !s_.accuracy) {
        shuffle(perm, 0, perm.size(), sample_rng_);
        equal_indices_.insert(equal_indices_.end(), perm.begin(), perm.end());
      } else {
        shuffle_draws(perm.size(), sample_rng_, [](size_t, size_t) {});  // draws only
      }
    }
  }
  if (!s_.accuracy && equal_issue_) {
    if (offline && spq_ % n != 0) {
      spq_ += n - spq_ % n;
    } else if (!offline && min_queries_ % n != 0) {
      min_queries_ += n - min_queries_ % n;
    }
  }
  require(!s_.performance_issue_same || (s_.performance_issue_same_index >= 0 &&
                                         s_.performance_issue_same_index < n),
          "performance_issue_same_index must be below the loaded set size");
  period_ns_ = seconds_to_ns(1.0 / s_.target_qps);
}

int64_t QueryGenerator::take(std::vector<int64_t>& from, size_t* pos) {
  if (from.empty()) throw std::out_of_range("the sample draw order is empty");
  // MLPerf's draw lists are used once through; the equal-issue list wraps around.
  if (*pos >= from.size()) {
    if (&from != &equal_indices_) throw std::out_of_range("more queries than unique samples");
    *pos = 0;
  }
  return from[(*pos)++];
}

int64_t QueryGenerator::draw_index() {
  if (s_.accuracy) return take(mode_indices_, &mode_pos_);
  return static_cast<int64_t>(uniform_int(sample_rng_, 0, static_cast<uint64_t>(s_.sample_distribution_end - 1)));
}

bool QueryGenerator::next(std::vector<int64_t>* samples, int64_t* scheduled_ns) {
  const auto& loaded = s_.loaded_samples;
  const int64_t n = static_cast<int64_t>(loaded.size());
  const bool offline = s_.scenario == Scenario::kOffline;
  if (!(prev_timestamp_ < gen_duration_ns_ || generated_ < min_queries_)) {
    // Offline accuracy runs end with a smaller query holding what did not divide.
    if (offline && s_.accuracy && !remainder_done_) {
      remainder_done_ = true;
      const int64_t rest = n % spq_;
      if (rest != 0) {
        samples->resize(static_cast<size_t>(rest));
        for (auto& x : *samples) x = loaded[static_cast<size_t>(draw_index())];
        *scheduled_ns = timestamp_;
        ++generated_;
        return true;
      }
    }
    return false;
  }
  samples->resize(static_cast<size_t>(spq_));
  auto& out = *samples;
  if (s_.scenario == Scenario::kMultiStream) {
    int64_t i = s_.performance_issue_unique ? take(unique_indices_, &unique_pos_)
                : s_.performance_issue_same ? s_.performance_issue_same_index
                                            : draw_index();
    for (auto& x : out) {
      if (i >= n) throw std::out_of_range("MultiStream query runs past the padded set");
      x = loaded[static_cast<size_t>(i++)];
    }
  } else if (offline) {
    if (s_.performance_issue_same) {
      std::fill(out.begin(), out.end(), loaded[static_cast<size_t>(s_.performance_issue_same_index)]);
    } else {
      const int64_t full = spq_ / n;
      const int64_t rest = spq_ % n;
      for (int64_t r = 0; r < full; ++r) {
        std::copy(loaded.begin(), loaded.end(), out.begin() + r * n);
        if (s_.sample_concatenate_permutation) {
          shuffle(out, static_cast<size_t>(r * n), static_cast<size_t>((r + 1) * n), sample_rng_);
        }
      }
      std::copy(loaded.begin(), loaded.begin() + rest, out.begin() + full * n);
    }
  } else {
    for (auto& x : out) {
      const int64_t i = s_.performance_issue_unique ? take(unique_indices_, &unique_pos_)
                        : s_.performance_issue_same ? s_.performance_issue_same_index
                        : equal_issue_              ? take(equal_indices_, &equal_pos_)
                                                    : draw_index();
      x = loaded[static_cast<size_t>(i)];
    }
  }
  *scheduled_ns = timestamp_;
  ++generated_;
  prev_timestamp_ = timestamp_;
  timestamp_ += s_.scenario == Scenario::kServer
                    ? seconds_to_ns(exponential(schedule_rng_, s_.target_qps))
                    : period_ns_;
  if (equal_issue_ && generated_ >= min_queries_ && prev_timestamp_ < gen_duration_ns_ && !offline) {
    min_queries_ += n;
  }
  return true;
}

void QueryGenerator::drain() {
  std::vector<int64_t> scratch;
  int64_t t = 0;
  while (next(&scratch, &t)) {
  }
}

std::vector<std::vector<int64_t>> loadable_sets(int64_t total_sample_count, int64_t qsl_total_count,
                                                int64_t set_size, int64_t padding,
                                                uint64_t qsl_rng_seed) {
  require(total_sample_count >= 0 && qsl_total_count >= 0, "sample counts must be >= 0");
  require(set_size >= 1, "performance sample count must be >= 1");
  require(padding >= 0, "padding must be >= 0");
  Mt19937 rng(qsl_rng_seed);
  const int64_t count = std::min(total_sample_count, qsl_total_count);
  std::vector<int64_t> all(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) all[static_cast<size_t>(i)] = i;
  shuffle(all, 0, all.size(), rng);
  std::vector<std::vector<int64_t>> sets;
  for (int64_t i = 0; i < count; i += set_size) {
    const int64_t end = std::min(count, i + set_size);
    sets.emplace_back(all.begin() + i, all.begin() + end);
  }
  for (auto& set : sets) {
    const size_t base = set.size();
    for (int64_t k = 0; k < padding; ++k) set.push_back(set[static_cast<size_t>(k) % base]);
  }
  return sets;
}

}  // namespace mlperf
}  // namespace loadgen

