// The scalar math of every elementwise op, shared by the CPU loops and the CUDA kernels so both
// backends compute the same formula. A is the accumulation type (float, double or int64_t).
//
//   gelu (tanh form):  y = 0.5 x (1 + tanh(u)) = x s,  u = sqrt(2/pi) (x + 0.044715 x^3),
//                      computed as x s with s = 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)), the logistic of 2u
//   dgelu/dx        =  0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) du/dx = s + 2 x s (1 - s) du/dx,
//                      du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)                (1 - tanh^2 = 4 s (1 - s))
//   The logistic form is the CPU packets' (kernels/cpu/vector_math.h): no cancellation in 1 + tanh(u)
//   for negative x, and no tanh. On a GPU, f32 takes exp and the reciprocal from the fast hardware
//   approximations (__expf, __fdividef: a few ulp; four instructions where tanhf takes about
//   seventeen): GELU's backward, bound by its arithmetic, went from 18.7 to 14.9 us a launch at
//   gpt-small's size on an H100 (bench/RESULTS.md, tenth step).
//   gelu (exact):      y = 0.5 x (1 + erf(x / sqrt(2))),   dy/dx = 0.5 (1 + erf(x / sqrt(2))) + x phi(x)
//                      with phi(x) = exp(-x^2 / 2) / sqrt(2 pi), the normal density
//   silu:              y = x sigmoid(x) = x / (1 + exp(-x)),  dy/dx = s (1 + x (1 - s)),  s = sigmoid(x)
//   tanh' = 1 - y^2 ;  sigmoid' = y (1 - y) ;  relu' = [y > 0]
#pragma once
#include <cmath>
#include <type_traits>

#include "kernels/op.h"
#include "tensor/rng.h"  // REEL_HOST_DEVICE

namespace reel::math {

// exp(x) and 1 / x: the hardware's approximations for f32 on a GPU (ex2.approx, rcp.approx; 1 / x is
// 0 for |x| > 2^126), the exact ones elsewhere.
template <typename A>
REEL_HOST_DEVICE A exp_fast(A x) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same_v<A, float>) return __expf(x);
#endif
  using std::exp;
  return exp(x);
}
template <typename A>
REEL_HOST_DEVICE A recip_fast(A x) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same_v<A, float>) return __fdividef(1.0f, x);
#endif
  return A(1) / x;
}

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCoeff = 0.044715;
constexpr double kSqrtHalf = 0.7071067811865476;       // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;     // 1 / sqrt(2 pi)

// GELU's s = 1 / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): 0 where exp overflows (x below
// about -10 in f32), never NaN for a number x.
template <typename A>
REEL_HOST_DEVICE A gelu_logistic(A x) {
  A u = A(kSqrt2OverPi) * (x + A(kGeluCoeff) * x * x * x);
  return recip_fast(A(1) + exp_fast(A(-2) * u));
}

// `param` carries the op's scalar attr (exponent or value); unused otherwise.
template <OpKind Op, typename A>
REEL_HOST_DEVICE A unary(A x, A param) {
  using std::exp, std::log, std::sqrt, std::tanh, std::pow, std::abs;
  if constexpr (Op == OpKind::Neg) return -x;
  else if constexpr (Op == OpKind::Abs) return x < A(0) ? -x : x;
  else if constexpr (Op == OpKind::Exp) return exp(x);
  else if constexpr (Op == OpKind::Log) return log(x);
  else if constexpr (Op == OpKind::Sqrt) return sqrt(x);
  else if constexpr (Op == OpKind::Rsqrt) return A(1) / sqrt(x);
  else if constexpr (Op == OpKind::Tanh) return tanh(x);
  else if constexpr (Op == OpKind::Sigmoid) return A(1) / (A(1) + exp(-x));
  else if constexpr (Op == OpKind::Relu) return x > A(0) || x != x ? x : A(0);  // NaN stays NaN (PyTorch)
  else if constexpr (Op == OpKind::Gelu) return x * gelu_logistic(x);
  else if constexpr (Op == OpKind::GeluErf) {
    using std::erf;
    return A(0.5) * x * (A(1) + erf(x * A(kSqrtHalf)));
  } else if constexpr (Op == OpKind::Silu) return x / (A(1) + exp(-x));
  else if constexpr (Op == OpKind::PowScalar) return pow(x, param);
  else if constexpr (Op == OpKind::AddScalar) return x + param;
  else if constexpr (Op == OpKind::MulScalar) return x * param;
  else static_assert(Op == OpKind::Neg, "not a unary elementwise op");
}

template <OpKind Op, typename A>
REEL_HOST_DEVICE A binary(A a, A b) {
  if constexpr (Op == OpKind::Add) return a + b;
  else if constexpr (Op == OpKind::Sub) return a - b;
  else if constexpr (Op == OpKind::Mul) return a * b;
  else if constexpr (Op == OpKind::Div) return a / b;
  else if constexpr (Op == OpKind::Eq) return A(a == b);
  else if constexpr (Op == OpKind::Ne) return A(a != b);
  else if constexpr (Op == OpKind::Lt) return A(a < b);
  else if constexpr (Op == OpKind::Le) return A(a <= b);
  else if constexpr (Op == OpKind::Gt) return A(a > b);
  else if constexpr (Op == OpKind::Ge) return A(a >= b);
  // Backward helpers: a is the incoming gradient, b the saved tensor.
  else if constexpr (Op == OpKind::ReluBackward) return b > A(0) ? a : A(0);
  else if constexpr (Op == OpKind::TanhBackward) return a * (A(1) - b * b);
  else if constexpr (Op == OpKind::SigmoidBackward) return a * b * (A(1) - b);
  else if constexpr (Op == OpKind::GeluBackward) {
    A x = b, s = gelu_logistic(x);
    A du = A(kSqrt2OverPi) * (A(1) + A(3 * kGeluCoeff) * x * x);
    return a * (s + A(2) * x * s * (A(1) - s) * du);
  } else if constexpr (Op == OpKind::GeluErfBackward) {
    using std::erf, std::exp;
    A x = b;
    return a * (A(0.5) * (A(1) + erf(x * A(kSqrtHalf))) + x * A(kInvSqrt2Pi) * exp(A(-0.5) * x * x));
  } else if constexpr (Op == OpKind::SiluBackward) {
    using std::exp;
    A x = b, s = A(1) / (A(1) + exp(-x));
    return a * (s * (A(1) + x * (A(1) - s)));
  } else static_assert(Op == OpKind::Add, "not a binary elementwise op");
}

}  // namespace reel::math
