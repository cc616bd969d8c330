// Pinning the CPU kernels' OpenMP threads, one to a core, from inside the process: what OMP_PROC_BIND=close
// with OMP_PLACES=cores asks of the OpenMP runtime, for programs that cannot set those variables
// before it loads (GNU OpenMP reads them once, at load).
//
// Why one would: on a machine with more cores than threads, a thread that parks between parallel
// regions may wake on another core, away from the caches its last kernel filled. Measured on the GPU
// machine's 16-core host (bench/RESULTS.md), pinning did not pay there (cnn-small at 8 threads was 20%
// slower pinned), so it is off by default (`reel bench --bind-threads 1`); it suits a process that has
// the machine's cores to itself.
#pragma once
#include <string>
#include <vector>

namespace reel::cpu {

// The CPUs the threads would take, in order: the calling process's allowed CPUs (its affinity mask),
// one per physical core first (the lowest-numbered CPU of each core, as Linux's sysfs topology groups
// them), then the other hyperthreads. Empty where the affinity mask cannot be read.
std::vector<int> binding_order();

// Pins thread t of the OpenMP team of omp_get_max_threads() threads to binding_order()[t] (the calling
// thread is thread 0). Returns the CPUs taken, in thread order; empty, with nothing pinned, where
// there are fewer allowed CPUs than threads or a pin fails (the threads pinned before it are unpinned).
// Later parallel regions of the same or a smaller team reuse the pinned threads (GNU OpenMP keeps its
// pool); a larger team's extra threads are not pinned.
std::vector<int> bind_threads_to_cores();

// "0,2,4" for {0, 2, 4}: how bench prints the CPUs taken.
std::string cpu_list(const std::vector<int>& cpus);

}  // namespace reel::cpu
