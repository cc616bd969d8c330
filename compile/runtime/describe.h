// Human-readable views of a Plan: what `reel plan` and REEL_LOG=plan,memory print.
#pragma once
#include <string>

#include "compile/runtime/plan.h"

namespace reel::compile {

// One line: mode, kernels, graphs, buffers by kind.
std::string plan_summary(const Plan& p);
// Per device: the arena (planned peak) against the sum of the Internal buffers (no reuse), and the
// bytes of External and Input buffers.
std::string memory_summary(const Plan& p);
// What recomputation for a memory limit did (CompileOptions::memory_limit): the ops cloned into the
// backward, by op and count, the busiest node's live bytes before and after, and the FLOPs added
// per step; "" when nothing was recomputed and no limit was asked for.
std::string recompute_summary(const Plan& p, size_t limit);
// Every kernel: index, op (and the ops fused into it), its inputs and outputs as buffer refs with bytes.
std::string plan_listing(const Plan& p, size_t max_kernels = SIZE_MAX);
// Graphviz: kernels as boxes, buffers as ellipses (Internal ones with their arena offset).
std::string plan_dot(const Plan& p);

std::string bytes_str(size_t bytes);  // "1.5 MiB"
// The ops of a fused node, runs of one op counted: "add+gelu", "adamw_step x53".
std::string fused_str(const std::vector<std::string>& ops, const char* sep = "+");

}  // namespace reel::compile
