// (being written) CUDA kernels of the pool family.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_registry.h"

namespace reel {
void register_pool_cuda_kernels() {}
}  // namespace reel
