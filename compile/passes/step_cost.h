// Step cost — FLOPs of a node and a roofline estimate of a graph's run time, for choosing between
// plans that all fit a memory budget (compile/runtime/memory_budget.h) and for weighing what a
// recomputation adds (recompute.cpp).
//
// FLOPs of a node, roughly:
//   GEMM (matmul, gemm_epilogue)   2 M N K                  (M N outputs, K the inner dim)
//   convolution                    2 * outputs * C_in/groups * kh * kw   (each backward op as many)
//   attention                      4 B T^2 d   (Q K^T and P V, the causal mask not discounted; its
//                                               backward 2.5 times that: the scores again, four products)
//   anything else                  one per output element
// Time of a node: the slower of its arithmetic and its memory traffic, plus what starting it costs:
//   t = max(flops / R, bytes / BW) + launch
//   bytes   every input and output view read or written once
//   R       the device's dense rate for the node's dtype (16-bit tensor cores, f32, f64)
//   launch  per kernel: a replayed CUDA graph's node, an eager launch (the host's dispatch included)
// The rates are round figures for an H200-class GPU and a few CPU cores. The estimate is meant to rank
// candidates of one model on one device (a smaller micro-batch against a larger one that recomputes),
// not to predict a time: `reel bench` measures it.
#pragma once
#include "compile/ir/graph.h"

namespace reel::compile {

double node_flops(const Node& n);

// The graph's FLOPs, summed over its nodes.
double graph_flops(const Graph& g);

// How the graph's nodes are started: one by one from the host (eager), or replayed from a plan.
enum class Launch { Eager, Replayed };

// Estimated seconds for one run of `g` on `device` (see the top of this file).
double estimate_seconds(const Graph& g, Device device, Launch launch);

}  // namespace reel::compile
