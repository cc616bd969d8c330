// (being written) CUDA kernels of the norm family.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_registry.h"

namespace reel {
void register_norm_cuda_kernels() {}
}  // namespace reel
