#include "clock.h"

#include <sys/prctl.h>
#include <time.h>


namespace loadgen {

bool wait_until_ns(int64_t deadline_ns, int64_t spin_ns, const std::atomic<bool>* cancel) noexcept {
  constexpr int64_t kMaxSleepNs = 20'000'000;
  for (;;) {
    if (cancel && cancel->load(std::memory_order_relaxed)) return false;
    const int64_t now = now_ns();
    if (now >= deadline_ns) return true;
    const int64_t sleep_for = deadline_ns - spin_ns - now;
    if (sleep_for <= 0) break;
    const int64_t chunk = sleep_for < kMaxSleepNs ? sleep_for : kMaxSleepNs;
    timespec ts{static_cast<time_t>(chunk / 1'000'000'000), static_cast<long>(chunk % 1'000'000'000)};
    nanosleep(&ts, nullptr);
  }
  while (now_ns() < deadline_ns) {
    if (cancel && cancel->load(std::memory_order_relaxed)) return false;
    cpu_relax();
  }
  return true;
}

void set_min_timer_slack() noexcept {
#ifdef PR_SET_TIMERSLACK
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
}

}  // namespace loadgen
