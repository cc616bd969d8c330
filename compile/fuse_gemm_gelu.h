// GELU into the GEMMs on either side of it, under autocast (cuBLASLt's GELU epilogues,
// kernels/cuda/gemm_epilogue.h). A GPT's MLP, fc then GELU then fc2, as the earlier passes leave it:
//
// forward                                   (B, T, 4d) each; c the 16-bit compute dtype
//   z = gemm_bias(x, Wfc^T, bfc)            z in c: the pre-activation, kept for the backward   (node i)
//   t = copy(z) to f32                      store_gemm_bias_16bit's cast for GELU
//   u = gelu(t)
//   v = copy(u) to c                        autocast's cast for fc2's GEMM
// becomes one GEMM that writes v = gelu(acc + bias) and z = acc + bias (GELU_AUX_BIAS);
//
// backward
//   y = matmul(dy, Wfc2)                    y in c: fc2's input gradient (fuse_matmul_cast keeps it)  (node m)
//   g = copy(y) to f32,  x = copy(z) to f32
//   d = gelu_backward(g, x)
//   e = copy(d) to c                        autocast's cast for fc's two GEMMs and its bias sum
// becomes one GEMM that writes e = acc * gelu'(z) (DGELU).
//
// Three and four kernels go per layer and micro-batch, and with them the round trips of u, y, g, x
// and d through memory. GELU reads the f32 acc + bias instead of its 16-bit rounding, and its
// derivative multiplies the f32 accumulator instead of y: one rounding fewer each, within the dtype
// tolerance of the compiled-against-eager parity tests, not equal to the bit (cuBLASLt's tanh is its
// own, too). Applies on CUDA when each intermediate is an Internal buffer written once and read only
// by the chain, v and e are touched by nothing before the node that now writes them, z is not
// written between the forward and the backward's GEMM, and cuBLASLt has an algorithm (N divisible by
// 8). Runs after store_gemm_bias_16bit and fuse_matmul_cast made z and y 16-bit, before elementwise
// fusion would take the casts and GELU into kernels of their own.
#pragma once
#include "compile/passes.h"

namespace reel::compile {

void fuse_gemm_gelu(Graph& g, PassStats& stats);

}  // namespace reel::compile
