#include "affinity.h"

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace loadgen {

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

void set_current_thread_name(const char* name) noexcept {
  char buf[16] = {};
  for (size_t i = 0; i < sizeof buf - 1 && name[i] != '\0'; ++i) buf[i] = name[i];
  pthread_setname_np(pthread_self(), buf);
}

namespace {
// The kernel's struct sched_attr (include/uapi/linux/sched/types.h), first version: glibc
// has no wrapper for sched_getattr/sched_setattr, and the header is not always installed.
struct SchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime;
  uint64_t sched_deadline;
  uint64_t sched_period;
};
}  // namespace

bool request_sched_slice(int64_t slice_ns) noexcept {
#if defined(__linux__) && defined(SYS_sched_setattr) && defined(SYS_sched_getattr)
  if (slice_ns <= 0) return false;
  SchedAttr a;
  std::memset(&a, 0, sizeof a);
  if (syscall(SYS_sched_getattr, 0, &a, static_cast<unsigned>(sizeof a), 0U) != 0) return false;
  if (a.sched_policy != SCHED_OTHER && a.sched_policy != SCHED_BATCH) return false;  // not a fair thread
  a.size = sizeof a;
  a.sched_flags = 0;  // keep the nice value as it is (sched_nice holds it)
  a.sched_runtime = static_cast<uint64_t>(slice_ns);
  if (syscall(SYS_sched_setattr, 0, &a, 0U) != 0) return false;
  // Kernels before 6.12 accept sched_runtime for a fair thread and ignore it: read it back.
  SchedAttr b;
  std::memset(&b, 0, sizeof b);
  if (syscall(SYS_sched_getattr, 0, &b, static_cast<unsigned>(sizeof b), 0U) != 0) return false;
  return b.sched_runtime != 0 && b.sched_runtime <= static_cast<uint64_t>(std::max<int64_t>(slice_ns, 100'000));
#else
  (void)slice_ns;
  return false;
#endif
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
