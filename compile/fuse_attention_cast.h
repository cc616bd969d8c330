// Attention + cast fusion: under autocast, the f32 result of the fused attention op feeds a GEMM, which
// casts it to 16 bits first:
//   y, lse = causal_attention(qkv)           (y f32: the backward reads it)     y16 = copy(y) to bf16
//   dqkv = causal_attention_backward(...)    (f32: the bias gradient sums it)   d16 = copy(dqkv) to bf16
// The attention kernel writes the 16-bit copy as well (kernels/cuda/attention.h), and the cast node
// goes: one kernel and one read of the f32 result fewer per op. The f32 result stays (it has other
// readers). Applies when the cast is to the op's compute dtype, its output is contiguous and untouched
// before the cast, and the tensors are on the GPU; the copy equals the unfused cast to the bit.
//
// Then, where the forward's f32 y is read by nothing but the backward (the GPT's case: y16 feeds the
// projection's GEMM), the backward reads y16 instead and the forward no longer writes the f32 y: the
// step keeps y for the backward in 16 bits, as PyTorch's autocast does. Only the backward's row sums
// D = dy . y change (by y's rounding), so this one step is within tolerance of eager, not bitwise.
// Likewise a backward whose f32 dqkv has no reader left (its GEMMs and the bias gradient read the
// 16-bit copy) writes only the copy.
#pragma once
#include "compile/passes.h"

namespace reel::compile {

void fuse_attention_cast(Graph& g, PassStats& stats);

}  // namespace reel::compile
