// Programmatic dependent launch: the switch, and launch errors (launch.cuh).
#include <atomic>

#include "kernels/env_switch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/launch_programmatic.h"
#include "kernels/cuda/programmatic_launch.h"
#include "tensor/error.h"

namespace reel::cuda {
namespace {

// Read from REEL_PROGRAMMATIC_LAUNCH on first use.
EnvSwitch g_programmatic("REEL_PROGRAMMATIC_LAUNCH", "plain launches", "programmatic dependent launch");

// Compute capability 9.0 or later, asked once per device.
bool supports(int device) {
  static std::atomic<int> known[64] = {};  // 0: not asked; 1: no; 2: yes
  if (device < 0 || device >= 64) return false;
  int k = known[device].load(std::memory_order_relaxed);
  if (k == 0) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
    k = major >= 9 ? 2 : 1;
    known[device].store(k, std::memory_order_relaxed);
  }
  return k == 2;
}

}  // namespace

bool programmatic_launch() {
  if (!g_programmatic.get()) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  return supports(device);
}

bool set_programmatic_launch(bool on) { return g_programmatic.set(on); }

cudaError_t launch_programmatic(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                void** args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = programmatic_launch() ? 1 : 0;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelExC(&config, kernel, args);
}

void throw_launch_error(cudaError_t status, const void* kernel, dim3 grid, dim3 block, size_t smem) {
  const char* name = nullptr;
  if (cudaFuncGetName(&name, kernel) != cudaSuccess || name == nullptr) name = "(unnamed kernel)";
  cudaGetLastError();  // the failed launch's status is raised here, not by the next check
  throw Error(detail::cat("CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ") launching ",
                          name, " on grid (", grid.x, ", ", grid.y, ", ", grid.z, ") of blocks (", block.x, ", ",
                          block.y, ", ", block.z, ") with ", smem, " bytes of shared memory"));
}

}  // namespace reel::cuda
