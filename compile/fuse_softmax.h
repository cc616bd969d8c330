// Masked-softmax fusion: attention's
//   z = masked_fill(x, mask, -inf)   y = softmax(z, -1)   [y16 = copy(y) to bf16/f16]
// and, in the backward,
//   d = softmax_backward(g, y, -1)   dx = masked_fill(d, mask, 0)   [dx16 = copy(dx) to bf16/f16]
// traced as two or three kernels, become one (kernels/cuda/masked_softmax.h): the masked scores are
// never written, and the cast for the next GEMM is made in the same pass. The first two nodes must be
// consecutive; the cast may come later (its output is untouched until then). Rows are the last dim,
// the mask a contiguous (T, C) f32 tensor broadcast over the leading dims, every other tensor
// contiguous f32. The kernels repeat softmax.cu's arithmetic in its order: results are bit-identical.
// CUDA tensors only.
#pragma once
#include "compile/passes.h"

namespace reel::compile {

void fuse_masked_softmax(Graph& g, PassStats& stats);

}  // namespace reel::compile
