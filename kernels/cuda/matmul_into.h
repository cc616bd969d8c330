// The CUDA matmul into a caller's result, the kernel of the matmul_into op (autocast's cast folded
// into the GEMM, a weight gradient written or added by it):
//   out (..., M, N) = a (..., M, K) @ b (..., K, N), batch dims broadcast as in the matmul op;
// a and b share a dtype; out is contiguous, in their dtype or f32 (f16/bf16 operands then give an
// f32 result straight from the f32 accumulator, with no 16-bit rounding).
// Declared without CUDA types; defined in matmul.cu.
#pragma once
#include "tensor/tensor.h"

namespace reel::cuda {

// accumulate: out += a @ b (cuBLAS's beta = 1), as weight gradients accumulate over micro-batches.
void matmul_into(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate = false);

}  // namespace reel::cuda
