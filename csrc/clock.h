#pragma once
// The one clock of loadgen and the ways its threads wait on it.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace loadgen {

/// Monotonic time in integer nanoseconds (std::chrono::steady_clock, which on Linux is
/// CLOCK_MONOTONIC: the same clock as Python's time.monotonic_ns()). Thread-safe.
inline int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Waits until now_ns() >= deadline_ns: sleeps until `spin_ns` before the deadline,
/// then spins (spin_ns = 0: sleeps only). Returns early, with false, once `*cancel`
/// becomes true (checked at least every 20 ms while sleeping). Returns true on time.
bool wait_until_ns(int64_t deadline_ns, int64_t spin_ns, const std::atomic<bool>* cancel) noexcept;

/// Sets the calling thread's timer slack to 1 ns (Linux), so sleeps end on time.
void set_min_timer_slack() noexcept;

/// A pause instruction for spin loops.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace loadgen
