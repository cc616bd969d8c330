// Pinning the OpenMP team's threads one to a core (thread_binding.h).
#include "kernels/cpu/thread_binding.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <fstream>
#include <set>
#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace reel::cpu {

namespace {

// (package, core) of `cpu` from sysfs, or (-1, cpu) where the topology is not there (each CPU its own core).
std::pair<int, int> core_of(int cpu) {
  const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
  int package = -1, core = -1;
  std::ifstream(dir + "physical_package_id") >> package;
  std::ifstream(dir + "core_id") >> core;
  if (package < 0 || core < 0) return {-1, cpu};
  return {package, core};
}

bool pin(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
}

}  // namespace

std::vector<int> binding_order() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return {};
  std::vector<int> first, rest;
  std::set<std::pair<int, int>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    (cores.insert(core_of(cpu)).second ? first : rest).push_back(cpu);
  }
  first.insert(first.end(), rest.begin(), rest.end());
  return first;
}

std::vector<int> bind_threads_to_cores() {
#ifdef _OPENMP
  const std::vector<int> order = binding_order();
  const int n = omp_get_max_threads();
  if (int(order.size()) < n) return {};
  cpu_set_t before;  // the mask every thread had (the process's), for undoing a partial binding
  CPU_ZERO(&before);
  if (sched_getaffinity(0, sizeof before, &before) != 0) return {};
  std::atomic<int> failed{0};
#pragma omp parallel num_threads(n)
  {
    if (!pin(order[size_t(omp_get_thread_num())])) failed.fetch_add(1);
  }
  if (failed.load() > 0) {
#pragma omp parallel num_threads(n)
    pthread_setaffinity_np(pthread_self(), sizeof before, &before);
    return {};
  }
  return std::vector<int>(order.begin(), order.begin() + n);
#else
  return {};
#endif
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (int c : cpus) out += (out.empty() ? "" : ",") + std::to_string(c);
  return out;
}

}  // namespace reel::cpu
