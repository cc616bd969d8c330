// Built when nvcc is absent: no CUDA kernels are registered, and supports(op, CUDA) is false.
#include "kernels/cuda/batch_norm_one_launch.h"
#include "kernels/cuda/batch_norm_stats_switch.h"
#include "kernels/cuda/programmatic_launch.h"
#include "kernels/library_workspaces.h"
#include "kernels/registry.h"

namespace reel {
void register_cuda_backend() {}
std::map<std::string, size_t> library_workspaces(Device) { return {}; }
namespace cuda {
bool programmatic_launch() { return false; }  // no CUDA kernels to launch
bool set_programmatic_launch(bool) { return false; }
bool batch_norm_one_launch() { return false; }  // no CUDA kernels to launch
bool set_batch_norm_one_launch(bool) { return false; }
bool batch_norm_stats_last_block() { return false; }  // no CUDA kernels to launch
bool set_batch_norm_stats_last_block(bool) { return false; }
}  // namespace cuda
}  // namespace reel
