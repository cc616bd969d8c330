// "The last block finishes": a split reduction in one launch instead of two.
//
// The blocks of a group (say, the row chunks of one column tile) each write a partial result to a
// workspace and then count themselves in on the group's counter. The block that arrives last has
// every other partial visible (each writer fenced before counting), combines them in a fixed order
// and writes the result, so the bits are the same on every run and there are no atomics on the data;
// it then resets the counter to zero for the next launch.
//
// Counters come from a per-device pool of zeros (one per translation unit, zero at module load).
// A launch uses slots [0, groups); two launches never share a slot while running because reel runs a
// device's kernels on one stream, one after another (a captured CUDA graph replays them in the same
// order). Ops of one device run concurrently on two streams would share slots: tensor/cuda.h says so
// beside StreamGuard. The exception is a compiled plan's side streams (cuda::StreamFork), whose kernels
// run beside the main stream's: the slots come in lanes of kFinishCounterLaneSlots, one per stream
// (lane 0 the main stream's, lanes 1 and 2 the side streams'), and a launcher that may run on a side
// stream takes its slots from its stream's lane through finish_counter_base. Partials are read back
// from L2, never from a possibly stale L1 line: floats and doubles with ld.global.cg (cached in L2
// only), which the compiler may issue several at a time before the first returns, so a loop over many
// partials pays the L2 latency once per batch rather than once per partial; other types with volatile
// loads.
#pragma once
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "tensor/cuda.h"

namespace reel::cuda {

constexpr int kFinishCounterLaneSlots = 2048;  // the slots of one stream's lane: a launch uses at most these
constexpr int kFinishCounterSlots = kFinishCounterLaneSlots * (1 + kSideLanes);
static __device__ unsigned g_finish_counters[kFinishCounterSlots];

// The first finish counter of a launch on `st`: its lane's (tensor/cuda.h's side_lane: 0 on the main
// stream, 1 or 2 on a plan's side streams, which run beside it).
inline int64_t finish_counter_base(cudaStream_t st, Device dev) {
  return int64_t(side_lane(st, dev.index)) * kFinishCounterLaneSlots;
}

// The counter of group `group` (< kFinishCounterSlots).
__device__ __forceinline__ unsigned* finish_counter(int64_t group) { return &g_finish_counters[group]; }

// Called by every thread of a block after the block's partial writes; true in the group's last block.
__device__ __forceinline__ bool arrive_last(unsigned* counter, unsigned group_size) {
  __shared__ bool is_last;
  __threadfence();  // this thread's partial writes are visible device-wide before the block counts in
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    is_last = atomicAdd(counter, 1u) + 1 == group_size;
    if (is_last) atomicExch(counter, 0u);  // every block of the group has counted: ready for the next launch
  }
  __syncthreads();
  if (is_last) __threadfence();
  return is_last;
}

// A partial written by another block of the group, read from L2.
template <typename T>
__device__ __forceinline__ T load_partial(const T* p) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
    return __ldcg(p);
  else
    return *static_cast<const volatile T*>(p);
}

}  // namespace reel::cuda
