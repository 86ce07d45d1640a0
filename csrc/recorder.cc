#include "recorder.h"

#include <algorithm>
#include <string>

#include "atomic_ops.h"
#include "require.h"

namespace loadgen {
namespace {

using detail::require;

const RecorderSettings& validated(const RecorderSettings& s) {
  require(s.highest_trackable_ns >= 2,
          "highest_trackable_ns must be >= 2, got " + std::to_string(s.highest_trackable_ns));
  require(s.significant_figures >= 1 && s.significant_figures <= 5,
          "significant_figures must be in 1..5, got " + std::to_string(s.significant_figures));
  for (const int64_t slo : {s.slo_latency_ns, s.slo_ttft_ns, s.slo_tpot_ns}) {
    require(slo >= 0, "slo_*_ns must be >= 0 (0: none), got " + std::to_string(slo));
  }
  return s;
}

}  // namespace

BoundCounts::BoundCounts(const std::vector<int64_t>& bounds, const char* field) : n_(bounds.size()) {
  require(bounds.size() <= kMax, std::string(field) + " takes at most " + std::to_string(kMax) +
                                     " bounds, got " + std::to_string(bounds.size()));
  for (const int64_t b : bounds) {
    require(b >= 1, std::string(field) + ": each bound must be >= 1 ns, got " + std::to_string(b));
  }
  std::copy(bounds.begin(), bounds.end(), bounds_.begin());
}

std::vector<int64_t> BoundCounts::over() const {
  std::vector<int64_t> out(n_);
  for (size_t k = 0; k < n_; ++k) out[k] = over_[k].load(std::memory_order_relaxed);
  return out;
}

std::vector<int64_t> BoundCounts::bounds() const {
  return std::vector<int64_t>(bounds_.begin(), bounds_.begin() + static_cast<std::ptrdiff_t>(n_));
}

Recorder::Recorder(const RecorderSettings& settings)
    : top_(static_cast<uint64_t>(validated(settings).highest_trackable_ns)),
      significant_figures_(settings.significant_figures),
      latency_(1, settings.highest_trackable_ns, settings.significant_figures),
      service_(1, settings.highest_trackable_ns, settings.significant_figures),
      issue_delay_(1, settings.highest_trackable_ns, settings.significant_figures),
      ttft_(1, settings.highest_trackable_ns, settings.significant_figures),
      tpot_(1, settings.highest_trackable_ns, settings.significant_figures),
      slo_latency_ns_(settings.slo_latency_ns),
      slo_ttft_ns_(settings.slo_ttft_ns),
      slo_tpot_ns_(settings.slo_tpot_ns),
      slo_any_(settings.slo_latency_ns > 0 || settings.slo_ttft_ns > 0 ||
               settings.slo_tpot_ns > 0),
      latency_over_(settings.latency_bounds_ns, "latency_bounds_ns"),
      ttft_over_(settings.ttft_bounds_ns, "ttft_bounds_ns"),
      tpot_over_(settings.tpot_bounds_ns, "tpot_bounds_ns") {
  if (settings.query_latency) {
    query_latency_ = std::make_unique<ShardedHistogram>(1, settings.highest_trackable_ns,
                                                        settings.significant_figures);
  }
}

void Recorder::count_out_of_range(int64_t latency_ns, int64_t samples) noexcept {
  // Extremes first: a reader that sees the count sees extremes that include this one.
  atomic_min(out_of_range_min_, latency_ns);
  atomic_max(out_of_range_max_, latency_ns);
  out_of_range_.fetch_add(samples, std::memory_order_release);
}

// Each SLO is judged on the query's own times, exactly; a time that is missing (no
// first token) or negative fails the SLOs that need it.
void Recorder::judge_slos(int64_t scheduled_ns, int64_t completed_ns, int64_t tokens,
                          int64_t first_token_ns) noexcept {
  const int64_t latency = completed_ns - scheduled_ns;
  const bool lat_ok = slo_latency_ns_ == 0 || (latency >= 0 && latency <= slo_latency_ns_);
  const int64_t ttft = first_token_ns - scheduled_ns;
  const bool ttft_ok =
      slo_ttft_ns_ == 0 || (first_token_ns > 0 && ttft >= 0 && ttft <= slo_ttft_ns_);
  bool tpot_ok = true;
  if (slo_tpot_ns_ > 0 && tokens > 1) {
    tpot_ok = first_token_ns > 0 && completed_ns >= first_token_ns &&
              (completed_ns - first_token_ns) / (tokens - 1) <= slo_tpot_ns_;
  }
  slo_judged_.fetch_add(1, std::memory_order_relaxed);
  if (slo_latency_ns_ > 0 && lat_ok) slo_met_latency_.fetch_add(1, std::memory_order_relaxed);
  if (slo_ttft_ns_ > 0 && ttft_ok) slo_met_ttft_.fetch_add(1, std::memory_order_relaxed);
  if (slo_tpot_ns_ > 0 && tpot_ok) slo_met_tpot_.fetch_add(1, std::memory_order_relaxed);
  if (lat_ok && ttft_ok && tpot_ok) slo_met_.fetch_add(1, std::memory_order_relaxed);
}

HdrHistogram Recorder::query_latency() const {
  if (query_latency_) return query_latency_->snapshot();
  return HdrHistogram(1, static_cast<int64_t>(top_), significant_figures_);
}

RecorderCounts Recorder::counts() const noexcept {
  RecorderCounts c;
  c.tokens = tokens_.load(std::memory_order_relaxed);
  c.out_of_range = out_of_range_.load(std::memory_order_acquire);
  if (c.out_of_range > 0) {
    c.out_of_range_min_ns = out_of_range_min_.load(std::memory_order_relaxed);
    c.out_of_range_max_ns = out_of_range_max_.load(std::memory_order_relaxed);
  }
  c.first_token_out_of_range = first_token_out_of_range_.load(std::memory_order_relaxed);
  c.slo_judged = slo_judged_.load(std::memory_order_relaxed);
  c.slo_met = slo_met_.load(std::memory_order_relaxed);
  c.slo_met_latency = slo_met_latency_.load(std::memory_order_relaxed);
  c.slo_met_ttft = slo_met_ttft_.load(std::memory_order_relaxed);
  c.slo_met_tpot = slo_met_tpot_.load(std::memory_order_relaxed);
  c.stream_rate_milli_sum = stream_rate_sum_.load(std::memory_order_relaxed);
  c.stream_rate_count = stream_rate_count_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace loadgen
