// A second stream beside the plan's main one, for kernels that nothing right after them waits for.
//
// A transformer's backward sums each Linear's bias gradient over the rows of a micro-batch (a
// column_sums node: qkv's after attention's backward, fc's after GELU's), and nothing reads that sum
// until the next micro-batch adds to it or the optimizer takes it. The GEMMs right after it read the
// same gradient for the input and weight gradients. On one stream the sum's launch, its ramp and its
// last blocks' finish lie between those kernels; on a second stream it runs beside them (a GEMM of
// one wave or less leaves multiprocessors idle, and its tail leaves more), and the main stream waits
// for it only where it must:
//
//   main:  ... gelu_backward ── fc dX GEMM ──────── fc dW GEMM ── norm backward ── ...
//                                       └─ fork ─ side: column_sums (fc bias) ─┘ join
//
// A CNN's backward is alike: a convolution's weight gradient (from dY and the layer's input) is read by
// nothing until the gradients' casts or the optimizer, while the data gradient goes on down the net.
//
// Rules (side_joins and buffer_lifetimes):
//   - A node of stream 1 runs on the side stream after a fork: the side stream first waits for all
//     the main stream has enqueued before the node. Side nodes run in graph order among themselves.
//   - Its join is the first later main-stream node that reads or writes one of its outputs or writes
//     one of its inputs, and at the latest the node after the main stream's last reader of its
//     inputs (they live no longer than on one stream) and its `hold` main-stream nodes more; the main
//     stream waits for the side node before that node, or at the end of the plan's run (of its CUDA
//     graph) when there is none.
//   - Memory: the side node's buffers live until the node before its join (memory_plan.h's
//     buffer_lifetimes), so the planner hands none of their bytes to a node the main stream runs
//     meanwhile.
//   - Finish counters: the column-sum kernels and the stem convolution's weight gradient count their
//     blocks in the side stream's own lane of counters (kernels/cuda/last_block.cuh), so they never
//     share one with a main-stream kernel; the other side ops count none.
// The values are the same as on one stream (the same kernels on the same data, the same order of
// sums): only when the kernels run changes.
//
// The pass (side_stream) puts a node there when it is on a GPU, its op's kernels may run beside the
// main stream's (runs_beside in side_stream.cpp: column sums, embedding backward, multi-tensor casts,
// the weight gradients of Linears and convolutions; none shares a workspace with the main stream), its
// inputs have at most 4 MiB each and its work at most 1.5 GFLOP
// (beside the kernels of larger gradients, which fill the GPU by themselves, it measured slower) and
// at least one node runs between it and its join. A node whose inputs nothing reads after it (a micro-batch's embedding
// gradient, its weight gradients' casts into the f32 gradients) joins at once by the rule above; for it the pass holds
// its inputs up to Node::hold = 4 main-stream nodes longer, so that it runs beside the next micro-batch's first
// kernels, where the memory plan shows the step's planned peak unchanged. A second pass (side_stream_late) then moves
// each side node to just before the last main-stream reader of its inputs, so that it runs beside that reader alone: in
// a transformer's backward that is the weight-gradient GEMM (few output tiles: d x 3d or d x 4d), where the
// data-gradient GEMM before it (tokens x d) may fill the GPU by itself, so that a side kernel's blocks would delay some
// of its tiles to a second wave. Both run after every other pass; off under a memory limit, whose plan they would
// change lifetimes in.
#pragma once
#include <vector>

#include "compile/ir/graph.h"
#include "compile/passes/passes.h"

namespace reel::compile {

// For each node: its join (see above) if it runs on the side stream, -1 if it does not.
std::vector<int> side_joins(const Graph& g);
// Whether node n is small enough that the kernels beside it leave room for it: inputs of at most 4 MiB
// each and at most 1.5 GFLOP of work (larger ones fill the GPU by themselves; measured in side_stream.cpp).
bool small_enough_to_run_beside(const Node& n);

void assign_side_stream(Graph& g, PassStats& stats);      // side_stream
void run_side_nodes_late(Graph& g, PassStats& stats);     // side_stream_late
// The casts of a step's inputs (a CNN's images into 16-bit channels-last) moved up to kMaxHoist
// main-stream nodes earlier, onto the side stream: the next micro-batch's first convolution finds its
// input cast while the previous micro-batch's backward ran. Where the planned peak allows.
void cast_inputs_early(Graph& g, PassStats& stats);  // input_casts_early

}  // namespace reel::compile
