// (being written) CUDA kernels of the reduce family.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_registry.h"

namespace reel {
void register_reduce_cuda_kernels() {}
}  // namespace reel
