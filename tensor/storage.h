// Storage — a refcounted block of device or host memory that tensors view.
//
// Many tensors (views: reshape, transpose, slice, expand) share one Storage through shared_ptr;
// the block goes back to its Allocator when the last view dies. Allocators are per device type:
// the CPU one here, the CUDA caching allocator registered by the CUDA backend.
//
// A meta Storage (Storage(Storage::Meta{}, nbytes, device)) has a size and a device but no memory:
// data() is nullptr, no allocator is asked and none is given anything back. Dispatch makes them in
// meta mode (kernels/dispatch.h) so that a step can be traced, and its memory planned, without the
// memory; Tensor::data_ptr refuses them.
#pragma once
#include <cstddef>
#include <memory>

#include "tensor/device.h"

namespace reel {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes, Device device) = 0;
  virtual void deallocate(void* ptr, size_t nbytes, Device device) = 0;
  // The bytes a request of `nbytes` holds once rounded to the allocator's granule: what its statistics
  // count, and what the memory planner (compile/runtime/memory_budget.h) adds up to predict them.
  virtual size_t block_size(size_t nbytes) const { return nbytes; }
  // Bytes in live blocks on `device` now, and the most since start or the last reset_peak.
  virtual size_t allocated_bytes(Device device) const { return 0; }
  virtual size_t peak_bytes(Device device) const { return 0; }
  virtual void reset_peak(Device device) {}
};

// The allocator for a device type; throws reel::Error when that backend is not built or has no device.
Allocator& allocator_for(Device device);
// Backends install their allocator here at start-up (the CUDA backend does so for DeviceType::CUDA).
// Returns the allocator it replaces.
Allocator* set_allocator(DeviceType type, Allocator* allocator);

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  // Memory from a specific allocator (e.g. pinned host memory) rather than the device's default.
  Storage(size_t nbytes, Device device, Allocator& allocator);
  struct Meta {};
  Storage(Meta, size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  bool is_meta() const { return meta_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
  bool meta_ = false;

 public:
  Allocator* allocator() const { return allocator_; }
};

}  // namespace reel
