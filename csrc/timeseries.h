#pragma once
// The run's time series: per-interval counts and latency histograms, cut from the
// cumulative latency histogram at each interval's end.

#include <cstdint>
#include <mutex>
#include <vector>

#include "hdr_histogram.h"

namespace loadgen {

/// One interval of the time series.
struct IntervalPoint {
  int64_t start_offset_ns = 0;  ///< from the run's start
  int64_t length_ns = 0;
  int64_t issued = 0;       ///< issued during the interval
  int64_t completed = 0;    ///< latencies recorded during the interval
  int64_t latency_p50_ns = 0;
  int64_t latency_p99_ns = 0;
  int64_t latency_max_ns = 0;
  std::vector<uint8_t> latency_hdr;  ///< the interval's latency histogram, V2 compressed
};

/// Interval snapshots. Thread-safety: begin() and snapshot() from one thread (the
/// engine's monitor); points() from any thread.
class TimeSeries {
 public:
  /// The layout of the latency histograms it will be given.
  TimeSeries(int64_t highest_trackable_ns, int significant_figures);

  /// The first interval starts at `start_ns`.
  void begin(int64_t start_ns);
  /// Ends the current interval at `now_ns`, given the run's cumulative latency histogram
  /// and issued count so far, and starts the next.
  void snapshot(HdrHistogram latency, int64_t issued, int64_t now_ns);
  /// The intervals so far.
  std::vector<IntervalPoint> points() const;

 private:
  HdrHistogram prev_;
  int64_t prev_issued_ = 0;
  int64_t prev_ns_ = 0;
  int64_t start_ns_ = 0;
  mutable std::mutex mutex_;
  std::vector<IntervalPoint> points_;
};

}  // namespace loadgen
