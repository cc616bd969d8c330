// GELU into the GEMM before it, under autocast (cuBLASLt's GELU_AUX_BIAS epilogue,
// kernels/cuda/gemm_epilogue.h). A GPT's MLP forward, as the earlier passes leave it:
//
//   z = gemm_bias(x, Wfc^T, bfc)     (B, T, 4d) in c, the 16-bit compute dtype: the pre-activation,
//                                    kept for GELU's backward (store_gemm_bias_16bit)       (node i)
//   t = copy(z) to f32               store_gemm_bias_16bit's cast for GELU
//   u = gelu(t)                      f32
//   v = copy(u) to c                 autocast's cast for fc2's GEMM
//
// becomes one GEMM that writes v = gelu(acc + bias) and z = acc + bias: three kernels fewer per
// layer and micro-batch, and u and t never go through memory. GELU reads the f32 acc + bias instead
// of its 16-bit rounding (one rounding fewer; cuBLASLt's tanh is its own): within the dtype tolerance
// of the compiled-against-eager parity tests, not equal to the bit. Applies on CUDA when t and u are
// Internal buffers written once and read only by the chain, v is touched by nothing before the cast
// that wrote it, and cuBLASLt has an algorithm (4d divisible by 8). Runs after store_gemm_bias_16bit,
// before elementwise fusion would take the casts and GELU into a kernel of their own.
//
// The backward is left to elementwise fusion: GELU's backward reads z and fc2's 16-bit input
// gradient in one vectorised NVRTC kernel. cuBLASLt's DGELU epilogue, which would apply it in the
// epilogue of the GEMM that makes that gradient, measured slower on the H200: Nsight Compute timed
// its GEMM at 49 us against the plain GEMM's 18 us, and the step was 0.27 ms slower with it than with
// the plain GEMM and the vectorised kernel (bench/RESULTS.md).
#pragma once
#include "compile/passes.h"

namespace reel::compile {

void fuse_gemm_gelu(Graph& g, PassStats& stats);

}  // namespace reel::compile
