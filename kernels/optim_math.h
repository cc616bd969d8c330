// The optimizer updates as scalar formulas, shared by every kernel that applies them: the per-tensor
// adamw_step / sgd_step kernels of the CPU (kernels/cpu/optim.cpp) and CUDA (kernels/cuda/optim.cu),
// and the multi-tensor kernels the compiler fuses a whole optimizer step into
// (compile/passes/fuse_optimizer.cpp, kernels/cuda/multi_tensor_optim.cu). One formula means one rounding
// sequence, so a fused update is bit-identical to the per-tensor one.
//
//   AdamW (torch.optim.AdamW), t = the 1-based update count:
//     p = p (1 - lr wd);  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//     p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//   SGD (torch.optim.SGD):
//     d = g + wd p (only when wd != 0);  buf = first ? d : momentum buf + (1 - dampening) d;
//     d = nesterov ? d + momentum buf : buf (when there is a buffer);  p -= lr d
//
// Conventions: A is the accumulation type (f64 for f64 tensors, f32 otherwise); callers load each
// element into A, call the update, and store the results back once. The per-step scalars are derived
// from the double hyper-parameters once per thread (in double, then rounded to A), exactly as the
// per-tensor kernels always have, so every kernel sees the same A-valued coefficients.
//
// Roundings. Compilers contract a product and an add into one fused multiply-add where they see
// fit: g++ does so by default, nvcc in its front end and ptxas again late, per kernel, so the same
// formula inlined into the per-tensor and the multi-tensor kernel (or a float4 loop) could round
// differently, and the CPU and the GPU did. Each update is therefore written with its fused
// multiply-adds explicit (std::fma: one rounding on the host and the device) and no other product
// feeding an add: every compiler then has one way to evaluate it, and a kernel's update is bit-identical
// to the CPU's (sqrt and division are IEEE-rounded on both; nvcc's defaults -prec-div and -prec-sqrt).
#pragma once
#include <cmath>

#include "tensor/rng.h"  // REEL_HOST_DEVICE

namespace reel::math {

// AdamW's coefficients for one step, in the accumulation type.
template <typename A>
struct AdamWScalars {
  A beta1, beta2, eps;
  // 1 - beta1 and 1 - beta2, formed in double and rounded once: in f32 the difference 1 - 0.999 of two
  // f32 values is 1.0000124e-3, which made every first step of a zero-initialised tensor 6.4e-6 small.
  A one_minus_beta1, one_minus_beta2;
  A decay;      // 1 - lr wd (decoupled weight decay)
  A step_size;  // lr / (1 - b1^t)
  A bc2_sqrt;   // sqrt(1 - b2^t)
};

// lr and t are the step's device values (0-dim f64 tensors), read by the caller on their device.
template <typename A>
REEL_HOST_DEVICE AdamWScalars<A> adamw_scalars(double beta1, double beta2, double eps, double weight_decay, double lr,
                                               double t) {
  using std::pow;
  using std::sqrt;
  return {A(beta1),
          A(beta2),
          A(eps),
          A(1 - beta1),
          A(1 - beta2),
          A(1 - lr * weight_decay),
          A(lr / (1 - pow(beta1, t))),
          A(sqrt(1 - pow(beta2, t)))};
}

// One element: p, m, v updated in place from gradient g.
template <typename A>
REEL_HOST_DEVICE void adamw_update(A& p, A g, A& m, A& v, const AdamWScalars<A>& s) {
  using std::fma;
  using std::sqrt;
  m = fma(s.beta1, m, s.one_minus_beta1 * g);      // b1 m + (1 - b1) g
  v = fma(s.beta2, v, s.one_minus_beta2 * g * g);  // b2 v + (1 - b2) g^2
  // torch: denom = sqrt(v) / sqrt(bc2) + eps; p -= (lr / bc1) * m / denom
  const A denom = sqrt(v) / s.bc2_sqrt + s.eps;
  p = fma(p, s.decay, -(s.step_size * m / denom));  // p (1 - lr wd) - step m / denom
}

// SGD's coefficients for one step, in the accumulation type.
template <typename A>
struct SgdScalars {
  A lr, momentum, dampening1, weight_decay;  // dampening1 = 1 - dampening
  bool decay, nesterov, first_step;           // decay: weight_decay != 0 (torch skips the term at 0)
};

template <typename A>
REEL_HOST_DEVICE SgdScalars<A> sgd_scalars(double lr, double momentum, double dampening, double weight_decay,
                                           bool nesterov, bool first_step) {
  return {A(lr), A(momentum), A(1 - dampening), A(weight_decay), weight_decay != 0, nesterov, first_step};
}

// One element: p updated in place from gradient g; `buf` (the momentum buffer's value) is read and
// written only when the step has one (has_buf).
template <typename A>
REEL_HOST_DEVICE void sgd_update(A& p, A g, bool has_buf, A& buf, const SgdScalars<A>& s) {
  using std::fma;
  A d = g;
  if (s.decay) d = fma(s.weight_decay, p, d);  // g + wd p
  if (has_buf) {
    buf = s.first_step ? d : fma(s.momentum, buf, s.dampening1 * d);  // momentum buf + (1 - dampening) d
    d = s.nesterov ? fma(s.momentum, buf, d) : buf;
  }
  p = fma(-s.lr, d, p);  // p - lr d
}

}  // namespace reel::math
