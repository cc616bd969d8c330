// A layer norm backward's parameter sums taken off the main stream's path between kernels.
//
// On a GPU, layer_norm_backward_add runs two kernels: the row-in-registers backward, whose blocks
// each leave one row of partial sums of dw, db (and of the 16-bit copy's columns: the bias gradient of
// the Linear before), and a finish kernel that adds those rows up. Nothing reads dw, db or the bias
// gradient until the micro-batch's end (where they are added into the step's gradients) or the
// optimizer, yet the finish runs between the backward and the GEMMs that read its dx: a small grid
// that waits for the backward's last block, and whose end the next GEMM (cuBLAS's, launched without
// programmatic dependence) waits for. Measured (bench/RESULTS.md, seventeenth step) by leaving the
// finish out: gpt-tiny's step 7.9% and gpt-small's 4.5% shorter.
//
//   before:  LN backward [backward; finish] ── dX GEMM ── ... ── LN backward [backward; finish] ── ...
//   after:   LN partials ── dX GEMM ── ... ── LN partials + the previous one's sums ── ...
//            (the micro-batch's last sums: a layer_norm_param_sums node, which the side stream runs)
//
// The pass (split_norm_param_sums, the schedule stage's first) rewrites each layer_norm_backward_add
// whose device says how many blocks its backward runs (kernel_parts: the kernel's one wave of resident
// blocks; 0 where the row-in-registers kernel does not take the call, which then stays one node) into
//   layer_norm_backward_partials (its inputs but the sums to add to; attrs + parts)
//       -> out, part (parts, S, cols) f32 [, out16]           (part: a new Internal buffer)
//   layer_norm_param_sums (part [, sums_in]; attr accumulate) -> dw, db [, sums]
// and folds each sums node into the next norm backward of its micro-batch (attr finish: that kernel's
// warps add the partials up before their rows, in the finish kernel's order), where no node between
// them touches what the sums write or add to; the others stay nodes of their own, placed before the
// first node that does (or the next micro-batch's first), where side_stream takes them.
// The same kernels' arithmetic with the same grids and the same order of sums as the one node: the
// same bits. The partials live from their backward to the node that adds them up (parts x S x cols
// floats, under a MiB at gpt-small's size).
// Off under a memory limit (with the side stream) and on a CPU (no kernel answers kernel_parts).
#pragma once
#include <cstdint>
#include <functional>

#include "compile/ir/graph.h"
#include "compile/passes/passes.h"

namespace reel::compile {

// How many partial rows node n's backward would leave (0: leave the node whole).
using NormPartsFn = std::function<int64_t(const Graph& g, const Node& n)>;

// The pipeline's entry: the device's kernel_parts answers.
void split_norm_param_sums(Graph& g, PassStats& stats);  // split_norm_param_sums
// The same with `parts` answering for each layer_norm_backward_add, taken as the device's word (no call
// is checked against its kernels): tests, on a CPU's graph relabelled as a GPU's.
void split_norm_param_sums(Graph& g, PassStats& stats, const NormPartsFn& parts);

}  // namespace reel::compile
