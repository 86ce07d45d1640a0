#pragma once
// The issue loop behind loadgen.mlperf, the MLPerf LoadGen-compatible API.
//
// MlperfRun walks the queries of a QueryGenerator with MLPerf's issuing rules per
// scenario and tracks completions per sample: wait-free from any thread, latency from
// each query's scheduled time, recorded by a Recorder.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "in_flight.h"
#include "mlperf/query_generator.h"
#include "notifier.h"
#include "recorder.h"

namespace loadgen {
namespace mlperf {

/// How a run issues and ends (MLPerf's effective settings, durations in ns).
struct RunSettings {
  Scenario scenario = Scenario::kSingleStream;
  bool accuracy = false;
  int64_t target_duration_ns = 0;
  int64_t min_query_count = 0;
  int64_t max_query_count = 0;   ///< 0: none
  int64_t max_duration_ns = 0;   ///< 0: none
  int64_t max_async_queries = 0; ///< Server: stop when more are outstanding (0: none)
  bool coalesce = false;         ///< Server: issue every past-due query in one call
  int64_t spin_ns = 0;           ///< Server: spin this long before each scheduled time
  int64_t table_capacity = 1 << 17;  ///< queries tracked at once (power of 2)
  int significant_figures = 3;
  int64_t highest_trackable_ns = 3'600'000'000'000;
  /// Sample latency bounds (ns, 0..8 of them, each >= 1): recorder().over_bound() counts the
  /// sample latencies strictly over each, exactly.
  std::vector<int64_t> latency_bounds_ns;
  /// Time-to-first-token and time-per-output-token bounds, counted the same way
  /// (recorder().over_ttft_bound(), over_tpot_bound()).
  std::vector<int64_t> ttft_bounds_ns;
  std::vector<int64_t> tpot_bounds_ns;
};

/// The SUT side of the issue loop: called on the issuing thread for each issue.
class IssueSink {
 public:
  virtual ~IssueSink() = default;
  /// Hands `n` samples (ids, QSL indices) to the SUT. Returns false to end the run (an
  /// error was raised; the caller keeps it).
  virtual bool issue(const uint64_t* ids, const int64_t* indices, size_t n) = 0;
  /// Called while the issuing thread waits (about every 50 ms); false ends the run.
  virtual bool keep_waiting() = 0;
  /// The issuing thread is about to wait (for a scheduled time or a completion): a
  /// sink that holds a lock other threads need to complete (Python's GIL) lets go of it
  /// here. issue() takes it back. Between waits the loop keeps it, so a loop that is
  /// behind schedule pays nothing per query for it.
  virtual void before_wait() {}
};

/// Counts and times of a finished (or running) run, with the recorder's counts (tokens,
/// out of range): out-of-range samples count as completed, but are in no latency figure.
struct RunCounts : IssueCounts {
  int64_t samples_issued = 0;
  int64_t issue_calls = 0;
  int64_t samples_completed = 0;
  /// Samples completed (or first tokens) whose ids were not in flight: late, duplicate
  /// or bogus alike (the engine tells them apart).
  int64_t unknown_completions = 0;
  int64_t latency_sum_ns = 0;
  int64_t query_latency_sum_ns = 0;
  int64_t max_latency_ns = 0;
  int64_t start_ns = 0;
  int64_t max_completion_ns = 0;
  int64_t final_scheduled_offset_ns = 0;
  int64_t final_issued_ns = 0;
  int64_t final_done_ns = 0;
  bool ran_out_of_generated_queries = false;
  bool too_many_outstanding = false;
  bool max_query_count_reached = false;
  bool max_duration_reached = false;
  bool ended_naturally = false;
  bool interrupted = false;
};

/// One run of the issue loop. complete()/first_token() may be called from any thread.
class MlperfRun {
 public:
  /// Throws std::invalid_argument naming a bad field.
  MlperfRun(RunSettings settings, GeneratorSettings generator);
  MlperfRun(const MlperfRun&) = delete;
  MlperfRun& operator=(const MlperfRun&) = delete;

  /// Walks the queries on the calling thread, issuing them through `sink`, then returns
  /// (without waiting for outstanding samples). Once.
  void issue_all(IssueSink& sink);
  /// Waits until every issued sample completed or `timeout_ns` passed (< 0: forever);
  /// true when all completed.
  bool wait_all(int64_t timeout_ns);
  /// Completes `n` samples at `t_ns`. `n_tokens` (may be null) gives output tokens per
  /// sample. Returns how many ids were not in flight (counted, never fatal).
  int64_t complete(const uint64_t* ids, size_t n, int64_t t_ns, const int64_t* n_tokens) noexcept;
  /// Records first tokens of `n` samples at `t_ns`; returns unknown ids.
  int64_t first_token(const uint64_t* ids, size_t n, int64_t t_ns) noexcept;
  /// Ends issuing at the next query (any thread).
  void stop() noexcept { stop_.store(true, std::memory_order_release); }

  RunCounts counts() const;
  /// The histograms (sample latency, query latency in MultiStream, issue delay, first
  /// token, time per output token) and the exact over-bound counts of sample latencies
  /// (aligned with RunSettings::latency_bounds_ns). Safe while running.
  const Recorder& recorder() const noexcept { return recorder_; }
  const QueryGenerator& generator() const noexcept { return gen_; }
  /// Finishes generation (after issue_all) so generator().generated() is the total.
  void drain_generator() { gen_.drain(); }
  /// Bits of a sample id that hold the sample's position in its query.
  int sample_bits() const noexcept { return sample_ids_.bits(); }

 private:
  // A slot of the ring: query seq takes slot seq mod capacity (MLPerf issues in order,
  // so a sample id needs no slot index and finding a slot needs no search).
  struct Slot {
    // (seq << count bits) | samples still outstanding: one word, so a late or repeated
    // completion can never touch a reused slot (0 samples: free).
    std::atomic<uint64_t> word{0};
    // Read by completing threads while the issue thread may already be refilling the
    // slot: atomic, and trusted only when the word still names the query afterwards.
    std::atomic<int64_t> scheduled_ns{0};
    std::atomic<int64_t> issued_ns{0};
    std::atomic<int64_t> done_ns{0};
    std::atomic<int64_t> first_token_ns{0};
  };
  // Claims the slot for query `seq`, waiting while its previous query is outstanding.
  bool claim(uint64_t seq, IssueSink& sink);
  uint64_t reserve_numbers() const noexcept;
  void publish(uint64_t seq, int64_t n_samples, int64_t scheduled_ns, int64_t issued_ns);
  bool wait_done(uint64_t seq, IssueSink& sink);
  // Server: waits for `scheduled_ns` (sleeping, then spinning s_.spin_ns); `*now` is the
  // time it ended. False when the run was stopped meanwhile.
  bool wait_until_scheduled(int64_t scheduled_ns, IssueSink& sink, int64_t* now);
  // Publishes query `seq` (its slot already claimed) and appends its sample ids and
  // indices to the issue call being built.
  void add_to_call(uint64_t seq, const std::vector<int64_t>& samples, int64_t scheduled_ns,
                   int64_t issued_ns, std::vector<uint64_t>* ids, std::vector<int64_t>* indices);
  // After an issue call: whether a stop rule ends issuing (and which, in result_).
  bool reached_end(int64_t queries_issued, int64_t duration_ns);
  // Counts `count` samples of query `seq` done at t_ns; `tpot_tokens` > 1 for a query of
  // one sample reporting its output tokens (time per output token).
  void finish_group(uint64_t seq, int64_t count, int64_t t_ns, int64_t tokens, int64_t tpot_tokens,
                    int64_t* unknown) noexcept;

  RunSettings s_;
  QueryGenerator gen_;
  TaggedWord sample_ids_;  // a sample's id: (seq << sample bits) | position in its query
  TaggedWord words_;       // a slot's word: (seq << count bits) | samples outstanding
  SlotTable<Slot> ring_;  // slots named by sequence number
  // Queries of several samples: one done bit per sample, so a sample completed twice is
  // counted as unknown instead of ending its query early (bit_words_ words per slot).
  size_t bit_words_ = 0;
  std::unique_ptr<std::atomic<uint64_t>[]> done_bits_;
  bool mark_sample(uint64_t seq, uint64_t position) noexcept;

  Recorder recorder_;

  std::atomic<bool> stop_{false};
  std::atomic<int64_t> queries_issued_{0};
  std::atomic<int64_t> samples_issued_{0};
  std::atomic<int64_t> queries_completed_{0};
  std::atomic<int64_t> samples_completed_{0};
  std::atomic<int64_t> unknown_{0};
  std::atomic<int64_t> latency_sum_{0};
  std::atomic<int64_t> query_latency_sum_{0};
  std::atomic<int64_t> max_latency_{0};
  std::atomic<int64_t> max_completion_{0};
  RunCounts result_;  // issue-thread fields, final after issue_all()
  uint64_t seq_base_ = 0;  // this run's block of query numbers starts after it, so a late
  uint64_t last_seq_ = 0;  // completion of another run never matches a query of this one
  uint64_t last_published_ = 0;  // issue thread: the last query published
  Notifier done_;     // a query finished
};

}  // namespace mlperf
}  // namespace loadgen
