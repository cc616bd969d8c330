// Horizontal (multi-tensor) fusion of the optimizer step.
//
// A traced optimizer step is one adamw_step (or sgd_step) node per parameter, each a tiny kernel; a
// GPT of 12 layers has 101 of them. They are independent updates that read the same step-wide
// tensors (found_inf, lr, and AdamW's step count), so a run of consecutive such nodes with the same
// attrs and the same step-wide refs becomes ONE node whose kernel updates every (param, grad, state)
// of the run: on the GPU a single multi-tensor launch (kernels/cuda/multi_tensor_optim.h; one per
// dtype and per 128 tensors), on the CPU one OpenMP loop over chunks of every tensor.
//
// The fused node, for tensors 0..k-1 of the run:
//   adamw_step  inputs  p0 g0 m0 v0  p1 g1 m1 v1 ...  found_inf? lr step   outputs  p0 m0 v0  p1 m1 v1 ...
//   sgd_step    inputs  p0 g0 b0?    p1 g1 b1?    ...  found_inf? lr        outputs  p0 b0?    p1 b1?    ...
// (b: the momentum buffer, present in every node of a run or in none). `fused` lists the k ops, the
// node is in_place, and stats.fused grows by k - 1. Every ref read or written stays on the node, so
// memory planning and dead-code elimination see the same lifetimes as before.
//
// Math: kernels/optim_math.h, the formula of the per-tensor kernels, with the same per-step
// coefficients: a fused plan is bit-identical to an unfused one. Nodes join a run only when their
// memory is disjoint from what the rest of the run writes (updating them at once cannot change what
// any of them reads). CUDA nodes fuse only in a build with the CUDA backend.
#pragma once
#include "compile/graph.h"
#include "compile/passes.h"

namespace reel::compile {

void fuse_optimizer(Graph& g, PassStats& stats);

}  // namespace reel::compile
