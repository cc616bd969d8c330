// Built when nvcc is absent: no CUDA kernels are registered, and supports(op, CUDA) is false.
#include "kernels/registry.h"

namespace reel {
void register_cuda_backend() {}
}  // namespace reel
