// CPU kernels of the optimizer family (formulas and conventions: kernels/schema/optim.cpp).
//
// The in-place updates walk contiguous buffers (the schema checks this) in the accumulation type A
// (f64 for f64, f32 otherwise): each element is loaded once, updated, and stored once, so 16-bit
// parameters round once per step. found_inf, lr and the step count are read here on the CPU, which
// is their device: the host never reads a GPU value (kernels/cuda/optim.cu reads them inside the
// kernels). The AdamW and SGD element formulas live in kernels/optim_math.h, shared with the CUDA
// kernels and with the multi-tensor (fused) optimizer kernels at the end of this file.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/dispatch.h"
#include "kernels/lr_schedule_math.h"
#include "kernels/multi_tensor.h"
#include "kernels/optim_math.h"

namespace reel {
namespace {

// True when an optional 0-dim found_inf flag is defined and set.
bool flag_set(const Tensor& found_inf) { return found_inf.defined() && *found_inf.data<float>() != 0.f; }

// The value of a 0-dim f64 tensor (lr, step) on the CPU.
double scalar_of(const Tensor& t) { return *t.data<double>(); }

// Element i of an AdamW (SGD) update: what the per-tensor kernels and the multi-tensor kernel's
// chunks both run.
template <typename T, typename A>
void adamw_at(int64_t i, T* p, A gi, T* m, T* v, const math::AdamWScalars<A>& s) {
  A pi = load(p[i]), mi = load(m[i]), vi = load(v[i]);
  math::adamw_update(pi, gi, mi, vi, s);
  p[i] = store<T>(pi);
  m[i] = store<T>(mi);
  v[i] = store<T>(vi);
}

template <typename T, typename A>
void sgd_at(int64_t i, T* p, A gi, T* buf, const math::SgdScalars<A>& s) {
  A pi = load(p[i]);
  A bi = buf ? load(buf[i]) : A(0);
  math::sgd_update(pi, gi, buf != nullptr, bi, s);
  p[i] = store<T>(pi);
  if (buf) buf[i] = store<T>(bi);
}

// param, grad, exp_avg, exp_avg_sq: (n) contiguous, one dtype; lr, step: 0-dim f64.
void adamw_kernel(const KernelCall& c) {
  if (flag_set(c.in[4])) return;
  const Attrs& a = c.attrs;
  const double lr = scalar_of(c.in[5]), t = scalar_of(c.in[6]);
  visit_float_dtype(c.in[0].dtype(), "adamw_step", [&]<typename T>() {
    using A = AccType<T>;
    T* p = c.out[0].data<T>();
    const T* g = c.in[1].data<T>();
    T* m = c.out[1].data<T>();
    T* v = c.out[2].data<T>();
    const math::AdamWScalars<A> s =
        math::adamw_scalars<A>(a.f("beta1"), a.f("beta2"), a.f("eps"), a.f("weight_decay"), lr, t);
    const int64_t n = c.in[0].numel();
#pragma omp parallel for if (n >= cpu::kParallelGrain)
    for (int64_t i = 0; i < n; ++i) adamw_at(i, p, load(g[i]), m, v, s);
  });
}

// param, grad, momentum_buf?: (n) contiguous, one dtype; lr: 0-dim f64.
void sgd_kernel(const KernelCall& c) {
  if (flag_set(c.in[3])) return;
  const Attrs& a = c.attrs;
  const bool has_buf = c.in[2].defined() && a.f("momentum") != 0;
  visit_float_dtype(c.in[0].dtype(), "sgd_step", [&]<typename T>() {
    using A = AccType<T>;
    T* p = c.out[0].data<T>();
    const T* g = c.in[1].data<T>();
    T* buf = has_buf ? c.out[1].data<T>() : nullptr;
    const math::SgdScalars<A> s = math::sgd_scalars<A>(scalar_of(c.in[4]), a.f("momentum"), a.f("dampening"),
                                                       a.f("weight_decay"), a.b("nesterov"), a.b("first_step"));
    const int64_t n = c.in[0].numel();
#pragma omp parallel for if (n >= cpu::kParallelGrain)
    for (int64_t i = 0; i < n; ++i) sgd_at(i, p, load(g[i]), buf, s);
  });
}

// The value of a 0-dim f32 or f64 factor (unscale_check's inv_scale, the clip coefficient), as double.
double factor_of(const Tensor& t) { return t.dtype() == DType::f64 ? *t.data<double>() : double(*t.data<float>()); }

// g_i: contiguous (n_i), any float dtype; inv_scale: 0-dim f32/f64; found_inf: 0-dim f32 (absent
// without attr check_finite).
void unscale_check_kernel(const KernelCall& c) {
  const bool check = c.attrs.b("check_finite", true);
  const size_t k = c.in.size() - (check ? 2 : 1);
  const Tensor& inv = c.in[k];
  const double inv_scale = factor_of(inv);
  bool found = false;
  for (size_t j = 0; j < k; ++j) {
    visit_float_dtype(c.in[j].dtype(), "unscale_check", [&]<typename T>() {
      using A = AccType<T>;
      T* g = c.out[j].data<T>();
      const A s = A(inv_scale);
      const int64_t n = c.in[j].numel();
      bool bad = false;
#pragma omp parallel for reduction(|| : bad) if (n >= cpu::kParallelGrain)
      for (int64_t i = 0; i < n; ++i) {
        A x = load(g[i]);
        bad = bad || !std::isfinite(x);
        g[i] = store<T>(x * s);
      }
      found = found || bad;
    });
  }
  if (check && found) *c.out[k].data<float>() = 1.f;
}

template <typename Tr>
void scaler_update_typed(const KernelCall& c) {
  float* scale = c.out[0].data<float>();
  Tr* tracker = c.out[1].data<Tr>();
  const bool found = *c.in[2].data<float>() != 0.f;
  const int64_t interval = c.attrs.i("growth_interval");
  if (found) {
    *scale = float(*scale * c.attrs.f("backoff_factor"));
    *tracker = Tr(0);
    return;
  }
  const int64_t successful = int64_t(*tracker) + 1;
  if (successful >= interval) {
    float grown = float(*scale * c.attrs.f("growth_factor"));
    if (std::isfinite(grown)) *scale = grown;
    *tracker = Tr(0);
  } else {
    *tracker = Tr(successful);
  }
}

void scaler_update_kernel(const KernelCall& c) {
  if (c.in[1].dtype() == DType::i64) scaler_update_typed<int64_t>(c);
  else scaler_update_typed<float>(c);
}

void clamp_scalar_kernel(const KernelCall& c) {
  const double lo = c.attrs.f("min", -INFINITY), hi = c.attrs.f("max", INFINITY);
  visit_float_dtype(c.in[0].dtype(), "clamp_scalar", [&]<typename T>() {
    using A = AccType<T>;
    const A alo = A(lo), ahi = A(hi);
    // Comparisons written so that NaN falls through unchanged (as torch.clamp propagates NaN).
    cpu::map1<T>(c.out[0], c.in[0], [alo, ahi](A x) { return x < alo ? alo : (x > ahi ? ahi : x); });
  });
}

// step, lr: 0-dim f64.
void lr_schedule_kernel(const KernelCall& c) {
  *c.out[0].data<double>() = math::scheduled_lr(math::lr_schedule_params(c.attrs), scalar_of(c.in[0]));
}

// ---- multi_tensor_adamw / multi_tensor_sgd (fused; layout in kernels/multi_tensor.h) ----
// The per-tensor kernels' loops over chunks of every tensor of the run, the chunks spread over the
// OpenMP threads at once (one parallel loop for the run instead of one per tensor).

constexpr int64_t kMultiTensorChunk = int64_t(1) << 14;  // elements per unit of work

struct TensorChunk {
  size_t tensor;
  int64_t begin, end;
};

// The step-wide values of a call, read once on the CPU.
struct StepValues {
  bool skip;           // found_inf set: the update does nothing (a clip still scales its gradients)
  double lr, t;        // t: AdamW's step count (0 for SGD)
  const Tensor* clip;  // the clip coefficient, or null
};

template <typename T>
void multi_tensor_chunk(OpKind op, const Attrs& a, const OptimTensor& x, const TensorChunk& c, const StepValues& v) {
  using A = AccType<T>;
  T* p = static_cast<T*>(x.param);
  // The gradient the update reads: element i at src[i - off]. With a clip, g * c rounded to T as
  // unscale_check stores it, written first (into g where the call stores it, else a buffer of the
  // chunk, kept per thread for the next chunks) and read back in a second loop: so the compiler cannot
  // contract the product into the update's FMAs, and the update sees unscale_check's bits.
  if (v.skip && !x.grad_out) return;
  const T* src = static_cast<const T*>(x.grad);
  int64_t off = 0;
  thread_local std::vector<T> scaled;
  if (v.clip) {
    const A coef = A(factor_of(*v.clip));
    T* to = static_cast<T*>(x.grad_out);
    if (!to) {
      scaled.resize(size_t(c.end - c.begin));
      to = scaled.data();
      off = c.begin;
    }
    for (int64_t i = c.begin; i < c.end; ++i) to[i - off] = store<T>(A(load(src[i]) * coef));
    src = to;
  }
  if (v.skip) return;  // found_inf: no update (a clip has still stored its gradients)
  if (op == OpKind::MultiTensorAdamW) {
    T* m = static_cast<T*>(x.state0);
    T* vs = static_cast<T*>(x.state1);
    const auto s = math::adamw_scalars<A>(a.f("beta1"), a.f("beta2"), a.f("eps"), a.f("weight_decay"), v.lr, v.t);
    for (int64_t i = c.begin; i < c.end; ++i) adamw_at(i, p, load(src[i - off]), m, vs, s);
    return;
  }
  T* buf = static_cast<T*>(x.state0);
  const auto s = math::sgd_scalars<A>(v.lr, a.f("momentum"), a.f("dampening"), a.f("weight_decay"), a.b("nesterov"),
                                      a.b("first_step"));
  for (int64_t i = c.begin; i < c.end; ++i) sgd_at(i, p, load(src[i - off]), buf, s);
}

void multi_tensor_kernel(const KernelCall& c) {
  const MultiTensorShared shared = multi_tensor_shared(c);
  const bool skip = flag_set(*shared.found_inf);
  if (skip && !clip_stores_grads(c.attrs)) return;
  const StepValues values{skip, scalar_of(*shared.lr), shared.step ? scalar_of(*shared.step) : 0.0, shared.clip};
  const std::vector<OptimTensor> tensors = multi_tensor_list(c);
  std::vector<TensorChunk> chunks;
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    total += tensors[i].numel;
    for (int64_t b = 0; b < tensors[i].numel; b += kMultiTensorChunk)
      chunks.push_back({i, b, std::min(b + kMultiTensorChunk, tensors[i].numel)});
  }
  const int64_t n = int64_t(chunks.size());
  // The schema checked every dtype, so nothing below throws inside the parallel loop.
#pragma omp parallel for schedule(dynamic, 1) if (total >= cpu::kParallelGrain)
  for (int64_t k = 0; k < n; ++k) {
    const TensorChunk& chunk = chunks[size_t(k)];
    visit_float_dtype(tensors[chunk.tensor].dtype, op_name(c.op), [&]<typename T>() {
      multi_tensor_chunk<T>(c.op, c.attrs, tensors[chunk.tensor], chunk, values);
    });
  }
}

}  // namespace

void register_optim_cpu_kernels() {
  constexpr DeviceType cpu = DeviceType::CPU;
  register_kernel(cpu, OpKind::AdamWStep, adamw_kernel);
  register_kernel(cpu, OpKind::SgdStep, sgd_kernel);
  register_kernel(cpu, OpKind::UnscaleCheck, unscale_check_kernel);
  register_kernel(cpu, OpKind::ScalerUpdate, scaler_update_kernel);
  register_kernel(cpu, OpKind::ClampScalar, clamp_scalar_kernel);
  register_kernel(cpu, OpKind::LrSchedule, lr_schedule_kernel);
  register_kernel(cpu, OpKind::MultiTensorAdamW, multi_tensor_kernel);
  register_kernel(cpu, OpKind::MultiTensorSgd, multi_tensor_kernel);
}

}  // namespace reel
