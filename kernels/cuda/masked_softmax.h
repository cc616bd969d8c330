// Masked softmax along the last dim, forward and backward, for the compiler's fusion of attention's
//   z = masked_fill(x, mask, fill); y = softmax(z, -1)        and its backward
//   d = softmax_backward(g, y, -1); dx = masked_fill(d, mask, 0)
// into one kernel each (compile/passes/fuse_masked_softmax.cpp). x, y, g, dx: (rows, C) contiguous f32; mask:
// (mask_rows, C) contiguous f32 (nonzero = masked), row r of x using mask row r % mask_rows (a (T, T)
// causal mask under (B, H, T, T) scores). y16 / dx16, when defined, also receive the result rounded
// to their 16-bit dtype (autocast's cast for the next GEMM, in the same pass). The arithmetic and its
// order are softmax.cu's, so the fused results equal the unfused ones to the bit.
// Declared without CUDA types; defined in masked_softmax.cu.
#pragma once
#include "tensor/tensor.h"

namespace reel::cuda {

void masked_softmax_fwd(const Tensor& x, const Tensor& mask, double fill, const Tensor& y, const Tensor& y16);
void masked_softmax_bwd(const Tensor& g, const Tensor& y, const Tensor& mask, const Tensor& dx, const Tensor& dx16);

}  // namespace reel::cuda
