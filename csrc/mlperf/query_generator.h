#pragma once
// MLPerf's queries, generated lazily.
//
// QueryGenerator yields, lazily and in order, the very queries the MLPerf LoadGen
// pre-generates for the same settings and seeds (same sample indices, same scheduled
// offsets, same count), so a harness sees the same load from either module while memory
// stays flat in run length.

#include <cstdint>
#include <vector>

#include "mlperf/rng.h"

namespace loadgen {
namespace mlperf {

/// MLPerf's scenarios, with MLPerf's numbering.
enum class Scenario : int { kSingleStream = 0, kMultiStream = 1, kServer = 2, kOffline = 3 };

/// What decides the queries of one run (MLPerf's effective settings plus the loaded set).
struct GeneratorSettings {
  Scenario scenario = Scenario::kSingleStream;
  bool accuracy = false;                  ///< accuracy-mode query set (else performance)
  std::vector<int64_t> loaded_samples;    ///< the loaded QSL set, MultiStream padding included
  int64_t sample_distribution_end = 0;    ///< loaded set size without padding (>= 1)
  int64_t samples_per_query = 1;          ///< >= 1
  int64_t target_duration_ns = 0;         ///< >= 0
  int64_t min_query_count = 0;            ///< >= 0
  double target_qps = 1.0;                ///< > 0
  bool performance_issue_unique = false;
  bool performance_issue_same = false;
  int64_t performance_issue_same_index = 0;
  bool sample_concatenate_permutation = false;
  uint64_t sample_index_rng_seed = 0;
  uint64_t schedule_rng_seed = 0;
};

/// Lazily yields MLPerf's queries. Not thread-safe.
class QueryGenerator {
 public:
  /// Throws std::invalid_argument naming a bad field.
  explicit QueryGenerator(GeneratorSettings settings);
  /// The next query: its sample indices into `samples` (resized) and its scheduled
  /// offset (ns from the start). False when every query has been generated.
  bool next(std::vector<int64_t>* samples, int64_t* scheduled_ns);
  /// Generates the rest without keeping it (to learn the total count).
  void drain();
  int64_t generated() const noexcept { return generated_; }
  /// Samples per query of the generated queries (Offline accuracy: the set size).
  int64_t samples_per_query() const noexcept { return spq_; }
  /// The offset after the last generated query (MLPerf's generated_query_duration).
  int64_t end_timestamp_ns() const noexcept { return timestamp_; }

 private:
  int64_t draw_index();
  int64_t take(std::vector<int64_t>& from, size_t* pos);

  GeneratorSettings s_;
  Mt19937 sample_rng_;
  Mt19937 schedule_rng_;
  int64_t spq_ = 1;
  int64_t gen_duration_ns_ = 0;
  int64_t min_queries_ = 0;
  bool equal_issue_ = false;
  bool remainder_done_ = false;
  int64_t generated_ = 0;
  int64_t timestamp_ = 0;
  int64_t prev_timestamp_ = 0;
  int64_t period_ns_ = 0;
  std::vector<int64_t> mode_indices_;  // accuracy mode: shuffled draw order
  size_t mode_pos_ = 0;
  std::vector<int64_t> unique_indices_;
  size_t unique_pos_ = 0;
  std::vector<int64_t> equal_indices_;
  size_t equal_pos_ = 0;
};

/// MLPerf's loadable sets: the first `total_sample_count` QSL indices (at most
/// `qsl_total_count`) shuffled with `qsl_rng_seed`, cut into sets of `set_size`, each
/// padded with its first `padding` entries (MultiStream).
std::vector<std::vector<int64_t>> loadable_sets(int64_t total_sample_count, int64_t qsl_total_count,
                                                int64_t set_size, int64_t padding,
                                                uint64_t qsl_rng_seed);

}  // namespace mlperf
}  // namespace loadgen
