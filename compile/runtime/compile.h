// compile() — a step function traced once and replayed as a plan, as torch.compile does for a
// function and TinyJit for a step.
//
//   auto step = compile::compile([&](const std::vector<Tensor>& in) { ...; return {loss}; },
//                                {compile::Mode::ReduceOverhead});
//   for (...) std::vector<Tensor> out = step({x0, y0, x1, y1});
//
// Lifecycle, per input signature (the shapes, dtypes and devices of the arguments):
//   call 0   runs the function eagerly: warm-up (lazily created optimizer state, cuDNN algorithm
//            choice, library handles), so that the next call sees the steady state;
//   call 1   runs it eagerly under the Tracer and builds a Plan (compile/runtime/plan.h) from the tape;
//   call 2+  replays the Plan (in reduce-overhead mode the first replay also captures the graphs).
// With CompileOptions::trace_without_running the first two calls are one: call 0 traces the function
// in meta mode (kernels/dispatch.h: every op checked and recorded, no kernel run, nothing allocated),
// builds the Plan and runs it outside any CUDA graph; call 1 captures. The step's memory is then the
// plan's from the first call: nothing runs at eager's footprint, which is what lets a memory limit
// with recomputation (memory_limit) hold from the start. The function must find everything it
// updates already made (compile_train_step has the optimizer create its state first), read no
// tensor's value on the host, and leave no host state of its own behind beyond what a call leaves;
// a trace that breaks any of this is a reel::Error naming the buffer or the op.
// A call whose signature matches no cached plan is a recompile (logged under REEL_LOG=recompiles
// with the mismatch); past `cache_limit` plans the function runs eagerly with a one-time warning,
// as torch.compile does at its recompile limit. A trace containing what a replay cannot honour (a
// tensor's values read on the host, by item() or to_vector(), whatever its device; random numbers
// host code drew from a Generator without a random op) is a graph break: that signature then always
// runs eagerly, reported with the op name and reason. Random ops (dropout, rand, randn) replay with
// fresh numbers, the ones an eager call would draw (Graph::random_sources).
//
// The contract, as for every tracing compiler: the function must do the same ops on every call
// with the same signature, and take host values only through its arguments — a host value that
// does not come from a tensor (a host-side lr, a counter) is frozen into the plan. reel's own
// training step meets it: the optimizer's lr and step count and the GradScaler live on the device.
// Results are fresh tensors each call. Parameters and state are updated in place, as eagerly.
// The plans of one function share one arena per device (arena_pool.h), so a function with many
// signatures (length buckets, recompiles) holds the largest plan's activations, not their sum; a
// compiled function is therefore called from one thread at a time.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compile/runtime/plan.h"

namespace reel::compile {

// Length buckets (CompileOptions::buckets): dim `dim` of the arguments listed in `inputs` changes from
// call to call (micro-batches of sentences); each call pads it up to the smallest of `sizes` that holds
// the call's longest, each argument with its own pad value, so that calls share one plan per bucket
// instead of tracing one per length, as torch._dynamo.mark_dynamic with a range lets a graph serve many.
// The padding must leave the function's results as they were: right-padded token ids under a causal
// model, with the targets padded with cross_entropy's ignore_index, do (tests/test_compile_buckets.cpp).
struct LengthBuckets {
  std::vector<size_t> inputs;      // which arguments
  int64_t dim = 1;                 // which dim of each
  std::vector<int64_t> sizes;      // ascending, positive
  std::vector<double> pad_values;  // one per entry of `inputs`
  // smallest, 2 smallest, 4 smallest, ... up to largest (largest itself last when not reached exactly).
  static std::vector<int64_t> powers_of_two(int64_t smallest, int64_t largest);
};

struct CompileOptions {
  Mode mode = Mode::Default;
  int cache_limit = 8;  // plans kept per function (one per input signature)
  bool fuse = true;     // fusion passes (off: the plan runs eager's kernels, bit for bit)
  // Passes turned off by name (compile/passes/pipeline.cpp lists them; REEL_PASSES=-name adds more),
  // and passes off by default turned on (REEL_PASSES=+name adds more).
  std::vector<std::string> disabled_passes, enabled_passes;
  // Bytes the step's own memory (activations, gradients, temporaries: the arena) may take per
  // device; above it the planner recomputes activations in the backward instead of keeping them
  // (compile/passes/recompute.cpp), the same bits either way. 0: no limit.
  size_t memory_limit = 0;
  // Arguments whose length varies, padded to buckets (above); unset: every new shape is a new plan.
  std::optional<LengthBuckets> buckets;
  // Trace in meta mode instead of running the first two calls eagerly (see the top of this file).
  bool trace_without_running = false;
  // The arena pool the plans use (arena_pool.h); unset: the function's own. Functions whose calls
  // never overlap (the pieces of one step: bucketed_step.h) can share one.
  std::shared_ptr<ArenaPool> arenas;

  CompileOptions(Mode mode = Mode::Default, int cache_limit = 8, bool fuse = true,
                 std::vector<std::string> disabled_passes = {}, size_t memory_limit = 0)
      : mode(mode),
        cache_limit(cache_limit),
        fuse(fuse),
        disabled_passes(std::move(disabled_passes)),
        memory_limit(memory_limit) {}
};

using StepFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

class CompiledFunction {
 public:
  CompiledFunction(StepFn fn, CompileOptions options);
  ~CompiledFunction();
  CompiledFunction(CompiledFunction&&) noexcept;
  CompiledFunction& operator=(CompiledFunction&&) noexcept;

  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs);

  // The plan of the last call (nullptr when it ran eagerly).
  const Plan* last_plan() const;
  // Every plan built so far, one per input signature met (a bucket, a recompile), in trace order.
  std::vector<const Plan*> plans() const;
  int traces() const;        // plans built so far (recompiles = traces - 1)
  int replays() const;       // calls served by a plan
  int eager_calls() const;   // calls run eagerly (warm-up, past the cache limit, graph breaks)
  const std::vector<GraphBreak>& graph_breaks() const;  // of every trace so far
  // With buckets: how many calls each bucket size served, by size.
  const std::map<int64_t, int64_t>& bucket_calls() const;
  // The arena its plans share (arena_pool.h): sized by the largest plan, whatever their number.
  const ArenaPool& arena_pool() const;
  const CompileOptions& options() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

inline CompiledFunction compile(StepFn fn, CompileOptions options = {}) {
  return CompiledFunction(std::move(fn), options);
}

// The signature of a call: "(16, 128) i64 cuda:0, (16, 128) i64 cuda:0".
std::string signature_str(const std::vector<Tensor>& inputs);

}  // namespace reel::compile
