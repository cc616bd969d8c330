// NCCL — collectives on CUDA tensors for the MPI backend (distributed/mpi_communicator.h).
//
// NCCL is not linked: libnccl.so.2 is dlopen()ed on the first collective on a CUDA tensor ($REEL_NCCL_LIB,
// else the loader path, else the CUDA toolkit's lib64; on the GPU machine PyTorch's copy in
// site-packages/nvidia/nccl/lib can be named with REEL_NCCL_LIB). Rank 0 makes the ncclUniqueId and
// broadcasts it over MPI (128 bytes in an i64 tensor); every rank then calls ncclCommInitRank for its
// device. Collectives run on the current CUDA stream (tensor/cuda.h), so they are ordered with the
// step's kernels and need no host synchronisation.
// Timeouts: after enqueueing, the host polls an event on the stream and ncclCommGetAsyncError until
// done or the deadline passes; then the communicator is aborted (ncclCommAbort) and the op reports a
// reel::Error. That wait costs a host synchronisation per collective (once per optimizer step for the
// gradients); REEL_NCCL_ASYNC=1 leaves the collective queued on the stream instead (no timeout).
// Untested in CI (no GPU there); the host-staging path is what the CPU tests exercise.
//
// When NCCL cannot be used (no CUDA build, REEL_DIST_NCCL=0, the library missing or failing to
// initialise) make_nccl_collectives returns nullptr after printing why once, and CUDA tensors go
// through host memory instead: correct, just slower.
#pragma once
#include <memory>
#include <string>

#include "distributed/communicator.h"

namespace reel::dist {

// Collectives on contiguous tensors of one CUDA device (the dtype conversions are the caller's).
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  virtual Device device() const = 0;
  virtual std::string describe() const = 0;
  virtual void all_reduce(const Tensor& t, ReduceOp op) = 0;  // op: sum, max or min
  virtual void broadcast(const Tensor& t, int root) = 0;
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;
};

// "NCCL 2.28.3 (path)" when libnccl.so.2 can be loaded here, else "" with the reason in *why_not.
std::string nccl_library(std::string* why_not = nullptr);

// NCCL for `device` over the ranks of `bootstrap` (which carries the unique id), or nullptr (see above).
// Collective over `bootstrap`: every rank must call it at the same point.
std::unique_ptr<DeviceCollectives> make_nccl_collectives(Communicator& bootstrap, Device device);

}  // namespace reel::dist
