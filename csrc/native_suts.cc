#include "native_suts.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <queue>
#include <string>
#include <vector>

#include "affinity.h"
#include "clock.h"
#include "require.h"
#include "rng.h"

namespace loadgen {

using detail::require;

void validate(const NativeSutSettings& s) {
  require(s.delay_ns >= 0, "sut.delay_ns must be >= 0, got " + std::to_string(s.delay_ns));
  if (s.kind == SutKind::kNetClient) validate(s.net);
  if (s.kind != SutKind::kDemo) return;
  require(s.workers >= 1 && s.workers <= 4096,
          "sut.workers must be in 1..4096, got " + std::to_string(s.workers));
  require(s.max_batch >= 1, "sut.max_batch must be >= 1, got " + std::to_string(s.max_batch));
  require(s.service_ns >= 0, "sut.service_ns must be >= 0, got " + std::to_string(s.service_ns));
  require(s.per_item_ns >= 0, "sut.per_item_ns must be >= 0, got " + std::to_string(s.per_item_ns));
  require(std::isfinite(s.sigma) && s.sigma >= 0 && s.sigma <= 3,
          "sut.sigma must be in 0..3, got " + std::to_string(s.sigma));
}

NativeSut::NativeSut(const NativeSutSettings& settings, uint64_t ring_capacity, int64_t spin_ns)
    : s_(settings), spin_ns_(spin_ns), mask_(ring_capacity - 1) {
  validate(s_);
  if (s_.kind == SutKind::kFixedDelay || s_.kind == SutKind::kDemo) {
    ring_.reset(new std::atomic<int64_t>[ring_capacity]());
    due_.reset(new std::atomic<int64_t>[ring_capacity]());
  }
  if (s_.kind == SutKind::kNetClient) net_ = make_net_client(s_.net);
}

NativeSut::~NativeSut() { close(); }

void NativeSut::start(CompletionSink& sink) {
  sink_ = &sink;
  if (net_) net_->start(sink);
  if (s_.kind == SutKind::kFixedDelay) thread_ = std::thread([this] { fixed_delay_loop(); });
  if (s_.kind == SutKind::kDemo) thread_ = std::thread([this] { demo_loop(); });
}

void NativeSut::submit(int64_t id, int64_t issued_ns, int64_t sample, int64_t scheduled_ns) noexcept {
  if (net_) {
    net_->submit(id, sample, scheduled_ns);
    return;
  }
  if (!ring_) {  // the null SUT
    sink_->complete_native(id, now_ns());
    return;
  }
  const uint64_t tail = tail_.load(std::memory_order_relaxed);
  ring_[tail & mask_].store(id, std::memory_order_relaxed);
  due_[tail & mask_].store(issued_ns + s_.delay_ns, std::memory_order_relaxed);
  tail_.store(tail + 1, std::memory_order_release);
  submitted_.notify();
}

void NativeSut::finish() noexcept {
  finished_.store(true, std::memory_order_release);
  submitted_.notify();
}

void NativeSut::close() noexcept {
  if (net_) net_->close();
  closing_.store(true, std::memory_order_release);
  submitted_.notify();
  if (thread_.joinable()) thread_.join();
}

void NativeSut::pin_sut_thread() noexcept {
  if (s_.cpus.empty()) return;
  try {
    pin_current_thread(s_.cpus);
  } catch (const std::exception&) {
    // The CPUs were checked against the process's when the settings were made; a
    // cpuset that shrank since leaves the thread where the scheduler puts it.
  }
}

void NativeSut::fixed_delay_loop() {
  set_current_thread_name(kSutThreadName);
  pin_sut_thread();
  set_min_timer_slack();
  uint64_t head = 0;
  for (;;) {
    if (closing_.load(std::memory_order_acquire)) return;
    if (head == tail_.load(std::memory_order_acquire)) {
      Notifier::Ticket ticket(submitted_);
      if (head != tail_.load(std::memory_order_acquire)) continue;
      if (finished_.load(std::memory_order_acquire)) return;  // all submitted were completed
      if (closing_.load(std::memory_order_acquire)) return;
      ticket.wait(10'000'000);
      continue;
    }
    const int64_t id = ring_[head & mask_].load(std::memory_order_relaxed);
    // From the ring, not the slot: a timed-out query's slot may already be reused.
    const int64_t due = due_[head & mask_].load(std::memory_order_relaxed);
    if (!wait_until_ns(due, spin_ns_, &closing_)) return;
    sink_->complete_native(id, now_ns());
    ++head;
  }
}


// The demo server, simulated on the completion thread: queries wait in arrival order;
// whenever a worker is free it takes up to max_batch of them; the batch completes
// after a sampled service time. Completions are reported when they are due.
void NativeSut::demo_loop() {
  set_current_thread_name(kSutThreadName);
  pin_sut_thread();
  set_min_timer_slack();
  Rng rng(s_.seed);
  auto service_ns = [&](int64_t batch) {
    const double u1 = std::max(rng.uniform(), 1e-300);
    const double u2 = rng.uniform();
    const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    const double base = static_cast<double>(s_.service_ns + s_.per_item_ns * (batch - 1));
    const double ns = base * std::exp(s_.sigma * normal);
    return ns < 3.6e12 ? static_cast<int64_t>(ns) : int64_t{3'600'000'000'000};  // at most an hour
  };
  struct Running {
    int64_t due_ns;
    std::vector<int64_t> ids;
    bool operator>(const Running& o) const { return due_ns > o.due_ns; }
  };
  std::priority_queue<Running, std::vector<Running>, std::greater<Running>> running;
  std::vector<int64_t> worker_free_ns(static_cast<size_t>(s_.workers), 0);
  std::deque<int64_t> waiting;
  uint64_t head = 0;
  for (;;) {
    if (closing_.load(std::memory_order_acquire)) return;
    const uint64_t tail = tail_.load(std::memory_order_acquire);
    for (; head != tail; ++head) waiting.push_back(ring_[head & mask_].load(std::memory_order_relaxed));
    int64_t now = now_ns();
    while (!running.empty() && running.top().due_ns <= now) {
      for (const int64_t id : running.top().ids) sink_->complete_native(id, now);
      running.pop();
      now = now_ns();
    }
    while (!waiting.empty()) {
      auto w = std::min_element(worker_free_ns.begin(), worker_free_ns.end());
      if (*w > now) break;
      Running r;
      const auto batch = std::min<int64_t>(s_.max_batch, static_cast<int64_t>(waiting.size()));
      for (int64_t k = 0; k < batch; ++k) {
        r.ids.push_back(waiting.front());
        waiting.pop_front();
      }
      r.due_ns = now + service_ns(batch);
      *w = r.due_ns;
      running.push(std::move(r));
    }
    if (finished_.load(std::memory_order_acquire) && running.empty() && waiting.empty() &&
        head == tail_.load(std::memory_order_acquire)) {
      return;
    }
    // Sleep until the next completion (spinning the last stretch) or a new arrival.
    const int64_t next = running.empty() ? now + 10'000'000 : running.top().due_ns;
    const int64_t until_spin = next - spin_ns_ - now_ns();
    if (until_spin > 0) {
      Notifier::Ticket ticket(submitted_);
      if (head == tail_.load(std::memory_order_acquire) && !closing_.load()) {
        ticket.wait(until_spin);
      }
    } else {
      while (now_ns() < next && head == tail_.load(std::memory_order_acquire) &&
             !closing_.load(std::memory_order_relaxed)) {
        cpu_relax();
      }
    }
  }
}

}  // namespace loadgen
