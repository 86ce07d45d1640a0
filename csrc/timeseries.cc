#include "timeseries.h"

#include <algorithm>
#include <utility>

#include "hdr_codec.h"

namespace loadgen {

TimeSeries::TimeSeries(int64_t highest_trackable_ns, int significant_figures)
    : prev_latency_(1, highest_trackable_ns, significant_figures),
      prev_issue_delay_(1, highest_trackable_ns, significant_figures),
      prev_ttft_(1, highest_trackable_ns, significant_figures),
      interval_(1, highest_trackable_ns, significant_figures) {}

void TimeSeries::begin(int64_t start_ns) {
  start_ns_ = start_ns;
  prev_ns_ = start_ns;
}

const HdrHistogram& TimeSeries::cut(HdrHistogram total, HdrHistogram& prev) {
  // Counts only grow, so nothing past the total's last used count is new.
  const int32_t n = total.used_counts_len();
  diff_.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    diff_[i] = std::max<int64_t>(total.count_at_index(i) - prev.count_at_index(i), 0);
  }
  interval_.load_counts(diff_.data(), n);
  prev = std::move(total);
  return interval_;
}

namespace {

// The counts of `now` less those of `before`, kinds with none left out.
std::map<std::string, int64_t> kind_deltas(const std::map<std::string, int64_t>& now,
                                           const std::map<std::string, int64_t>& before) {
  std::map<std::string, int64_t> out;
  for (const auto& [kind, n] : now) {
    const auto it = before.find(kind);
    const int64_t d = n - (it == before.end() ? 0 : it->second);
    if (d > 0) out.emplace(kind, d);
  }
  return out;
}

}  // namespace

void TimeSeries::snapshot(const Recorder& recorder, IntervalTotals totals, int64_t now_ns) {
  IntervalPoint p;
  p.start_offset_ns = prev_ns_ - start_ns_;
  p.length_ns = now_ns - prev_ns_;
  const HdrHistogram& latency = cut(recorder.latency(), prev_latency_);
  p.completed = latency.total_count();
  const double pcts[] = {50.0, 90.0, 99.0};
  int64_t v[3];
  latency.values_at_percentiles(pcts, v, 3);
  p.latency_p50_ns = v[0];
  p.latency_p90_ns = v[1];
  p.latency_p99_ns = v[2];
  p.latency_max_ns = latency.max();
  p.latency_hdr = encode_compressed(latency);
  // The issue delay and TTFT histograms are merged only when their count (read before
  // the merge, so that a value recorded during it is seen next time) grew since the last
  // interval: a TTFT histogram stays empty in most runs.
  const int64_t delays = recorder.issue_delay_count();
  if (delays != prev_issue_delays_) {
    prev_issue_delays_ = delays;
    const HdrHistogram& delay = cut(recorder.issue_delay(), prev_issue_delay_);
    p.issue_delay_p50_ns = delay.value_at_percentile(50.0);
    p.issue_delay_p99_ns = delay.value_at_percentile(99.0);
    p.issue_delay_max_ns = delay.max();
  }
  const int64_t first_tokens = recorder.ttft_count();
  if (first_tokens != prev_first_tokens_) {
    prev_first_tokens_ = first_tokens;
    const HdrHistogram& ttft = cut(recorder.ttft(), prev_ttft_);
    p.ttft_p50_ns = ttft.value_at_percentile(50.0);
    p.ttft_p99_ns = ttft.value_at_percentile(99.0);
  }
  const int64_t tokens = recorder.counts().tokens;
  p.tokens = tokens - prev_tokens_;
  prev_tokens_ = tokens;
  p.issued = totals.issued - prev_.issued;
  p.failed = totals.failed - prev_.failed;
  p.timed_out = totals.timed_out - prev_.timed_out;
  p.errors = kind_deltas(totals.errors, prev_.errors);
  p.outstanding = totals.outstanding;
  prev_ = std::move(totals);
  prev_ns_ = now_ns;
  std::lock_guard<std::mutex> lock(mutex_);
  points_.push_back(std::move(p));
}

std::vector<IntervalPoint> TimeSeries::points() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return points_;
}

std::optional<IntervalPoint> TimeSeries::last() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (points_.empty()) return std::nullopt;
  return points_.back();
}

}  // namespace loadgen
