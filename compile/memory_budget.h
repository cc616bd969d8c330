// Memory budget — the largest micro-batch whose training step fits a memory budget, found by
// planning the step without running it.
//
// For an effective batch N and each candidate micro-batch m (powers of two from 1 up to N, and N):
//   ACCUM = ceil(N / m); the last micro-batch has N - m (ACCUM - 1) items (m when m divides N);
//   one step is traced in meta mode (kernels/dispatch.h: no kernel, no memory) and its planned peak is
//     peak(m) = arena(m)       the memory plan's arena on the device (compile/memory_plan.h): the step's
//                              activations, gradients and temporaries, reused by liveness;
//             + external       parameters, optimizer state, scaler state, constants: buffers that outlive
//                              the step (the trace's External buffers);
//             + inputs         the step's N items of inputs and targets (a compiled step binds all its
//                              micro-batches at once), scaled from the traced micro-batches;
//             + workspaces     the libraries' fixed workspaces: on CUDA one cuBLAS and one cuBLASLt
//                              workspace of 32 MiB each per device (kernels/cuda/register.cu,
//                              gemm_epilogue.cu); nothing on the CPU. cuDNN's per-call workspaces come
//                              from the caching allocator and are not counted.
// The trace holds min(ACCUM, 2) micro-batches: the second already overlaps the gradients the first
// left, and every later one repeats it, so a longer step has the same peak. The arena is that of the
// step as traced (unfused: what eager execution holds at most by liveness); fusion only removes
// buffers. Not counted: the caching allocator's rounding and fragmentation, the CUDA context.
//
// pick_micro_batch takes the largest m with peak(m) <= budget. When m does not divide N, the
// optimizer counts items (set_items_per_step(N)) so that the smaller last micro-batch is weighted by
// its share and the loss normalisation stays that of the whole batch.
//
// The traced step uses a fresh optimizer from the caller's factory (its lazily created state, e.g.
// AdamW's exp_avg, is made there as meta tensors and dropped with it), and the parameters' gradients
// are set aside before and restored after, so the model and its real optimizer are left as they were.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compile/graph.h"
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
};

// One candidate micro-batch and its planned peak, in parts.
struct BudgetCandidate {
  int64_t micro_batch = 0;
  int64_t accum = 0;             // ceil(N / micro_batch)
  int64_t last_micro_batch = 0;  // N - micro_batch (accum - 1)
  size_t arena_bytes = 0, external_bytes = 0, input_bytes = 0, workspace_bytes = 0;
  bool fits = false;

  size_t peak() const { return arena_bytes + external_bytes + input_bytes + workspace_bytes; }
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
// The fixed library workspaces on `device` (see the top of this file).
size_t library_workspace_bytes(Device device);
// One step of `count` micro-batches of `micro_batch` items traced with a fresh optimizer: in meta mode
// (nothing runs), or for real when `meta` is false (the step runs: parameters are updated; for tests).
Graph trace_step_graph(const BudgetSetup& setup, int64_t micro_batch, int64_t count, bool meta = true);
// One candidate's planned peak, from a step traced in meta mode.
BudgetCandidate plan_candidate(const BudgetSetup& setup, int64_t micro_batch);
// Every candidate of candidate_micro_batches(setup.effective_batch).
std::vector<BudgetCandidate> plan_candidates(const BudgetSetup& setup);
// The largest micro-batch whose peak fits `budget`; throws reel::Error naming the budget, the smallest
// candidate's peak and its largest part when none fits.
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
