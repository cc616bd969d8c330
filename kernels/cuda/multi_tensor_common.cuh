// Pieces shared by the multi-tensor kernels (multi_tensor_optim.cu's AdamW and SGD, optim.cu's
// unscale_check): tensor k of a launch is cut into fixed-size chunks, chunk c of tensor k is the
// virtual block first_block[k] + c (first_block: the prefix sums of the chunk counts), and a fixed
// number of physical blocks per SM walks the virtual blocks with a grid stride.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace reel::cuda {

// The tensor virtual block b belongs to: the last k < count with first_block[k] <= b. A binary search;
// b is uniform across the block, so every probe is one broadcast read of the launch's table.
__device__ __forceinline__ int tensor_of_block(const int64_t* first_block, int count, int64_t b) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Physical blocks per SM for a multi-tensor launch: enough to hide memory latency.
constexpr int kMultiTensorBlocksPerSm = 16;

// The physical grid for `virtual_blocks` on `device`: kMultiTensorBlocksPerSm per SM at most, at least 1.
inline unsigned multi_tensor_grid(int device, int64_t virtual_blocks) {
  const int64_t max_grid = std::max(1, multiprocessor_count(device) * kMultiTensorBlocksPerSm);
  return unsigned(std::max<int64_t>(1, std::min(virtual_blocks, max_grid)));
}

}  // namespace reel::cuda
