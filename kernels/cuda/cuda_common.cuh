// Shared pieces of the CUDA kernels: status checks (cuBLAS, cuDNN, NVRTC, launches), the current
// stream and library handles, device scalar types, and strided-offset arguments for kernels.
//
// Conventions of every CUDA kernel in reel:
//   - it runs on cuda::current_stream() of its tensors' device; no kernel synchronises with the host;
//   - temporary memory (workspaces) comes from the caching allocator as Tensors, never cudaMalloc;
//   - 16-bit values are loaded to float (to_acc) and rounded back once (from_acc); f64 stays double;
//   - it opens with grid_dependency_wait() and is launched by launch_kernel() (launch.cuh:
//     programmatic dependent launch; tools/check_kernel_prologue.sh checks both);
//   - after each launch REEL_CUDA_LAUNCH_CHECK() raises a launch error with file:line.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/launch.cuh"
#include "kernels/dispatch.h"
#include "kernels/loop_geometry.h"
#include "tensor/cuda.h"
#include "tensor/cuda_check.h"

#define REEL_CUDA_LAUNCH_CHECK() REEL_CUDA_CHECK(cudaGetLastError())

#define REEL_CUBLAS_CHECK(expr)                                                                          \
  do {                                                                                                   \
    cublasStatus_t reel_status_ = (expr);                                                                \
    if (reel_status_ != CUBLAS_STATUS_SUCCESS)                                                           \
      throw ::reel::Error(::reel::detail::cat("cuBLAS error ", cublasGetStatusName(reel_status_), " (", \
                                              cublasGetStatusString(reel_status_), ") at ", __FILE__,  \
                                              ":", __LINE__, ": ", #expr));                              \
  } while (0)

#define REEL_CUDNN_CHECK(expr)                                                                   \
  do {                                                                                           \
    cudnnStatus_t reel_status_ = (expr);                                                         \
    if (reel_status_ != CUDNN_STATUS_SUCCESS)                                                    \
      throw ::reel::Error(::reel::detail::cat("cuDNN error ", cudnnGetErrorString(reel_status_), \
                                              " at ", __FILE__, ":", __LINE__, ": ", #expr));    \
  } while (0)

namespace reel::cuda {

// The current stream of `device` as a cudaStream_t.
inline cudaStream_t stream_of(Device device) { return static_cast<cudaStream_t>(current_stream(device.index)); }
inline cudaStream_t stream_of(const Tensor& t) { return stream_of(t.device()); }

// Per-thread, per-device library handles, bound to the current stream on every call.
cublasHandle_t cublas_handle(Device device);
cublasLtHandle_t cublaslt_handle(Device device);
cudnnHandle_t cudnn_handle(Device device);
// Device scratch memory from the caching allocator (freed when the Tensor dies; stream order keeps
// reuse safe).
Tensor workspace(size_t bytes, Device device);
// A workspace kept for the life of the process, recorded by name (kernels/library_workspaces.h).
Tensor persistent_workspace(const char* name, size_t bytes, Device device);
// The workspace of cuBLAS and cuBLASLt on `device` (this thread's): kBlasWorkspaceBytes, made once and
// kept ("cublas"), in two halves of kBlasGemmWorkspaceBytes: GEMMs on the main stream use the first,
// GEMMs on a compiled plan's side lane 1 (tensor/cuda.h's StreamFork) the second, so that two GEMMs
// running at once never share workspace. The GEMMs of one stream run one after another, so the
// handle's GEMMs, the epilogue GEMMs and autotuning share a half instead of holding one each. Every
// GEMM, eager or compiled, on either stream, is given a half's size, so that one problem gets the
// same algorithm (the same bits) wherever it runs. Side lane 2 has none: the epilogue GEMMs that run
// there (the only GEMMs a plan puts there) take what their algorithm needs from the caching allocator
// per call (kernels/cuda/gemm_epilogue.cu); asking for it there is an error.
constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;
constexpr size_t kBlasGemmWorkspaceBytes = kBlasWorkspaceBytes / 2;
// The current stream's half (made on first use).
void* blas_workspace(Device device);

// Whether p is 16-byte aligned: what vector loads (float4, cp.async) and library kernels ask of an operand.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Streaming multiprocessors of device `index` (asked once per device).
inline int multiprocessor_count(int index) {
  static int sms[64] = {};
  if (index < 0 || index >= 64) return 1;
  if (sms[index] == 0) REEL_CUDA_CHECK(cudaDeviceGetAttribute(&sms[index], cudaDevAttrMultiProcessorCount, index));
  return sms[index];
}

// Blocks of `kernel` (a __global__ function) that fit on one SM at once with `threads` threads and
// `smem` bytes of dynamic shared memory, at least 1: asked of the runtime once per (kernel, threads,
// smem) and remembered. Grids of one wave of resident blocks size themselves by it.
template <typename Kernel>
int resident_blocks_per_sm(Kernel kernel, int threads, size_t smem = 0) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t>, int> known;
  std::lock_guard<std::mutex> lock(mutex);
  int& n = known[{reinterpret_cast<const void*>(kernel), threads, smem}];
  if (n == 0) {
    REEL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
    n = std::max(n, 1);
  }
  return n;
}

// Host scalar type -> device scalar type.
template <typename T> struct DeviceScalar { using type = T; };
template <> struct DeviceScalar<Half> { using type = __half; };
template <> struct DeviceScalar<BFloat16> { using type = __nv_bfloat16; };
template <typename T> using Dev = typename DeviceScalar<T>::type;

__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ int64_t to_acc(int64_t v) { return v; }

template <typename D> __device__ __forceinline__ D from_acc(float v);
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_acc<double>(float v) { return double(v); }
template <> __device__ __forceinline__ int64_t from_acc<int64_t>(float v) { return int64_t(v); }
template <typename D> __device__ __forceinline__ D from_acc(double v) { return D(v); }
template <typename D> __device__ __forceinline__ D from_acc(int64_t v) { return D(v); }

// The accumulation type on the device: float for 16-bit and f32, double for f64, int64 for i64.
template <typename D> struct DeviceAcc { using type = float; };
template <> struct DeviceAcc<double> { using type = double; };
template <> struct DeviceAcc<int64_t> { using type = int64_t; };
template <typename D> using Acc = typename DeviceAcc<D>::type;

// Calls fn.template operator()<D>() with D the device scalar type of float dtype `t`; only the four
// float types are instantiated (formulas such as exp have no integer meaning on the device).
template <typename Fn>
void visit_float(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::f16: return fn.template operator()<__half>();
    case DType::bf16: return fn.template operator()<__nv_bfloat16>();
    default:
      throw Error(detail::cat(op, ": dtype ", dtype_name(t), " is not supported (expected f32, f64, f16 or bf16)"));
  }
}

// Up to kMaxLoopDims merged dims of an N-operand strided loop, passed to kernels by value.
constexpr int kMaxLoopDims = 10;
template <int N>
struct StridedOffsets {
  int ndim;
  int64_t sizes[kMaxLoopDims];
  int64_t strides[N][kMaxLoopDims];

  // Element offsets of operand k for linear index i (row-major over the merged dims).
  __device__ __forceinline__ void offsets(int64_t i, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      int64_t idx = i % sizes[d];
      i /= sizes[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += idx * strides[k][d];
    }
  }
  // The same for i < 2^32: 32-bit division and remainder are several times cheaper than 64-bit ones,
  // and the index arithmetic is most of a broadcast kernel's instructions.
  __device__ __forceinline__ void offsets32(uint32_t i, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      uint32_t size = uint32_t(sizes[d]);
      uint32_t idx = i % size;
      i /= size;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += int64_t(idx) * strides[k][d];
    }
  }
};

template <size_t N>
StridedOffsets<int(N)> make_offsets(const LoopGeometry<N>& g) {
  StridedOffsets<int(N)> o{};
  REEL_CHECK(int(g.sizes.size()) <= kMaxLoopDims, "cuda: tensors with more than ", kMaxLoopDims,
             " non-mergeable dims are not supported");
  o.ndim = int(g.sizes.size());
  for (int d = 0; d < o.ndim; ++d) {
    o.sizes[d] = g.sizes[d];
    for (size_t k = 0; k < N; ++k) o.strides[k][d] = g.strides[k][d];
  }
  return o;
}

// Blocks for a grid-stride loop over n items with `threads` per block.
inline unsigned blocks_for(int64_t n, int threads = 256) {
  int64_t b = (n + threads - 1) / threads;
  return unsigned(std::min<int64_t>(std::max<int64_t>(b, 1), 65535 * 8));
}

}  // namespace reel::cuda
