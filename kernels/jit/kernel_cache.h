// The caches of generated kernels: compiled code on disk, loaded kernels in memory, and counters.
//
// Disk: one file per kernel in kernel_cache_dir(), named by a 64-bit FNV-1a hash of its identity —
// the text that determines the code: compiler version, target architecture, options and the full
// source. The file repeats the identity, and a read returns the code only when it matches exactly,
// so a hash collision or a truncated file is a miss, never the wrong kernel. Files are written to a
// temporary name and renamed into place (atomic on POSIX), so concurrent processes and crashes
// never leave a partial file under the final name. Failing to write (a read-only home, say) costs
// a recompilation next time, nothing else: it is logged under REEL_LOG=kernels.
//   directory: $REEL_CACHE_DIR if set, else $XDG_CACHE_HOME/reel/kernels, else ~/.cache/reel/kernels
//
// Memory: loaded kernels by identity (and device), shared by every plan of the process, so the
// many identical chains of a step (one per layer and micro-batch) are compiled and loaded once.
//
// Counters (kernel_cache_stats): NVRTC compilations, disk hits, memory hits — a second process, or
// a process that dropped its memory cache, shows disk hits and no new compilation.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace reel::jit {

struct KernelCacheStats {
  uint64_t compilations = 0;  // sources compiled by NVRTC
  uint64_t disk_hits = 0;     // compiled code found on disk
  uint64_t memory_hits = 0;   // loaded kernels found in this process
};
KernelCacheStats kernel_cache_stats();

std::string kernel_cache_dir();  // read from the environment on every call
// Deletes the cached kernel files (and leftover temporaries) in kernel_cache_dir(); returns how many.
// Other files in the directory are left alone.
size_t clear_kernel_cache();
// Drops this process's loaded kernels (plans that use them keep theirs alive): the next plan loads
// from disk as a new process would.
void clear_kernel_memory_cache();

// ---- for the code generator (kernels/jit/nvrtc.cpp) ----

uint64_t fnv1a64(const std::string& text);
// The cached code of `identity`, or nullopt (counts a disk hit when found).
std::optional<std::string> kernel_cache_load(const std::string& identity);
// Stores `code` under `identity`, atomically; errors are logged, not thrown.
void kernel_cache_store(const std::string& identity, const std::string& code);
// Loaded kernels, type-erased (the CUDA side owns the type). find counts a memory hit.
std::shared_ptr<void> kernel_memory_cache_find(const std::string& key);
void kernel_memory_cache_put(const std::string& key, std::shared_ptr<void> value);
void count_kernel_compilation();

}  // namespace reel::jit
