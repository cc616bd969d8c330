// AccumulationSplit — how the N items of one optimizer step are cut into micro-batches of m items:
// the one place that computes it, for the memory planner's candidates (compile/runtime/memory_budget.h),
// the optimizer (Optimizer::set_effective_batch) and `reel train --effective-batch`.
//
//   ACCUM = ceil(N / m)              micro-batches per step
//   last  = N - m (ACCUM - 1)        items in the last one: m when m divides N, else 1 .. m-1
// so that m (ACCUM - 1) + last = N exactly. When last != m the step is uneven: the optimizer counts
// items (set_items_per_step(N)), so that each micro-batch's loss weighs its share of the N items.
// The arithmetic never forms N + m (ceil as N / m plus a remainder test), so it holds up to INT64_MAX.
#pragma once
#include <cstdint>

namespace reel::optim {

struct AccumulationSplit {
  int64_t micro_batch = 0;       // m
  int64_t accum = 0;             // ceil(N / m)
  int64_t last_micro_batch = 0;  // N - m (accum - 1)

  // N, back from the split.
  int64_t effective_batch() const { return micro_batch * (accum - 1) + last_micro_batch; }
  // The last micro-batch is smaller than the others (the optimizer then counts items).
  bool uneven() const { return last_micro_batch != micro_batch; }
  // Items in micro-batch `index` (0-based) of a step.
  int64_t micro_batch_size(int64_t index) const { return index == accum - 1 ? last_micro_batch : micro_batch; }
};

// Throws reel::Error unless 0 < micro_batch <= effective_batch.
AccumulationSplit split_accumulation(int64_t effective_batch, int64_t micro_batch);

}  // namespace reel::optim
