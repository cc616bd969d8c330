// Vectorised f32 formulas for the CPU kernels whose scalar form calls a slow libm function per element
// (std::tanh: ~15 ns an element, where a packet of 8 costs about that much): GELU and its backward,
// and softmax's shifted exp.
//
//   gelu (tanh form):  y = 0.5 x (1 + tanh(u)) = x s,      u = sqrt(2/pi) (x + 0.044715 x^3)
//                      with s = 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u))      (the logistic of 2u)
//   dgelu/dx:          0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) du/dx = s + 2 x s (1 - s) du/dx,
//                      du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)             (1 - tanh^2 = 4 s (1 - s))
// The logistic form is the same function as kernels/elementwise_math.h's tanh form, with no
// cancellation in 1 + tanh(u) for negative x (its relative error against f64 is ~7e-7, the tanh
// form's in f32 ~4e-5); exp runs through Eigen's packet exp, 16 floats a packet
// (kernels/cpu/vector_math_packets.h): one AVX-512 register where the CPU has AVX-512, else two AVX2
// registers. The choice is made once per process (REEL_CPU_AVX512=0 keeps AVX2), so within a run
// every call takes the same code.
//
// Every element goes through the same packet code, the tail of an array too (copied into a padded
// packet), so a value's result does not depend on where it sits: the eager kernel (rows of any
// stride, staged through a buffer) and the fused kernel's interpreter (blocks of registers) give the
// same bits for the same input. f64 keeps the scalar formulas (gradcheck's reference).
#pragma once
#include <cstdint>

namespace reel::cpu {

void gelu_f32(const float* x, float* y, int64_t n);
// y = g * dgelu/dx(x)
void gelu_backward_f32(const float* g, const float* x, float* y, int64_t n);

// y = exp(x - m) over n values, exactly 0 where x - m < log(FLT_MIN) (a masked -inf among them);
// returns the sum of y (softmax's numerator and normaliser in one pass; m is the row's maximum).
float exp_shifted_f32(const float* x, float m, float* y, int64_t n);

// Whether these functions run the AVX-512 build in this process.
bool vector_math_avx512();

// The two builds, for tests that check each (the AVX-512 one only where cpu_has_avx512()).
namespace detail {
bool cpu_has_avx512();
void gelu_f32_avx2(const float* x, float* y, int64_t n);
void gelu_backward_f32_avx2(const float* g, const float* x, float* y, int64_t n);
void gelu_f32_avx512(const float* x, float* y, int64_t n);
void gelu_backward_f32_avx512(const float* g, const float* x, float* y, int64_t n);
float exp_shifted_f32_avx2(const float* x, float m, float* y, int64_t n);
float exp_shifted_f32_avx512(const float* x, float m, float* y, int64_t n);
}  // namespace detail

}  // namespace reel::cpu
