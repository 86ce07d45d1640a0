#include "hdr_histogram.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace loadgen {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

// Number of buckets needed so that `value` is trackable; mirrors HdrHistogram_c,
// including its guard against shifting past INT64_MAX.
int32_t buckets_needed_to_cover(int64_t value, int32_t sub_bucket_count, int32_t unit_magnitude) {
  int64_t smallest_untrackable = static_cast<int64_t>(sub_bucket_count) << unit_magnitude;
  int32_t buckets = 1;
  while (smallest_untrackable <= value) {
    if (smallest_untrackable > INT64_MAX / 2) return buckets + 1;
    smallest_untrackable <<= 1;
    ++buckets;
  }
  return buckets;
}

void atomic_min(std::atomic<int64_t>& a, int64_t v) noexcept {
  int64_t cur = a.load(std::memory_order_relaxed);
  while (v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

void atomic_max(std::atomic<int64_t>& a, int64_t v) noexcept {
  int64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace

HdrHistogram::HdrHistogram(int64_t lowest_discernible_value, int64_t highest_trackable_value,
                           int significant_figures)
    : lowest_discernible_value_(lowest_discernible_value),
      highest_trackable_value_(highest_trackable_value),
      significant_figures_(significant_figures) {
  require(lowest_discernible_value >= 1,
          "lowest_discernible_value must be >= 1, got " + std::to_string(lowest_discernible_value));
  require(significant_figures >= 1 && significant_figures <= 5,
          "significant_figures must be in 1..5, got " + std::to_string(significant_figures));
  require(lowest_discernible_value <= INT64_MAX / 2 &&
              highest_trackable_value >= 2 * lowest_discernible_value,
          "highest_trackable_value must be >= 2 * lowest_discernible_value (" +
              std::to_string(lowest_discernible_value) + "), got " +
              std::to_string(highest_trackable_value));

  int64_t largest_single_unit = 2;
  for (int i = 0; i < significant_figures; ++i) largest_single_unit *= 10;
  int32_t sub_bucket_count_magnitude = 0;
  while ((int64_t{1} << sub_bucket_count_magnitude) < largest_single_unit) ++sub_bucket_count_magnitude;
  sub_bucket_half_count_magnitude_ = std::max(sub_bucket_count_magnitude, 1) - 1;
  unit_magnitude_ = 63 - __builtin_clzll(static_cast<uint64_t>(lowest_discernible_value));
  require(unit_magnitude_ + sub_bucket_half_count_magnitude_ <= 61,
          "lowest_discernible_value " + std::to_string(lowest_discernible_value) +
              " is too large for significant_figures " + std::to_string(significant_figures));
  sub_bucket_count_ = int32_t{1} << (sub_bucket_half_count_magnitude_ + 1);
  sub_bucket_half_count_ = sub_bucket_count_ / 2;
  sub_bucket_mask_ = static_cast<uint64_t>(sub_bucket_count_ - 1) << unit_magnitude_;
  bucket_count_ = buckets_needed_to_cover(highest_trackable_value, sub_bucket_count_, unit_magnitude_);
  counts_len_ = (bucket_count_ + 1) * sub_bucket_half_count_;
  counts_.reset(new std::atomic<int64_t>[counts_len_]());
}

HdrHistogram::HdrHistogram(const HdrHistogram& other) { copy_from(other); }

HdrHistogram& HdrHistogram::operator=(const HdrHistogram& other) {
  if (this != &other) copy_from(other);
  return *this;
}

HdrHistogram::HdrHistogram(HdrHistogram&& other) noexcept { *this = std::move(other); }

HdrHistogram& HdrHistogram::operator=(HdrHistogram&& other) noexcept {
  if (this == &other) return *this;
  lowest_discernible_value_ = other.lowest_discernible_value_;
  highest_trackable_value_ = other.highest_trackable_value_;
  significant_figures_ = other.significant_figures_;
  unit_magnitude_ = other.unit_magnitude_;
  sub_bucket_half_count_magnitude_ = other.sub_bucket_half_count_magnitude_;
  sub_bucket_count_ = other.sub_bucket_count_;
  sub_bucket_half_count_ = other.sub_bucket_half_count_;
  sub_bucket_mask_ = other.sub_bucket_mask_;
  bucket_count_ = other.bucket_count_;
  counts_len_ = other.counts_len_;
  total_.store(other.total_.load());
  rejected_.store(other.rejected_.load());
  min_.store(other.min_.load());
  max_.store(other.max_.load());
  counts_ = std::move(other.counts_);
  return *this;
}

void HdrHistogram::copy_from(const HdrHistogram& other) {
  lowest_discernible_value_ = other.lowest_discernible_value_;
  highest_trackable_value_ = other.highest_trackable_value_;
  significant_figures_ = other.significant_figures_;
  unit_magnitude_ = other.unit_magnitude_;
  sub_bucket_half_count_magnitude_ = other.sub_bucket_half_count_magnitude_;
  sub_bucket_count_ = other.sub_bucket_count_;
  sub_bucket_half_count_ = other.sub_bucket_half_count_;
  sub_bucket_mask_ = other.sub_bucket_mask_;
  bucket_count_ = other.bucket_count_;
  counts_len_ = other.counts_len_;
  counts_.reset(new std::atomic<int64_t>[counts_len_]());
  for (int32_t i = 0; i < counts_len_; ++i) {
    counts_[i].store(other.counts_[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  total_.store(other.total_.load(std::memory_order_relaxed));
  rejected_.store(other.rejected_.load(std::memory_order_relaxed));
  min_.store(other.min_.load(std::memory_order_relaxed));
  max_.store(other.max_.load(std::memory_order_relaxed));
}

bool HdrHistogram::record_atomic(int64_t value, int64_t count) noexcept {
  const int32_t index = counts_index_checked(value);
  if (index < 0 || count < 0) {
    if (count > 0) rejected_.fetch_add(count, std::memory_order_relaxed);
    return false;
  }
  if (count == 0) return true;
  counts_[index].fetch_add(count, std::memory_order_relaxed);
  total_.fetch_add(count, std::memory_order_relaxed);
  atomic_min(min_, value);
  atomic_max(max_, value);
  return true;
}

bool HdrHistogram::record_corrected(int64_t value, int64_t expected_interval, int64_t count,
                                    bool atomic) noexcept {
  auto rec = [&](int64_t v) { return atomic ? record_atomic(v, count) : record_n(v, count); };
  if (!rec(value)) return false;
  if (expected_interval <= 0 || value <= expected_interval) return true;
  for (int64_t missing = value - expected_interval; missing >= expected_interval;
       missing -= expected_interval) {
    if (!rec(missing)) return false;
  }
  return true;
}

size_t HdrHistogram::record_values(const int64_t* values, const int64_t* counts, size_t n,
                                   bool atomic) noexcept {
  size_t recorded = 0;
  if (atomic) {
    for (size_t i = 0; i < n; ++i) recorded += record_atomic(values[i], counts ? counts[i] : 1);
  } else if (counts) {
    for (size_t i = 0; i < n; ++i) recorded += record_n(values[i], counts[i]);
  } else {
    for (size_t i = 0; i < n; ++i) recorded += record(values[i]);
  }
  return recorded;
}

void HdrHistogram::add_rejected(int64_t n) noexcept {
  if (n > 0) rejected_.fetch_add(n, std::memory_order_relaxed);
}

bool HdrHistogram::same_layout(const HdrHistogram& other) const noexcept {
  return unit_magnitude_ == other.unit_magnitude_ &&
         sub_bucket_count_ == other.sub_bucket_count_ && bucket_count_ == other.bucket_count_;
}

bool HdrHistogram::can_hold(const HdrHistogram& other) const noexcept {
  if (same_layout(other) || other.total_count() == 0) return true;
  // add() re-records other's buckets at their lowest equivalent values.
  return counts_index_checked(other.lowest_equivalent_value(other.raw_max())) >= 0;
}

int64_t HdrHistogram::add(const HdrHistogram& other) {
  add_rejected(other.rejected_count());
  if (same_layout(other)) {
    // Atomic adds, so that merging never loses a concurrent record_atomic.
    const int32_t used = other.used_counts_len();
    for (int32_t i = 0; i < used; ++i) {
      const int64_t c = other.count_at_index(i);
      if (c) counts_[i].fetch_add(c, std::memory_order_relaxed);
    }
    total_.fetch_add(other.total_count(), std::memory_order_relaxed);
    if (other.total_count() > 0) {
      atomic_min(min_, other.raw_min());
      atomic_max(max_, other.raw_max());
    }
    return 0;
  }
  int64_t dropped = 0;
  const int32_t used = other.used_counts_len();
  for (int32_t i = 0; i < used; ++i) {
    const int64_t c = other.count_at_index(i);
    if (c && !record_atomic(other.value_from_index(i), c)) dropped += c;
  }
  return dropped;
}

void HdrHistogram::reset() noexcept {
  for (int32_t i = 0; i < counts_len_; ++i) counts_[i].store(0, std::memory_order_relaxed);
  total_.store(0);
  rejected_.store(0);
  min_.store(INT64_MAX);
  max_.store(0);
}

int64_t HdrHistogram::min() const noexcept {
  if (total_count() == 0) return 0;
  const int64_t m = raw_min();
  return m == INT64_MAX ? 0 : lowest_equivalent_value(m);
}

int64_t HdrHistogram::max() const noexcept {
  const int64_t m = raw_max();
  return m == 0 ? 0 : highest_equivalent_value(m);
}

int32_t HdrHistogram::used_counts_len() const noexcept {
  if (total_count() == 0) return 0;
  const int32_t index = counts_index_checked(raw_max());
  return index < 0 ? counts_len_ : index + 1;
}

double HdrHistogram::mean() const noexcept {
  const int64_t total = total_count();
  if (total == 0) return 0.0;
  // Exact integer sum (as HdrHistogram's reference implementations do), then one division.
  unsigned __int128 sum = 0;
  const int32_t used = used_counts_len();
  for (int32_t i = 0; i < used; ++i) {
    const int64_t c = count_at_index(i);
    if (c) sum += static_cast<unsigned __int128>(c) *
                  static_cast<uint64_t>(median_equivalent_value(value_from_index(i)));
  }
  return static_cast<double>(static_cast<long double>(sum) / static_cast<long double>(total));
}

double HdrHistogram::stddev() const noexcept {
  const int64_t total = total_count();
  if (total == 0) return 0.0;
  const double m = mean();
  double sum_sq = 0.0;
  const int32_t used = used_counts_len();
  for (int32_t i = 0; i < used; ++i) {
    const int64_t c = count_at_index(i);
    if (c) {
      const double dev = static_cast<double>(median_equivalent_value(value_from_index(i))) - m;
      sum_sq += dev * dev * static_cast<double>(c);
    }
  }
  return std::sqrt(sum_sq / static_cast<double>(total));
}

namespace {
int64_t count_at_percentile(double percentile, int64_t total) {
  const double requested = std::min(std::max(percentile, 0.0), 100.0);
  // Same expression and rounding as the reference implementations, so that results
  // agree bucket for bucket.
  const auto target = static_cast<int64_t>(requested * static_cast<double>(total) / 100.0 + 0.5);
  return std::max<int64_t>(target, 1);
}
}  // namespace

int64_t HdrHistogram::value_at_percentile(double percentile) const noexcept {
  int64_t out = 0;
  values_at_percentiles(&percentile, &out, 1);
  return out;
}

void HdrHistogram::values_at_percentiles(const double* percentiles, int64_t* out, size_t n) const {
  const int64_t total = total_count();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return percentiles[a] < percentiles[b]; });
  size_t next = 0;
  if (total == 0) {
    for (size_t k = 0; k < n; ++k) out[k] = 0;
    return;
  }
  int64_t running = 0;
  for (int32_t i = 0; i < counts_len_ && next < n; ++i) {
    running += count_at_index(i);
    while (next < n && running >= count_at_percentile(percentiles[order[next]], total)) {
      const int64_t v = value_from_index(i);
      out[order[next]] = percentiles[order[next]] > 0.0 ? highest_equivalent_value(v)
                                                        : lowest_equivalent_value(v);
      ++next;
    }
  }
  // Only reachable while another thread records: the counts ran out before the total.
  for (; next < n; ++next) out[order[next]] = max();
}

double HdrHistogram::percentile_of_value(int64_t value) const noexcept {
  const int64_t total = total_count();
  if (total == 0) return 100.0;
  if (value < 0) return 0.0;
  int32_t last = counts_index_for(value);
  if (last < 0 || last >= counts_len_) last = counts_len_ - 1;
  int64_t below = 0;
  for (int32_t i = 0; i <= last; ++i) below += count_at_index(i);
  return 100.0 * static_cast<double>(below) / static_cast<double>(total);
}

int64_t HdrHistogram::count_between(int64_t low, int64_t high) const noexcept {
  if (high < low || high < 0) return 0;
  const int32_t first = low <= 0 ? 0 : counts_index_for(low);
  int32_t last = counts_index_for(high);
  if (last < 0 || last >= counts_len_) last = counts_len_ - 1;
  if (first < 0 || first >= counts_len_) return 0;
  int64_t sum = 0;
  for (int32_t i = first; i <= last; ++i) sum += count_at_index(i);
  return sum;
}

int64_t HdrHistogram::count_at_value(int64_t value) const noexcept {
  const int32_t index = counts_index_checked(value);
  return index < 0 ? 0 : count_at_index(index);
}

int64_t HdrHistogram::value_from_index(int32_t index) const noexcept {
  int32_t bucket = (index >> sub_bucket_half_count_magnitude_) - 1;
  int32_t sub_bucket = (index & (sub_bucket_half_count_ - 1)) + sub_bucket_half_count_;
  if (bucket < 0) {
    sub_bucket -= sub_bucket_half_count_;
    bucket = 0;
  }
  return static_cast<int64_t>(sub_bucket) << (bucket + unit_magnitude_);
}

int64_t HdrHistogram::lowest_equivalent_value(int64_t value) const noexcept {
  const int32_t b = bucket_index(value);
  return static_cast<int64_t>(sub_bucket_index(value, b)) << (b + unit_magnitude_);
}

int64_t HdrHistogram::equivalent_value_range(int64_t value) const noexcept {
  const int32_t b = bucket_index(value);
  const int32_t sb = sub_bucket_index(value, b);
  const int32_t adjusted = sb >= sub_bucket_count_ ? b + 1 : b;
  return int64_t{1} << (unit_magnitude_ + adjusted);
}

int64_t HdrHistogram::highest_equivalent_value(int64_t value) const noexcept {
  // Unsigned, because the top bucket's next non-equivalent value may be 2^63.
  return static_cast<int64_t>(static_cast<uint64_t>(lowest_equivalent_value(value)) +
                              static_cast<uint64_t>(equivalent_value_range(value)) - 1);
}

int64_t HdrHistogram::median_equivalent_value(int64_t value) const noexcept {
  return lowest_equivalent_value(value) + (equivalent_value_range(value) >> 1);
}

void HdrHistogram::load_counts(const int64_t* counts, int32_t n) {
  if (n < 0 || n > counts_len_) throw std::invalid_argument("load_counts: too many counts");
  reset();
  int64_t total = 0;
  int32_t first = -1;
  int32_t last = -1;
  for (int32_t i = 0; i < n; ++i) {
    if (counts[i] < 0) throw std::invalid_argument("load_counts: negative count");
    if (counts[i] == 0) continue;
    if (__builtin_add_overflow(total, counts[i], &total)) {
      throw std::invalid_argument("load_counts: total count overflows 64 bits");
    }
    counts_[i].store(counts[i], std::memory_order_relaxed);
    if (first < 0) first = i;
    last = i;
  }
  total_.store(total);
  if (first >= 0) {
    min_.store(value_from_index(first));
    max_.store(highest_equivalent_value(value_from_index(last)));
  }
}

}  // namespace loadgen
