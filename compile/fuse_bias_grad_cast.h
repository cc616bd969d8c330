// Bias gradients from the 16-bit gradient: under autocast a Linear's output gradient g (f32) is cast
// to 16 bits for the two GEMMs of its backward, and its bias gradient is the column sum of g:
//   db  = sum(g, every dim but the last)  (node s: traced inside the bias add's backward)
//   g16 = copy(g) to bf16                 (node c: the GEMMs read g16)
// The sum then reads g16 instead, accumulating in f32 (kernels/cuda/column_sums.h), and moves to just
// after the cast when it came first (nothing between them may touch db): half the bytes
// of the largest reads of a GPT's backward (the fc layer's g is (B*T, 4d) f32), and where g has no
// other reader the elementwise kernel that produces g and g16 stops writing g at all. PyTorch's
// autocast sums the same 16-bit gradient. The result differs from the f32 sum by the 16-bit rounding
// of each summand (relative 2^-9 in bf16, averaging out over the rows): within the dtype tolerance of
// the compiled-against-eager parity tests, not equal to the bit. Applies on the GPU, when g is f32,
// contiguous and written once, and the cast is to a contiguous 16-bit buffer of g's shape.
// Then the parameter's gradient takes the sums directly: AccumulateGrad's copy of db into the
// gradient (the first micro-batch) or its in-place add (params +=, the later ones) goes, and the
// column-sum kernel writes, or adds to, the gradient in its last step: one launch fewer per bias
// and micro-batch, equal to the bit to the sum and then the add. Applies when db is read by that
// copy or add alone and nothing touches the gradient between the two.
#pragma once
#include "compile/passes.h"

namespace reel::compile {

void fuse_bias_grad_cast(Graph& g, PassStats& stats);

// Node n as one of this pass's column sums (in: the 16-bit gradient, then the parameter's gradient
// when accumulating; out: the sums): whether it adds them to its output (params +=); nullopt for
// any other node.
std::optional<bool> column_sums_accumulate(const Node& n);

}  // namespace reel::compile
