#pragma once
// Which CPUs the process may use, and pinning threads to them.

#include <vector>

namespace loadgen {

/// Pins the calling thread to `cpus` (non-empty). Throws std::invalid_argument naming
/// a CPU the process may not use.
void pin_current_thread(const std::vector<int>& cpus);

/// Names the calling thread (at most 15 bytes are kept), as /proc/self/task/*/comm shows
/// it: loadgen's threads are "lg-issue", "lg-monitor" and "lg-sut", so that per-thread
/// CPU figures can be told apart by role. Best effort: never fails.
void set_current_thread_name(const char* name) noexcept;

/// CPUs the process may run on (its affinity mask, which reflects a pod's cpuset).
std::vector<int> allowed_cpus();

}  // namespace loadgen
