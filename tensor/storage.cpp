#include "tensor/storage.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

#include "tensor/error.h"

namespace reel {
namespace {

// 64-byte aligned host memory: whole cache lines, and aligned loads for Eigen's AVX paths.
// glibc serves blocks over 32 MiB with fresh mmaps that are unmapped on free, so every large
// activation would page-fault on first touch (a 64 MiB tensor: ~16k faults, tens of ms). Raising the
// mmap and trim thresholds keeps freed blocks in the heap for reuse, as a caching allocator would.
// It counts the bytes of its live blocks (64-byte rounded) and their peak, as the CUDA allocator does.
class CpuAllocator : public Allocator {
 public:
  CpuAllocator() {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  void* allocate(size_t nbytes, Device) override {
    const size_t size = block_size(nbytes);
    void* p = std::aligned_alloc(64, size);
    REEL_CHECK(p != nullptr, "cpu allocator: out of host memory asking for ", nbytes, " bytes");
    const size_t now = allocated_.fetch_add(size) + size;
    size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {}
    return p;
  }
  void deallocate(void* ptr, size_t nbytes, Device) override {
    std::free(ptr);
    allocated_.fetch_sub(block_size(nbytes));
  }
  size_t block_size(size_t nbytes) const override { return nbytes == 0 ? 64 : (nbytes + 63) / 64 * 64; }
  size_t allocated_bytes(Device) const override { return allocated_.load(); }
  size_t peak_bytes(Device) const override { return peak_.load(); }
  void reset_peak(Device) override { peak_.store(allocated_.load()); }

 private:
  std::atomic<size_t> allocated_{0}, peak_{0};
};

CpuAllocator cpu_allocator;
Allocator* allocators[2] = {&cpu_allocator, nullptr};

}  // namespace

Allocator& allocator_for(Device device) {
  Allocator* a = allocators[static_cast<int>(device.type)];
  REEL_CHECK(a != nullptr, "device ", device.str(),
             ": no allocator (this build of reel has no CUDA backend, or no GPU is visible)");
  return *a;
}

Allocator* set_allocator(DeviceType type, Allocator* allocator) {
  Allocator* prev = allocators[static_cast<int>(type)];
  allocators[static_cast<int>(type)] = allocator;
  return prev;
}

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  allocator_ = &allocator_for(device);
  data_ = allocator_->allocate(nbytes, device);
}

Storage::Storage(size_t nbytes, Device device, Allocator& allocator)
    : nbytes_(nbytes), device_(device), allocator_(&allocator) {
  data_ = allocator_->allocate(nbytes, device);
}

// No allocator: a meta block never owns memory, and it is valid for a device that has none here.
Storage::Storage(Meta, size_t nbytes, Device device) : nbytes_(nbytes), device_(device), meta_(true) {}

Storage::~Storage() {
  if (data_ && !meta_) allocator_->deallocate(data_, nbytes_, device_);
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    try {
      size_t used = 0;
      int idx = std::stoi(s.substr(5), &used);
      if (used == s.size() - 5 && idx >= 0) return cuda(idx);
    } catch (const std::exception&) {
    }
  }
  throw Error("device: cannot parse \"" + s + "\" (expected cpu, cuda or cuda:N)");
}

}  // namespace reel

