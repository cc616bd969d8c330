// (being written) CUDA kernels of the linalg family.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_registry.h"

namespace reel {
void register_linalg_cuda_kernels() {}
}  // namespace reel
