// The AVX-512 build of kernels/cpu/vector_math_packets.h (16 floats a packet). The Makefile compiles
// this one file with the AVX-512 flags; vector_math.cpp calls it only where the CPU reports AVX-512
// (F, DQ, BW, VL), so the rest of reel stays x86-64-v3.
#include "kernels/cpu/vector_math.h"
#include "kernels/cpu/vector_math_packets.h"

namespace reel::cpu::detail {

void gelu_f32_avx512(const float* x, float* y, int64_t n) { GeluPackets<16>::gelu_array(x, y, n); }

void gelu_backward_f32_avx512(const float* g, const float* x, float* y, int64_t n) {
  GeluPackets<16>::gelu_backward_array(g, x, y, n);
}

}  // namespace reel::cpu::detail
