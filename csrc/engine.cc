#include "engine.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

#include "affinity.h"
#include "clock.h"
#include "require.h"
#include "sse.h"

namespace loadgen {
namespace {

using detail::require;

uint64_t pow2_at_least(uint64_t n) {
  uint64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// How many queries may be in flight when the settings do not say: room for deep
// backlogs, bounded so that the table and sample store stay within ~64 MB.
constexpr uint64_t kDefaultTableCapacity = uint64_t{1} << 18;
constexpr uint64_t kMaxSampleSlots = uint64_t{1} << 23;
constexpr uint64_t kMaxTableCapacity = uint64_t{1} << 24;

std::unique_ptr<ArrivalSchedule> make_schedule(const EngineSettings& s) {
  if (s.load_mode == LoadMode::kClosedLoop) return nullptr;
  switch (s.arrival) {
    case ArrivalKind::kConstant:
      return std::make_unique<ArrivalSchedule>(ArrivalSchedule::constant(s.target_qps));
    case ArrivalKind::kPoisson:
      return std::make_unique<ArrivalSchedule>(
          ArrivalSchedule::poisson(s.target_qps, s.schedule_seed, s.burstiness));
    case ArrivalKind::kStages:
      return std::make_unique<ArrivalSchedule>(
          ArrivalSchedule::stages(s.stages, s.stages_poisson, s.schedule_seed, s.burstiness));
    case ArrivalKind::kTrace:
      return std::make_unique<ArrivalSchedule>(ArrivalSchedule::trace(s.trace_offsets_ns));
    case ArrivalKind::kOffline:
      return std::make_unique<ArrivalSchedule>(ArrivalSchedule::offline());
  }
  throw std::invalid_argument("arrival: unknown kind");
}

// The settings, checked before any member is built from them (the arrival settings are
// checked by make_schedule, the native SUT's by NativeSut, the bounds by Recorder).
EngineSettings validated(EngineSettings s) {
  require(s.highest_trackable_ns >= 1000,
          "highest_trackable_ns must be >= 1000, got " + std::to_string(s.highest_trackable_ns));
  const std::pair<const char*, int64_t> non_negative[] = {
      {"min_duration", s.min_duration_ns}, {"min_query_count", s.min_query_count},
      {"max_duration", s.max_duration_ns}, {"max_query_count", s.max_query_count},
      {"warmup", s.warmup_ns},            {"ramp_up", s.ramp_up_ns},
      {"sched_slice", s.sched_slice_ns},
      {"max_in_flight", s.max_in_flight},  {"spin", s.spin_ns},
      {"timeout", s.timeout_ns},           {"grace", s.grace_ns},
      {"interval", s.interval_ns},         {"table_capacity", s.table_capacity},
      {"max_error_messages", s.max_error_messages}};
  for (const auto& [name, value] : non_negative) {
    require(value >= 0, std::string(name) + " must be >= 0, got " + std::to_string(value));
  }
  require(s.samples_per_query >= 1,
          "samples_per_query must be >= 1, got " + std::to_string(s.samples_per_query));
  require(s.sample_count >= 1, "sample_count must be >= 1, got " + std::to_string(s.sample_count));
  if (s.load_mode == LoadMode::kClosedLoop) {
    require(s.concurrency >= 1, "concurrency must be >= 1, got " + std::to_string(s.concurrency));
  }
  require(s.ramp_up_ns == 0 || s.load_mode == LoadMode::kClosedLoop,
          "ramp_up_ns applies to the closed loop only (an open loop's schedule is its ramp)");
  require(s.ramp_up_ns <= s.warmup_ns, "ramp_up_ns (" + std::to_string(s.ramp_up_ns) +
                                           ") must be within the warm-up, warmup_ns (" +
                                           std::to_string(s.warmup_ns) + "): the ramp's queries are counted apart");
  // A native client's I/O threads ask for the issue thread's slice too: they read the
  // responses whose times are the latencies.
  s.sut.net.sched_slice_ns = s.sched_slice_ns;
  const bool self_bounded =
      s.load_mode == LoadMode::kOpenLoop &&
      (s.arrival == ArrivalKind::kTrace || s.arrival == ArrivalKind::kStages);
  require(self_bounded || s.max_duration_ns > 0 || s.max_query_count > 0 ||
              s.min_duration_ns > 0 || s.min_query_count > 0,
          "the run needs a bound: a duration or a query count (both are zero)");
  require(s.table_capacity == 0 || (s.table_capacity & (s.table_capacity - 1)) == 0,
          "table_capacity must be a power of 2, got " + std::to_string(s.table_capacity));
  require(!(s.follow_ups && s.inline_dispatch), "follow_ups needs the issue thread: not with inline_dispatch");
  require(!s.inline_dispatch || s.sut.kind == SutKind::kQueue,
          "inline_dispatch needs a Python (queue) SUT; native SUTs are issued from the issue thread");
  return s;
}

// Slots of the in-flight table (a power of 2) for validated settings.
uint64_t table_capacity_for(const EngineSettings& s) {
  uint64_t capacity = static_cast<uint64_t>(s.table_capacity);
  if (capacity == 0) {
    const uint64_t spq = static_cast<uint64_t>(s.samples_per_query);
    if (s.load_mode == LoadMode::kClosedLoop) {
      // Twice the concurrency, so that out-of-order completions rarely leave the next
      // id's slot still occupied.
      capacity = pow2_at_least(2 * static_cast<uint64_t>(s.concurrency));
    } else if (s.max_in_flight > 0) {
      capacity = pow2_at_least(static_cast<uint64_t>(s.max_in_flight));
    } else {
      capacity = kDefaultTableCapacity;
      while (capacity > 1 && capacity * spq > kMaxSampleSlots) capacity >>= 1;
    }
  }
  require(capacity <= kMaxTableCapacity,
          "in-flight table of " + std::to_string(capacity) + " slots is too large (max " +
              std::to_string(kMaxTableCapacity) + "); lower concurrency or max_in_flight");
  return capacity;
}

RecorderSettings recorder_settings(const EngineSettings& s) {
  RecorderSettings r;
  r.highest_trackable_ns = s.highest_trackable_ns;
  r.significant_figures = s.significant_figures;
  r.latency_bounds_ns = s.latency_bounds_ns;
  r.ttft_bounds_ns = s.ttft_bounds_ns;
  r.tpot_bounds_ns = s.tpot_bounds_ns;
  r.slo_latency_ns = s.slo_latency_ns;
  r.slo_ttft_ns = s.slo_ttft_ns;
  r.slo_tpot_ns = s.slo_tpot_ns;
  return r;
}

// Error kinds and messages come from SUTs and servers: any bytes, of any size, as many
// distinct kinds as they like. What the engine keeps of them is bounded and printable,
// so that a misbehaving SUT cannot bloat the result document or put control characters
// into it.
constexpr size_t kMaxKindBytes = 64;
constexpr size_t kKindScanBytes = 4096;
constexpr size_t kMaxMessageBytes = 500;
constexpr size_t kMaxErrorKinds = 64;
constexpr const char* kOtherKinds = "other_kinds";

bool is_kind_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-' || c == ':';
}

// The kind as a short identifier: letters, digits and `_.-:`; every run of other
// characters becomes one '_' (none at either end). Nothing left: "error".
std::string clean_kind(const std::string& kind) {
  std::string out;
  bool gap = false;
  const size_t n = std::min(kind.size(), kKindScanBytes);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(kind[i]);
    if ((c & 0xC0) == 0x80) continue;  // inside a multi-byte character, already a gap
    if (!is_kind_char(c)) {
      gap = true;
      continue;
    }
    if (out.size() + (gap && !out.empty() ? 2 : 1) > kMaxKindBytes) break;
    if (gap && !out.empty()) out += '_';
    gap = false;
    out += static_cast<char>(c);
  }
  return out.empty() ? std::string("error") : out;
}

// Bytes of the well-formed UTF-8 character at s[i..end), or 0.
size_t utf8_char_bytes(const std::string& s, size_t i, size_t end) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const size_t len = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
  if (len == 0 || i + len > end) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  const unsigned char c1 = static_cast<unsigned char>(s[i + 1 < end ? i + 1 : i]);
  if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0) ||  // overlong; surrogate
      (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90)) {  // overlong; above U+10FFFF
    return 0;
  }
  return len;
}

// The first kMaxMessageBytes of a message (cut on a character boundary, saying how much
// was cut), with control characters as spaces and bytes that are not UTF-8 as '?'.
std::string clean_message(const std::string& m) {
  size_t keep = std::min(m.size(), kMaxMessageBytes);
  while (keep < m.size() && keep > 0 && (static_cast<unsigned char>(m[keep]) & 0xC0) == 0x80) --keep;
  std::string out;
  out.reserve(keep + 40);
  for (size_t i = 0; i < keep;) {
    const size_t len = utf8_char_bytes(m, i, keep);
    const unsigned char c = static_cast<unsigned char>(m[i]);
    if (len == 0) {
      out += '?';
      ++i;
    } else if (len == 1) {
      out += c < 0x20 || c == 0x7F ? ' ' : static_cast<char>(c);
      ++i;
    } else {
      if (c == 0xC2 && static_cast<unsigned char>(m[i + 1]) < 0xA0) {
        out += ' ';  // a C1 control character (U+0080..U+009F)
      } else {
        out.append(m, i, len);
      }
      i += len;
    }
  }
  if (keep < m.size()) out += " ... (" + std::to_string(m.size() - keep) + " more bytes cut)";
  return out;
}

}  // namespace

Engine::Engine(EngineSettings settings)
    : s_(validated(std::move(settings))),
      schedule_(make_schedule(s_)),
      selector_(s_.sample_count, s_.sample_order, s_.sample_seed),
      table_(table_capacity_for(s_), s_.samples_per_query),
      mask_(table_.capacity() - 1),
      native_(s_.sut, table_.capacity(), s_.spin_ns),
      recorder_(recorder_settings(s_)),
      timeseries_(s_.highest_trackable_ns, s_.significant_figures) {
  if (s_.sut.kind == SutKind::kQueue) ring_.reset(new std::atomic<int64_t>[table_.capacity()]());
  // Inline issuing: the thread that resolves a query generates the next one. For the
  // queue SUT that is its consumer. For the native HTTP and gRPC clients in a closed
  // loop, an I/O thread: the thread that read a response sends the next request (as wrk
  // does). An open loop on a native client is timed by the issue thread, which does
  // nothing else: it sleeps (then polls) to each arrival and sends it itself, and never
  // reads a response, so that reading a burst of responses cannot make an arrival late.
  inline_issue_ = (s_.sut.kind == SutKind::kQueue &&
                   (s_.load_mode == LoadMode::kClosedLoop || s_.inline_dispatch)) ||
                  (network_sut() && s_.load_mode == LoadMode::kClosedLoop);
  if (s_.records.sink != RecordSink::kNone) {
    records_ = std::make_unique<RequestLog>(s_.records, [this] { done_.notify(); });
  }
}


Engine::~Engine() {
  abort();
  wait(-1);
}

void Engine::start() {
  if (started_) throw std::logic_error("an engine runs once; create a new one");
  started_ = true;
  if (records_) records_->start();
  native_.start(*this);  // first: the issue thread submits to it at once
  issue_thread_ = std::thread([this] { issue_loop(); });
  monitor_thread_ = std::thread([this] { monitor_loop(); });
}

void Engine::stop() noexcept {
  stop_.store(true);
  room_.notify();
  done_.notify();
}

void Engine::abort() noexcept {
  abort_.store(true);
  stop();
}

bool Engine::wait(int64_t timeout_ns) {
  if (!started_) return true;
  const int64_t deadline = timeout_ns < 0 ? INT64_MAX : now_ns() + timeout_ns;
  for (;;) {
    Notifier::Ticket e(done_);
    // Over once every query is resolved and, with records, every record written.
    if (run_over_.load(std::memory_order_acquire) && (!records_ || records_->done())) break;
    const int64_t now = now_ns();
    if (now >= deadline) return false;
    e.wait(std::min<int64_t>(deadline - now, 50'000'000));
  }
  std::lock_guard<std::mutex> lock(join_mutex_);
  for (std::thread* t : {&issue_thread_, &monitor_thread_}) {
    if (t->joinable()) t->join();
  }
  if (records_) records_->join();
  finished_.store(true, std::memory_order_release);
  return true;
}

bool Engine::should_stop_issuing(int64_t count, int64_t elapsed_ns,
                                 int64_t last_elapsed_ns) const noexcept {
  // Limits: the next query would break one. Minimums (MLPerf): the queries issued so
  // far already meet both, so the query that crosses the minimum duration is issued.
  // Every bound counts from the end of the warm-up.
  count -= warmup_issued_.load(std::memory_order_relaxed);
  elapsed_ns -= s_.warmup_ns;
  last_elapsed_ns -= s_.warmup_ns;
  if (s_.max_query_count > 0 && count >= s_.max_query_count) return true;
  if (s_.max_duration_ns > 0 && elapsed_ns >= s_.max_duration_ns) return true;
  if (s_.min_duration_ns > 0 || s_.min_query_count > 0) {
    return count >= s_.min_query_count && last_elapsed_ns >= s_.min_duration_ns;
  }
  return false;
}

bool Engine::wait_for_room(int64_t limit, int64_t deadline_ns) noexcept {
  // Spin briefly (a completion is often microseconds away), then sleep on the futex.
  const int64_t spin_until = now_ns() + std::min<int64_t>(s_.spin_ns, 200'000);
  for (bool sleeping = false;;) {
    // A ticket only once spinning is over: while one is held, every completion pays a
    // wake-up system call.
    std::optional<Notifier::Ticket> ticket;
    if (sleeping) ticket.emplace(room_);
    if (stop_.load(std::memory_order_relaxed)) return false;
    if (in_flight() < limit) return true;
    if (now_ns() >= deadline_ns) return false;  // the run's time is up while waiting
    if (!sleeping) {
      if (now_ns() < spin_until) {
        cpu_relax();
      } else {
        sleeping = true;
      }
      continue;
    }
    ticket->wait(std::min<int64_t>(10'000'000, deadline_ns - now_ns()));
  }
}

void Engine::issue_loop() {
  set_current_thread_name(kIssueThreadName);
  try {
    if (!s_.pin_cpus.empty()) pin_current_thread(s_.pin_cpus);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(info_mutex_);
    run_error_ = e.what();
    stop_.store(true);
  }
  set_min_timer_slack();
  slice_applied_.store(request_sched_slice(s_.sched_slice_ns), std::memory_order_release);
  const int64_t t0 = now_ns();
  inline_prev_scheduled_ = t0;
  if (s_.load_mode == LoadMode::kClosedLoop) ramp_next_ns_.store(t0, std::memory_order_relaxed);
  warmup_end_ns_.store(t0 + s_.warmup_ns, std::memory_order_relaxed);
  start_ns_.store(t0, std::memory_order_release);
  done_.notify();  // the monitor waits for the start time
  queued_.notify();  // inline consumers wait for it too
  if (inline_issue_) {
    issue_ready();  // the native HTTP client's first queries (the queue SUT's consumer asks itself)
    wait_for_inline_issuing();
  } else if (s_.follow_ups && s_.load_mode == LoadMode::kOpenLoop) {
    issue_open_with_follow_ups(t0);
  } else {
    issue_scheduled(t0);
  }
  finish_issuing();
  end_run();
}

void Engine::wait_for_inline_issuing() {
  // Consumers generate the queries; this thread runs the end of the run, and is the
  // timer of multi-turn follow-ups: it wakes the consumers when the earliest falls due.
  const int64_t t0 = start_ns_.load();
  const int64_t run_end = s_.max_duration_ns > 0 ? t0 + s_.warmup_ns + s_.max_duration_ns : INT64_MAX;
  int64_t woken_due = INT64_MIN, woken_pushes = -1;
  while (!issuing_done_.load(std::memory_order_acquire) && !stop_.load()) {
    Notifier::Ticket e(done_);
    if (issuing_done_.load(std::memory_order_acquire) || stop_.load()) break;
    const int64_t now = now_ns();
    // The run's time is up, and nothing may have made room to notice it (every query
    // in flight, or every user thinking): end issuing here.
    if (now >= run_end) break;
    // The earliest follow-up or, during a ramp, the next stream's start.
    const int64_t due = std::min(follow_due_.load(std::memory_order_acquire),
                                 ramp_next_ns_.load(std::memory_order_acquire));
    const int64_t pushes = follow_pushes_.load(std::memory_order_acquire);
    if (due == INT64_MAX || (due == woken_due && pushes == woken_pushes)) {
      e.wait(run_end > now ? std::min<int64_t>(run_end - now, 10'000'000) : 10'000'000);
      continue;
    }
    if (due > now + s_.spin_ns) {  // sleep, waking for an earlier follow-up or the end
      e.wait(std::min<int64_t>(due - now - s_.spin_ns, 10'000'000));
      continue;
    }
    wait_until_ns(due, s_.spin_ns, &stop_);
    woken_due = due;
    woken_pushes = pushes;
    if (network_sut()) {
      issue_ready();  // a native client's next stream goes out from this thread
      continue;
    }
    room_.notify();  // synchronous consumers sleep on room_, the event loop on the eventfd
    queued_.notify_eventfd();
  }
  // Under the consumers' lock, so that no query is generated after this point.
  std::lock_guard<std::mutex> lock(consumer_mutex_);
  finish_issuing();
}

void Engine::issue_scheduled(int64_t t0) {
  const bool closed = s_.load_mode == LoadMode::kClosedLoop;
  const int64_t spq = s_.samples_per_query;
  // A native client's arrivals: the issue thread spins at least the last 20 us, since
  // its wake-up from a timed sleep (about 15 us here, more on a busy host) would be late.
  const int64_t spin = network_sut() ? std::max<int64_t>(s_.spin_ns, 20'000) : s_.spin_ns;
  int64_t count = 0;
  int64_t started = 0;  // closed loop with a ramp: streams started
  int64_t prev_scheduled = t0;
  int64_t last_offset = -1;  // schedule offset of the last query issued
  // Waiting for room (cap or table) must not outlast a duration limit.
  const int64_t run_deadline = s_.max_duration_ns > 0 ? t0 + s_.warmup_ns + s_.max_duration_ns : INT64_MAX;
  while (!stop_.load(std::memory_order_relaxed)) {
    int64_t scheduled;
    bool waited = false;
    if (closed) {
      const int64_t elapsed = now_ns() - t0;
      if (should_stop_issuing(count, elapsed, elapsed)) break;
      if (started < s_.concurrency && s_.ramp_up_ns > 0) {
        // The ramp: the next stream starts at its time; until then a started stream's
        // next query goes out when it makes room.
        const int64_t start_at = stream_start_ns(t0, started);
        if (in_flight() < started ||
            (now_ns() < start_at && wait_for_room(started, std::min(run_deadline, start_at)))) {
          scheduled = std::max(prev_scheduled, last_free_ns_.load(std::memory_order_acquire));
        } else {
          if (stop_.load(std::memory_order_relaxed) || now_ns() >= run_deadline) break;
          if (now_ns() < start_at) continue;
          scheduled = std::max(prev_scheduled, start_at);
          ++started;
        }
      } else if (in_flight() >= s_.concurrency) {
        if (!wait_for_room(s_.concurrency, run_deadline)) break;
        // The next query was due when a slot freed up, not when this thread noticed.
        scheduled = std::max(prev_scheduled, last_free_ns_.load(std::memory_order_acquire));
      } else {
        scheduled = count < s_.concurrency ? t0 : now_ns();
      }
    } else {
      int64_t offset;
      if (!schedule_->next(&offset)) break;
      // Bounds follow the schedule (so the same seeds issue the same queries), except
      // offline, where everything is due at 0 and only the clock can end the run.
      const int64_t elapsed = s_.arrival == ArrivalKind::kOffline ? now_ns() - t0 : offset;
      if (should_stop_issuing(count, elapsed,
                              s_.arrival == ArrivalKind::kOffline ? elapsed : last_offset)) {
        break;
      }
      last_offset = offset;
      scheduled = t0 + offset;
      if (!wait_until_ns(scheduled, spin, &stop_)) break;
      if (s_.max_in_flight > 0 && in_flight() >= s_.max_in_flight) {
        waited = true;
        cap_waits_.fetch_add(1, std::memory_order_relaxed);
        if (!wait_for_room(s_.max_in_flight, run_deadline)) break;
      }
    }
    const int64_t slot_index = wait_for_free_slot(waited, run_deadline);
    if (slot_index < 0) break;
    const int64_t seq = count + 1;
    const int64_t id = table_.make_id(seq, static_cast<uint64_t>(slot_index));
    table_.fill(id, scheduled, 0);
    int64_t* samples = table_.samples(id);
    for (int64_t k = 0; k < spq; ++k) samples[k] = selector_.next();
    prev_scheduled = scheduled;
    ++count;
    dispatch(id, seq, scheduled);
  }
}

void Engine::wait_for_arrival_or_follow_up(int64_t t) noexcept {
  while (!stop_.load(std::memory_order_relaxed)) {
    const int64_t due = follow_due_.load(std::memory_order_acquire);
    const int64_t until = std::min(t, due);
    const int64_t now = now_ns();
    if (now >= until) return;
    if (until - now > s_.spin_ns) {  // sleep, waking for an earlier follow-up
      Notifier::Ticket e(done_);
      if (follow_due_.load(std::memory_order_acquire) != due) continue;
      e.wait(std::min<int64_t>(until - now - s_.spin_ns, 10'000'000));
      continue;
    }
    wait_until_ns(until, s_.spin_ns, &stop_);
  }
}

void Engine::issue_open_with_follow_ups(int64_t t0) {
  int64_t count = 0;
  int64_t last_offset = -1;
  int64_t offset = 0;
  bool have_arrival = false;
  const int64_t run_deadline = s_.max_duration_ns > 0 ? t0 + s_.warmup_ns + s_.max_duration_ns : INT64_MAX;
  while (!stop_.load(std::memory_order_relaxed)) {
    if (!have_arrival) {
      if (!schedule_->next(&offset)) break;  // the schedule's end ends issuing
      have_arrival = true;
    }
    const int64_t arrival = t0 + offset;
    wait_for_arrival_or_follow_up(arrival);
    if (stop_.load(std::memory_order_relaxed)) break;
    const int64_t now = now_ns();
    int64_t scheduled = 0;
    int64_t tag = -1;
    int64_t due = 0;
    if (follow_due_.load(std::memory_order_acquire) <= now && pop_due_follow_up(now, &due, &tag)) {
      if (should_stop_issuing(count, due - t0, last_offset)) {
        follow_dropped_.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      scheduled = due;
    } else {
      if (now < arrival) continue;  // woken with nothing due yet
      if (should_stop_issuing(count, offset, last_offset)) break;
      last_offset = offset;
      have_arrival = false;
      scheduled = arrival;
    }
    bool waited = false;
    if (s_.max_in_flight > 0 && in_flight() >= s_.max_in_flight) {
      waited = true;
      cap_waits_.fetch_add(1, std::memory_order_relaxed);
      if (!wait_for_room(s_.max_in_flight, run_deadline)) {
        if (tag >= 0) follow_dropped_.fetch_add(1, std::memory_order_relaxed);
        break;
      }
    }
    const int64_t slot_index = wait_for_free_slot(waited, run_deadline);
    if (slot_index < 0) {
      if (tag >= 0) follow_dropped_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    const int64_t seq = count + 1;
    const int64_t id = table_.make_id(seq, static_cast<uint64_t>(slot_index));
    table_.fill(id, scheduled, 0);
    table_.samples(id)[0] = tag >= 0 ? tag : selector_.next();
    if (tag >= 0) follow_issued_.fetch_add(1, std::memory_order_relaxed);
    ++count;
    dispatch(id, seq, scheduled);
  }
}

int64_t Engine::wait_for_free_slot(bool waited, int64_t run_deadline) noexcept {
  int64_t slot_index = table_.find_free_slot();
  if (slot_index >= 0) return slot_index;
  // Every slot holds an outstanding query: the table is the cap. Poll rather than
  // sleep on the notifier: a full table means a deep backlog, and a waiting ticket
  // would cost every one of those completions a wake-up system call.
  if (!waited) cap_waits_.fetch_add(1, std::memory_order_relaxed);
  const int64_t capacity = static_cast<int64_t>(table_.capacity());
  const int64_t spin_until = now_ns() + 200'000;
  while (slot_index < 0 && !stop_.load(std::memory_order_relaxed) && now_ns() < run_deadline) {
    // Watch the in-flight count (one load), not the table (a full scan), and spin
    // briefly before sleeping: in a deep backlog slots free up continuously.
    if (in_flight() >= capacity) {
      if (now_ns() < spin_until) {
        cpu_relax();
      } else {
        wait_until_ns(now_ns() + 20'000, 0, &stop_);
      }
      continue;
    }
    slot_index = table_.find_free_slot();
  }
  return slot_index;
}

void Engine::end_run() {
  // Polled, not woken per completion: at the end of an offline run a million queries
  // may complete during the grace period, and each wake-up would cost a system call.
  const int64_t grace_end = s_.grace_ns > INT64_MAX / 2 ? INT64_MAX : now_ns() + s_.grace_ns;
  while (in_flight() > 0 && !abort_.load()) {
    const int64_t now = now_ns();
    if (now >= grace_end) break;
    wait_until_ns(std::min<int64_t>(grace_end, now + 1'000'000), 0, &abort_);
  }
  native_.close();  // the native SUT stops completing before the rest is cancelled
  cancel_outstanding();
  if (records_) records_->seal();  // every query is resolved: no record comes after this
  end_ns_.store(now_ns());
  run_over_.store(true, std::memory_order_release);
  done_.notify();
  queued_.notify();
}

void Engine::finish_issuing() noexcept {
  int64_t zero = 0;
  issue_end_ns_.compare_exchange_strong(zero, now_ns());
  issuing_done_.store(true, std::memory_order_release);
  drop_follow_ups();
  queued_.notify();
  native_.finish();
  done_.notify();
}

void Engine::track_timeout(int64_t id) {
  if (s_.timeout_ns <= 0) return;
  std::lock_guard<std::mutex> lock(timeout_mutex_);
  timeout_queue_.push_back(id);
}

bool Engine::complete_internal(int64_t id, int64_t completed_ns, int64_t n_tokens,
                               bool count_unknown, int64_t n_input, const TokenEvents* events) noexcept {
  if (n_tokens < -1 || n_tokens > kMaxTokenCount) {
    // A count no answer has: the query fails (no total takes it, so none can wrap).
    try {
      fail(id, "invalid_token_count",
           "n_tokens " + std::to_string(n_tokens) + " is out of range (-1: not known, or 0 to " +
               std::to_string(kMaxTokenCount) + ")");
    } catch (...) {  // out of memory for the message: fail() resolved the query first
    }
    return false;
  }
  if (!table_.claim_issued(id)) {
    if (count_unknown) count_stray(id);
    return false;
  }
  const InFlightTable::Slot& sl = table_.slot(id);
  const int64_t t = completed_ns > 0 ? completed_ns : now_ns();
  if (s_.timeout_ns > 0 && t - sl.scheduled_ns >= s_.timeout_ns) {
    // Past its deadline: timed out, whether the reaper or the answer got here first
    // (the monitor thread may run late on a busy machine).
    time_out(id, t, InFlightTable::kBySut);
    return true;
  }
  if (in_warmup(sl.scheduled_ns)) {
    warmup_completed_.fetch_add(1, std::memory_order_relaxed);
  } else {
    // A time out of range is counted by the recorder; the query is completed all the same.
    recorder_.complete(sl.scheduled_ns, sl.issued_ns, t, 1, std::max<int64_t>(n_tokens, 0), n_tokens,
                       sl.first_token_ns.load(std::memory_order_relaxed));
    completed_.fetch_add(1, std::memory_order_relaxed);
  }
  log_resolution(id, RecordStatus::kOk, t, n_tokens, 0, n_input, events);
  release(id, t, InFlightTable::kBySut);
  return true;
}

void Engine::count_stray(int64_t id) noexcept {
  switch (table_.classify_stray(id)) {
    case InFlightTable::Stray::kNeverIssued:
      unknown_.fetch_add(1, std::memory_order_relaxed);
      break;
    case InFlightTable::Stray::kDuplicate:
      duplicate_.fetch_add(1, std::memory_order_relaxed);
      break;
    case InFlightTable::Stray::kLate:
      late_.fetch_add(1, std::memory_order_relaxed);
      break;
  }
}

void Engine::append_record(int64_t id, RecordStatus status, int64_t t, int64_t n_tokens,
                           uint16_t kind, int64_t n_input, const TokenEvents* events) noexcept {
  const InFlightTable::Slot& sl = table_.slot(id);
  RequestRecord r;
  r.query = table_.seq_of(id);
  r.scheduled_ns = sl.scheduled_ns;
  r.issued_ns = sl.issued_ns;
  r.completed_ns = t;
  r.first_token_ns = sl.first_token_ns.load(std::memory_order_relaxed);
  r.sample_index = table_.samples(id)[0];
  r.output_tokens = static_cast<int32_t>(std::clamp<int64_t>(n_tokens, -1, INT32_MAX));
  r.input_tokens = static_cast<int32_t>(std::clamp<int64_t>(n_input, -1, INT32_MAX));
  r.samples = static_cast<int32_t>(std::min<int64_t>(s_.samples_per_query, INT32_MAX));
  r.error_kind = kind;
  r.status = static_cast<uint8_t>(status);
  r.warmup = in_warmup(sl.scheduled_ns) ? 1 : 0;
  records_->append(r, events);
}

void Engine::release(int64_t id, int64_t t, InFlightTable::ResolvedBy by) noexcept {
  table_.free(id, by);
  // A closed loop's next query is due from when this one ended, however it ended.
  last_free_ns_.store(t > 0 ? t : now_ns(), std::memory_order_release);
  resolved_.fetch_add(1, std::memory_order_seq_cst);
  room_.notify();
  // Inline, room is work for the consumer: an async consumer waits on the eventfd
  // (synchronous inline consumers sleep on room_, notified above).
  if (inline_issue_) queued_.notify_eventfd();
}

void Engine::time_out(int64_t id, int64_t t, InFlightTable::ResolvedBy by) noexcept {
  count_resolution(id, timed_out_);
  log_resolution(id, RecordStatus::kTimedOut, t);
  release(id, t, by);
}

int64_t Engine::complete_many(const int64_t* ids, const int64_t* completed_ns, int64_t n) noexcept {
  int64_t ok = 0;
  for (int64_t i = 0; i < n; ++i) ok += complete(ids[i], completed_ns ? completed_ns[i] : 0);
  return ok;
}

bool Engine::fail(int64_t id, const std::string& kind, const std::string& message, bool count_unknown) {
  if (!table_.claim_issued(id)) {
    if (count_unknown) count_stray(id);
    return false;
  }
  const bool measured = count_resolution(id, failed_);
  std::string clean;
  if (records_) {
    // The record goes in before the slot is released; a kind that cannot be kept
    // (no memory) is written as "error".
    uint16_t kind_index = 0;
    try {
      clean = clean_kind(kind);
      kind_index = records_->intern_kind(clean);
    } catch (...) {
    }
    log_resolution(id, RecordStatus::kFailed, now_ns(), -1, kind_index);
  }
  release(id, 0, InFlightTable::kBySut);  // before the bookkeeping, which allocates and could throw
  if (!measured) return true;  // a warm-up failure: counted apart, its kind and message not kept
  if (clean.empty()) clean = clean_kind(kind);
  std::lock_guard<std::mutex> lock(info_mutex_);
  auto it = error_counts_.find(clean);
  if (it == error_counts_.end()) {
    it = error_counts_.size() < kMaxErrorKinds ? error_counts_.emplace(clean, 0).first
                                               : error_counts_.try_emplace(kOtherKinds, 0).first;
  }
  const bool first_of_kind = ++it->second == 1;
  // The first max_error_messages messages, whatever their kinds; past them, the first
  // message of each new kind (up to as many again), so that one noisy kind does not hide
  // the others.
  const int64_t kept = static_cast<int64_t>(error_messages_.size());
  if (kept < s_.max_error_messages || (first_of_kind && kept < 2 * s_.max_error_messages)) {
    clean += ": ";
    clean += clean_message(message);
    error_messages_.push_back(std::move(clean));
  }
  return true;
}

bool Engine::first_token(int64_t id, int64_t t_ns) noexcept {
  const int64_t t = t_ns > 0 ? t_ns : now_ns();
  int64_t scheduled = 0;
  if (!table_.stamp_first_token(id, t, &scheduled)) return false;
  if (!in_warmup(scheduled)) recorder_.first_token(scheduled, t);  // out of range: counted there
  return true;
}

void Engine::reap_timeouts(int64_t now) noexcept {
  std::lock_guard<std::mutex> lock(timeout_mutex_);
  while (!timeout_queue_.empty()) {
    const int64_t id = timeout_queue_.front();
    InFlightTable::Slot& sl = table_.slot(id);
    const uint64_t w = sl.word.load(std::memory_order_acquire);
    const uint64_t st = InFlightTable::state_of(w);
    if (InFlightTable::id_of(w) != id || st == InFlightTable::kFree) {  // resolved (perhaps reused)
      timeout_queue_.pop_front();
      continue;
    }
    if (st == InFlightTable::kIssuing || st == InFlightTable::kClaimed) return;  // in transition; look again later
    // Deadlines are scheduled + timeout, so they come in queue order.
    // The slot may be freed and refilled meanwhile (the transition below then fails):
    // scheduled_ns is read atomically, as fill() writes it.
    if (now - __atomic_load_n(&sl.scheduled_ns, __ATOMIC_RELAXED) < s_.timeout_ns) return;
    if (table_.transition(id, st, InFlightTable::kClaimed)) {
      time_out(id, now, InFlightTable::kByEngine);
      timeout_queue_.pop_front();
    }
  }
}

void Engine::cancel_outstanding() noexcept {
  for (uint64_t i = 0; i < table_.capacity(); ++i) {
    const int64_t id = table_.claim_outstanding(i);
    if (id != 0) {
      count_resolution(id, cancelled_);
      const int64_t t = now_ns();
      log_resolution(id, RecordStatus::kCancelled, t);
      release(id, t, InFlightTable::kByEngine);
    }
  }
}

void Engine::monitor_loop() {
  set_current_thread_name(kMonitorThreadName);
  for (;;) {  // wait for the start time
    Notifier::Ticket e(done_);
    if (start_ns_.load() != 0 || run_over_.load()) break;
    e.wait(10'000'000);
  }
  // The time series starts at the end of the warm-up.
  const int64_t start = start_ns_.load() + s_.warmup_ns;
  timeseries_.begin(start);
  int64_t next_snapshot = s_.interval_ns > 0 ? start + s_.interval_ns : INT64_MAX;
  const int64_t reap_every = s_.timeout_ns > 0
                                 ? std::clamp<int64_t>(s_.timeout_ns / 10, 1'000'000, 10'000'000)
                                 : INT64_MAX;
  int64_t next_reap = s_.timeout_ns > 0 ? start + reap_every : INT64_MAX;
  for (;;) {
    Notifier::Ticket e(done_);
    if (run_over_.load(std::memory_order_acquire)) break;
    const int64_t now = now_ns();
    if (now >= next_reap) {
      reap_timeouts(now);
      next_reap = now + reap_every;  // reap_every is finite whenever next_reap is
    }
    if (now >= next_snapshot) {
      timeseries_.snapshot(recorder_, interval_totals(), now);
      next_snapshot += s_.interval_ns;
      if (next_snapshot <= now) next_snapshot = now + s_.interval_ns;
    }
    const int64_t sleep = std::min({next_reap, next_snapshot, now + 100'000'000}) - now;
    e.wait(std::max<int64_t>(sleep, 0));
  }
  if (s_.interval_ns > 0) timeseries_.snapshot(recorder_, interval_totals(), end_ns_.load());
}

IntervalTotals Engine::interval_totals() const {
  IntervalTotals t;
  t.issued = measured_issued();
  t.failed = failed_.load(std::memory_order_relaxed);
  t.timed_out = timed_out_.load(std::memory_order_relaxed);
  t.outstanding = measured_outstanding();
  // A failure is counted in failed_ before its kind is: read the kinds after it, and
  // only once there has been one (most runs have none).
  if (t.failed > 0) t.errors = error_counts();
  return t;
}

int64_t Engine::measured_outstanding() const noexcept {
  const int64_t resolved = resolved_.load();
  const int64_t issued = issued_.load();
  const int64_t warmup_outstanding = warmup_issued_.load() - warmup_completed_.load() - warmup_failed_.load();
  return std::max<int64_t>(issued - resolved - std::max<int64_t>(warmup_outstanding, 0), 0);
}

EngineCounts Engine::counts() const {
  EngineCounts c;
  // What is in flight first: it reads the counters below in the order it needs.
  c.outstanding = measured_outstanding();
  c.warmup_issued = warmup_issued_.load();
  c.warmup_completed = warmup_completed_.load();
  c.warmup_failed = warmup_failed_.load();
  c.issued = issued_.load() - c.warmup_issued;
  c.completed = completed_.load();
  c.failed = failed_.load();
  c.timed_out = timed_out_.load();
  c.cancelled = cancelled_.load();
  c.unknown_completions = unknown_.load();
  c.duplicate_completions = duplicate_.load();
  c.late_completions = late_.load();
  c.room_waits = cap_waits_.load();
  static_cast<RecorderCounts&>(c) = recorder_.counts();
  return c;
}

std::map<std::string, int64_t> Engine::error_counts() const {
  std::lock_guard<std::mutex> lock(info_mutex_);
  return error_counts_;
}

std::vector<std::string> Engine::error_messages() const {
  std::lock_guard<std::mutex> lock(info_mutex_);
  return error_messages_;
}

std::string Engine::run_error() const {
  std::lock_guard<std::mutex> lock(info_mutex_);
  return run_error_;
}

}  // namespace loadgen
