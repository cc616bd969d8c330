// Layer-norm kernels with a neighbouring op folded in, for the compiler's fusion passes. Declared
// without CUDA types; defined in norm.cu.
//
// layer_norm_fwd_16 — autocast's cast of the result into the norm (compile/fuse_norm_cast.h):
//   y = layer_norm(x, w, b, eps)  (f32);  y16 = y.to(bf16 | f16)     (the input of the next GEMM)
// as one kernel: the f32 y is never written. x: f32 (rows, cols), any strides; w, b: (cols) f32 or
// undefined; y16: contiguous bf16 or f16 of x's size; mean, rstd: (rows) f32, written as layer_norm
// writes them (the backward reads them). The arithmetic is layer_norm's, and the rounding to 16 bits
// the cast's, so y16 equals the unfused cast of y to the bit. With `addend` and `sum_out` (f32, x's
// shape; the residual connection's add before a pre-norm block's norm) the norm is of x + addend,
// which is also written to sum_out, as the unfused add would store it: equal to the bit too.
//
// layer_norm_bwd_add — the residual branch's gradient added to dx (compile/fuse_norm_backward_add.h):
//   dx, dw, db = layer_norm_backward(g, x, w, mean, rstd);  out = dx + residual
// as one kernel pass over the rows: out holds dx + residual, and dx itself is never written. Inputs
// as layer_norm_backward's; residual and out: x's shape and dtype, contiguous. Each element is dx
// rounded to x's dtype plus residual, as the unfused add computes it: equal to the bit. When out16 is
// given (bf16 or f16, contiguous), out is also written rounded into it: autocast's cast of the
// residual stream's gradient for the next GEMM, equal to the unfused cast to the bit. When sums16 is
// given too (f32, contiguous, one value per normalised column), the same pass sums out16's values
// per column into it, or adds the sums to it with `accumulate`: the bias gradient of the Linear whose
// output gradient out16 is, as kernels/cuda/column_sums.h would sum it (f32 sums of the 16-bit
// values, in another fixed order: equal to those sums up to f32 rounding, the same bits every run).
#pragma once
#include "tensor/tensor.h"

namespace reel::cuda {

void layer_norm_fwd_16(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y16,
                       const Tensor& mean, const Tensor& rstd, const Tensor& addend = Tensor(),
                       const Tensor& sum_out = Tensor());

void layer_norm_bwd_add(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                        const Tensor& residual, const Tensor& out, const Tensor& dw, const Tensor& db,
                        const Tensor& out16 = Tensor(), const Tensor& sums16 = Tensor(), bool accumulate = false);

}  // namespace reel::cuda
