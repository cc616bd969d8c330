// The scalar math of every elementwise op, shared by the CPU loops and the CUDA kernels so both
// backends compute the same formula. A is the accumulation type (float, double or int64_t).
//
//   gelu (tanh form):  y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   dgelu/dx        =  0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//   gelu (exact):      y = 0.5 x (1 + erf(x / sqrt(2))),   dy/dx = 0.5 (1 + erf(x / sqrt(2))) + x phi(x)
//                      with phi(x) = exp(-x^2 / 2) / sqrt(2 pi), the normal density
//   silu:              y = x sigmoid(x) = x / (1 + exp(-x)),  dy/dx = s (1 + x (1 - s)),  s = sigmoid(x)
//   tanh' = 1 - y^2 ;  sigmoid' = y (1 - y) ;  relu' = [y > 0]
#pragma once
#include <cmath>

#include "kernels/op.h"
#include "tensor/rng.h"  // REEL_HOST_DEVICE

namespace reel::math {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCoeff = 0.044715;
constexpr double kSqrtHalf = 0.7071067811865476;       // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;     // 1 / sqrt(2 pi)

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
  else if constexpr (Op == OpKind::Gelu) {
    A u = A(kSqrt2OverPi) * (x + A(kGeluCoeff) * x * x * x);
    return A(0.5) * x * (A(1) + tanh(u));
  } else if constexpr (Op == OpKind::GeluErf) {
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
    using std::tanh;
    A x = b;
    A u = A(kSqrt2OverPi) * (x + A(kGeluCoeff) * x * x * x);
    A t = tanh(u);
    A du = A(kSqrt2OverPi) * (A(1) + A(3 * kGeluCoeff) * x * x);
    return a * (A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * du);
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
