// Layer norm writing its result in 16 bits, for the compiler's fusion of autocast's
//   y = layer_norm(x, w, b, eps)  (f32);  y16 = y.to(bf16 | f16)     (the input of the next GEMM)
// into one kernel (compile/fuse_norm_cast.h): the f32 y is never written. x: f32 (rows, cols), any
// strides; w, b: (cols) f32 or undefined; y16: contiguous bf16 or f16 of x's size; mean, rstd: (rows)
// f32, written as layer_norm writes them (the backward reads them). The arithmetic is layer_norm's,
// and the rounding to 16 bits the cast's, so y16 equals the unfused cast of y to the bit.
// Declared without CUDA types; defined in norm.cu.
#pragma once
#include "tensor/tensor.h"

namespace reel::cuda {

void layer_norm_fwd_16(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y16,
                       const Tensor& mean, const Tensor& rstd);

}  // namespace reel::cuda
