// Layer norm + cast fusion: under autocast a layer norm feeds a Linear, which casts it to 16 bits:
//   y, mean, rstd = layer_norm(x, w, b)   (y f32)      y16 = copy(y) to bf16/f16
// When the cast is y's only reader, the two become one kernel that writes y16 directly
// (kernels/cuda/layer_norm_fused.h): the f32 y is never written nor read back. mean and rstd stay
// outputs (the backward reads them). The cast may come later than the norm (its output untouched
// until then). Bit-identical to the unfused pair. CUDA tensors, f32 x only.
// The residual connection's add that feeds a pre-norm block's norm (x = r + h; layer_norm(x)) joins
// the same kernel when nothing reads x in between: the kernel computes x, writes it (the residual
// stream goes on) and normalises it, bit-identical to the add followed by the norm.
#pragma once
#include "compile/passes.h"

namespace reel::compile {

void fuse_norm_cast(Graph& g, PassStats& stats);

}  // namespace reel::compile
