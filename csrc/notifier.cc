#include "notifier.h"

#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace loadgen {

Notifier::~Notifier() {
  const int fd = efd_.load();
  if (fd >= 0) close(fd);
}

void Notifier::sleep(uint32_t seen, int64_t timeout_ns) noexcept {
  if (epoch_.load(std::memory_order_seq_cst) != seen) return;
  timespec ts{};
  timespec* tsp = nullptr;
  if (timeout_ns >= 0) {
    ts.tv_sec = static_cast<time_t>(timeout_ns / 1'000'000'000);
    ts.tv_nsec = static_cast<long>(timeout_ns % 1'000'000'000);
    tsp = &ts;
  }
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&epoch_), FUTEX_WAIT_PRIVATE, seen, tsp, nullptr, 0);
}

void Notifier::notify() noexcept {
  // Pairs with the seq_cst increment in Ticket: either a would-be waiter's count is seen
  // here, or that waiter's condition check sees what the notifier published before this.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_relaxed) > 0) {
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&epoch_), FUTEX_WAKE_PRIVATE, INT_MAX,
            nullptr, nullptr, 0);
  }
  notify_eventfd();
}

void Notifier::notify_eventfd() noexcept {
  if (armed_.load(std::memory_order_seq_cst) && armed_.exchange(false)) {
    const int fd = efd_.load();
    if (fd >= 0) {
      const uint64_t one = 1;
      (void)!write(fd, &one, sizeof one);
    }
  }
}

int Notifier::eventfd() {
  int fd = efd_.load();
  if (fd >= 0) return fd;
  const int created = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (created < 0) return -1;
  int expected = -1;
  if (!efd_.compare_exchange_strong(expected, created)) {
    close(created);
    return expected;
  }
  return created;
}

void Notifier::drain_eventfd() noexcept {
  const int fd = efd_.load();
  if (fd < 0) return;
  uint64_t value;
  (void)!read(fd, &value, sizeof value);
}

}  // namespace loadgen
