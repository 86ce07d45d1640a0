#pragma once
// Lock-free running extremes of atomics.

#include <atomic>

namespace loadgen {

/// Raises `a` to `v` when `v` is larger (relaxed). Wait-free when `v` is not larger,
/// lock-free otherwise. Any thread.
template <class T>
void atomic_max(std::atomic<T>& a, T v) noexcept {
  T cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

/// Lowers `a` to `v` when `v` is smaller (relaxed). Any thread.
template <class T>
void atomic_min(std::atomic<T>& a, T v) noexcept {
  T cur = a.load(std::memory_order_relaxed);
  while (v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace loadgen
