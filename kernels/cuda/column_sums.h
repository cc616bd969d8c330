// Column sums into an f32 result, for the compiler's bias-gradient fusion (compile/fuse_bias_grad_cast.h):
//   out (N) = sum over rows of x (..., N)     x contiguous f32, f16 or bf16 (accumulated in f32)
// A 16-bit x with N a multiple of 8 (16-byte aligned) takes a kernel of its own that reads 8 columns a
// thread per 16-byte load; anything else the Sum op's column reduction (kernels/cuda/reduce.cu), to
// its bits. Both split the rows in fixed chunks and add them in order: the same bits on every run.
// Declared without CUDA types; defined in reduce.cu.
#pragma once
#include "tensor/tensor.h"

namespace reel::cuda {

void column_sums_into(const Tensor& x, const Tensor& out);

}  // namespace reel::cuda
