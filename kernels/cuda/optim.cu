// CUDA kernels of the optimizer family: the CPU's formulas (kernels/cpu/optim.cpp, documented in
// kernels/schema/optim.cpp) as grid-stride kernels, one launch per tensor; unscale_check, which takes
// every gradient at once, as one launch per dtype over a table of them (multi_tensor_optim.cu's
// work split: tensor k's chunks are virtual blocks first_block[k] ..).
//
// No host reads: the 0-dim found_inf flag, inv_scale, scale and growth tracker, and the per-step lr
// and step count (0-dim f64) are read inside the kernels, so an optimizer step with its schedule and
// GradScaler skip can be captured in a CUDA graph and replayed with those values advancing. Each
// thread of adamw_step derives the bias corrections from lr and t once, in double, as the CPU does,
// before its grid-stride loop. A kernel that sees found_inf != 0 returns before touching anything.
// The AdamW and SGD element formulas are kernels/optim_math.h's, shared with the CPU and with the
// multi-tensor kernels the compiler fuses an optimizer step into (kernels/cuda/multi_tensor_optim.cu).
// unscale_check's threads may all store 1.0f to found_inf at once; the race is benign (every writer
// stores the same value).
// Arithmetic runs in A = Acc<D> (f32 for f32/f16/bf16, f64 for f64), as on the CPU.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/multi_tensor_common.cuh"
#include "kernels/cuda/cuda_registry.h"
#include "kernels/cuda/multi_tensor_optim.h"
#include "kernels/multi_tensor.h"
#include "kernels/lr_schedule_math.h"
#include "kernels/optim_math.h"

namespace reel {
namespace cuda {
namespace {

__device__ __forceinline__ bool flag_set(const float* found_inf) { return found_inf && *found_inf != 0.f; }

// param, grad, exp_avg, exp_avg_sq: (n) contiguous; lr, step: 0-dim f64 (step = t, 1-based).
template <typename D, typename A = Acc<D>>
__global__ void adamw_step_kernel(D* p, const D* g, D* m, D* v, const float* found_inf, const double* lr_ptr,
                                  const double* step_ptr, int64_t n, double beta1, double beta2, double eps,
                                  double wd) {
  grid_dependency_wait();
  if (flag_set(found_inf)) return;
  const math::AdamWScalars<A> s = math::adamw_scalars<A>(beta1, beta2, eps, wd, *lr_ptr, *step_ptr);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    A pi = to_acc(p[i]), mi = to_acc(m[i]), vi = to_acc(v[i]);
    math::adamw_update(pi, to_acc(g[i]), mi, vi, s);
    p[i] = from_acc<D>(pi);
    m[i] = from_acc<D>(mi);
    v[i] = from_acc<D>(vi);
  }
}

// param, grad, buf (or null): (n) contiguous; lr: 0-dim f64.
template <typename D, typename A = Acc<D>>
__global__ void sgd_step_kernel(D* p, const D* g, D* buf, const float* found_inf, const double* lr_ptr, int64_t n,
                                double mom, double damp, double wd, bool nesterov, bool first) {
  grid_dependency_wait();
  if (flag_set(found_inf)) return;
  const math::SgdScalars<A> s = math::sgd_scalars<A>(*lr_ptr, mom, damp, wd, nesterov, first);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    A pi = to_acc(p[i]);
    A bi = buf ? to_acc(buf[i]) : A(0);
    math::sgd_update(pi, to_acc(g[i]), buf != nullptr, bi, s);
    if (buf) buf[i] = from_acc<D>(bi);
    p[i] = from_acc<D>(pi);
  }
}

// Gradients of one dtype for one unscale_check launch: each (numel) contiguous, numel > 0. A kernel
// argument (__grid_constant__), so a captured launch carries it.
constexpr int kUnscaleTensors = 256;
constexpr int kUnscaleThreads = 256;
constexpr int64_t kUnscaleChunk = 4 * kUnscaleThreads;  // elements per virtual block
struct UnscaleTable {
  void* g[kUnscaleTensors];
  int64_t numel[kUnscaleTensors];
  int64_t first_block[kUnscaleTensors + 1];  // first_block[count]: the launch's virtual blocks
  int count;
};
static_assert(sizeof(UnscaleTable) + 64 <= 32764, "unscale table too large for the kernel arguments");

// g *= inv_scale in place, found_inf = 1 if any g was not finite (no flag: null); S: the inv_scale type
// (float or double).
template <typename D, typename S, typename A = Acc<D>>
__global__ void unscale_check_kernel(const __grid_constant__ UnscaleTable t, const S* inv_scale, float* found_inf) {
  grid_dependency_wait();
  const A s = A(*inv_scale);
  bool bad = false;
  for (int64_t vb = blockIdx.x; vb < t.first_block[t.count]; vb += gridDim.x) {
    const int k = tensor_of_block(t.first_block, t.count, vb);
    D* g = static_cast<D*>(t.g[k]);
    const int64_t begin = (vb - t.first_block[k]) * kUnscaleChunk, end = min(begin + kUnscaleChunk, t.numel[k]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      A x = to_acc(g[i]);
      bad = bad || !isfinite(x);
      g[i] = from_acc<D>(A(x * s));
    }
  }
  if (bad && found_inf) *found_inf = 1.f;
}

// One thread: PyTorch's _amp_update_scale_ (see kernels/schema/optim.cpp).
template <typename Tr>
__global__ void scaler_update_kernel(float* scale, Tr* tracker, const float* found_inf, double growth,
                                     double backoff, int64_t interval) {
  grid_dependency_wait();
  if (*found_inf != 0.f) {
    *scale = float(*scale * backoff);
    *tracker = Tr(0);
    return;
  }
  int64_t successful = int64_t(*tracker) + 1;
  if (successful >= interval) {
    float grown = float(*scale * growth);
    if (isfinite(grown)) *scale = grown;
    *tracker = Tr(0);
  } else {
    *tracker = Tr(successful);
  }
}

// One thread: lr = schedule(step), both 0-dim f64 (kernels/lr_schedule_math.h).
__global__ void lr_schedule_kernel(const double* step, double* lr, math::LrScheduleParams schedule) {
  grid_dependency_wait();
  *lr = math::scheduled_lr(schedule, *step);
}

// y (contiguous) = clamp(x) with x of any strides; NaN passes through.
template <typename D, typename A = Acc<D>>
__global__ void clamp_scalar_kernel(StridedOffsets<2> geo, int64_t n, D* y, const D* x, A lo, A hi) {
  grid_dependency_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    geo.offsets(i, off);
    A v = to_acc(x[off[1]]);
    y[off[0]] = from_acc<D>(A(v < lo ? lo : (v > hi ? hi : v)));
  }
}

const float* flag_ptr(const Tensor& t) { return t.defined() ? static_cast<const float*>(t.data_ptr()) : nullptr; }

const double* scalar_ptr(const Tensor& t) { return static_cast<const double*>(t.data_ptr()); }

void adamw_step(const KernelCall& c) {
  const Attrs& a = c.attrs;
  const int64_t n = c.in[0].numel();
  if (n == 0) return;
  visit_float(c.in[0].dtype(), "adamw_step", [&]<typename D>() {
    launch_kernel(adamw_step_kernel<D>, blocks_for(n), 256, 0, stream_of(c.in[0]), static_cast<D*>(c.out[0].data_ptr()),
                  static_cast<const D*>(c.in[1].data_ptr()), static_cast<D*>(c.out[1].data_ptr()),
                  static_cast<D*>(c.out[2].data_ptr()), flag_ptr(c.in[4]), scalar_ptr(c.in[5]), scalar_ptr(c.in[6]), n,
                  a.f("beta1"), a.f("beta2"), a.f("eps"), a.f("weight_decay"));
    REEL_CUDA_LAUNCH_CHECK();
  });
}

void sgd_step(const KernelCall& c) {
  const Attrs& a = c.attrs;
  const double mom = a.f("momentum");
  const bool has_buf = c.in[2].defined() && mom != 0;
  const int64_t n = c.in[0].numel();
  if (n == 0) return;
  visit_float(c.in[0].dtype(), "sgd_step", [&]<typename D>() {
    launch_kernel(sgd_step_kernel<D>, blocks_for(n), 256, 0, stream_of(c.in[0]), static_cast<D*>(c.out[0].data_ptr()),
                  static_cast<const D*>(c.in[1].data_ptr()), has_buf ? static_cast<D*>(c.out[1].data_ptr()) : nullptr,
                  flag_ptr(c.in[3]), scalar_ptr(c.in[4]), n, mom, a.f("dampening"), a.f("weight_decay"),
                  a.b("nesterov"), a.b("first_step"));
    REEL_CUDA_LAUNCH_CHECK();
  });
}

void unscale_check(const KernelCall& c) {
  const bool check = c.attrs.b("check_finite", true);
  const size_t k = c.in.size() - (check ? 2 : 1);
  const Tensor& inv = c.in[k];
  float* found = check ? static_cast<float*>(c.out[k].data_ptr()) : nullptr;
  // The gradients grouped by dtype, in order, in launches of at most kUnscaleTensors.
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    UnscaleTable t{};
    Device device = inv.device();
    auto flush = [&] {
      if (t.count == 0) return;
      visit_float(dt, "unscale_check", [&]<typename D>() {
        cudaStream_t s = stream_of(device);
        const unsigned grid = multi_tensor_grid(device.index, t.first_block[t.count]);
        if (inv.dtype() == DType::f64)
          launch_kernel(unscale_check_kernel<D, double>, grid, kUnscaleThreads, 0, s, t, inv.data<double>(), found);
        else
          launch_kernel(unscale_check_kernel<D, float>, grid, kUnscaleThreads, 0, s, t, inv.data<float>(), found);
        REEL_CUDA_LAUNCH_CHECK();
      });
      t = UnscaleTable{};
    };
    for (size_t j = 0; j < k; ++j) {
      const int64_t n = c.in[j].numel();
      if (n == 0 || c.in[j].dtype() != dt) continue;
      device = c.in[j].device();
      t.g[t.count] = c.out[j].data_ptr();
      t.numel[t.count] = n;
      t.first_block[t.count + 1] = t.first_block[t.count] + (n + kUnscaleChunk - 1) / kUnscaleChunk;
      if (++t.count == kUnscaleTensors) flush();
    }
    flush();
  }
}

void scaler_update(const KernelCall& c) {
  const Attrs& a = c.attrs;
  float* scale = c.out[0].data<float>();
  const float* found = c.in[2].data<float>();
  const double growth = a.f("growth_factor"), backoff = a.f("backoff_factor");
  const int64_t interval = a.i("growth_interval");
  cudaStream_t s = stream_of(c.in[0]);
  if (c.in[1].dtype() == DType::i64)
    launch_kernel(scaler_update_kernel<int64_t>, 1, 1, 0, s, scale, c.out[1].data<int64_t>(), found, growth, backoff,
                  interval);
  else
    launch_kernel(scaler_update_kernel<float>, 1, 1, 0, s, scale, c.out[1].data<float>(), found, growth, backoff,
                  interval);
  REEL_CUDA_LAUNCH_CHECK();
}

void clamp_scalar(const KernelCall& c) {
  const Tensor& x = c.in[0];
  const Tensor& y = c.out[0];
  const int64_t n = y.numel();
  if (n == 0) return;
  const double lo = c.attrs.f("min", -INFINITY), hi = c.attrs.f("max", INFINITY);
  std::array<std::vector<int64_t>, 2> strides{y.strides(), x.strides()};
  auto geo = make_offsets(make_geometry<2>(y.shape(), strides));
  visit_float(x.dtype(), "clamp_scalar", [&]<typename D>() {
    using A = Acc<D>;
    launch_kernel(clamp_scalar_kernel<D>, blocks_for(n), 256, 0, stream_of(y), geo, n, static_cast<D*>(y.data_ptr()),
                  static_cast<const D*>(x.data_ptr()), A(lo), A(hi));
    REEL_CUDA_LAUNCH_CHECK();
  });
}

void lr_schedule(const KernelCall& c) {
  launch_kernel(lr_schedule_kernel, 1, 1, 0, stream_of(c.in[0]), scalar_ptr(c.in[0]), c.out[0].data<double>(),
                math::lr_schedule_params(c.attrs));
  REEL_CUDA_LAUNCH_CHECK();
}

// multi_tensor_adamw / multi_tensor_sgd: the run's tensors grouped into launch tables (host work, no
// device memory), then one launch per dtype and per kMaxTensorsPerLaunch tensors. Building the tables
// on every call keeps the kernel free of state; under a CUDA graph it runs once, at the capture.
void multi_tensor_step(const KernelCall& c) {
  const MultiTensorShared shared = multi_tensor_shared(c);
  const MultiTensorList list(c.out[0].device().index, multi_tensor_list(c), op_name(c.op));
  const float* flag = shared.found_inf->defined() ? static_cast<const float*>(shared.found_inf->data_ptr()) : nullptr;
  const double* lr = static_cast<const double*>(shared.lr->data_ptr());
  const Attrs& a = c.attrs;
  const GradClip clip = shared.clip ? GradClip{shared.clip->data_ptr(), shared.clip->dtype() == DType::f64} : GradClip{};
  if (c.op == OpKind::MultiTensorAdamW) {
    list.adamw(flag, lr, static_cast<const double*>(shared.step->data_ptr()),
               {a.f("beta1"), a.f("beta2"), a.f("eps"), a.f("weight_decay")}, clip);
  } else {
    list.sgd(flag, lr, {a.f("momentum"), a.f("dampening"), a.f("weight_decay"), a.b("nesterov"), a.b("first_step")},
             clip);
  }
}

}  // namespace
}  // namespace cuda

void register_optim_cuda_kernels() {
  constexpr DeviceType gpu = DeviceType::CUDA;
  register_kernel(gpu, OpKind::AdamWStep, cuda::adamw_step);
  register_kernel(gpu, OpKind::SgdStep, cuda::sgd_step);
  register_kernel(gpu, OpKind::UnscaleCheck, cuda::unscale_check);
  register_kernel(gpu, OpKind::ScalerUpdate, cuda::scaler_update);
  register_kernel(gpu, OpKind::ClampScalar, cuda::clamp_scalar);
  register_kernel(gpu, OpKind::LrSchedule, cuda::lr_schedule);
  register_kernel(gpu, OpKind::MultiTensorAdamW, cuda::multi_tensor_step);
  register_kernel(gpu, OpKind::MultiTensorSgd, cuda::multi_tensor_step);
}

}  // namespace reel
