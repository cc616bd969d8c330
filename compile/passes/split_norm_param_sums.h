// A layer norm backward's parameter sums as a node of their own, which the side stream can run.
//
// On a GPU, layer_norm_backward_add runs two kernels: the row-in-registers backward, whose blocks
// each leave one row of partial sums of dw, db (and of the 16-bit copy's columns: the bias gradient of
// the Linear before), and a finish kernel that adds those rows up. Nothing reads dw, db or the bias
// gradient until the micro-batch's end (where they are added into the step's gradients) or the
// optimizer, yet on one node the finish runs between the backward and the GEMMs that read its dx: a
// small grid that waits for the backward's last block, and whose end the next GEMM (cuBLAS's, launched
// without programmatic dependence) waits for.
//
// Off by default (REEL_PASSES=+split_norm_param_sums turns it on): measured side by side on H100s
// (bench/RESULTS.md, seventeenth step) in three calls, the sums beside made gpt-tiny's step 2.1%, 0.1%
// and 0.0% shorter and gpt-small's 0.1%, 0.9% and 0.8%, within the spread between machines, and
// gpt-small's measured peak was 2 MiB higher in the last two. (Leaving the finish out altogether, wrong values and
// all, had measured 7.9% and 4.5%: the kernel's launch and its wait are not all that went.) Tried and
// dropped: the sums added up by the next norm backward's warps before their rows (no node of their
// own): gpt-tiny -3.2% and -0.5% in two calls, gpt-small 0.5% and 1.0% slower, its peak 2 MiB higher.
//
//   before:  ... ── layer_norm_backward_add [backward; finish] ── dX GEMM ── ...
//   after:   ... ── layer_norm_backward_partials ── dX GEMM ── ...
//                               └─ fork ─ side: layer_norm_param_sums ─┘ join (a few nodes later)
//
// The pass (split_norm_param_sums, the schedule stage's first) rewrites each layer_norm_backward_add
// whose device says how many blocks its backward runs (kernel_parts: the kernel's one wave of resident
// blocks; 0 where the row-in-registers kernel does not take the call, which then stays one node) into
//   layer_norm_backward_partials (its inputs but the sums to add to; attrs + parts)
//       -> out, part (parts, S, cols) f32 [, out16]           (part: a new Internal buffer)
//   layer_norm_param_sums (part [, sums_in]; attr accumulate) -> dw, db [, sums]
// The same kernels with the same grids and the same order of sums as the one node: the same bits.
// side_stream then takes layer_norm_param_sums, its partials (parts x S x cols floats, under a MiB at
// gpt-small's size) held past the next main-stream nodes where the planned peak grows by no more than
// their bytes: what the one node's kernel took from the caching allocator for them at that point.
// Off under a memory limit (with the side stream) and on a CPU (no kernel answers kernel_parts).
// What it keeps for the next step: the two ops, with every backend's kernels and harness cases, and
// kernel_parts (kernels/dispatch.h), the way for a pass to size a buffer by a kernel's grid.
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
