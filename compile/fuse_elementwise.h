// Elementwise fusion: runs of consecutive elementwise nodes become one kernel that computes the whole
// chain per element, reading each input once and writing only what is read after the chain.
//
//   k1: t = add(x, bias)   k2: u = gelu(t)   k3: v = mul(u, s)    ->   k: v = [add gelu mul](x, bias, s)
//
// First, an elementwise node over contiguous tensors of one size that reads a fusable producer's
// output traced in another shape (a reshape between them) is rewritten in the producer's shape (same
// bytes, same linear order). Then each fusable node moves up (at most 16 places) to just after the last writer of its inputs
// when that writer is a fusable node of its shape and nothing in between touches its outputs: a chain
// split by unrelated nodes (attention scales q, copies k, then casts q) becomes consecutive.
// A group is a maximal run of consecutive nodes (graph order; consecutive is what makes the rewrite
// safe: nothing runs between its members) where every node
//   - is an op of kernels/ops.def's elementwise family, clamp_scalar, or a copy between two tensors
//     of one device (a cast or a layout copy), with no pass-made kernel yet;
//   - iterates the group's shape (its output's shape) and writes a contiguous ref;
//   - touches tensors of the group's one device only;
// and where every buffer the group writes is referenced, by every node of the group, with exactly
// one geometry (buffer, shape, strides, offset, dtype). So element e of the group's loop reads and
// writes the written buffers only at element e: a value produced inside the group is taken from the
// register, not memory, and no element can see another's write. Inputs the group does not write may
// be broadcast or strided arbitrarily.
//
// A group of k >= 2 nodes becomes one Node: op = the last op, fused = the op names, kernel = the
// chain (compile/fused_expr.h) run by the CPU executor or as an NVRTC kernel (compile/nvrtc.h);
// inputs = the refs it reads from memory, outputs = the refs it writes. A value is not written at
// all when its buffer is Internal, not a graph output and read by no node outside the group.
// stats.fused grows by k - 1. Results: for f32/f64 the same formulas in the same types as the
// unfused kernels (bit for bit on the CPU); f16/bf16 intermediates stay in float.
#pragma once
#include "compile/passes.h"

namespace reel::compile {

// build_kernels false: the fused nodes carry a kernel that refuses to run (nothing is compiled); for
// graphs that are only planned, never run.
void fuse_elementwise(Graph& g, PassStats& stats, bool build_kernels = true);

}  // namespace reel::compile
