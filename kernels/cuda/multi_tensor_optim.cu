// Multi-tensor AdamW and SGD kernels (see kernels/cuda/multi_tensor_optim.h): one launch updates every
// tensor of a table, as PyTorch's multi_tensor_apply / _foreach kernels do.
//
// Work split: tensor k of a launch is cut into chunks of kChunk elements; chunk c of tensor k is the
// virtual block first_block[k] + c, so first_block is the prefix sum of the chunk counts. Physical
// blocks walk the virtual blocks with a grid stride; a block finds its tensor by a binary search over
// first_block (the index is uniform across the block, so every probe is one broadcast read of the
// argument table), and its threads walk the chunk's elements with a block stride (coalesced).
// Each thread derives the step's coefficients once, before its loop (kernels/optim_math.h: in
// double from lr and t, then rounded to A), exactly as the per-tensor kernels of
// kernels/cuda/optim.cu do, and each element goes through the same formula: bit-identical results.
//
// The table is a __grid_constant__ kernel argument: it lives in the launch's parameter space, is
// read without a local copy, and becomes part of the kernel node when a stream is captured.
// Arithmetic runs in A = Acc<D> (f32 for f32/f16/bf16, f64 for f64); a kernel that sees
// found_inf != 0 updates nothing (the GradScaler's skipped step). With a clip (attr clip: the step's
// clip_grad_norm_ folded in) each gradient is first scaled as unscale_check scales it, one rounded
// product (__fmul_rn), and stored back where the call keeps the clipped gradients: the update sees
// unscale_check's values, and since kernels/optim_math.h writes its multiply-adds explicitly it
// rounds as the per-tensor kernels do, so the fused step gives the unfused step's bits.
#include "kernels/cuda/multi_tensor_optim.h"

#include <algorithm>
#include <limits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/multi_tensor_common.cuh"
#include "kernels/optim_math.h"

namespace reel::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 4 * kThreads;  // elements per virtual block

// One launch's tensors, all of one dtype, each with numel > 0.
struct LaunchTable {
  void* param[kMaxTensorsPerLaunch];
  const void* grad[kMaxTensorsPerLaunch];
  void* grad_out[kMaxTensorsPerLaunch];  // where a clip stores g * c, or null
  void* state0[kMaxTensorsPerLaunch];
  void* state1[kMaxTensorsPerLaunch];
  int64_t numel[kMaxTensorsPerLaunch];
  int64_t first_block[kMaxTensorsPerLaunch + 1];  // first_block[count] = the launch's virtual blocks
  int count;
};
// CUDA 12.1+ accepts up to 32764 bytes of kernel arguments on sm_70 and newer.
static_assert(sizeof(LaunchTable) + 256 <= 32764, "multi-tensor table too large for the kernel arguments");

__device__ __forceinline__ bool flag_set(const float* found_inf) { return found_inf && *found_inf != 0.f; }

// The tensor that virtual block b belongs to (multi_tensor_common.cuh).
__device__ __forceinline__ int tensor_of_block(const LaunchTable& t, int64_t b) {
  return cuda::tensor_of_block(t.first_block, t.count, b);
}

// x * c rounded once (no FMA contraction into the update that reads it): unscale_check's product.
__device__ __forceinline__ float mul_rn(float x, float c) { return __fmul_rn(x, c); }
__device__ __forceinline__ double mul_rn(double x, double c) { return __dmul_rn(x, c); }

// The clip's coefficient in A (as unscale_check reads its inv_scale), or 1 without a clip.
template <typename A>
__device__ __forceinline__ A clip_coef(const GradClip& clip) {
  if (!clip.coef) return A(1);
  return clip.f64 ? A(*static_cast<const double*>(clip.coef)) : A(*static_cast<const float*>(clip.coef));
}

// The chunk [begin, end) of tensor k, and what each element of it is given: gradient(i) is the
// gradient the update reads (with a clip: g * c rounded to D, also stored where grad_out is set).
template <typename D, typename A>
struct Chunk {
  int64_t begin, end;
  const D* g;
  D* g_out;
  bool clip;
  A coef;

  __device__ __forceinline__ Chunk(const LaunchTable& t, int k, int64_t b, const GradClip& c, A coef_)
      : g(static_cast<const D*>(t.grad[k])), g_out(static_cast<D*>(t.grad_out[k])), clip(c.coef != nullptr),
        coef(coef_) {
    begin = (b - t.first_block[k]) * kChunk;
    end = begin + kChunk < t.numel[k] ? begin + kChunk : t.numel[k];
  }
  __device__ __forceinline__ A gradient(int64_t i) const {
    if (!clip) return to_acc(g[i]);
    const D scaled = from_acc<D>(mul_rn(to_acc(g[i]), coef));
    if (g_out) g_out[i] = scaled;
    return to_acc(scaled);
  }
};

// p, g, m, v of each tensor: (numel) contiguous; lr, step: 0-dim f64 (step = t, 1-based). A found_inf
// skips the update; a clip's stored gradients are written all the same (unscale_check writes them
// before the step reads found_inf).
template <typename D, typename A = Acc<D>>
__global__ void adamw_step_multi_tensor_kernel(const __grid_constant__ LaunchTable table, const float* found_inf,
                                               const double* lr, const double* step, AdamWHyper h, GradClip clip) {
  grid_dependency_wait();
  const bool skip = flag_set(found_inf);
  if (skip && !clip.coef) return;
  const A coef = clip_coef<A>(clip);
  const math::AdamWScalars<A> s = math::adamw_scalars<A>(h.beta1, h.beta2, h.eps, h.weight_decay, *lr, *step);
  const int64_t blocks = table.first_block[table.count];
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int k = tensor_of_block(table, b);
    const Chunk<D, A> c(table, k, b, clip, coef);
    if (skip) {
      if (c.g_out)
        for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) c.gradient(i);
      continue;
    }
    D* p = static_cast<D*>(table.param[k]);
    D* m = static_cast<D*>(table.state0[k]);
    D* v = static_cast<D*>(table.state1[k]);
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
      A pi = to_acc(p[i]), mi = to_acc(m[i]), vi = to_acc(v[i]);
      math::adamw_update(pi, c.gradient(i), mi, vi, s);
      p[i] = from_acc<D>(pi);
      m[i] = from_acc<D>(mi);
      v[i] = from_acc<D>(vi);
    }
  }
}

// p, g, buf (state0; null without momentum) of each tensor: (numel) contiguous; lr: 0-dim f64.
template <typename D, typename A = Acc<D>>
__global__ void sgd_step_multi_tensor_kernel(const __grid_constant__ LaunchTable table, const float* found_inf,
                                             const double* lr, SgdHyper h, GradClip clip) {
  grid_dependency_wait();
  const bool skip = flag_set(found_inf);
  if (skip && !clip.coef) return;
  const A coef = clip_coef<A>(clip);
  const math::SgdScalars<A> s =
      math::sgd_scalars<A>(*lr, h.momentum, h.dampening, h.weight_decay, h.nesterov, h.first_step);
  const int64_t blocks = table.first_block[table.count];
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int k = tensor_of_block(table, b);
    const Chunk<D, A> c(table, k, b, clip, coef);
    if (skip) {
      if (c.g_out)
        for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) c.gradient(i);
      continue;
    }
    D* p = static_cast<D*>(table.param[k]);
    D* buf = static_cast<D*>(table.state0[k]);
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
      A pi = to_acc(p[i]);
      A bi = buf ? to_acc(buf[i]) : A(0);
      math::sgd_update(pi, c.gradient(i), buf != nullptr, bi, s);
      if (buf) buf[i] = from_acc<D>(bi);
      p[i] = from_acc<D>(pi);
    }
  }
}

}  // namespace

struct MultiTensorList::Impl {
  struct Launch {
    DType dtype;
    unsigned grid;
    LaunchTable table;
  };
  int device = 0;
  std::vector<Launch> launches;
  unsigned max_grid = 1;

  // Appends tensor t to launch `open` (an index; -1: none yet), opening a new one when it is full.
  void add(const OptimTensor& t, int& open) {
    if (open < 0 || launches[open].table.count == kMaxTensorsPerLaunch) {
      launches.push_back(Launch{t.dtype, 0, LaunchTable{}});
      open = int(launches.size()) - 1;
    }
    LaunchTable& tb = launches[open].table;
    const int k = tb.count++;
    tb.param[k] = t.param;
    tb.grad[k] = t.grad;
    tb.grad_out[k] = t.grad_out;
    tb.state0[k] = t.state0;
    tb.state1[k] = t.state1;
    tb.numel[k] = t.numel;
    tb.first_block[k + 1] = tb.first_block[k] + (t.numel + kChunk - 1) / kChunk;
  }
};

MultiTensorList::MultiTensorList(int device, const std::vector<OptimTensor>& tensors, const char* op)
    : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->max_grid = multi_tensor_grid(device, std::numeric_limits<int64_t>::max());
  // One dtype at a time, in the order the dtypes first appear; the tables' order within a dtype is
  // the tensors' order (any order would give the same bits: every element is independent).
  std::vector<DType> seen;
  for (const OptimTensor& t : tensors) {
    REEL_CHECK(is_floating(t.dtype), op, ": dtype ", dtype_name(t.dtype), " of a ", t.numel,
               "-element parameter is not supported (expected f32, f64, f16 or bf16)");
    if (std::find(seen.begin(), seen.end(), t.dtype) == seen.end()) seen.push_back(t.dtype);
  }
  for (DType d : seen) {
    int open = -1;
    for (const OptimTensor& t : tensors)
      if (t.dtype == d && t.numel > 0) impl_->add(t, open);
  }
  for (Impl::Launch& l : impl_->launches)
    l.grid = unsigned(std::min<int64_t>(l.table.first_block[l.table.count], impl_->max_grid));
}

MultiTensorList::~MultiTensorList() = default;

size_t MultiTensorList::launches() const { return impl_->launches.size(); }

void MultiTensorList::adamw(const float* found_inf, const double* lr, const double* step, const AdamWHyper& h,
                            GradClip clip) const {
  cudaStream_t stream = stream_of(Device::cuda(impl_->device));
  for (const Impl::Launch& l : impl_->launches) {
    visit_float(l.dtype, "adamw_step", [&]<typename D>() {
      launch_kernel(adamw_step_multi_tensor_kernel<D>, l.grid, kThreads, 0, stream, l.table, found_inf, lr, step, h,
                    clip);
      REEL_CUDA_LAUNCH_CHECK();
    });
  }
}

void MultiTensorList::sgd(const float* found_inf, const double* lr, const SgdHyper& h, GradClip clip) const {
  cudaStream_t stream = stream_of(Device::cuda(impl_->device));
  for (const Impl::Launch& l : impl_->launches) {
    visit_float(l.dtype, "sgd_step", [&]<typename D>() {
      launch_kernel(sgd_step_multi_tensor_kernel<D>, l.grid, kThreads, 0, stream, l.table, found_inf, lr, h, clip);
      REEL_CUDA_LAUNCH_CHECK();
    });
  }
}

}  // namespace reel::cuda
