#include "affinity.h"

#include <pthread.h>
#include <sched.h>

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
