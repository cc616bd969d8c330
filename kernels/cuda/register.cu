// register_cuda_backend(): the CUDA side of dispatch's tables, and the library handles every
// family shares (one per thread and device, created on first use, bound to the current stream).
#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_registry.h"
#include "kernels/library_workspaces.h"
#include "kernels/registry.h"
#include "tensor/storage.h"

namespace reel {

void register_cuda_backend() {
  cuda::install_allocator();
  register_memory_cuda_kernels();
  register_elementwise_cuda_kernels();
  register_reduce_cuda_kernels();
  register_linalg_cuda_kernels();
  register_pool_cuda_kernels();
  register_norm_cuda_kernels();
  register_attention_cuda_kernels();
  register_optim_cuda_kernels();
  jit::register_fused_elementwise_cuda_kernel();
}

namespace cuda {
namespace {
constexpr int kMaxDevices = 16;

void set_device(Device device) {
  int current = -1;
  REEL_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device.index) REEL_CUDA_CHECK(cudaSetDevice(device.index));
}
}  // namespace

void* blas_workspace(Device device) {
  thread_local Tensor workspaces[kMaxDevices];
  const int lane = side_lane(stream_of(device), device.index);
  REEL_CHECK(lane < 2, "cuBLAS on ", device.str(), ": no workspace on side lane 2, where only GEMMs with an epilogue "
             "(cuBLASLt, with their algorithm's own bytes) run ahead; a plan put another GEMM there");
  Tensor& ws = workspaces[device.index];
  if (!ws.defined()) ws = persistent_workspace("cublas", kBlasWorkspaceBytes, device);
  return static_cast<char*>(ws.data_ptr()) + (lane == 1 ? kBlasGemmWorkspaceBytes : 0);
}

// cuBLAS gets a workspace of ours: its own default pool allocates lazily, which would break a CUDA
// graph capture, and cublasSetStream resets the workspace, so it is set again after every rebind
// (to the half of the stream it is bound to).
cublasHandle_t cublas_handle(Device device) {
  thread_local cublasHandle_t handles[kMaxDevices] = {};
  set_device(device);
  cublasHandle_t& h = handles[device.index];
  if (!h) {
    REEL_CUBLAS_CHECK(cublasCreate(&h));
    // Exact f32 GEMMs (no TF32) and f32 split-K partial sums: parity with the CPU is the contract.
    REEL_CUBLAS_CHECK(cublasSetMathMode(
        h, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  }
  REEL_CUBLAS_CHECK(cublasSetStream(h, stream_of(device)));
  REEL_CUBLAS_CHECK(cublasSetWorkspace(h, blas_workspace(device), kBlasGemmWorkspaceBytes));
  return h;
}

cublasLtHandle_t cublaslt_handle(Device device) {
  thread_local cublasLtHandle_t handles[kMaxDevices] = {};
  set_device(device);
  cublasLtHandle_t& h = handles[device.index];
  if (!h) REEL_CUBLAS_CHECK(cublasLtCreate(&h));
  return h;
}

cudnnHandle_t cudnn_handle(Device device) {
  thread_local cudnnHandle_t handles[kMaxDevices] = {};
  set_device(device);
  cudnnHandle_t& h = handles[device.index];
  if (!h) REEL_CUDNN_CHECK(cudnnCreate(&h));
  REEL_CUDNN_CHECK(cudnnSetStream(h, stream_of(device)));
  return h;
}

Tensor workspace(size_t bytes, Device device) {
  return Tensor::empty({int64_t((bytes + 7) / 8)}, DType::i64, device);
}

namespace {
std::mutex workspaces_mutex;
std::map<std::string, size_t> persistent_workspaces[kMaxDevices];
}  // namespace

Tensor persistent_workspace(const char* name, size_t bytes, Device device) {
  Tensor t = workspace(bytes, device);
  std::lock_guard<std::mutex> lock(workspaces_mutex);
  persistent_workspaces[device.index][name] += allocator_for(device).block_size(t.nbytes());
  return t;
}

}  // namespace cuda

std::map<std::string, size_t> library_workspaces(Device device) {
  if (!device.is_cuda() || device.index < 0 || device.index >= cuda::kMaxDevices) return {};
  std::lock_guard<std::mutex> lock(cuda::workspaces_mutex);
  return cuda::persistent_workspaces[device.index];
}

namespace cuda {

}  // namespace cuda
}  // namespace reel
