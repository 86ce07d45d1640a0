#pragma once
// Sleep-until-notified for one kind of event, without a syscall on the notify side
// unless someone is actually asleep (Linux futex), and optionally an eventfd for an
// asyncio loop (loop.add_reader) that must not poll.

#include <atomic>
#include <cstdint>

namespace loadgen {

/// A waiter takes a Ticket, checks its condition, and if it must wait calls
/// ticket.wait(); notify() wakes every ticket holder. A notifier with no ticket holders
/// costs notify() one fence and one load (no shared write), which keeps the hot paths
/// that notify on every query cheap. Thread-safe.
class Notifier {
 public:
  Notifier() = default;
  ~Notifier();
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  /// Registers the caller as a would-be waiter (until destroyed). Take it *before*
  /// checking the condition: a notify() after that point is never missed.
  class Ticket {
   public:
    explicit Ticket(Notifier& n) noexcept : n_(n) {
      n_.waiters_.fetch_add(1, std::memory_order_seq_cst);
      seen_ = n_.epoch_.load(std::memory_order_seq_cst);
    }
    ~Ticket() { n_.waiters_.fetch_sub(1, std::memory_order_relaxed); }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    /// Sleeps until a notify() after the ticket was taken, or `timeout_ns` (< 0:
    /// forever). Spurious returns are possible; callers re-check their condition.
    void wait(int64_t timeout_ns) noexcept { n_.sleep(seen_, timeout_ns); }

   private:
    Notifier& n_;
    uint32_t seen_;
  };

  /// Wakes every ticket holder (and signals the eventfd, when armed).
  void notify() noexcept;
  /// Signals the eventfd if it is armed, and nothing else (no fence: the caller's own
  /// seq_cst read-modify-write orders it against arm_eventfd()'s re-check).
  void notify_eventfd() noexcept;

  /// Creates (once) and returns a non-blocking eventfd that becomes readable on notify()
  /// after arm_eventfd(). Returns -1 when eventfds are unavailable.
  int eventfd();
  /// Asks for the next notify() to signal the eventfd.
  void arm_eventfd() noexcept { armed_.store(true, std::memory_order_seq_cst); }
  /// Consumes a pending eventfd signal (non-blocking).
  void drain_eventfd() noexcept;

 private:
  void sleep(uint32_t seen, int64_t timeout_ns) noexcept;

  std::atomic<uint32_t> epoch_{0};
  std::atomic<int32_t> waiters_{0};
  std::atomic<bool> armed_{false};
  std::atomic<int> efd_{-1};
};

}  // namespace loadgen
