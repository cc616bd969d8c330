// The fused attention kernels as entry points (kernels/cuda/attention.cu), for the registered
// ops and for the compiler's fusion of autocast's cast of their result (compile/passes/fuse_attention_cast.cpp).
// Declared without CUDA types.
//
// attention_fwd_into: qkv (B, T, 3d) -> y (B, T, d), lse (B, H, T), as the attention op
// computes them, and, when y16 is defined, y rounded to the compute dtype into y16 as well (the cast
// a GEMM's autocast would run next, to the bit). attention_bwd_into: dqkv, as
// attention_backward computes it, and its 16-bit copy into dqkv16 when defined. Outputs are
// contiguous; a 16-bit copy must be of the compute dtype.
//
// For f32 values the compiler may hand qkv (forward and backward) and the saved y (backward) in the
// 16-bit compute dtype instead, which halves what a step keeps for the backward. The kernels round
// qkv to that dtype before use, so a 16-bit qkv gives the same bits as its f32 source; a 16-bit y
// changes only D = dy . y by y's rounding. The forward's y and the backward's dqkv may then be
// undefined (only the 16-bit copy is written). dy may be in the compute dtype too (a GEMM's 16-bit
// result): the same bits as its f32 image give.
//
// causal: keys s <= t only (the default: the transformer decoder's case), else every key. mask:
// undefined, or the additive f32 mask the schema checked (broadcastable to (B, H, T, T), any strides).
#pragma once
#include "tensor/tensor.h"

namespace reel::cuda {

void attention_fwd_into(const Tensor& qkv, int64_t heads, DType compute, const Tensor& y, const Tensor& lse,
                        const Tensor& y16, bool causal = true, const Tensor& mask = Tensor());
void attention_bwd_into(const Tensor& dy, const Tensor& qkv, const Tensor& y, const Tensor& lse, int64_t heads,
                        DType compute, const Tensor& dqkv, const Tensor& dqkv16, bool causal = true,
                        const Tensor& mask = Tensor());

}  // namespace reel::cuda
