// Memory budget — the largest micro-batch whose training step fits a memory budget, found by
// planning the step without running it.
//
// For an effective batch N and each candidate micro-batch m (powers of two from 1 up to N, and N):
//   ACCUM = ceil(N / m); the last micro-batch has N - m (ACCUM - 1) items (m when m divides N);
//   one step is traced in meta mode (kernels/dispatch.h: no kernel, no memory) and its planned peak is
//     peak(m) = step(m)        the step's activations, gradients and temporaries:
//                              eager: the most bytes its buffers hold at once when each is allocated
//                                at its first use and freed after its last, every size rounded as the
//                                device's allocator rounds it (compile/passes/memory_plan.h live_peak_bytes);
//                              compiled (BudgetSetup::compile_mode): the fused plan's arena, one block
//                                (the passes of compile/runtime/plan.h run on the traced graph, nothing built);
//             + external       parameters, gradients' owners aside: optimizer state, scaler state and
//                              folded constants, buffers that outlive the step (the trace's External
//                              buffers), each rounded;
//             + inputs         the step's N items of inputs and targets, one block per micro-batch
//                              (a compiled plan also keeps its own copy of them);
//             + workspaces     the libraries' persistent workspaces (kernels/library_workspaces.h): on
//                              CUDA one workspace of 32 MiB per device that cuBLAS and cuBLASLt
//                              share (eager GEMMs, epilogues, autotuning), and any other already made
//                              (they stay for the life of the process); nothing on the CPU.
// An eager step is traced with min(ACCUM, 2) micro-batches: the second already overlaps the
// gradients the first left, and every later one repeats it, so a longer step has the same peak. A
// compiled one is traced whole (ACCUM micro-batches, the last one smaller where N asks): its arena is
// placed over all of them. A compiled step's first two calls run eagerly (the warm-up, and the trace
// that the plan is built from), so its planned peak is the larger of the plan's and the eager step's,
// unless it is traced without running (BudgetSetup::trace_without_running), when the plan's is all. Not counted: cuDNN's
// per-call workspaces (from the caching allocator during a convolution), cached free blocks (reserved,
// not allocated) and the CUDA context. `reel bench --plan-memory` prints the plan beside the measured
// peak (bench/RESULTS.md has the table); `reel train` compares them after its first step.
//
// Recomputation (a compiled step): a candidate m whose plan does not fit the budget, but whose eager
// first calls do, is planned again with a memory limit (CompileOptions::memory_limit,
// compile/passes/recompute.cpp) of what the budget leaves for the step's arena once the external
// buffers, inputs and workspaces are counted: the same micro-batch, some activations computed twice.
// So each m may have two candidates, with and without recomputation.
//
// pick_micro_batch takes, among the candidates that fit, the one with the most items per second by
// compile/passes/step_cost.h's roofline estimate (a larger micro-batch starts fewer kernels for the
// same FLOPs; recomputation adds FLOPs and kernels), the larger micro-batch on a tie (and when
// nothing was estimated). When m does not divide N, the optimizer counts items
// (set_items_per_step(N)) so that the smaller last micro-batch is weighted by its share and the loss
// normalisation stays that of the whole batch.
//
// The traced step uses a fresh optimizer from the caller's factory (its lazily created state, e.g.
// AdamW's exp_avg, is made there as meta tensors and dropped with it), and the parameters' gradients
// are set aside before and restored after, so the model and its real optimizer are left as they were.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compile/ir/graph.h"
#include "compile/runtime/plan.h"
#include "optim/train_step.h"

namespace reel::compile {

// (micro_batch, count) -> `count` micro-batches of `micro_batch` items each. Called in meta mode, so
// inputs made with ops (zeros, full, ...) are meta tensors; real tensors work too.
using MicroBatchFn = std::function<std::vector<optim::MicroBatch>(int64_t micro_batch, int64_t count)>;
// A fresh optimizer over the model's parameters, configured as the real one (scaler, clipping).
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>()>;

struct BudgetSetup {
  MicroBatchFn make_micro;
  optim::LossFn loss_fn;
  OptimizerFactory make_optimizer;
  Device device;
  int64_t effective_batch = 0;
  std::optional<Mode> compile_mode;  // unset: the step runs eagerly
  size_t memory_limit = 0;           // compiled: CompileOptions::memory_limit (recomputation to fit it)
  // Compiled, without a memory_limit of the caller's: plan_candidates_for also plans each micro-batch
  // that does not fit with the recomputation that would make it fit (see the top of this file).
  bool recompute_to_fit = true;
  // Compiled with CompileOptions::trace_without_running: no call runs eagerly, so the eager first
  // calls' peak is not counted (eager_calls_bytes stays 0).
  bool trace_without_running = false;
};

// One candidate micro-batch and its planned peak, in parts.
struct BudgetCandidate {
  int64_t micro_batch = 0;
  int64_t accum = 0;             // ceil(N / micro_batch)
  int64_t last_micro_batch = 0;  // N - micro_batch (accum - 1)
  // arena_bytes: the step's own part (see the top of this file: eager lifetimes, or the fused arena).
  size_t arena_bytes = 0, external_bytes = 0, input_bytes = 0, workspace_bytes = 0;

  // Compiled: the peak of its first two calls, which run eagerly (the warm-up, and the trace before
  // the plan is built); 0 for an eager step or one traced without running.
  size_t eager_calls_bytes = 0;
  // Compiled: the plan's memory limit (CompileOptions::memory_limit; 0: none), and what recomputing to
  // fit it cloned: nodes and the FLOPs they add per step.
  size_t memory_limit = 0;
  size_t recomputed_nodes = 0;
  double recompute_flops = 0;
  // One optimizer step's seconds by step_cost.h's roofline estimate (0: not estimated); a ranking, not
  // a measurement.
  double estimated_seconds = 0;
  bool fits = false;

  // The steady state: what every step holds at most (a compiled step: each replay).
  size_t steady_peak() const { return arena_bytes + external_bytes + input_bytes + workspace_bytes; }
  // What the run holds at most: the steady state, or a compiled step's eager first calls if larger.
  size_t peak() const { return std::max(steady_peak(), eager_calls_bytes); }
  // The largest part of the peak and its name ("activations and gradients (arena)", ...).
  std::pair<const char*, size_t> largest_part() const;
};

struct BudgetChoice {
  int64_t effective_batch = 0;
  size_t budget = 0;
  std::vector<BudgetCandidate> candidates;  // accum, last_micro_batch and fits filled in
  size_t chosen = 0;                        // index into candidates

  const BudgetCandidate& choice() const { return candidates[chosen]; }
  // The optimizer counts items (set_items_per_step(N)) when the last micro-batch is smaller.
  bool counts_items() const { return choice().last_micro_batch != choice().micro_batch; }
};

// 1, 2, 4, ... up to N, and N itself when it is not a power of two.
std::vector<int64_t> candidate_micro_batches(int64_t effective_batch);
// The fixed library workspaces on `device` for a step, eager or compiled (see the top of this file).
size_t library_workspace_bytes(Device device);
// The bytes the allocator of `device` holds for a request of `nbytes` (its rounding); `nbytes` itself
// where this build has no allocator for the device.
size_t allocation_bytes(Device device, size_t nbytes);
// The allocator's bytes in live blocks on `device` now, and the most since the last reset_peak_bytes.
size_t allocated_bytes(Device device);
size_t peak_bytes(Device device);
void reset_peak_bytes(Device device);
// "planned 812.0 MiB, measured 830.5 MiB (+2.3%)", with a warning line when they differ by more than
// `tolerance` (a fraction): what `reel train` prints after its first step.
std::string compare_planned_peak(size_t planned, size_t measured, double tolerance = 0.05);
// The steady peak planned for compiled plans that share one arena pool and run one at a time (the
// plans of one function, or of a BucketedTrainStep's pieces): the largest plan's arena (the pool's
// block), the External buffers of all of them once each (parameters, gradients, optimizer state:
// plans of one model share them), every plan's static copies of its inputs, and the library
// workspaces. What a run of those plans holds on `device`, with nothing else allocated.
size_t plans_steady_peak(const std::vector<const Plan*>& plans, Device device);
// One step of `count` micro-batches of `micro_batch` items traced with a fresh optimizer: in meta mode
// (nothing runs), or for real when `meta` is false (the step runs: parameters are updated; for tests).
// A `last_micro_batch` other than 0 or micro_batch makes the last one that size (the optimizer then
// counts items).
Graph trace_step_graph(const BudgetSetup& setup, int64_t micro_batch, int64_t count, bool meta = true,
                       int64_t last_micro_batch = 0);
// One candidate's planned peak, from a step traced in meta mode.
BudgetCandidate plan_candidate(const BudgetSetup& setup, int64_t micro_batch);
// Every candidate of candidate_micro_batches(setup.effective_batch), each at setup.memory_limit.
std::vector<BudgetCandidate> plan_candidates(const BudgetSetup& setup);
// The same, and for a compiled step each micro-batch that does not fit `budget` also planned with the
// recomputation that fits it (setup.recompute_to_fit; see the top of this file).
std::vector<BudgetCandidate> plan_candidates_for(const BudgetSetup& setup, size_t budget);
// Among the candidates that fit `budget`, the most items per second by estimate (the larger micro-batch
// on a tie); throws reel::Error naming the budget, the smallest candidate's peak and its largest part
// when none fits.
BudgetChoice pick_micro_batch(std::vector<BudgetCandidate> candidates, int64_t effective_batch, size_t budget);

// The candidates as a table, with the choice marked and the remainder rule in the footer.
std::string budget_table(const BudgetChoice& choice);
// "the planner would choose micro-batch 32 x ACCUM 4 for budget 1.00 GiB (planned peak 812.0 MiB)".
std::string budget_advice(const BudgetChoice& choice);
// An out-of-memory reel::Error (the CUDA caching allocator's or the host allocator's).
bool is_out_of_memory(const std::exception& e);

// "512MiB", "1GiB", "2.5GB", "300MB", "4096" (bytes), "1.5 GiB": binary (KiB MiB GiB TiB) or decimal
// (KB MB GB TB) units, case-insensitive, B optional. Throws reel::Error on anything else.
size_t parse_memory_size(const std::string& text);

}  // namespace reel::compile
