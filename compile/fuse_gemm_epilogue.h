// GEMM epilogue fusion: a Linear layer's
//
//   y = matmul(x, W^T)            x (..., K), W^T (K, N)          (16-bit under autocast)
//  [y = copy(y) to f32]           autocast's cast of the result back to f32
//   z = add(y, bias)              bias (N)
//
// traced as two or three consecutive kernels, becomes one cuBLASLt GEMM with the BIAS epilogue
// (kernels/cuda/gemm_epilogue.h): the bias is added to the f32 accumulator and the result written
// once, in f32 when the cast was there. Only on CUDA tensors, when x's batch folds into the GEMM's
// rows, the intermediates are Internal buffers read by nothing else, and cuBLASLt has an algorithm.
// Results differ from the unfused kernels only by the GEMM's summation order (and, in 16-bit, by
// skipping the rounding of y before the bias: the fused result is the more accurate one).
#pragma once
#include "compile/passes.h"

namespace reel::compile {

void fuse_gemm_epilogue(Graph& g, PassStats& stats);

}  // namespace reel::compile
