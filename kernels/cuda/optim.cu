// (being written) CUDA kernels of the optimizer family.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_registry.h"
namespace reel {
void register_optim_cuda_kernels() {}
}  // namespace reel
