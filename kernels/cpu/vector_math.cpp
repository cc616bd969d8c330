// Vectorised f32 formulas (see vector_math.h): the AVX2 build of vector_math_packets.h, and the choice
// between it and the AVX-512 build (vector_math_avx512.cpp).
#include "kernels/cpu/vector_math.h"

#include <cstdlib>
#include <cstring>

#include "kernels/cpu/vector_math_packets.h"

namespace reel::cpu {

namespace detail {

// Flattened (every call inside inlined) as the AVX-512 build is: the packet code runs without calls.
[[gnu::flatten]] void gelu_f32_avx2(const float* x, float* y, int64_t n) { VectorPackets<16>::gelu_array(x, y, n); }

[[gnu::flatten]] void gelu_backward_f32_avx2(const float* g, const float* x, float* y, int64_t n) {
  VectorPackets<16>::gelu_backward_array(g, x, y, n);
}

[[gnu::flatten]] float exp_shifted_f32_avx2(const float* x, float m, float* y, int64_t n) {
  return VectorPackets<16>::exp_shifted_array(x, m, y, n);
}

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

}  // namespace detail

bool vector_math_avx512() {
  static const bool on = [] {
    const char* v = std::getenv("REEL_CPU_AVX512");
    return detail::cpu_has_avx512() && !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

void gelu_f32(const float* x, float* y, int64_t n) {
  if (vector_math_avx512()) detail::gelu_f32_avx512(x, y, n);
  else detail::gelu_f32_avx2(x, y, n);
}

void gelu_backward_f32(const float* g, const float* x, float* y, int64_t n) {
  if (vector_math_avx512()) detail::gelu_backward_f32_avx512(g, x, y, n);
  else detail::gelu_backward_f32_avx2(g, x, y, n);
}

float exp_shifted_f32(const float* x, float m, float* y, int64_t n) {
  return vector_math_avx512() ? detail::exp_shifted_f32_avx512(x, m, y, n) : detail::exp_shifted_f32_avx2(x, m, y, n);
}

}  // namespace reel::cpu
