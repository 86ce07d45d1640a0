#pragma once
// The run's time series: per-interval counts and histograms, cut from the run's
// cumulative figures at each interval's end (deltas at snapshot time: nothing is added
// to the per-query path).

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "hdr_histogram.h"
#include "recorder.h"

namespace loadgen {

/// One interval of the time series.
struct IntervalPoint {
  int64_t start_offset_ns = 0;  ///< from the run's start
  int64_t length_ns = 0;
  int64_t issued = 0;       ///< issued during the interval
  int64_t completed = 0;    ///< latencies recorded during the interval
  int64_t latency_p50_ns = 0;
  int64_t latency_p90_ns = 0;
  int64_t latency_p99_ns = 0;
  int64_t latency_max_ns = 0;
  std::vector<uint8_t> latency_hdr;  ///< the interval's latency histogram, V2 compressed
  int64_t failed = 0;       ///< queries failed during the interval
  int64_t timed_out = 0;    ///< queries timed out during the interval
  std::map<std::string, int64_t> errors;  ///< failures during the interval by (cleaned) kind
  int64_t outstanding = 0;  ///< queries in flight at the interval's end
  /// Issue delay of the queries whose issue delay was recorded during the interval.
  int64_t issue_delay_p50_ns = 0;
  int64_t issue_delay_p99_ns = 0;
  int64_t issue_delay_max_ns = 0;
  /// Time to first token of the first tokens recorded during the interval (0: none).
  int64_t ttft_p50_ns = 0;
  int64_t ttft_p99_ns = 0;
  int64_t tokens = 0;       ///< output tokens reported by completions during the interval
};

/// The engine's own cumulative counts at an interval's end (the recorder gives the rest).
struct IntervalTotals {
  int64_t issued = 0;
  int64_t failed = 0;
  int64_t timed_out = 0;
  int64_t outstanding = 0;  ///< at that moment, not cumulative
  std::map<std::string, int64_t> errors;  ///< failures so far by kind
};

/// Interval snapshots. Thread-safety: begin() and snapshot() from one thread (the
/// engine's monitor); points() and last() from any thread.
class TimeSeries {
 public:
  /// The layout of the histograms it will be given.
  TimeSeries(int64_t highest_trackable_ns, int significant_figures);

  /// The first interval starts at `start_ns`.
  void begin(int64_t start_ns);
  /// Ends the current interval at `now_ns`, given the recorder and the run's cumulative
  /// counts so far, and starts the next. Cost: a merged snapshot of the latency
  /// histogram (and of the issue delay and TTFT histograms when they grew), one pass
  /// over each, and one compression.
  void snapshot(const Recorder& recorder, IntervalTotals totals, int64_t now_ns);
  /// The intervals so far.
  std::vector<IntervalPoint> points() const;
  /// The newest interval, or nothing before the first has ended.
  std::optional<IntervalPoint> last() const;

 private:
  // The part of `total` recorded since `prev`'s snapshot, in interval_ (valid until the
  // next cut); `prev` becomes `total`.
  const HdrHistogram& cut(HdrHistogram total, HdrHistogram& prev);

  HdrHistogram prev_latency_;
  HdrHistogram prev_issue_delay_;
  HdrHistogram prev_ttft_;
  HdrHistogram interval_;        // scratch: the interval being cut
  std::vector<int64_t> diff_;    // scratch: its counts
  IntervalTotals prev_;
  int64_t prev_tokens_ = 0;
  int64_t prev_issue_delays_ = 0;   // recorder.issue_delay_count() at the last cut
  int64_t prev_first_tokens_ = 0;   // recorder.ttft_count() at the last cut
  int64_t prev_ns_ = 0;
  int64_t start_ns_ = 0;
  mutable std::mutex mutex_;
  std::vector<IntervalPoint> points_;
};

}  // namespace loadgen
