#pragma once
// Sleep-until-notified for one kind of event, without a syscall on the notify side
// unless someone is actually asleep (Linux futex), and optionally an eventfd for an
// asyncio loop (loop.add_reader) that must not poll.

#include <atomic>
#include <cstdint>

namespace loadgen {

/// Waiters call wait(epoch()) after re-checking their condition; notify() wakes them.
/// Thread-safe.
class Notifier {
 public:
  Notifier() = default;
  ~Notifier();
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  /// The current epoch, to be read before checking the condition.
  uint32_t epoch() const noexcept { return epoch_.load(std::memory_order_seq_cst); }
  /// Sleeps until notify() moves the epoch past `seen`, or `timeout_ns` (< 0: forever)
  /// passes. Spurious returns are possible; callers re-check their condition.
  void wait(uint32_t seen, int64_t timeout_ns) noexcept;
  /// Wakes every waiter (and signals the eventfd, when armed). Cheap when nobody waits.
  void notify() noexcept;

  /// Creates (once) and returns a non-blocking eventfd that becomes readable on notify()
  /// after arm_eventfd(). Returns -1 when eventfds are unavailable.
  int eventfd();
  /// Asks for the next notify() to signal the eventfd.
  void arm_eventfd() noexcept { armed_.store(true, std::memory_order_seq_cst); }
  /// Consumes a pending eventfd signal (non-blocking).
  void drain_eventfd() noexcept;

 private:
  std::atomic<uint32_t> epoch_{0};
  std::atomic<int32_t> waiters_{0};
  std::atomic<bool> armed_{false};
  std::atomic<int> efd_{-1};
};

}  // namespace loadgen
