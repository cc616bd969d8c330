// The pass pipeline: what runs on a traced graph before its memory is planned, in order. One entry
// per pass, grouped by stage; pipeline.cpp holds the list, one line each, and is the place to read
// (or change) the order. Each pass file opens with the pattern it rewrites and why.
//
//   cleanup  dead code, constants folded at build time, common subexpressions
//   fusion   chains of nodes rewritten into the fused ops of kernels/ops.def, where the device of
//            the tensors has the op (supports) and takes the call (supports_call)
//   schedule which stream runs a node: column sums beside the main stream (side_stream.h)
//   memory   with a memory limit (PassOptions::memory_limit), recomputation: nodes cloned into the
//            backward until the step's live bytes fit (recompute.cpp)
//   (then the Plan places every Internal buffer in one arena by liveness: passes/memory_plan.h)
//
// Turning passes off, for study and for bisecting a wrong result: PassOptions::disabled (from
// CompileOptions::disabled_passes) and the environment, REEL_PASSES=-name,-name (every name in
// pipeline(); a name not there is an error that lists them). A pass off by default
// (Pass::on_by_default) runs when named in PassOptions::enabled (CompileOptions::enabled_passes) or
// as REEL_PASSES=+name; off wins over on. PassOptions::fuse = false turns the whole fusion stage
// off: the plan then runs eager's own kernels, bit for bit.
#pragma once
#include <string>
#include <vector>

#include "compile/ir/graph.h"
#include "compile/passes/passes.h"

namespace reel::compile {

enum class PassStage { Cleanup, Fusion, Schedule };

struct Pass {
  const char* name;  // as REEL_PASSES and `reel plan` spell it
  PassStage stage;
  void (*run)(Graph& g, PassStats& stats);
  const char* what;  // one line for listings
  // Off unless asked for by name (PassOptions::enabled, REEL_PASSES=+name): a pass that computes the
  // right values but measured slower than the kernels it replaces, kept for study and for the work
  // that makes it pay, or one whose GPU kernels have not yet run on a GPU (pipeline.cpp says which).
  bool on_by_default = true;
  // Off when the step has a memory limit (PassOptions::memory_limit): a pass that moves nodes earlier
  // and so could raise the live bytes the recompute step is asked to fit.
  bool under_memory_limit = true;
};

// Every pass, in the order the pipeline runs them.
const std::vector<Pass>& pipeline();

struct PassOptions {
  bool fuse = true;                   // the fusion stage at all
  std::vector<std::string> disabled;  // passes turned off by name
  std::vector<std::string> enabled;   // passes off by default turned on by name
  // Bytes of live step memory per device above which, after the other passes, recompute_to_fit
  // (recompute.cpp) clones nodes into the backward; 0: no recomputation.
  size_t memory_limit = 0;

  PassOptions(bool fuse = true, std::vector<std::string> disabled = {}, size_t memory_limit = 0)
      : fuse(fuse), disabled(std::move(disabled)), memory_limit(memory_limit) {}
};

// The passes of `options` (and REEL_PASSES) on g, in order; `stats` gets the node counts before and
// after. Under REEL_LOG=passes each pass logs the nodes it left. Before the schedule stage (and again
// at the end) every node a pass built without a phase (Node::phase) gets one from the traced nodes
// whose outputs it writes, or from its neighbours: the schedule passes read them.
Graph optimize_graph(Graph g, const PassOptions& options, PassStats& stats);

// The names REEL_PASSES turns off ("-elementwise,-optimizer" -> {"elementwise", "optimizer"}) and
// on ("+elementwise_column_sums"); a name that is no pass, or an item without its sign, is a
// reel::Error listing the passes. Read from the environment on each call.
std::vector<std::string> passes_disabled_by_env();
std::vector<std::string> passes_enabled_by_env();

}  // namespace reel::compile
