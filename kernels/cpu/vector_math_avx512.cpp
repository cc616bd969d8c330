// The AVX-512 build of kernels/cpu/vector_math_packets.h (16 floats a packet). The Makefile compiles
// this one file with the AVX-512 flags; vector_math.cpp calls it only where the CPU reports AVX-512
// (F, DQ, BW, VL), so the rest of reel stays x86-64-v3. Each entry is flattened (every call inside it
// inlined), so no Eigen template is left out of line here to be shared with the AVX2 objects (the
// Makefile checks the object for weak symbols), and the packet code runs without calls.
#include "kernels/cpu/vector_math.h"
#include "kernels/cpu/vector_math_packets.h"

namespace reel::cpu::detail {

[[gnu::flatten]] void gelu_f32_avx512(const float* x, float* y, int64_t n) { VectorPackets<16>::gelu_array(x, y, n); }

[[gnu::flatten]] void gelu_backward_f32_avx512(const float* g, const float* x, float* y, int64_t n) {
  VectorPackets<16>::gelu_backward_array(g, x, y, n);
}

[[gnu::flatten]] float exp_shifted_f32_avx512(const float* x, float m, float* y, int64_t n) {
  return VectorPackets<16>::exp_shifted_array(x, m, y, n);
}

}  // namespace reel::cpu::detail
