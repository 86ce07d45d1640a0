#pragma once
// Which CPUs the process may use, and pinning threads to them.

#include <cstdint>
#include <vector>

namespace loadgen {

/// Pins the calling thread to `cpus` (non-empty). Throws std::invalid_argument naming
/// a CPU the process may not use.
void pin_current_thread(const std::vector<int>& cpus);

/// The names loadgen's native threads give themselves (at most 15 bytes each).
inline constexpr char kIssueThreadName[] = "lg-issue";
inline constexpr char kMonitorThreadName[] = "lg-monitor";
inline constexpr char kSutThreadName[] = "lg-sut";
inline constexpr char kRecordsThreadName[] = "lg-records";
inline constexpr char kHttpThreadName[] = "lg-http";
inline constexpr char kGrpcThreadName[] = "lg-grpc";

/// A native thread's name and the role its CPU is reported under.
struct ThreadRole {
  const char* name;
  const char* role;
};

/// Every native thread name with its role: the one table the host figures read
/// (exported as `_core.THREAD_ROLES`). A thread named anything else is not loadgen's.
inline constexpr ThreadRole kThreadRoles[] = {
    {kIssueThreadName, "issue"},     {kMonitorThreadName, "monitor"}, {kSutThreadName, "native_sut"},
    {kRecordsThreadName, "records"}, {kHttpThreadName, "io"},         {kGrpcThreadName, "io"},
};

/// Names the calling thread (at most 15 bytes are kept), as /proc/self/task/*/comm shows
/// it: loadgen's threads take their names from the table above, so that per-thread CPU
/// figures can be told apart by role. Best effort: never fails.
void set_current_thread_name(const char* name) noexcept;

/// Asks the kernel for a scheduler slice of `slice_ns` for the calling thread (Linux 6.12
/// and later: `sched_attr.sched_runtime` of a SCHED_OTHER thread, which EEVDF uses as the
/// thread's requested slice; no privilege needed). A thread that asks for a slice shorter
/// than its neighbours' gets an earlier virtual deadline, so when it wakes on a busy core
/// it preempts a CPU-bound neighbour at once instead of waiting for that neighbour's
/// slice (milliseconds) to end. The kernel clamps the slice to 0.1-100 ms. Returns true
/// when the kernel took it; false (nothing changed) on older kernels or when refused.
/// `slice_ns` <= 0 does nothing and returns false. Best effort: never throws.
bool request_sched_slice(int64_t slice_ns) noexcept;

/// CPUs the process may run on (its affinity mask, which reflects a pod's cpuset).
std::vector<int> allowed_cpus();

}  // namespace loadgen
