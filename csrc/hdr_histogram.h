#pragma once
// A log-linear High Dynamic Range histogram, following the published HdrHistogram design
// (bucket layout, equivalent-value ranges and iteration order are the same as
// HdrHistogram_c and Java's HdrHistogram, so encoded payloads are interchangeable).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace loadgen {

/// A High Dynamic Range histogram of non-negative 64-bit integer values.
///
/// Values in [0, highest_trackable_value] are recorded with a relative precision of
/// `significant_figures` decimal digits; values below `lowest_discernible_value` share
/// the first bucket. Counts are 64-bit.
///
/// Thread-safety: the `record*` family is for one writing thread at a time (plain
/// loads and stores, a few instructions). `record_atomic` may be called from any number
/// of threads at once. Every reader (percentiles, counts, encode, copy) may run while a
/// writer records: counts are read with relaxed atomic loads, so a read that overlaps
/// recording sees some consistent-per-bucket state, never a torn value. Configuration
/// methods (`reset`, `add`, assignment) need exclusive access.
class HdrHistogram {
 public:
  /// Creates an empty histogram.
  /// lowest_discernible_value: >= 1; the smallest value told apart from 0.
  /// highest_trackable_value: >= 2 * lowest_discernible_value.
  /// significant_figures: 1..5, decimal digits of precision kept at every magnitude.
  /// Throws std::invalid_argument naming the field and its allowed range.
  HdrHistogram(int64_t lowest_discernible_value, int64_t highest_trackable_value,
               int significant_figures);
  HdrHistogram(const HdrHistogram& other);
  HdrHistogram& operator=(const HdrHistogram& other);
  HdrHistogram(HdrHistogram&& other) noexcept;
  HdrHistogram& operator=(HdrHistogram&& other) noexcept;
  ~HdrHistogram() = default;

  // --- recording (hot path: never throws, returns false when out of range) ---

  /// Records one occurrence of `value`. Single writer. Returns false (and counts the
  /// value as rejected) when value < 0 or value is beyond the trackable range.
  bool record(int64_t value) noexcept { return record_n(value, 1); }

  /// Records `count` (>= 0) occurrences of `value`. Single writer.
  bool record_n(int64_t value, int64_t count) noexcept {
    const int32_t index = counts_index_checked(value);
    if (index < 0 || count < 0) {
      if (count > 0) bump(rejected_, count);
      return false;
    }
    if (count == 0) return true;  // nothing recorded: min and max stay as they are
    bump(counts_[index], count);
    bump(total_, count);
    if (value < min_.load(std::memory_order_relaxed)) min_.store(value, std::memory_order_relaxed);
    if (value > max_.load(std::memory_order_relaxed)) max_.store(value, std::memory_order_relaxed);
    return true;
  }

  /// Records `count` occurrences of `value`; safe from any number of threads at once
  /// (lock-free: one atomic add per counter, min/max by compare-and-swap when they move).
  bool record_atomic(int64_t value, int64_t count = 1) noexcept;

  /// Records `value` and, when it exceeds `expected_interval` (> 0), the values
  /// value - k * expected_interval that are >= expected_interval, as HdrHistogram_c's
  /// hdr_record_corrected_values does (coordinated-omission back-fill). Single writer
  /// unless `atomic`.
  bool record_corrected(int64_t value, int64_t expected_interval, int64_t count = 1,
                        bool atomic = false) noexcept;

  /// Records n values (each once, or counts[i] times when counts is non-null).
  /// `atomic` selects record_atomic semantics. Returns how many values were recorded.
  size_t record_values(const int64_t* values, const int64_t* counts, size_t n,
                       bool atomic) noexcept;

  /// Adds `n` to the rejected count (values that were measured but could not be
  /// recorded elsewhere, e.g. restored state).
  void add_rejected(int64_t n) noexcept;

  // --- merging and reset ---

  /// True when every value recorded in `other` fits into this histogram's range.
  bool can_hold(const HdrHistogram& other) const noexcept;

  /// Adds all of `other`'s counts. Exact when the two have the same layout; otherwise
  /// each of other's buckets is re-recorded at its lowest equivalent value. Values that
  /// do not fit are dropped and counted as rejected; returns how many were dropped.
  int64_t add(const HdrHistogram& other);

  /// Clears every count, min, max and the rejected count.
  void reset() noexcept;

  // --- statistics (readers) ---

  int64_t total_count() const noexcept { return total_.load(std::memory_order_relaxed); }
  /// Values that were offered but not recorded (negative or beyond range).
  int64_t rejected_count() const noexcept { return rejected_.load(std::memory_order_relaxed); }
  /// Lowest equivalent value of the smallest recorded value; 0 when empty.
  int64_t min() const noexcept;
  /// Highest equivalent value of the largest recorded value; 0 when empty.
  int64_t max() const noexcept;
  /// Raw smallest/largest value recorded (INT64_MAX / 0 when empty).
  int64_t raw_min() const noexcept { return min_.load(std::memory_order_relaxed); }
  int64_t raw_max() const noexcept { return max_.load(std::memory_order_relaxed); }
  /// Mean of the recorded values, each taken at its bucket's median equivalent value.
  double mean() const noexcept;
  /// Population standard deviation, on the same basis as mean().
  double stddev() const noexcept;
  /// The value at `percentile` (0..100; above 100 is taken as 100): the highest
  /// equivalent value of the bucket where the cumulative count first reaches
  /// round(percentile / 100 * total); the lowest equivalent value for percentile 0.
  /// 0 when empty.
  int64_t value_at_percentile(double percentile) const noexcept;
  /// value_at_percentile for each of `n` percentiles (any order), in one pass.
  void values_at_percentiles(const double* percentiles, int64_t* out, size_t n) const;
  /// Percentage (0..100) of recorded values at or below `value`'s bucket; 100 when empty.
  double percentile_of_value(int64_t value) const noexcept;
  /// Count of recorded values whose buckets lie between those of low and high inclusive.
  int64_t count_between(int64_t low, int64_t high) const noexcept;
  /// Count in the bucket that holds `value` (0 when out of range).
  int64_t count_at_value(int64_t value) const noexcept;

  // --- layout ---

  int64_t lowest_discernible_value() const noexcept { return lowest_discernible_value_; }
  int64_t highest_trackable_value() const noexcept { return highest_trackable_value_; }
  int significant_figures() const noexcept { return significant_figures_; }
  int32_t counts_len() const noexcept { return counts_len_; }
  int32_t bucket_count() const noexcept { return bucket_count_; }
  int32_t sub_bucket_count() const noexcept { return sub_bucket_count_; }
  int32_t unit_magnitude() const noexcept { return unit_magnitude_; }
  /// True when both have the same bucket layout (then add() is an exact array sum).
  bool same_layout(const HdrHistogram& other) const noexcept;

  /// Count at counts-array index `index` (0 <= index < counts_len()).
  int64_t count_at_index(int32_t index) const noexcept {
    return counts_[index].load(std::memory_order_relaxed);
  }
  /// Index of the bucket holding `value`, or -1 when value < 0 or beyond range.
  int32_t counts_index_checked(int64_t value) const noexcept {
    if (value < 0) return -1;
    const int32_t index = counts_index_for(value);
    return (index < 0 || index >= counts_len_) ? -1 : index;
  }
  /// Lowest value that falls into the bucket at counts-array `index`.
  int64_t value_from_index(int32_t index) const noexcept;
  int64_t lowest_equivalent_value(int64_t value) const noexcept;
  int64_t highest_equivalent_value(int64_t value) const noexcept;
  int64_t median_equivalent_value(int64_t value) const noexcept;
  /// Width of the range of values that share `value`'s bucket.
  int64_t equivalent_value_range(int64_t value) const noexcept;
  /// Index one past the last non-zero count (0 when empty).
  int32_t used_counts_len() const noexcept;

  /// Sets the raw min and max (as recorded values, not bucket bounds) after the counts
  /// were restored from an encoding that does not carry them. Exclusive access.
  void restore_raw_min_max(int64_t raw_min, int64_t raw_max) noexcept {
    min_.store(raw_min);
    max_.store(raw_max);
  }

  /// Replaces the counts with `counts[0..n)` (n <= counts_len()), recomputing total,
  /// min and max from them, as a decoded histogram does. Exclusive access.
  void load_counts(const int64_t* counts, int32_t n);

 private:
  static void bump(std::atomic<int64_t>& a, int64_t n) noexcept {
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  int32_t bucket_index(int64_t value) const noexcept {
    // value | mask keeps the index >= 0 for values below the first bucket's top.
    const int pow2ceiling = 64 - __builtin_clzll(static_cast<uint64_t>(value) | sub_bucket_mask_);
    return pow2ceiling - unit_magnitude_ - (sub_bucket_half_count_magnitude_ + 1);
  }
  int32_t sub_bucket_index(int64_t value, int32_t bucket) const noexcept {
    return static_cast<int32_t>(value >> (bucket + unit_magnitude_));
  }
  int32_t counts_index(int32_t bucket, int32_t sub_bucket) const noexcept {
    return ((bucket + 1) << sub_bucket_half_count_magnitude_) + sub_bucket - sub_bucket_half_count_;
  }
  int32_t counts_index_for(int64_t value) const noexcept {
    const int32_t b = bucket_index(value);
    return counts_index(b, sub_bucket_index(value, b));
  }
  void copy_from(const HdrHistogram& other);

  int64_t lowest_discernible_value_;
  int64_t highest_trackable_value_;
  int significant_figures_;
  int32_t unit_magnitude_;
  int32_t sub_bucket_half_count_magnitude_;
  int32_t sub_bucket_count_;
  int32_t sub_bucket_half_count_;
  uint64_t sub_bucket_mask_;
  int32_t bucket_count_;
  int32_t counts_len_;

  std::atomic<int64_t> total_{0};
  std::atomic<int64_t> rejected_{0};
  std::atomic<int64_t> min_{INT64_MAX};
  std::atomic<int64_t> max_{0};
  std::unique_ptr<std::atomic<int64_t>[]> counts_;
};

}  // namespace loadgen
