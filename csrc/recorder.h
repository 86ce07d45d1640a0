#pragma once
// What a run records about its queries, and the rules for recording it, shared by the
// issue engine and the MLPerf issue loop: the latency, service time, issue delay, time to
// first token and time per output token histograms (and, for MultiStream, per-query
// latency), the output token sum, exact counts of latencies over configured bounds, and
// completions whose times cannot be recorded. See DESIGN.md, "Nothing recorded is lost".

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "hdr_histogram.h"
#include "sharded_histogram.h"

namespace loadgen {

/// Exact counts of values strictly over each of up to kMax bounds, kept as values are
/// recorded (never estimated from histogram buckets).
/// Thread-safety: count() from any thread, wait-free; reads while others count.
class BoundCounts {
 public:
  static constexpr size_t kMax = 8;
  /// Throws std::invalid_argument naming `field` when there are more than kMax bounds
  /// or one is < 1.
  BoundCounts(const std::vector<int64_t>& bounds, const char* field);
  /// Adds `weight` to the count of every bound that `value` is strictly over.
  void count(int64_t value, int64_t weight) noexcept {
    for (size_t k = 0; k < n_; ++k) {
      if (value > bounds_[k]) over_[k].fetch_add(weight, std::memory_order_relaxed);
    }
  }
  /// The counts, aligned with bounds().
  std::vector<int64_t> over() const;
  std::vector<int64_t> bounds() const;

 private:
  size_t n_ = 0;
  std::array<int64_t, kMax> bounds_{};
  // Written only when a value is over a bound; on its own cache line, away from the
  // read-mostly fields above.
  alignas(64) std::array<std::atomic<int64_t>, kMax> over_{};
};

/// How a Recorder is built. Validated by the Recorder's constructor.
struct RecorderSettings {
  /// Top of every histogram's range, ns (>= 2). A latency above it is out of range.
  int64_t highest_trackable_ns = 3'600'000'000'000;
  /// HDR precision, decimal digits (1..5).
  int significant_figures = 3;
  /// Latency bounds, ns: 0..8 of them, each >= 1. over_bound()[k] counts the latencies
  /// strictly greater than latency_bounds_ns[k], exactly.
  std::vector<int64_t> latency_bounds_ns;
  /// Time-to-first-token and time-per-output-token bounds, ns, counted the same way
  /// (over_ttft_bound(), over_tpot_bound()); 0..8 each, each >= 1.
  std::vector<int64_t> ttft_bounds_ns;
  std::vector<int64_t> tpot_bounds_ns;
  /// Service level objectives, ns (0: none; else >= 1): every recorded completion is
  /// judged against each that is set, exactly (RecorderCounts::slo_*). Latency is
  /// completed - scheduled, TTFT first token - scheduled, TPOT (completed - first token)
  /// / (tokens - 1); a query with at most one output token has no TPOT and meets it.
  int64_t slo_latency_ns = 0;
  int64_t slo_ttft_ns = 0;
  int64_t slo_tpot_ns = 0;
  /// Also keep a per-query latency histogram (record_query_latency()).
  bool query_latency = false;
};

/// The counters of a Recorder, read together.
struct RecorderCounts {
  int64_t tokens = 0;  ///< output tokens reported at completion
  /// Completions (weighted by samples) not recorded: completed before the query was
  /// scheduled or issued, or with a latency above highest_trackable_ns.
  int64_t out_of_range = 0;
  /// Smallest and largest latency (completed - scheduled, signed ns) of those
  /// completions; both 0 when out_of_range is 0.
  int64_t out_of_range_min_ns = 0;
  int64_t out_of_range_max_ns = 0;
  /// First tokens not recorded: before the query was scheduled, more than
  /// highest_trackable_ns after it, or after the query's completion (whose time per
  /// output token is then not recorded either).
  int64_t first_token_out_of_range = 0;
  /// With SLOs set: measured completions judged (each once, whatever its samples), those
  /// meeting every SLO, and those meeting each one (0 when that one is not set).
  int64_t slo_judged = 0;
  int64_t slo_met = 0;
  int64_t slo_met_latency = 0;
  int64_t slo_met_ttft = 0;
  int64_t slo_met_tpot = 0;
  /// Per stream: the sum over completions with a first token before their completion of
  /// tokens / (completed - first token), in milli-tokens per second, and how many.
  int64_t stream_rate_milli_sum = 0;
  int64_t stream_rate_count = 0;
};

/// The counts both issue loops (Engine, mlperf::MlperfRun) keep about their queries, with
/// their recorder's counts.
struct IssueCounts : RecorderCounts {
  int64_t issued = 0;     ///< queries handed to the SUT (the engine's after its warm-up)
  int64_t completed = 0;  ///< queries completed (MLPerf: every sample of them)
  /// Queries that waited for room in flight before their issue: a free slot of the
  /// in-flight table, or the engine's in-flight cap.
  int64_t room_waits = 0;
};

/// Records completions, first tokens and issue delays from any number of threads.
/// Thread-safety: every record call is wait-free after the calling thread's first call
/// (which registers its histogram shards), takes no lock and allocates nothing; reads
/// (snapshots, counts) are safe while others record.
class Recorder {
 public:
  /// At most this many latency bounds.
  static constexpr size_t kMaxLatencyBounds = BoundCounts::kMax;

  /// Throws std::invalid_argument naming the bad field (latency_bounds_ns,
  /// highest_trackable_ns, significant_figures).
  explicit Recorder(const RecorderSettings& settings);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// One completion of `samples` samples (>= 1) of a query scheduled at `scheduled_ns`
  /// and issued at `issued_ns`, completed at `completed_ns` (all on the one clock).
  /// Records latency (completed - scheduled) and service time (completed - issued)
  /// `samples` times, counts latencies over each bound, adds `tokens` (>= 0) to the
  /// token sum, adds the stream's rate tokens / (completed - first token) when it has a
  /// first token before its completion, and, when `tpot_tokens` > 1 and
  /// `first_token_ns` > 0, records the time per output token (completed - first token)
  /// / (tpot_tokens - 1).
  /// Returns false, and records nothing but the out-of-range count and extremes and the
  /// tokens, when a time is out of range (see RecorderCounts::out_of_range).
  bool complete(int64_t scheduled_ns, int64_t issued_ns, int64_t completed_ns, int64_t samples = 1,
                int64_t tokens = 0, int64_t tpot_tokens = 0, int64_t first_token_ns = 0) noexcept {
    const int64_t latency = completed_ns - scheduled_ns;
    const int64_t service = completed_ns - issued_ns;
    // One unsigned compare each catches both a negative time and one above the range.
    if (slo_any_) judge_slos(scheduled_ns, completed_ns, tpot_tokens, first_token_ns);
    if (static_cast<uint64_t>(latency) > top_ || static_cast<uint64_t>(service) > top_) {
      count_out_of_range(latency, samples);
      if (tokens > 0) tokens_.fetch_add(tokens, std::memory_order_relaxed);
      return false;
    }
    latency_.record_n(latency, samples);
    service_.record_n(service, samples);
    latency_over_.count(latency, samples);
    if (tokens > 0) tokens_.fetch_add(tokens, std::memory_order_relaxed);
    if (tokens > 0 && first_token_ns > 0 && completed_ns > first_token_ns) {
      const double rate =
          static_cast<double>(tokens) * 1e12 / static_cast<double>(completed_ns - first_token_ns);
      stream_rate_sum_.fetch_add(std::llround(rate), std::memory_order_relaxed);
      stream_rate_count_.fetch_add(1, std::memory_order_relaxed);
    }
    if (tpot_tokens > 1 && first_token_ns > 0) {
      if (completed_ns >= first_token_ns) {
        const int64_t tpot = (completed_ns - first_token_ns) / (tpot_tokens - 1);
        tpot_.record(tpot);
        tpot_over_.count(tpot, 1);
      } else {
        first_token_out_of_range_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    return true;
  }
  /// The first token of a query scheduled at `scheduled_ns` came at `t_ns`: records the
  /// time to first token, or counts it as out of range. Returns whether it was recorded.
  bool first_token(int64_t scheduled_ns, int64_t t_ns) noexcept {
    const int64_t ttft = t_ns - scheduled_ns;
    if (static_cast<uint64_t>(ttft) > top_) {
      first_token_out_of_range_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    ttft_over_.count(ttft, 1);
    return ttft_.record(ttft);
  }
  /// A query scheduled at `scheduled_ns` reached the SUT at `issued_ns`.
  void issue_delay(int64_t scheduled_ns, int64_t issued_ns) noexcept {
    issue_delay_.record(issued_ns - scheduled_ns);
  }
  /// Records one query's latency (ns) in the per-query histogram (settings.query_latency
  /// must be set; otherwise a no-op). For latencies complete() already accepted.
  void record_query_latency(int64_t latency_ns) noexcept {
    if (query_latency_) query_latency_->record(latency_ns);
  }

  /// Merged snapshots (safe while recording).
  HdrHistogram latency() const { return latency_.snapshot(); }
  HdrHistogram service_time() const { return service_.snapshot(); }
  HdrHistogram issue_delay() const { return issue_delay_.snapshot(); }
  HdrHistogram ttft() const { return ttft_.snapshot(); }
  HdrHistogram tpot() const { return tpot_.snapshot(); }
  /// How many issue delays and first tokens were recorded so far (cheap: no merge).
  int64_t issue_delay_count() const { return issue_delay_.total_count(); }
  int64_t ttft_count() const { return ttft_.total_count(); }
  /// Empty (same layout) when the settings did not ask for it.
  HdrHistogram query_latency() const;

  RecorderCounts counts() const noexcept;
  /// Latencies (weighted by samples) strictly over each bound, aligned with
  /// latency_bounds_ns().
  std::vector<int64_t> over_bound() const { return latency_over_.over(); }
  std::vector<int64_t> latency_bounds_ns() const { return latency_over_.bounds(); }
  /// Times to first token, and times per output token, strictly over each of
  /// settings.ttft_bounds_ns / tpot_bounds_ns.
  std::vector<int64_t> over_ttft_bound() const { return ttft_over_.over(); }
  std::vector<int64_t> over_tpot_bound() const { return tpot_over_.over(); }
  int64_t highest_trackable_ns() const noexcept { return static_cast<int64_t>(top_); }
  int significant_figures() const noexcept { return significant_figures_; }

 private:
  void count_out_of_range(int64_t latency_ns, int64_t samples) noexcept;
  void judge_slos(int64_t scheduled_ns, int64_t completed_ns, int64_t tokens,
                  int64_t first_token_ns) noexcept;

  uint64_t top_;  // highest_trackable_ns
  int significant_figures_;
  ShardedHistogram latency_;
  ShardedHistogram service_;
  ShardedHistogram issue_delay_;
  ShardedHistogram ttft_;
  ShardedHistogram tpot_;
  std::unique_ptr<ShardedHistogram> query_latency_;
  std::atomic<int64_t> tokens_{0};
  std::atomic<int64_t> out_of_range_{0};
  std::atomic<int64_t> out_of_range_min_{INT64_MAX};
  std::atomic<int64_t> out_of_range_max_{INT64_MIN};
  std::atomic<int64_t> first_token_out_of_range_{0};
  int64_t slo_latency_ns_;
  int64_t slo_ttft_ns_;
  int64_t slo_tpot_ns_;
  bool slo_any_;
  std::atomic<int64_t> slo_judged_{0};
  std::atomic<int64_t> slo_met_{0};
  std::atomic<int64_t> slo_met_latency_{0};
  std::atomic<int64_t> slo_met_ttft_{0};
  std::atomic<int64_t> slo_met_tpot_{0};
  std::atomic<int64_t> stream_rate_sum_{0};  // milli-tokens/s
  std::atomic<int64_t> stream_rate_count_{0};
  BoundCounts latency_over_;
  BoundCounts ttft_over_;
  BoundCounts tpot_over_;
};

}  // namespace loadgen
