// Built when nvcc is absent: no CUDA kernels are registered, and supports(op, CUDA) is false.
#include "kernels/library_workspaces.h"
#include "kernels/registry.h"

namespace reel {
void register_cuda_backend() {}
std::map<std::string, size_t> library_workspaces(Device) { return {}; }
}  // namespace reel
