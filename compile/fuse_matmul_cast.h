// Fusions into a GEMM's output. First, autocast's cast into the GEMM that precedes it:
//
//   y = matmul(a, b)          16-bit operands and result              (node i)
//   ...                       nodes that touch neither y nor z
//   z = copy(y) to f32        the cast back to f32, contiguous         (node j > i)
//
// becomes one GEMM at node i that writes z directly in f32 from its f32 accumulator
// (kernels/cuda/matmul_into.h): one kernel and one round trip through memory fewer, and one
// rounding to 16 bits fewer. Applies when y is an Internal buffer read only by the copy (and not a
// graph output) and z's buffer is Internal and written only by the copy — then no node between i and
// j can see the difference. CUDA tensors only; everything else is left as traced. Not where z is read
// once by one elementwise op: elementwise fusion folds the cast into that op's kernel instead, which
// moves half the bytes (y in 16 bits) and keeps eager's values. Nor where z is read once by an
// attention backward as its dy: that backward reads the 16-bit y as it is (same bits) and the copy
// goes.
#pragma once
#include "compile/passes.h"

namespace reel::compile {

void fuse_matmul_cast(Graph& g, PassStats& stats);

// Weight gradients written by their GEMM: a 2-D GEMM's result y, read only by the node that puts it
// into a parameter's gradient — the first micro-batch's copy (AccumulateGrad's private copy) or a
// later one's in-place add (params +=), possibly through a transposed view (a Linear's W^T) — is
// computed straight into the gradient, transposed operands swapped (z = (a b)^T = b^T a^T), with
// beta = 1 for the add. Applies when no node between the GEMM and that copy/add touches the
// gradient, which then is simply written earlier. Run after fuse_matmul_cast (so 16-bit GEMMs that
// now write f32 qualify). CUDA tensors only.
void fuse_matmul_accumulate(Graph& g, PassStats& stats);

}  // namespace reel::compile
