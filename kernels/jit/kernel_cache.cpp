// Kernel caches (see kernel_cache.h). File layout, all sizes little-endian uint64:
//   "REELK1\n" | identity size | identity | code size | code
#include "kernels/jit/kernel_cache.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <unordered_map>

#include "tensor/log.h"
#include "tensor/error.h"

namespace reel::jit {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[] = "REELK1\n";
constexpr const char* kExtension = ".reelk";

std::atomic<uint64_t> compilations{0}, disk_hits{0}, memory_hits{0};
std::atomic<uint64_t> temp_counter{0};

// Never destroyed: unloading CUDA libraries from a static destructor would race the runtime's own
// teardown at exit. (Loaded kernels a process keeps are released by the OS, as PyTorch's are.)
struct MemoryCache {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<void>> entries;
};
MemoryCache& memory_cache() {
  static MemoryCache* cache = new MemoryCache();
  return *cache;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

fs::path file_for(const std::string& identity) { return fs::path(kernel_cache_dir()) / (hex64(fnv1a64(identity)) + kExtension); }

void put_u64(std::string& out, uint64_t v) {
  for (int b = 0; b < 8; ++b) out.push_back(char((v >> (8 * b)) & 0xff));
}

// Reads a uint64 at `at` (advancing it); false when the text is too short.
bool get_u64(const std::string& in, size_t& at, uint64_t& v) {
  if (in.size() < at + 8) return false;
  v = 0;
  for (int b = 0; b < 8; ++b) v |= uint64_t(static_cast<unsigned char>(in[at + size_t(b)])) << (8 * b);
  at += 8;
  return true;
}

// The code stored in `file` for `identity`, or nullopt when the file is not a complete entry for it.
std::optional<std::string> parse_entry(const std::string& file, const std::string& identity) {
  const size_t magic = sizeof kMagic - 1;
  if (file.compare(0, magic, kMagic) != 0) return std::nullopt;
  size_t at = magic;
  uint64_t n = 0;
  if (!get_u64(file, at, n) || file.size() < at + n || file.compare(at, n, identity) != 0 || n != identity.size())
    return std::nullopt;
  at += n;
  if (!get_u64(file, at, n) || file.size() != at + n) return std::nullopt;
  return file.substr(at, n);
}

}  // namespace

KernelCacheStats kernel_cache_stats() { return {compilations.load(), disk_hits.load(), memory_hits.load()}; }

std::string kernel_cache_dir() {
  if (const char* d = std::getenv("REEL_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "reel" / "kernels").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "reel" / "kernels").string();
  std::error_code ec;
  fs::path tmp = fs::temp_directory_path(ec);
  return ((ec ? fs::path("/tmp") : tmp) / "reel-kernels").string();
}

size_t clear_kernel_cache() {
  std::error_code ec;
  fs::directory_iterator it(kernel_cache_dir(), ec), end;
  size_t removed = 0;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool ours = name.size() > std::strlen(kExtension) &&
                      (name.ends_with(kExtension) || name.find(std::string(kExtension) + ".tmp.") != std::string::npos);
    std::error_code rm;
    if (ours && fs::remove(it->path(), rm)) ++removed;
  }
  return removed;
}

void clear_kernel_memory_cache() {
  MemoryCache& c = memory_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.entries.clear();
}

uint64_t fnv1a64(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::optional<std::string> kernel_cache_load(const std::string& identity) {
  std::ifstream f(file_for(identity), std::ios::binary);
  if (!f) return std::nullopt;
  std::string file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::optional<std::string> code = parse_entry(file, identity);
  if (code) disk_hits.fetch_add(1);
  return code;
}

void kernel_cache_store(const std::string& identity, const std::string& code) {
  const fs::path path = file_for(identity);
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) {
    log_line("kernels", detail::cat("cannot create the kernel cache directory ", path.parent_path().string(), ": ", ec.message()));
    return;
  }
  std::string entry(kMagic);
  put_u64(entry, identity.size());
  entry += identity;
  put_u64(entry, code.size());
  entry += code;
  // A name no other thread or process uses, renamed over the final one once complete.
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(temp_counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(entry.data(), std::streamsize(entry.size()));
    f.close();
    if (!f) {
      log_line("kernels", "cannot write " + tmp.string());
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    log_line("kernels", detail::cat("cannot rename ", tmp.string(), " to ", path.string(), ": ", ec.message()));
    fs::remove(tmp, ec);
    return;
  }
  log_line("kernels", "cached " + path.string());
}

std::shared_ptr<void> kernel_memory_cache_find(const std::string& key) {
  MemoryCache& c = memory_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.entries.find(key);
  if (it == c.entries.end()) return nullptr;
  memory_hits.fetch_add(1);
  return it->second;
}

void kernel_memory_cache_put(const std::string& key, std::shared_ptr<void> value) {
  MemoryCache& c = memory_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.entries[key] = std::move(value);
}

void count_kernel_compilation() { compilations.fetch_add(1); }

}  // namespace reel::jit
