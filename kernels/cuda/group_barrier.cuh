// A barrier per group of blocks of one grid: every block goes on with the result the group's last
// block combined, after "the last block finishes" (kernels/cuda/last_block.cuh). Only batch norm's
// one-launch backward (batch_norm_tiles.cuh) uses it, so only its translation unit holds the
// generation counters below.
#pragma once

#include "kernels/cuda/last_block.cuh"

namespace reel::cuda {

// When every block of a group is resident at once (the launcher checks the grid against the
// occupancy), the blocks can go on with the result the last block combined. Each block reads the
// group's generation counter (result_generation_counter) before it counts itself in
// (result_generation); the last block, after
// writing the result, advances the generation (publish_result); every block waits until the
// generation differs from the one it read (wait_for_result) and then reads the result from L2
// (load_partial). No block can read the generation after the advance, since the last block arrives
// after every read; a later launch reads the advanced value, so nothing needs resetting, and no block
// does more than one atomic (a count of the blocks that had seen a flag, reset by the last of them,
// cost gpt-small's layer norm backward microseconds of serialised atomics). A block that waits holds
// its multiprocessor: a group whose blocks cannot all be resident would wait forever, which is why
// only a launcher that has checked the occupancy (and runs nothing that waits on these blocks beside
// them) may use it.

// The generation counters: a pool of their own, beside the finish counters, which must read zero
// when a launch starts (a generation never returns to zero). Slot `group` of the launch's lane.
static __device__ unsigned g_result_generations[kFinishCounterSlots];
__device__ __forceinline__ unsigned* result_generation_counter(int64_t group) { return &g_result_generations[group]; }

// Called by every thread of every block before it counts itself in (arrive_last): the generation.
__device__ __forceinline__ unsigned result_generation(const unsigned* generation) {
  __shared__ unsigned seen;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) seen = *static_cast<const volatile unsigned*>(generation);
  __syncthreads();
  return seen;
}

// Called by every thread of the last block after it wrote the group's result.
__device__ __forceinline__ void publish_result(unsigned* generation) {
  __threadfence();  // this thread's writes of the result are visible device-wide before the advance
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) atomicAdd(generation, 1u);
}

// Called by every thread of every block of the group: returns once the result is published.
__device__ __forceinline__ void wait_for_result(const unsigned* generation, unsigned seen) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    while (*static_cast<const volatile unsigned*>(generation) == seen) __nanosleep(32);
    __threadfence();  // the result's writes, fenced before the advance, are seen after it
  }
  __syncthreads();
}

}  // namespace reel::cuda
