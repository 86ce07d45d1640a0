#include "timeseries.h"

#include <algorithm>
#include <utility>

#include "hdr_codec.h"

namespace loadgen {

TimeSeries::TimeSeries(int64_t highest_trackable_ns, int significant_figures)
    : prev_(1, highest_trackable_ns, significant_figures) {}

void TimeSeries::begin(int64_t start_ns) {
  start_ns_ = start_ns;
  prev_ns_ = start_ns;
}

void TimeSeries::snapshot(HdrHistogram total, int64_t issued, int64_t now_ns) {
  std::vector<int64_t> diff(static_cast<size_t>(total.counts_len()));
  for (int32_t i = 0; i < total.counts_len(); ++i) {
    diff[i] = std::max<int64_t>(total.count_at_index(i) - prev_.count_at_index(i), 0);
  }
  HdrHistogram interval(1, prev_.highest_trackable_value(), prev_.significant_figures());
  interval.load_counts(diff.data(), static_cast<int32_t>(diff.size()));
  IntervalPoint p;
  p.start_offset_ns = prev_ns_ - start_ns_;
  p.length_ns = now_ns - prev_ns_;
  p.issued = issued - prev_issued_;
  p.completed = interval.total_count();
  p.latency_p50_ns = interval.value_at_percentile(50.0);
  p.latency_p99_ns = interval.value_at_percentile(99.0);
  p.latency_max_ns = interval.max();
  p.latency_hdr = encode_compressed(interval);
  prev_ = std::move(total);
  prev_issued_ = issued;
  prev_ns_ = now_ns;
  std::lock_guard<std::mutex> lock(mutex_);
  points_.push_back(std::move(p));
}

std::vector<IntervalPoint> TimeSeries::points() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return points_;
}

}  // namespace loadgen
