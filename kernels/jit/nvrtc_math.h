// The scalar formulas of the fusable elementwise ops as source text for NVRTC — and the very same
// text compiled on the host, so that a test can hold it to kernels/elementwise_math.h bit for bit.
//
// Why a copy at all: fused kernels are generated and compiled at run time, and the build has no
// step that could turn kernels/elementwise_math.h (host/device C++ that includes reel headers and
// <cmath>, which NVRTC does not have) into a string. So the formulas are written once, below, as
// the argument of REEL_NVRTC_MATH(...). That macro both
//   - compiles them here, in namespace reel::jit::nvrtc_math, with REEL_FM_FN = inline and the
//     math_* primitives on std::, and
//   - stringizes them (kNvrtcMathSource), unexpanded, for the generated programs, whose prelude
//     defines REEL_FM_FN = __device__ __forceinline__ and the math_* primitives on CUDA's libm.
// tests/test_compile_fusion.cpp compares every op_* function with math::unary / math::binary in
// f32 and f64 over many arguments, bit for bit: a change made to one side only fails the tests.
//
// Each op_<name> takes and returns the accumulation type A (float, double or long long), exactly
// as math::unary<Op, A> / math::binary<Op, A> do; the scalar attr is passed already converted to A.
// Rules for the text: no preprocessor lines, no string literals; comments vanish when stringized.
#pragma once
#include <cmath>
#include <cstdint>

#define REEL_FM_FN inline

namespace reel::jit::nvrtc_math {

// Host primitives: std:: overloads in the argument's type, as elementwise_math.h's `using std::exp`.
inline float math_exp(float x) { return std::exp(x); }
inline double math_exp(double x) { return std::exp(x); }
inline float math_log(float x) { return std::log(x); }
inline double math_log(double x) { return std::log(x); }
inline float math_sqrt(float x) { return std::sqrt(x); }
inline double math_sqrt(double x) { return std::sqrt(x); }
inline float math_tanh(float x) { return std::tanh(x); }
inline double math_tanh(double x) { return std::tanh(x); }
inline float math_erf(float x) { return std::erf(x); }
inline double math_erf(double x) { return std::erf(x); }
// exp and 1 / x where a formula takes the device's fast approximations in f32 (elementwise_math.h's
// exp_fast, recip_fast): exact on the host.
inline float math_exp_fast(float x) { return std::exp(x); }
inline double math_exp_fast(double x) { return std::exp(x); }
template <typename A> inline A math_recip_fast(A x) { return A(1) / x; }
inline float math_pow(float x, float y) { return std::pow(x, y); }
inline double math_pow(double x, double y) { return std::pow(x, y); }
// The arithmetic that ends an op and starts the next: plain on the host; on the device the prelude
// makes them correctly rounded single instructions, never contracted into an FMA across two ops.
template <typename A> inline A math_mul(A a, A b) { return a * b; }
template <typename A> inline A math_add(A a, A b) { return a + b; }
template <typename A> inline A math_sub(A a, A b) { return a - b; }

}  // namespace reel::jit::nvrtc_math

// Compiles the formulas here and keeps their text (not macro-expanded: `#` stringizes the raw
// argument, so REEL_FM_FN stays a name that each side defines).
#define REEL_NVRTC_MATH(...)                                                   \
  namespace reel::jit::nvrtc_math {                                        \
  __VA_ARGS__                                                                  \
  }                                                                            \
  namespace reel::jit {                                                    \
  inline constexpr const char* kNvrtcMathSource = #__VA_ARGS__;                \
  }

REEL_NVRTC_MATH(
  template <typename A> REEL_FM_FN A op_neg(A x) { return -x; }
  template <typename A> REEL_FM_FN A op_abs(A x) { return x < A(0) ? -x : x; }
  template <typename A> REEL_FM_FN A op_exp(A x) { return math_exp(x); }
  template <typename A> REEL_FM_FN A op_log(A x) { return math_log(x); }
  template <typename A> REEL_FM_FN A op_sqrt(A x) { return math_sqrt(x); }
  template <typename A> REEL_FM_FN A op_rsqrt(A x) { return A(1) / math_sqrt(x); }
  template <typename A> REEL_FM_FN A op_tanh(A x) { return math_tanh(x); }
  template <typename A> REEL_FM_FN A op_sigmoid(A x) { return A(1) / (A(1) + math_exp(-x)); }
  template <typename A> REEL_FM_FN A op_relu(A x) { return x > A(0) || x != x ? x : A(0); }
  // gelu, tanh form: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), as x s with
  // s = 1 / (1 + exp(-2u)) (elementwise_math.h: why)
  template <typename A> REEL_FM_FN A gelu_logistic(A x) {
    A u = A(0.7978845608028654) * (x + A(0.044715) * x * x * x);
    return math_recip_fast(A(1) + math_exp_fast(A(-2) * u));
  }
  template <typename A> REEL_FM_FN A op_gelu(A x) { return x * gelu_logistic(x); }
  // gelu, exact: 0.5 x (1 + erf(x / sqrt(2)))
  template <typename A> REEL_FM_FN A op_gelu_erf(A x) { return A(0.5) * x * (A(1) + math_erf(x * A(0.7071067811865476))); }
  // silu: x sigmoid(x)
  template <typename A> REEL_FM_FN A op_silu(A x) { return x / (A(1) + math_exp(-x)); }
  template <typename A> REEL_FM_FN A op_pow_scalar(A x, A p) { return math_pow(x, p); }
  template <typename A> REEL_FM_FN A op_add_scalar(A x, A p) { return math_add(x, p); }
  template <typename A> REEL_FM_FN A op_mul_scalar(A x, A p) { return math_mul(x, p); }

  template <typename A> REEL_FM_FN A op_add(A a, A b) { return math_add(a, b); }
  template <typename A> REEL_FM_FN A op_sub(A a, A b) { return math_sub(a, b); }
  template <typename A> REEL_FM_FN A op_mul(A a, A b) { return math_mul(a, b); }
  template <typename A> REEL_FM_FN A op_div(A a, A b) { return a / b; }
  template <typename A> REEL_FM_FN A op_eq(A a, A b) { return A(a == b); }
  template <typename A> REEL_FM_FN A op_ne(A a, A b) { return A(a != b); }
  template <typename A> REEL_FM_FN A op_lt(A a, A b) { return A(a < b); }
  template <typename A> REEL_FM_FN A op_le(A a, A b) { return A(a <= b); }
  template <typename A> REEL_FM_FN A op_gt(A a, A b) { return A(a > b); }
  template <typename A> REEL_FM_FN A op_ge(A a, A b) { return A(a >= b); }
  // Backward helpers: a is the incoming gradient, b the saved tensor (y, or gelu's, gelu_erf's, silu's x).
  template <typename A> REEL_FM_FN A op_relu_backward(A a, A b) { return b > A(0) ? a : A(0); }
  template <typename A> REEL_FM_FN A op_tanh_backward(A a, A b) { return a * (A(1) - b * b); }
  template <typename A> REEL_FM_FN A op_sigmoid_backward(A a, A b) { return a * b * (A(1) - b); }
  template <typename A> REEL_FM_FN A op_gelu_backward(A a, A b) {
    A x = b, s = gelu_logistic(x);
    A du = A(0.7978845608028654) * (A(1) + A(3 * 0.044715) * x * x);
    return a * (s + A(2) * x * s * (A(1) - s) * du);
  }
  template <typename A> REEL_FM_FN A op_gelu_erf_backward(A a, A b) {
    A x = b;
    return a * (A(0.5) * (A(1) + math_erf(x * A(0.7071067811865476))) + x * A(0.3989422804014327) * math_exp(A(-0.5) * x * x));
  }
  template <typename A> REEL_FM_FN A op_silu_backward(A a, A b) {
    A x = b, s = A(1) / (A(1) + math_exp(-x));
    return a * (s * (A(1) + x * (A(1) - s)));
  }

  // where(cond, a, b), masked_fill(x, mask; value), clamp_scalar(x; lo, hi) as their kernels do
  // (clamp's comparisons let NaN through unchanged).
  template <typename A> REEL_FM_FN A op_where(A c, A a, A b) { return c != A(0) ? a : b; }
  template <typename A> REEL_FM_FN A op_masked_fill(A x, A m, A v) { return m != A(0) ? v : x; }
  template <typename A> REEL_FM_FN A op_clamp_scalar(A x, A lo, A hi) { return x < lo ? lo : (x > hi ? hi : x); }

  // Philox4x32-10, tensor/rng.h's philox4x32_10 in types NVRTC knows without headers: the four words
  // at (key, counter). A fused kernel draws dropout's mask with it where the mask is read.
  struct philox_words { unsigned int w0, w1, w2, w3; };
  REEL_FM_FN philox_words philox4x32_10_words(unsigned long long key, unsigned long long counter) {
    unsigned int c0 = (unsigned int)counter, c1 = (unsigned int)(counter >> 32), c2 = 0u, c3 = 0u;
    unsigned int k0 = (unsigned int)key, k1 = (unsigned int)(key >> 32);
    for (int round = 0; round < 10; ++round) {
      unsigned long long p0 = (unsigned long long)0xD2511F53u * c0;
      unsigned long long p1 = (unsigned long long)0xCD9E8D57u * c2;
      unsigned int n0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0;
      unsigned int n1 = (unsigned int)p1;
      unsigned int n2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1;
      unsigned int n3 = (unsigned int)p0;
      c0 = n0; c1 = n1; c2 = n2; c3 = n3;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    philox_words r = {c0, c1, c2, c3};
    return r;
  }
  // Word k (0..3) by selects, not by indexing an array (which would put it in local memory).
  REEL_FM_FN unsigned int philox_word(philox_words r, unsigned int k) {
    return k == 0u ? r.w0 : (k == 1u ? r.w1 : (k == 2u ? r.w2 : r.w3));
  }
  // Dropout's rule (kernels/cpu/norm.cpp): kept iff the word's uniform (w >> 8) 2^-24 >= float(p);
  // the mask is then the kept value (already a value of the mask's dtype), else 0.
  template <typename A> REEL_FM_FN A dropout_mask_of(unsigned int word, float threshold, A keep) {
    return float(word >> 8) * (1.0f / 16777216.0f) >= threshold ? keep : A(0);
  }
  // Element i of a mask drawn from (key, start): word i % 4 of the block at counter start + i / 4.
  template <typename A>
  REEL_FM_FN A op_dropout_mask(unsigned long long key, unsigned long long start, unsigned long long i, float threshold, A keep) {
    return dropout_mask_of(philox_word(philox4x32_10_words(key, start + i / 4u), (unsigned int)(i % 4u)), threshold, keep);
  }
)
