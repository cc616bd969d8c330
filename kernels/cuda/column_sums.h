// Column sums into an f32 result, for the compiler's bias-gradient fusion (compile/fuse_bias_grad_cast.h):
//   out (N) = sum over rows of x (..., N)     x contiguous f32, f16 or bf16 (accumulated in f32)
// The same kernels, split and order as the Sum op's column reductions (kernels/cuda/reduce.cu), so the
// result is the same on every run. Declared without CUDA types; defined in reduce.cu.
#pragma once
#include "tensor/tensor.h"

namespace reel::cuda {

void column_sums_into(const Tensor& x, const Tensor& out);

}  // namespace reel::cuda
