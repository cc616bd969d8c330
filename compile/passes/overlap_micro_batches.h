// A micro-batch's first forward kernels run ahead, on a third stream, under the backward before it.
//
// A step of ACCUM micro-batches is traced as forward 0, backward 0, forward 1, backward 1, ...: one
// chain of kernels, each waiting for the one before. Forward k+1 reads nothing backward k writes (the
// weights change only at the optimizer; the gradients backward k adds to are read by nothing before
// the step's end), so its first kernels may start before backward k's last ones have run. On small
// models those kernels are short and latency-bound (a layer norm of 2048 rows, a GEMM of one wave):
// two chains side by side fill the gaps one leaves.
//
//   main:    ... backward k, layer 1 ── backward k, layer 0 ──┐ join ── forward k+1, layer 1 ── ...
//                          └─ fork ─ lane 2: forward k+1: embedding, layer 0 ─┘
//   lane 1:  the backward's weight gradients and sums, beside both (side_stream.h)
//
// The pass moves the first `ahead` main-stream nodes of each micro-batch's forward (Node::phase
// "micro-batch k+1", from its first main-stream node on) up before the last `under` main-stream
// nodes of the phase before it, onto stream 2, where:
//   - every moved node is independent of every node it passes (reads nothing they write, writes
//     nothing they read or write): the same values, in any order the streams run them;
//   - its op's kernels may run beside any other stream's (runs_ahead: forward ops that share no
//     device memory with other kernels but their operands; the ones that count blocks use their
//     lane's finish counters, kernels/cuda/last_block.cuh; its GEMMs are cuBLASLt's with an
//     epilogue, whose workspace comes from the lane's own allocator blocks, kernels/cuda/cuda_common.cuh);
//   - the step's planned peak stays where it was (memory_plan.h: a moved node's buffers live until
//     its join); where it would grow, half as many nodes are tried, down to one.
// Lane 2 runs the moved nodes in graph order after a fork from the main stream at their new place;
// the main stream waits for one (side_stream.h's side_joins) before the first node of another stream
// that touches its outputs or writes its inputs: forward k+1's first kernel left on the main stream.
// Off on a CPU (one kernel at a time) and under a memory limit. `ahead` and `under` come from
// REEL_OVERLAP_KERNELS ("ahead,under"; default 8,16, measured in overlap_micro_batches.cpp).
#pragma once
#include "compile/ir/graph.h"
#include "compile/passes/passes.h"

namespace reel::compile {

// The pipeline's entry: `ahead` and `under` from REEL_OVERLAP_KERNELS, or the defaults.
void overlap_micro_batches(Graph& g, PassStats& stats);  // overlap_micro_batches
void overlap_micro_batches(Graph& g, PassStats& stats, int ahead, int under);

}  // namespace reel::compile
