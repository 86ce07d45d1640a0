#include "clock.h"

#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <time.h>

#include <stdexcept>
#include <string>

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

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

void pin_current_thread(const std::vector<int>& cpus) {
  if (cpus.empty()) throw std::invalid_argument("pin_cpus must not be empty");
  const std::vector<int> allowed = allowed_cpus();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    bool ok = false;
    for (int a : allowed) ok = ok || a == c;
    if (!ok || c < 0 || c >= CPU_SETSIZE) {
      std::string list;
      for (int a : allowed) list += (list.empty() ? "" : ",") + std::to_string(a);
      throw std::invalid_argument("pin_cpus: CPU " + std::to_string(c) +
                                  " is not available to this process (allowed: " + list + ")");
    }
    CPU_SET(c, &set);
  }
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
    throw std::invalid_argument("pin_cpus: the system refused the CPU affinity");
  }
}

}  // namespace loadgen
