#include "engine.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <optional>
#include <queue>
#include <stdexcept>

#include "clock.h"
#include "hdr_codec.h"

namespace loadgen {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

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
      return std::make_unique<ArrivalSchedule>(ArrivalSchedule::poisson(s.target_qps, s.schedule_seed));
    case ArrivalKind::kStages:
      return std::make_unique<ArrivalSchedule>(
          ArrivalSchedule::stages(s.stages, s.stages_poisson, s.schedule_seed));
    case ArrivalKind::kTrace:
      return std::make_unique<ArrivalSchedule>(ArrivalSchedule::trace(s.trace_offsets_ns));
    case ArrivalKind::kOffline:
      return std::make_unique<ArrivalSchedule>(ArrivalSchedule::offline());
  }
  throw std::invalid_argument("arrival: unknown kind");
}

}  // namespace

Engine::Engine(EngineSettings settings)
    : s_(std::move(settings)),
      selector_(s_.sample_count, s_.sample_order, s_.sample_seed),
      latency_(1, std::max<int64_t>(s_.highest_trackable_ns, 2), s_.significant_figures),
      service_(1, std::max<int64_t>(s_.highest_trackable_ns, 2), s_.significant_figures),
      issue_delay_(1, std::max<int64_t>(s_.highest_trackable_ns, 2), s_.significant_figures),
      ttft_(1, std::max<int64_t>(s_.highest_trackable_ns, 2), s_.significant_figures),
      tpot_(1, std::max<int64_t>(s_.highest_trackable_ns, 2), s_.significant_figures),
      interval_prev_(1, std::max<int64_t>(s_.highest_trackable_ns, 2), s_.significant_figures) {
  require(s_.highest_trackable_ns >= 1000,
          "highest_trackable_ns must be >= 1000, got " + std::to_string(s_.highest_trackable_ns));
  const std::pair<const char*, int64_t> non_negative[] = {
      {"min_duration", s_.min_duration_ns}, {"min_query_count", s_.min_query_count},
      {"max_duration", s_.max_duration_ns}, {"max_query_count", s_.max_query_count},
      {"max_in_flight", s_.max_in_flight},  {"spin", s_.spin_ns},
      {"timeout", s_.timeout_ns},           {"grace", s_.grace_ns},
      {"interval", s_.interval_ns},         {"sut_delay", s_.sut_delay_ns},
      {"table_capacity", s_.table_capacity}, {"max_error_messages", s_.max_error_messages},
      {"demo_service", s_.demo_service_ns}, {"demo_per_item", s_.demo_per_item_ns}};
  for (const auto& [name, value] : non_negative) {
    require(value >= 0, std::string(name) + " must be >= 0, got " + std::to_string(value));
  }
  require(s_.samples_per_query >= 1,
          "samples_per_query must be >= 1, got " + std::to_string(s_.samples_per_query));
  require(s_.sample_count >= 1, "sample_count must be >= 1, got " + std::to_string(s_.sample_count));
  if (s_.sut == SutKind::kDemo) {
    require(s_.demo_workers >= 1 && s_.demo_workers <= 4096,
            "demo_workers must be in 1..4096, got " + std::to_string(s_.demo_workers));
    require(s_.demo_max_batch >= 1, "demo_max_batch must be >= 1, got " + std::to_string(s_.demo_max_batch));
    require(std::isfinite(s_.demo_sigma) && s_.demo_sigma >= 0 && s_.demo_sigma <= 3,
            "demo_sigma must be in 0..3, got " + std::to_string(s_.demo_sigma));
  }
  if (s_.load_mode == LoadMode::kClosedLoop) {
    require(s_.concurrency >= 1, "concurrency must be >= 1, got " + std::to_string(s_.concurrency));
  }
  schedule_ = make_schedule(s_);  // validates the arrival settings
  const bool self_bounded =
      s_.load_mode == LoadMode::kOpenLoop &&
      (s_.arrival == ArrivalKind::kTrace || s_.arrival == ArrivalKind::kStages);
  require(self_bounded || s_.max_duration_ns > 0 || s_.max_query_count > 0 ||
              s_.min_duration_ns > 0 || s_.min_query_count > 0,
          "the run needs a bound: a duration or a query count (both are zero)");
  require(s_.table_capacity == 0 || (s_.table_capacity & (s_.table_capacity - 1)) == 0,
          "table_capacity must be a power of 2, got " + std::to_string(s_.table_capacity));

  uint64_t capacity = static_cast<uint64_t>(s_.table_capacity);
  if (capacity == 0) {
    const uint64_t spq = static_cast<uint64_t>(s_.samples_per_query);
    if (s_.load_mode == LoadMode::kClosedLoop) {
      // Twice the concurrency, so that out-of-order completions rarely leave the next
      // id's slot still occupied.
      capacity = pow2_at_least(2 * static_cast<uint64_t>(s_.concurrency));
    } else if (s_.max_in_flight > 0) {
      capacity = pow2_at_least(static_cast<uint64_t>(s_.max_in_flight));
    } else {
      capacity = kDefaultTableCapacity;
      while (capacity > 1 && capacity * spq > kMaxSampleSlots) capacity >>= 1;
    }
  }
  require(capacity <= kMaxTableCapacity,
          "in-flight table of " + std::to_string(capacity) + " slots is too large (max " +
              std::to_string(kMaxTableCapacity) + "); lower concurrency or max_in_flight");
  mask_ = capacity - 1;
  while ((uint64_t{1} << slot_bits_) < capacity) ++slot_bits_;
  slots_.reset(new Slot[capacity]);
  samples_.assign(capacity * static_cast<uint64_t>(s_.samples_per_query), 0);
  if (s_.sut == SutKind::kQueue) ring_.reset(new std::atomic<int64_t>[capacity]());
  require(!s_.inline_dispatch || s_.sut == SutKind::kQueue,
          "inline_dispatch needs a Python (queue) SUT; native SUTs are issued from the issue thread");
  inline_issue_ = s_.sut == SutKind::kQueue &&
                  (s_.load_mode == LoadMode::kClosedLoop || s_.inline_dispatch);
  if (s_.sut == SutKind::kFixedDelay || s_.sut == SutKind::kDemo) {
    delay_ring_.reset(new std::atomic<int64_t>[capacity]());
    delay_due_.reset(new std::atomic<int64_t>[capacity]());
  }
}

Engine::~Engine() {
  abort();
  wait(-1);
}

void Engine::start() {
  if (started_) throw std::logic_error("an engine runs once; create a new one");
  started_ = true;
  issue_thread_ = std::thread([this] { issue_loop(); });
  monitor_thread_ = std::thread([this] { monitor_loop(); });
  if (s_.sut == SutKind::kFixedDelay) completion_thread_ = std::thread([this] { completion_loop(); });
  if (s_.sut == SutKind::kDemo) completion_thread_ = std::thread([this] { demo_loop(); });
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
    if (run_over_.load(std::memory_order_acquire)) break;
    const int64_t now = now_ns();
    if (now >= deadline) return false;
    e.wait(std::min<int64_t>(deadline - now, 50'000'000));
  }
  std::lock_guard<std::mutex> lock(join_mutex_);
  for (std::thread* t : {&issue_thread_, &monitor_thread_, &completion_thread_}) {
    if (t->joinable()) t->join();
  }
  finished_.store(true, std::memory_order_release);
  return true;
}

bool Engine::should_stop_issuing(int64_t count, int64_t elapsed_ns,
                                 int64_t last_elapsed_ns) const noexcept {
  // Limits: the next query would break one. Minimums (MLPerf): the queries issued so
  // far already meet both, so the query that crosses the minimum duration is issued.
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
    ticket->wait(10'000'000);
  }
}

void Engine::issue_loop() {
  try {
    if (!s_.pin_cpus.empty()) pin_current_thread(s_.pin_cpus);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(info_mutex_);
    run_error_ = e.what();
    stop_.store(true);
  }
  set_min_timer_slack();
  const bool closed = s_.load_mode == LoadMode::kClosedLoop;
  const int64_t spq = s_.samples_per_query;
  const int64_t t0 = now_ns();
  inline_prev_scheduled_ = t0;
  start_ns_.store(t0, std::memory_order_release);
  done_.notify();  // the monitor waits for the start time
  queued_.notify();  // inline consumers wait for it too
  int64_t count = 0;
  int64_t prev_scheduled = t0;
  int64_t last_offset = -1;  // schedule offset of the last query issued
  // Waiting for room (cap or table) must not outlast a duration limit.
  const int64_t run_deadline = s_.max_duration_ns > 0 ? t0 + s_.max_duration_ns : INT64_MAX;

  if (inline_issue_) {
    // Consumers generate the queries; this thread only runs the end of the run.
    while (!issuing_done_.load(std::memory_order_acquire) && !stop_.load()) {
      Notifier::Ticket e(done_);
      if (issuing_done_.load(std::memory_order_acquire) || stop_.load()) break;
      e.wait(10'000'000);
    }
    // Under the consumers' lock, so that no query is generated after this point.
    std::lock_guard<std::mutex> lock(consumer_mutex_);
    finish_issuing();
  }
  while (!inline_issue_ && !stop_.load(std::memory_order_relaxed)) {
    int64_t scheduled;
    bool waited = false;
    if (closed) {
      const int64_t elapsed = now_ns() - t0;
      if (should_stop_issuing(count, elapsed, elapsed)) break;
      if (in_flight() >= s_.concurrency) {
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
      if (!wait_until_ns(scheduled, s_.spin_ns, &stop_)) break;
      if (s_.max_in_flight > 0 && in_flight() >= s_.max_in_flight) {
        waited = true;
        cap_waits_.fetch_add(1, std::memory_order_relaxed);
        if (!wait_for_room(s_.max_in_flight, run_deadline)) break;
      }
    }
    int64_t slot_index = find_free_slot();
    if (slot_index < 0) {
      // Every slot holds an outstanding query: the table is the cap. Poll rather than
      // sleep on the notifier: a full table means a deep backlog, and a waiting ticket
      // would cost every one of those completions a wake-up system call.
      if (!waited) cap_waits_.fetch_add(1, std::memory_order_relaxed);
      const int64_t capacity = static_cast<int64_t>(mask_ + 1);
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
        slot_index = find_free_slot();
      }
      if (slot_index < 0) break;
    }
    const int64_t seq = count + 1;
    const int64_t id = make_id(seq, static_cast<uint64_t>(slot_index));
    Slot& sl = slot(id);
    sl.scheduled_ns = scheduled;
    sl.issued_ns = 0;
    sl.first_token_ns.store(0, std::memory_order_relaxed);
    int64_t* samples = &samples_[(static_cast<uint64_t>(id) & mask_) * static_cast<uint64_t>(spq)];
    for (int64_t k = 0; k < spq; ++k) samples[k] = selector_.next();
    prev_scheduled = scheduled;
    ++count;
    dispatch(id, seq, scheduled);
  }
  finish_issuing();

  // Polled, not woken per completion: at the end of an offline run a million queries
  // may complete during the grace period, and each wake-up would cost a system call.
  const int64_t grace_end = s_.grace_ns > INT64_MAX / 2 ? INT64_MAX : now_ns() + s_.grace_ns;
  while (in_flight() > 0 && !abort_.load()) {
    const int64_t now = now_ns();
    if (now >= grace_end) break;
    wait_until_ns(std::min<int64_t>(grace_end, now + 1'000'000), 0, &abort_);
  }
  closing_.store(true);
  cancel_outstanding();
  delayed_.notify();
  if (completion_thread_.joinable()) completion_thread_.join();
  end_ns_.store(now_ns());
  run_over_.store(true, std::memory_order_release);
  done_.notify();
  queued_.notify();
}

void Engine::finish_issuing() noexcept {
  int64_t zero = 0;
  issue_end_ns_.compare_exchange_strong(zero, now_ns());
  issuing_done_.store(true, std::memory_order_release);
  queued_.notify();
  delayed_.notify();
  done_.notify();
}

int64_t Engine::issue_inline(int64_t seq, int64_t slot_index, int64_t scheduled, int64_t now,
                             int64_t* samples_out) {
  const int64_t spq = s_.samples_per_query;
  const int64_t id = make_id(seq, static_cast<uint64_t>(slot_index));
  Slot& sl = slot(id);
  sl.scheduled_ns = scheduled;
  sl.issued_ns = now;
  sl.first_token_ns.store(0, std::memory_order_relaxed);
  int64_t* dst = &samples_[(static_cast<uint64_t>(id) & mask_) * static_cast<uint64_t>(spq)];
  for (int64_t k = 0; k < spq; ++k) dst[k] = selector_.next();
  std::copy(dst, dst + spq, samples_out);
  sl.state.store(word(id, kIssued), std::memory_order_release);
  issued_.store(seq, std::memory_order_release);
  issue_delay_.record(now - scheduled);
  track_timeout(id);
  inline_count_ = seq;
  return id;
}

bool Engine::inline_next_arrival(int64_t t0, int64_t* scheduled_ns) {
  if (!inline_pending_) {
    if (!schedule_->next(&inline_pending_offset_)) {
      finish_issuing();
      return false;
    }
    inline_pending_ = true;
  }
  const bool offline = s_.arrival == ArrivalKind::kOffline;
  const int64_t elapsed = offline ? now_ns() - t0 : inline_pending_offset_;
  if (should_stop_issuing(inline_count_, elapsed, offline ? elapsed : inline_last_offset_)) {
    finish_issuing();
    return false;
  }
  *scheduled_ns = t0 + inline_pending_offset_;
  return true;
}

int64_t Engine::generate_inline(int64_t* ids, int64_t* samples, int64_t* scheduled_ns,
                                int64_t max) {
  const int64_t t0 = start_ns_.load(std::memory_order_acquire);
  if (t0 == 0 || issuing_done_.load(std::memory_order_relaxed)) return 0;
  const int64_t spq = s_.samples_per_query;
  const bool closed = s_.load_mode == LoadMode::kClosedLoop;
  int64_t n = 0;
  while (n < max) {
    if (stop_.load(std::memory_order_relaxed)) {
      finish_issuing();
      break;
    }
    const int64_t now = now_ns();
    int64_t scheduled;
    if (closed) {
      if (in_flight() >= s_.concurrency) break;
      if (should_stop_issuing(inline_count_, now - t0, now - t0)) {
        finish_issuing();
        break;
      }
      // Due when the slot freed up (the last completion), not when this thread got here.
      scheduled = inline_count_ < s_.concurrency
                      ? t0
                      : std::max(inline_prev_scheduled_, last_free_ns_.load(std::memory_order_acquire));
    } else {
      if (!inline_next_arrival(t0, &scheduled)) break;
      if (scheduled > now) {  // not due yet: the caller waits for it
        inline_next_due_ns_.store(scheduled, std::memory_order_relaxed);
        break;
      }
      if (s_.max_duration_ns > 0 && now - t0 >= s_.max_duration_ns &&
          (in_flight() >= (s_.max_in_flight > 0 ? s_.max_in_flight : INT64_MAX) ||
           find_free_slot() < 0)) {
        finish_issuing();  // the run's time is up while waiting for room
        break;
      }
      if (s_.max_in_flight > 0 && in_flight() >= s_.max_in_flight) {
        if (!inline_cap_counted_) cap_waits_.fetch_add(1, std::memory_order_relaxed);
        inline_cap_counted_ = true;
        inline_next_due_ns_.store(0, std::memory_order_relaxed);
        break;
      }
    }
    const int64_t slot_index = find_free_slot();
    if (slot_index < 0) {  // the table is full: wait for room
      if (!closed) {
        if (!inline_cap_counted_) cap_waits_.fetch_add(1, std::memory_order_relaxed);
        inline_cap_counted_ = true;
        inline_next_due_ns_.store(0, std::memory_order_relaxed);
      }
      break;
    }
    ids[n] = issue_inline(inline_count_ + 1, slot_index, scheduled, now, samples + n * spq);
    scheduled_ns[n] = scheduled;
    inline_prev_scheduled_ = scheduled;
    if (!closed) {
      inline_last_offset_ = inline_pending_offset_;
      inline_pending_ = false;
      inline_cap_counted_ = false;
    }
    ++n;
  }
  return n;
}

int64_t Engine::find_free_slot() noexcept {
  for (uint64_t k = 0; k <= mask_; ++k) {
    const uint64_t i = (free_cursor_ + k) & mask_;
    if ((slots_[i].state.load(std::memory_order_acquire) & 7) == kFree) {
      free_cursor_ = i + 1;
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

void Engine::track_timeout(int64_t id) {
  if (s_.timeout_ns <= 0) return;
  std::lock_guard<std::mutex> lock(timeout_mutex_);
  timeout_queue_.push_back(id);
}

void Engine::dispatch(int64_t id, int64_t seq, int64_t scheduled_ns) {
  Slot& sl = slot(id);
  int64_t issued_at = 0;
  if (s_.sut != SutKind::kQueue) {  // native SUTs receive the query right here
    issued_at = now_ns();
    sl.issued_ns = issued_at;
    sl.state.store(word(id, kIssued), std::memory_order_release);
    track_timeout(id);  // after the state store: the reaper must see this id in the slot
    issued_.store(seq, std::memory_order_release);
    issue_delay_.record(issued_at - scheduled_ns);
  }
  switch (s_.sut) {
    case SutKind::kNull:
      complete_internal(id, now_ns(), -1, false);
      return;
    case SutKind::kFixedDelay:
    case SutKind::kDemo: {
      const uint64_t tail = delay_tail_.load(std::memory_order_relaxed);
      delay_ring_[tail & mask_].store(id, std::memory_order_relaxed);
      delay_due_[tail & mask_].store(issued_at + s_.sut_delay_ns, std::memory_order_relaxed);
      delay_tail_.store(tail + 1, std::memory_order_release);
      delayed_.notify();
      return;
    }
    case SutKind::kQueue: {
      sl.state.store(word(id, kQueued), std::memory_order_release);
      track_timeout(id);
      issued_.store(seq, std::memory_order_release);
      const uint64_t tail = ring_tail_.load(std::memory_order_relaxed);
      ring_[tail & mask_].store(id, std::memory_order_relaxed);
      ring_tail_.store(tail + 1, std::memory_order_release);
      queued_.notify();
      return;
    }
  }
}

void Engine::completion_loop() {
  set_min_timer_slack();
  uint64_t head = 0;
  for (;;) {
    if (closing_.load(std::memory_order_acquire)) return;
    if (head == delay_tail_.load(std::memory_order_acquire)) {
      Notifier::Ticket ticket(delayed_);
      if (head != delay_tail_.load(std::memory_order_acquire)) continue;
      if (issuing_done_.load(std::memory_order_acquire) && in_flight() == 0) return;
      if (closing_.load(std::memory_order_acquire)) return;
      ticket.wait(10'000'000);
      continue;
    }
    const int64_t id = delay_ring_[head & mask_].load(std::memory_order_relaxed);
    // From the ring, not the slot: a timed-out query's slot may already be reused.
    const int64_t due = delay_due_[head & mask_].load(std::memory_order_relaxed);
    if (!wait_until_ns(due, s_.spin_ns, &closing_)) return;
    complete_internal(id, now_ns(), -1, false);
    ++head;
  }
}

// The demo server, simulated on the completion thread: queries wait in arrival order;
// whenever a worker is free it takes up to demo_max_batch of them; the batch completes
// after a sampled service time. Completions are reported when they are due.
void Engine::demo_loop() {
  set_min_timer_slack();
  Rng rng(s_.sut_seed);
  auto service_ns = [&](int64_t batch) {
    const double u1 = std::max(rng.uniform(), 1e-300);
    const double u2 = rng.uniform();
    const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    const double base = static_cast<double>(s_.demo_service_ns + s_.demo_per_item_ns * (batch - 1));
    const double ns = base * std::exp(s_.demo_sigma * normal);
    return ns < 3.6e12 ? static_cast<int64_t>(ns) : int64_t{3'600'000'000'000};  // at most an hour
  };
  struct Running {
    int64_t due_ns;
    std::vector<int64_t> ids;
    bool operator>(const Running& o) const { return due_ns > o.due_ns; }
  };
  std::priority_queue<Running, std::vector<Running>, std::greater<Running>> running;
  std::vector<int64_t> worker_free_ns(static_cast<size_t>(s_.demo_workers), 0);
  std::deque<int64_t> waiting;
  uint64_t head = 0;
  for (;;) {
    if (closing_.load(std::memory_order_acquire)) return;
    const uint64_t tail = delay_tail_.load(std::memory_order_acquire);
    for (; head != tail; ++head) waiting.push_back(delay_ring_[head & mask_].load(std::memory_order_relaxed));
    int64_t now = now_ns();
    while (!running.empty() && running.top().due_ns <= now) {
      for (const int64_t id : running.top().ids) complete_internal(id, now, -1, false);
      running.pop();
      now = now_ns();
    }
    while (!waiting.empty()) {
      auto w = std::min_element(worker_free_ns.begin(), worker_free_ns.end());
      if (*w > now) break;
      Running r;
      const auto batch = std::min<int64_t>(s_.demo_max_batch, static_cast<int64_t>(waiting.size()));
      for (int64_t k = 0; k < batch; ++k) {
        r.ids.push_back(waiting.front());
        waiting.pop_front();
      }
      r.due_ns = now + service_ns(batch);
      *w = r.due_ns;
      running.push(std::move(r));
    }
    if (issuing_done_.load(std::memory_order_acquire) && running.empty() && waiting.empty() &&
        head == delay_tail_.load(std::memory_order_acquire)) {
      return;
    }
    // Sleep until the next completion (spinning the last stretch) or a new arrival.
    const int64_t next = running.empty() ? now + 10'000'000 : running.top().due_ns;
    const int64_t until_spin = next - s_.spin_ns - now_ns();
    if (until_spin > 0) {
      Notifier::Ticket ticket(delayed_);
      if (head == delay_tail_.load(std::memory_order_acquire) && !closing_.load()) {
        ticket.wait(until_spin);
      }
    } else {
      while (now_ns() < next && head == delay_tail_.load(std::memory_order_acquire) &&
             !closing_.load(std::memory_order_relaxed)) {
        cpu_relax();
      }
    }
  }
}

int64_t Engine::take_batch(int64_t* ids, int64_t* samples, int64_t* scheduled_ns, int64_t max,
                           int64_t timeout_ns, int64_t spin_ns) {
  if (s_.sut != SutKind::kQueue) throw std::logic_error("take_batch needs the queue SUT");
  const int64_t spq = s_.samples_per_query;
  const int64_t start = now_ns();
  const int64_t deadline = timeout_ns < 0 ? INT64_MAX : start + timeout_ns;
  const int64_t spin_end = start + spin_ns;
  for (bool sleeping = false;;) {
    // Spin first; take a ticket (then re-check) only to sleep, since while one is held
    // every queued query (or, inline, every completion) pays a wake-up system call.
    // Inline consumers wait for completions, or for the issue thread's start signal.
    std::optional<Notifier::Ticket> ticket;
    if (sleeping) ticket.emplace(inline_issue_ && start_ns_.load() != 0 ? room_ : queued_);
    int64_t n = 0;
    if (inline_issue_) {
      std::lock_guard<std::mutex> lock(consumer_mutex_);
      n = generate_inline(ids, samples, scheduled_ns, max);
    } else {
      std::lock_guard<std::mutex> lock(consumer_mutex_);
      uint64_t head = ring_head_.load(std::memory_order_relaxed);
      const uint64_t tail = ring_tail_.load(std::memory_order_acquire);
      if (head != tail) {
        const int64_t now = now_ns();
        while (head != tail && n < max) {
          const int64_t id = ring_[head & mask_].load(std::memory_order_relaxed);
          ++head;
          Slot& sl = slot(id);
          uint64_t expect = word(id, kQueued);
          if (!sl.state.compare_exchange_strong(expect, word(id, kIssuing),
                                                std::memory_order_acq_rel)) {
            continue;  // timed out or cancelled while queued
          }
          sl.issued_ns = now;
          const int64_t* src = &samples_[(static_cast<uint64_t>(id) & mask_) * static_cast<uint64_t>(spq)];
          std::copy(src, src + spq, samples + n * spq);
          const int64_t delay = now - sl.scheduled_ns;
          sl.state.store(word(id, kIssued), std::memory_order_release);
          issue_delay_.record(delay);
          scheduled_ns[n] = now - delay;
          ids[n++] = id;
        }
        ring_head_.store(head, std::memory_order_release);
      }
    }
    if (n > 0) return n;
    if (issuing_done_.load(std::memory_order_acquire) &&
        ring_head_.load(std::memory_order_acquire) == ring_tail_.load(std::memory_order_acquire)) {
      return -1;
    }
    const int64_t now = now_ns();
    if (now >= deadline) return 0;
    if (inline_issue_ && s_.load_mode == LoadMode::kOpenLoop && start_ns_.load() != 0) {
      const int64_t due = inline_next_due_ns_.load(std::memory_order_relaxed);
      if (due > 0) {  // the next query is due at a known time: sleep, then spin, to it
        wait_until_ns(std::min(due, deadline), s_.spin_ns, &stop_);
        continue;
      }
    }
    if (!sleeping) {
      if (now < spin_end) {
        cpu_relax();
      } else {
        sleeping = true;
      }
      continue;
    }
    ticket->wait(std::min<int64_t>(deadline - now, 50'000'000));
  }
}

int Engine::eventfd() { return queued_.eventfd(); }

void Engine::arm_eventfd() noexcept {
  queued_.drain_eventfd();
  queued_.arm_eventfd();
  // Anything queued (or the end) after the last take_batch must not be missed; inline,
  // neither may the start of the run or room for the next query.
  const bool inline_ready = inline_issue_ && start_ns_.load() != 0 &&
                            in_flight() < (s_.load_mode == LoadMode::kClosedLoop ? s_.concurrency : 1);
  if (ring_head_.load() != ring_tail_.load() || issuing_done_.load() || inline_ready) {
    queued_.notify();
  }
}

bool Engine::complete_internal(int64_t id, int64_t completed_ns, int64_t n_tokens,
                               bool count_unknown) noexcept {
  if (!valid_id(id)) {
    if (count_unknown) unknown_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  Slot& sl = slot(id);
  uint64_t expect = word(id, kIssued);
  if (!sl.state.compare_exchange_strong(expect, word(id, kClaimed), std::memory_order_acq_rel)) {
    if (count_unknown) unknown_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const int64_t t = completed_ns > 0 ? completed_ns : now_ns();
  latency_.record(t - sl.scheduled_ns);
  service_.record(t - sl.issued_ns);
  if (n_tokens >= 0) {
    tokens_.fetch_add(n_tokens, std::memory_order_relaxed);
    const int64_t first = sl.first_token_ns.load(std::memory_order_relaxed);
    if (first > 0 && n_tokens > 1) tpot_.record((t - first) / (n_tokens - 1));
  }
  completed_.fetch_add(1, std::memory_order_relaxed);
  release(id, t);
  return true;
}

void Engine::release(int64_t id, int64_t t) noexcept {
  slot(id).state.store(word(id, kFree), std::memory_order_release);
  // A closed loop's next query is due from when this one ended, however it ended.
  last_free_ns_.store(t > 0 ? t : now_ns(), std::memory_order_release);
  resolved_.fetch_add(1, std::memory_order_seq_cst);
  room_.notify();
  // Inline, room is work for the consumer: an async consumer waits on the eventfd
  // (synchronous inline consumers sleep on room_, notified above).
  if (inline_issue_) queued_.notify_eventfd();
}

int64_t Engine::complete_many(const int64_t* ids, const int64_t* completed_ns, int64_t n) noexcept {
  int64_t ok = 0;
  for (int64_t i = 0; i < n; ++i) ok += complete(ids[i], completed_ns ? completed_ns[i] : 0);
  return ok;
}

bool Engine::fail(int64_t id, const std::string& kind, const std::string& message) {
  if (!valid_id(id)) {
    unknown_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  uint64_t expect = word(id, kIssued);
  if (!slot(id).state.compare_exchange_strong(expect, word(id, kClaimed), std::memory_order_acq_rel)) {
    unknown_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  failed_.fetch_add(1, std::memory_order_relaxed);
  release(id);  // before the bookkeeping, which allocates and could throw
  std::lock_guard<std::mutex> lock(info_mutex_);
  ++error_counts_[kind];
  if (static_cast<int64_t>(error_messages_.size()) < s_.max_error_messages) {
    error_messages_.push_back(kind + ": " + message);
  }
  return true;
}

bool Engine::first_token(int64_t id, int64_t t_ns) noexcept {
  if (!valid_id(id)) return false;
  Slot& sl = slot(id);
  if (sl.state.load(std::memory_order_acquire) != word(id, kIssued)) return false;
  const int64_t t = t_ns > 0 ? t_ns : now_ns();
  int64_t expect = 0;
  if (!sl.first_token_ns.compare_exchange_strong(expect, t, std::memory_order_relaxed)) return false;
  const int64_t scheduled = sl.scheduled_ns;
  // The query may have resolved (and its slot been reused) since the check above:
  // then undo the stamp, which would otherwise belong to the slot's next query.
  if (sl.state.load(std::memory_order_acquire) != word(id, kIssued)) {
    int64_t mine = t;
    sl.first_token_ns.compare_exchange_strong(mine, 0, std::memory_order_relaxed);
    return false;
  }
  ttft_.record(t - scheduled);
  return true;
}

void Engine::reap_timeouts(int64_t now) noexcept {
  std::lock_guard<std::mutex> lock(timeout_mutex_);
  while (!timeout_queue_.empty()) {
    const int64_t id = timeout_queue_.front();
    Slot& sl = slot(id);
    const uint64_t w = sl.state.load(std::memory_order_acquire);
    const uint64_t st = w & 7;
    if (static_cast<int64_t>(w >> 3) != id || st == kFree) {  // resolved (perhaps reused)
      timeout_queue_.pop_front();
      continue;
    }
    if (st == kIssuing || st == kClaimed) return;  // in transition; look again later
    // Deadlines are scheduled + timeout, so they come in queue order.
    if (now - sl.scheduled_ns < s_.timeout_ns) return;
    uint64_t expect = w;
    if (sl.state.compare_exchange_strong(expect, word(id, kClaimed), std::memory_order_acq_rel)) {
      timed_out_.fetch_add(1, std::memory_order_relaxed);
      release(id, now);
      timeout_queue_.pop_front();
    }
  }
}

void Engine::cancel_outstanding() noexcept {
  for (uint64_t i = 0; i <= mask_; ++i) {
    Slot& sl = slots_[i];
    for (;;) {
      uint64_t w = sl.state.load(std::memory_order_acquire);
      const uint64_t st = w & 7;
      if (st == kFree) break;
      if (st == kIssuing || st == kClaimed) {  // a consumer or completer is mid-way
        cpu_relax();
        continue;
      }
      if (sl.state.compare_exchange_strong(w, word(static_cast<int64_t>(w >> 3), kClaimed),
                                           std::memory_order_acq_rel)) {
        cancelled_.fetch_add(1, std::memory_order_relaxed);
        release(static_cast<int64_t>(w >> 3));
        break;
      }
    }
  }
}

void Engine::monitor_loop() {
  for (;;) {  // wait for the start time
    Notifier::Ticket e(done_);
    if (start_ns_.load() != 0 || run_over_.load()) break;
    e.wait(10'000'000);
  }
  interval_prev_ns_ = start_ns_.load();
  int64_t next_snapshot = s_.interval_ns > 0 ? interval_prev_ns_ + s_.interval_ns : INT64_MAX;
  const int64_t reap_every = s_.timeout_ns > 0
                                 ? std::clamp<int64_t>(s_.timeout_ns / 10, 1'000'000, 10'000'000)
                                 : INT64_MAX;
  int64_t next_reap = s_.timeout_ns > 0 ? interval_prev_ns_ + reap_every : INT64_MAX;
  for (;;) {
    Notifier::Ticket e(done_);
    if (run_over_.load(std::memory_order_acquire)) break;
    const int64_t now = now_ns();
    if (now >= next_reap) {
      reap_timeouts(now);
      next_reap = now + reap_every;  // reap_every is finite whenever next_reap is
    }
    if (now >= next_snapshot) {
      snapshot_interval(now);
      next_snapshot += s_.interval_ns;
      if (next_snapshot <= now) next_snapshot = now + s_.interval_ns;
    }
    const int64_t sleep = std::min({next_reap, next_snapshot, now + 100'000'000}) - now;
    e.wait(std::max<int64_t>(sleep, 0));
  }
  if (s_.interval_ns > 0) snapshot_interval(end_ns_.load());
}

void Engine::snapshot_interval(int64_t now) {
  HdrHistogram total = latency_.snapshot();
  std::vector<int64_t> diff(static_cast<size_t>(total.counts_len()));
  for (int32_t i = 0; i < total.counts_len(); ++i) {
    diff[i] = std::max<int64_t>(total.count_at_index(i) - interval_prev_.count_at_index(i), 0);
  }
  HdrHistogram interval(1, std::max<int64_t>(s_.highest_trackable_ns, 2), s_.significant_figures);
  interval.load_counts(diff.data(), static_cast<int32_t>(diff.size()));
  IntervalPoint p;
  p.start_offset_ns = interval_prev_ns_ - start_ns_.load();
  p.length_ns = now - interval_prev_ns_;
  const int64_t issued = issued_.load();
  p.issued = issued - interval_prev_issued_;
  p.completed = interval.total_count();
  p.latency_p50_ns = interval.value_at_percentile(50.0);
  p.latency_p99_ns = interval.value_at_percentile(99.0);
  p.latency_max_ns = interval.max();
  p.latency_hdr = encode_compressed(interval);
  interval_prev_ = std::move(total);
  interval_prev_issued_ = issued;
  interval_prev_ns_ = now;
  std::lock_guard<std::mutex> lock(info_mutex_);
  timeseries_.push_back(std::move(p));
}

EngineCounts Engine::counts() const {
  EngineCounts c;
  c.issued = issued_.load();
  c.completed = completed_.load();
  c.failed = failed_.load();
  c.timed_out = timed_out_.load();
  c.cancelled = cancelled_.load();
  c.outstanding = c.issued - resolved_.load();
  c.unknown_completions = unknown_.load();
  c.cap_waits = cap_waits_.load();
  c.tokens = tokens_.load();
  return c;
}

std::vector<IntervalPoint> Engine::timeseries() const {
  std::lock_guard<std::mutex> lock(info_mutex_);
  return timeseries_;
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
