#pragma once
// Which CPUs the process may use, and pinning threads to them.

#include <vector>

namespace loadgen {

/// Pins the calling thread to `cpus` (non-empty). Throws std::invalid_argument naming
/// a CPU the process may not use.
void pin_current_thread(const std::vector<int>& cpus);

/// CPUs the process may run on (its affinity mask, which reflects a pod's cpuset).
std::vector<int> allowed_cpus();

}  // namespace loadgen
