#pragma once
// The issue engine: a dedicated thread walks an arrival schedule and hands queries to a
// system under test; completions arrive from any thread; three clocks per query feed
// three HDR histograms. See DESIGN.md, "The one rule of measurement".

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hdr_histogram.h"
#include "in_flight.h"
#include "native_suts.h"
#include "notifier.h"
#include "recorder.h"
#include "request_log.h"
#include "sample_selector.h"
#include "schedule.h"
#include "timeseries.h"

namespace loadgen {

/// How queries are generated.
enum class LoadMode {
  kOpenLoop,    ///< at the times an ArrivalSchedule gives
  kClosedLoop,  ///< `concurrency` queries in flight; the next when one completes
};

/// Everything a run needs. Durations in ns, rates in queries per second.
struct EngineSettings {
  LoadMode load_mode = LoadMode::kOpenLoop;
  ArrivalKind arrival = ArrivalKind::kPoisson;
  double target_qps = 0.0;              ///< constant and poisson
  std::vector<Stage> stages;            ///< stages
  bool stages_poisson = false;          ///< stages: Poisson arrivals instead of even spacing
  /// poisson and Poisson stages: gamma shape of the gaps (1: exponential; see
  /// ArrivalSchedule::poisson).
  double burstiness = 1.0;
  std::vector<int64_t> trace_offsets_ns;  ///< trace
  int64_t concurrency = 0;              ///< closed loop: queries in flight (>= 1)
  int64_t max_in_flight = 0;            ///< open loop: cap on outstanding queries (0: none)

  int64_t min_duration_ns = 0;     ///< keep issuing until this long and...
  int64_t min_query_count = 0;     ///< ...this many queries (both, when either is set)
  int64_t max_duration_ns = 0;     ///< stop issuing at this offset (0: no limit)
  int64_t max_query_count = 0;     ///< stop after this many queries (0: no limit)
  /// Warm-up: queries scheduled in the first warmup_ns are issued at the schedule like
  /// any other, but not recorded; they are counted apart (EngineCounts::warmup_*). The
  /// durations and query counts above, the time series and the histograms all start
  /// at the end of the warm-up.
  int64_t warmup_ns = 0;
  /// Closed loop: the `concurrency` streams start evenly over the first ramp_up_ns
  /// (stream k at start + k * ramp_up_ns / concurrency) instead of all at once, so that
  /// they are not in phase and their start is not one burst of sends. The ramp is part of
  /// the warm-up (warmup_ns >= ramp_up_ns): its queries are counted apart. 0: all at once.
  int64_t ramp_up_ns = 0;

  int64_t samples_per_query = 1;
  int64_t sample_count = 1;
  SampleOrder sample_order = SampleOrder::kRandom;
  uint64_t schedule_seed = 0;
  uint64_t sample_seed = 0;

  int64_t spin_ns = 100'000;       ///< spin this long before each scheduled time (0: sleep only)
  /// The scheduler slice the issue thread (and a native client's I/O threads) ask the
  /// kernel for (see request_sched_slice(), affinity.h): on a busy core a thread with a
  /// short slice preempts a CPU-bound neighbour when it wakes, so arrivals go out on
  /// time. 0: the kernel's default slice.
  int64_t sched_slice_ns = 100'000;
  std::vector<int> pin_cpus;       ///< CPUs for the issue thread (empty: not pinned)
  int64_t timeout_ns = 0;          ///< per-query timeout, from the scheduled time (0: none)
  int64_t grace_ns = 10'000'000'000;  ///< how long to wait for outstanding queries at the end
  int64_t interval_ns = 1'000'000'000;  ///< time-series interval (0: none)

  int significant_figures = 3;
  int64_t highest_trackable_ns = 3'600'000'000'000;  ///< histogram range top (1 h)
  int64_t table_capacity = 0;  ///< in-flight table slots, a power of 2 (0: chosen)

  /// Open loop with the queue SUT: the consumer thread itself waits for each scheduled
  /// time and issues what is due (no issue thread hand-off: one busy thread instead of
  /// two, and no cross-thread wake-up in the latency). Closed loop with the queue SUT
  /// always works this way.
  bool inline_dispatch = false;
  /// Open loop with the queue SUT or the native network client: the SUT schedules
  /// follow-up queries (multi-turn conversations, Engine::follow_up()); the issue thread
  /// then waits for the next arrival and the earliest follow-up alike. Closed loops take
  /// follow-ups without it.
  bool follow_ups = false;

  /// Where queries go, and the native SUTs' parameters.
  NativeSutSettings sut;
  /// Latency bounds (ns, 0..8 of them, each >= 1): recorder().over_bound() counts
  /// exactly how many latencies were strictly over each.
  std::vector<int64_t> latency_bounds_ns;
  /// Time-to-first-token and time-per-output-token bounds, counted the same way
  /// (recorder().over_ttft_bound(), over_tpot_bound()).
  std::vector<int64_t> ttft_bounds_ns;
  std::vector<int64_t> tpot_bounds_ns;
  /// Service level objectives, ns (0: none): each measured completion is judged against
  /// all of them (RecorderSettings::slo_*; counts in EngineCounts::slo_*).
  int64_t slo_latency_ns = 0;
  int64_t slo_ttft_ns = 0;
  int64_t slo_tpot_ns = 0;
  /// Error messages kept whatever their kinds; the first of each later kind is kept too,
  /// up to as many again (see Engine::fail()).
  int64_t max_error_messages = 10;
  /// Per-request records: one RequestRecord per resolved query (warm-up ones too),
  /// written to records.path as JSON lines or as a raw spool (see RequestLog).
  RequestLogSettings records;
};

/// Counts at the end of a run (or so far). issued == completed + failed + timed_out +
/// cancelled + outstanding. The recorder's counts (tokens, out of range) come with them:
/// out-of-range completions count as completed but are in no histogram, and make the
/// run's latencies incomplete.
struct EngineCounts : IssueCounts {
  int64_t failed = 0;
  int64_t timed_out = 0;
  int64_t cancelled = 0;
  int64_t outstanding = 0;
  /// complete()/fail() of an id not in flight, by what it was (see InFlightTable::Stray):
  int64_t unknown_completions = 0;    ///< an id never handed out
  int64_t duplicate_completions = 0;  ///< a query the SUT had completed or failed already
  int64_t late_completions = 0;       ///< a query timed out or cancelled (or too far back to tell)
  /// Warm-up queries (scheduled before the end of the warm-up), by outcome; in no
  /// other count and in no histogram.
  int64_t warmup_issued = 0;
  int64_t warmup_completed = 0;
  int64_t warmup_failed = 0;     ///< failed, timed out or cancelled
};

/// An engine runs once. Thread-safety: every public method may be called from any
/// thread; complete()/fail()/first_token() are wait-free apart from the first call on a
/// thread (which registers its histogram shard) and fail()'s message bookkeeping.
class Engine : private CompletionSink {
 public:
  /// Validates the settings; throws std::invalid_argument naming the field.
  explicit Engine(EngineSettings settings);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Starts the issue thread (and the monitor and completion threads). Once.
  void start();
  /// Asks the run to end: no more queries are issued; outstanding ones get the grace
  /// period, then are cancelled. Any thread, any time, idempotent.
  void stop() noexcept;
  /// Ends the run now: like stop() with no grace period.
  void abort() noexcept;
  /// Waits until the run has finished (every query resolved, threads joined) or
  /// `timeout_ns` (< 0: forever) passes. Returns true when finished.
  bool wait(int64_t timeout_ns);
  bool finished() const noexcept { return finished_.load(std::memory_order_acquire); }
  bool started() const noexcept { return started_; }

  // --- queue SUT: the consumer side ---

  /// Takes up to `max` queued queries: writes their ids, sample indices
  /// (samples_per_query per query) and scheduled times, and stamps them issued now.
  /// Waits up to `timeout_ns` (< 0: forever), spinning the first `spin_ns`, when none is
  /// queued. Returns the number taken, 0 on timeout, -1 when the run will hand out no
  /// more queries.
  int64_t take_batch(int64_t* ids, int64_t* samples, int64_t* scheduled_ns, int64_t max,
                     int64_t timeout_ns, int64_t spin_ns);
  /// An fd that becomes readable when queries are queued or the run ends; re-arm with
  /// arm_eventfd() after take_batch() returned 0.
  int eventfd();
  void arm_eventfd() noexcept;
  /// True when closed-loop queries are generated by the consumer itself, at the moment
  /// it asks (closed loop with the queue SUT): a completion and the next query then
  /// need no hand-off between threads, so the loop's own overhead is what it measures.
  bool inline_issue() const noexcept { return inline_issue_; }

  // --- multi-turn: follow-up queries (the queue SUT or the native network client) ---

  /// Schedules one more query, due at `at_ns` (now_ns() clock) and handed out with `tag`
  /// as its sample index; its latency counts from `at_ns`. Until it is issued it holds a
  /// place among the closed loop's `concurrency` queries, so a conversation waiting out
  /// its think time keeps its user's place: call it before completing the query it
  /// follows. The issue thread wakes the consumers (eventfd, room) when it falls due.
  /// Returns false, scheduling nothing, once issuing has ended (the run's bounds count
  /// follow-ups like any query). Throws std::logic_error unless the run uses the queue
  /// SUT or the native network client (SutKind::kNetClient, whose checker thread calls
  /// it) with one sample per query, in a closed loop or in an open loop with
  /// settings().follow_ups (not inline_dispatch). In an open loop a follow-up holds no
  /// place: the in-flight cap applies to it when it is issued. Any thread.
  bool follow_up(int64_t tag, int64_t at_ns);
  /// Follow-ups scheduled and not yet issued, issued, and dropped (refused or left
  /// pending because issuing ended first).
  int64_t follow_ups_pending() const noexcept { return follow_pending_.load(std::memory_order_acquire); }
  int64_t follow_ups_issued() const noexcept { return follow_issued_.load(std::memory_order_relaxed); }
  int64_t follow_ups_dropped() const noexcept { return follow_dropped_.load(std::memory_order_relaxed); }

  // --- completion, from any thread ---

  /// Completes query `id` at `completed_ns` (0: now). `n_tokens` in 0..kMaxTokenCount
  /// records output tokens (and time per output token after a first_token()); -1: none;
  /// any other count fails the query as invalid_token_count (false). False when the id
  /// is not in flight; that is counted (unknown, duplicate or late), never fatal. A time
  /// before the query was scheduled or issued, or a latency above highest_trackable_ns,
  /// completes the query but is counted as out of range instead of recorded.
  /// `n_input` >= 0: the request's input tokens, for its per-request record; `events`
  /// (may be null): a stream's token events, for the same record (borrowed for the call).
  bool complete(int64_t id, int64_t completed_ns = 0, int64_t n_tokens = -1, int64_t n_input = -1,
                const TokenEvents* events = nullptr) noexcept {
    return complete_internal(id, completed_ns, n_tokens, true, n_input, events);
  }
  /// complete() for n ids; `completed_ns` may be null (now) or hold one time per id.
  int64_t complete_many(const int64_t* ids, const int64_t* completed_ns, int64_t n) noexcept;
  /// Fails query `id` with an error kind and message; false when `id` is not in flight.
  /// Any bytes, any size: the kind is counted as a short identifier (letters, digits and
  /// `_.-:`, each run of other characters one '_', at most 64 bytes, "error" when nothing
  /// is left; past 64 distinct kinds, the rest count as "other_kinds"). A kept message
  /// is "kind: message", cut to its first 500 bytes on a character boundary (saying how
  /// many more were cut), with control characters as spaces and bytes that are not UTF-8
  /// as '?'. Kept: the first max_error_messages messages, then the first of each new
  /// kind, up to twice max_error_messages in all. Any thread.
  /// `count_unknown` false: an id not in flight is not counted (failing whatever of a
  /// batch is still in flight).
  bool fail(int64_t id, const std::string& kind, const std::string& message, bool count_unknown = true);
  /// Records the first token of query `id` at `t_ns` (0: now); once per query.
  bool first_token(int64_t id, int64_t t_ns = 0) noexcept;

  // --- results ---

  /// The counts so far. Any thread, during a run too: atomic loads only (no lock, no
  /// allocation), cheap enough to poll.
  EngineCounts counts() const;
  /// The histograms (latency, service time, issue delay, TTFT, TPOT) and the exact
  /// over-bound counts (aligned with settings().latency_bounds_ns). Safe while running.
  const Recorder& recorder() const noexcept { return recorder_; }
  /// The intervals so far (every interval_ns; safe while running).
  std::vector<IntervalPoint> timeseries() const { return timeseries_.points(); }
  /// The newest interval, or nothing before the first ended. Any thread, during a run
  /// too: copies one point under the series' lock (held by the monitor only to append).
  std::optional<IntervalPoint> last_interval() const { return timeseries_.last(); }
  /// Error counts by (cleaned) kind, and the kept messages as "kind: message" (see fail()).
  /// error_counts() is safe from any thread during a run and cheap: it copies the map of
  /// at most 65 kinds under the lock fail() takes for its bookkeeping.
  std::map<std::string, int64_t> error_counts() const;
  std::vector<std::string> error_messages() const;
  /// now_ns() at the first scheduled time, at the end of issuing, and at the end.
  int64_t start_ns() const noexcept { return start_ns_.load(); }
  /// now_ns() at the end of the warm-up: where durations and the time series start
  /// (start_ns() + settings().warmup_ns once started, else 0).
  int64_t measure_start_ns() const noexcept {
    const int64_t t0 = start_ns_.load();
    return t0 != 0 ? t0 + s_.warmup_ns : 0;
  }
  int64_t issue_end_ns() const noexcept { return issue_end_ns_.load(); }
  int64_t end_ns() const noexcept { return end_ns_.load(); }
  /// Whether the issue thread's scheduler slice request (settings().sched_slice_ns) was
  /// taken by the kernel; false until the issue thread has started.
  bool sched_slice_applied() const noexcept { return slice_applied_.load(std::memory_order_acquire); }
  /// An error that ended the run early (e.g. pinning failed on the issue thread), or "".
  std::string run_error() const;
  const EngineSettings& settings() const noexcept { return s_; }
  /// The per-request records, or null when settings().records.sink is kNone. Written
  /// completely once wait() returned true.
  RequestLog* records() noexcept { return records_.get(); }
  const RequestLog* records() const noexcept { return records_.get(); }
  int64_t table_capacity() const noexcept { return static_cast<int64_t>(table_.capacity()); }
  /// The native network client, when the run's SUT is one (SutKind::kNetClient), else null.
  NetClient* net_client() noexcept { return native_.net(); }

 private:
  // Completes issued query `id` (see complete()); counts an id not in flight as unknown
  // when `count_unknown`.
  bool complete_internal(int64_t id, int64_t completed_ns, int64_t n_tokens,
                         bool count_unknown, int64_t n_input = -1, const TokenEvents* events = nullptr) noexcept;
  // Frees a claimed slot (ended at t, 0: now; resolved by `by`) and wakes the issue thread.
  void release(int64_t id, int64_t t, InFlightTable::ResolvedBy by) noexcept;
  /// Resolves a claimed query as timed out at time t (its deadline passed).
  void time_out(int64_t id, int64_t t, InFlightTable::ResolvedBy by) noexcept;
  // Counts a completion or failure of `id`, not in flight, as unknown, duplicate or late.
  void count_stray(int64_t id) noexcept;
  // Whether a query scheduled at `scheduled_ns` belongs to the warm-up (never before
  // the start time is known: warmup_end_ns_ starts at INT64_MIN).
  bool in_warmup(int64_t scheduled_ns) const noexcept {
    return scheduled_ns < warmup_end_ns_.load(std::memory_order_relaxed);
  }
  // The issue side: query `seq` (1-based) scheduled at `scheduled_ns` was issued.
  void note_issued(int64_t seq, int64_t scheduled_ns) noexcept {
    if (in_warmup(scheduled_ns)) warmup_issued_.store(seq, std::memory_order_relaxed);
    issued_.store(seq, std::memory_order_release);
  }
  // Counts one resolution other than completion: in `measured` or, for a warm-up
  // query, as a warm-up failure. Returns whether it was a measured query.
  bool count_resolution(int64_t id, std::atomic<int64_t>& measured) noexcept {
    if (in_warmup(table_.slot(id).scheduled_ns)) {
      warmup_failed_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    measured.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  int64_t measured_issued() const noexcept {
    return issued_.load(std::memory_order_acquire) - warmup_issued_.load(std::memory_order_relaxed);
  }
  // Measured queries in flight: all in flight, less the warm-up's still in flight.
  int64_t measured_outstanding() const noexcept;
  // The engine's cumulative counts for the time series' next point.
  IntervalTotals interval_totals() const;
  int64_t in_flight() const noexcept {
    return issued_.load(std::memory_order_acquire) - resolved_.load(std::memory_order_acquire);
  }

  void issue_loop();
  // Inline issuing: waits while consumers generate the queries, then ends issuing.
  void wait_for_inline_issuing();
  // Walks the schedule (or the closed loop) from start time t0, issuing until a bound,
  // a stop request or the end of the schedule.
  void issue_scheduled(int64_t t0);
  // issue_scheduled() for an open loop with follow-ups (settings().follow_ups).
  void issue_open_with_follow_ups(int64_t t0);
  // Open loop with follow-ups: sleeps, then spins, until `t` or until a follow-up falls
  // due before it (woken by follow_up() for an earlier one), or stop.
  void wait_for_arrival_or_follow_up(int64_t t) noexcept;
  // A free in-flight slot, waiting (and counting a cap wait unless `waited` already
  // did) while the table is full; -1 on stop or at run_deadline.
  int64_t wait_for_free_slot(bool waited, int64_t run_deadline) noexcept;
  // After issuing: the grace period, then cancellation of what is left, then the end.
  void end_run();
  // Closed loop, queue SUT: generates up to `max` queries on the caller's thread
  // (consumer_mutex_ held). Marks issuing done when a bound is reached.
  int64_t generate_inline(int64_t* ids, int64_t* samples, int64_t* scheduled_ns, int64_t max);
  // The next arrival for inline open loop; false (and issuing finished) at the end.
  bool inline_next_arrival(int64_t t0, int64_t* scheduled_ns);
  // Claims a free slot for query `seq` and fills it as issued now (consumer thread).
  // `tag` >= 0: the query's one sample index (a follow-up), else the selector's.
  int64_t issue_inline(int64_t seq, int64_t slot_index, int64_t scheduled, int64_t now,
                       int64_t* samples_out, int64_t tag = -1);
  void finish_issuing() noexcept;
  // Pops the earliest follow-up if due by `now`: its due time and tag.
  bool pop_due_follow_up(int64_t now, int64_t* due, int64_t* tag);
  // Drops every pending follow-up (issuing has ended), counting them.
  void drop_follow_ups() noexcept;
  // Closed loop: when stream k (0-based) starts, the run having started at t0.
  int64_t stream_start_ns(int64_t t0, int64_t k) const noexcept {
    return t0 + (s_.concurrency > 0 ? static_cast<int64_t>(static_cast<__int128>(s_.ramp_up_ns) * k / s_.concurrency) : 0);
  }
  // Closed loop: queries in flight plus follow-ups waiting to be issued.
  int64_t occupancy() const noexcept {
    return in_flight() + follow_pending_.load(std::memory_order_acquire);
  }
  // Appends the record of query `id` (claimed, not yet released) resolved at `t`, when
  // records are kept.
  void log_resolution(int64_t id, RecordStatus status, int64_t t, int64_t n_tokens = -1,
                      uint16_t kind = 0, int64_t n_input = -1, const TokenEvents* events = nullptr) noexcept {
    if (records_) append_record(id, status, t, n_tokens, kind, n_input, events);
  }
  void append_record(int64_t id, RecordStatus status, int64_t t, int64_t n_tokens, uint16_t kind,
                     int64_t n_input, const TokenEvents* events) noexcept;
  void complete_native(int64_t id, int64_t t_ns) noexcept override {
    complete_internal(id, t_ns, -1, false);
  }
  void complete_tokens_native(int64_t id, int64_t t_ns, int64_t n_tokens, int64_t n_input) noexcept override {
    complete_internal(id, t_ns, n_tokens, false, n_input);
  }
  void complete_stream_native(int64_t id, int64_t t_ns, int64_t n_tokens, int64_t n_input,
                              const TokenEvents& events) noexcept override {
    complete_internal(id, t_ns, n_tokens, false, n_input, &events);
  }
  bool wants_token_events() const noexcept override { return records_ != nullptr; }
  void first_token_native(int64_t id, int64_t t_ns) noexcept override { first_token(id, t_ns); }
  // Closed loop with the native HTTP client: generates and sends the next queries on
  // the calling thread (the one that resolved a query), while there is room.
  void issue_ready() noexcept override;
  void fail_native(int64_t id, const std::string& kind, const std::string& message) noexcept override {
    try {
      fail(id, kind, message);
    } catch (...) {  // out of memory for the message's bookkeeping: fail() resolved the query first
    }
  }
  void monitor_loop();
  bool should_stop_issuing(int64_t count, int64_t elapsed_ns, int64_t last_elapsed_ns) const noexcept;
  // Waits until in-flight < limit (or stop); false when stopped first.
  bool wait_for_room(int64_t limit, int64_t deadline_ns) noexcept;
  void dispatch(int64_t id, int64_t seq, int64_t scheduled_ns);
  void track_timeout(int64_t id);
  void reap_timeouts(int64_t now) noexcept;
  void cancel_outstanding() noexcept;

  EngineSettings s_;
  std::unique_ptr<ArrivalSchedule> schedule_;
  SampleSelector selector_;     // owned by whichever thread issues
  bool inline_issue_ = false;
  // The SUT is the native network client (HTTP/1.1 or gRPC).
  bool network_sut() const noexcept { return s_.sut.kind == SutKind::kNetClient; }
  int64_t inline_count_ = 0;          // inline issuing: queries generated (consumer_mutex_)
  // Closed loop, inline: streams started (written under consumer_mutex_).
  std::atomic<int64_t> streams_started_{0};
  // Closed loop with a ramp: when the next stream starts (INT64_MAX: all have started).
  std::atomic<int64_t> ramp_next_ns_{INT64_MAX};
  std::atomic<bool> slice_applied_{false};
  int64_t inline_prev_scheduled_ = 0;
  // Inline open loop (consumer_mutex_): the next arrival, drawn but not yet due.
  bool inline_pending_ = false;
  int64_t inline_pending_offset_ = 0;
  int64_t inline_last_offset_ = -1;
  bool inline_cap_counted_ = false;
  std::atomic<int64_t> inline_next_due_ns_{0};  // 0: waiting for room, not for time
  InFlightTable table_;
  uint64_t mask_ = 0;  // of ring_, which has the table's capacity
  std::unique_ptr<std::atomic<int64_t>[]> ring_;  // queue SUT: ids, SPSC-ish
  std::atomic<uint64_t> ring_head_{0};  // next to pop (consumers, under consumer_mutex_)
  std::atomic<uint64_t> ring_tail_{0};  // next to push (issue thread)
  std::mutex consumer_mutex_;

  NativeSut native_;
  Recorder recorder_;
  TimeSeries timeseries_;

  std::atomic<int64_t> issued_{0};    // written by the issue thread only
  std::atomic<int64_t> resolved_{0};  // completed + failed + timed out + cancelled
  std::atomic<int64_t> completed_{0};
  std::atomic<int64_t> failed_{0};
  std::atomic<int64_t> timed_out_{0};
  std::atomic<int64_t> cancelled_{0};
  std::atomic<int64_t> unknown_{0};
  std::atomic<int64_t> duplicate_{0};
  std::atomic<int64_t> late_{0};
  std::atomic<int64_t> cap_waits_{0};
  std::atomic<int64_t> last_free_ns_{0};
  std::atomic<int64_t> warmup_end_ns_{INT64_MIN};  // start + warmup_ns, once started
  std::atomic<int64_t> warmup_issued_{0};  // the last warm-up seq (issue side only)
  std::atomic<int64_t> warmup_completed_{0};
  std::atomic<int64_t> warmup_failed_{0};
  // Timeouts: ids in issue order (= deadline order, as deadlines are scheduled + timeout).
  std::mutex timeout_mutex_;
  std::deque<int64_t> timeout_queue_;

  // Multi-turn follow-ups: a min-heap of (due, tag) under follow_mutex_; the pending
  // count and the earliest due time (INT64_MAX: none) are readable without the lock.
  std::mutex follow_mutex_;
  std::vector<std::pair<int64_t, int64_t>> follow_heap_;
  std::atomic<int64_t> follow_pending_{0};
  std::atomic<int64_t> follow_due_{INT64_MAX};
  std::atomic<int64_t> follow_pushes_{0};
  std::atomic<int64_t> follow_issued_{0};
  std::atomic<int64_t> follow_dropped_{0};

  std::atomic<bool> stop_{false};
  std::atomic<bool> abort_{false};
  std::atomic<bool> issuing_done_{false};
  std::atomic<bool> run_over_{false};  // every query resolved; threads about to exit
  std::atomic<bool> finished_{false};  // threads joined
  std::atomic<int64_t> start_ns_{0};
  std::atomic<int64_t> issue_end_ns_{0};
  std::atomic<int64_t> end_ns_{0};
  bool started_ = false;

  Notifier room_;      // in-flight dropped (issue thread waits on it)
  Notifier queued_;    // queries queued / run over (consumers wait on it)
  Notifier done_;      // run finished, or stop requested (monitor waits on it)

  mutable std::mutex info_mutex_;
  std::map<std::string, int64_t> error_counts_;
  std::vector<std::string> error_messages_;
  std::string run_error_;

  std::thread issue_thread_;
  std::thread monitor_thread_;
  std::mutex join_mutex_;
  // Last: destroyed first, while done_ (which its writer notifies) still exists.
  std::unique_ptr<RequestLog> records_;
};

}  // namespace loadgen
