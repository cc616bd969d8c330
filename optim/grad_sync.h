// GradSync — the optimizer's hook for data parallelism: called once per optimizer step, at the
// accumulation boundary, before anything reads the gradients (unscale, the inf check, the norm,
// clipping, the update). optim/ knows nothing of communication; parallel/data_parallel.h implements it.
//
// The contract. When sync(params, weight) is called, each parameter's .grad holds this rank's
// gradient of the mean loss over the items its step saw (the accumulation contract of
// optim/optimizer.h, correction included), or is undefined when no gradient reached it on this rank.
// `weight` is the number of items this rank's step saw: items_seen when the optimizer counts items;
// micro-batches x micro-batch size when it counts micro-batches (just the micro-batches when the size
// was not given: equal micro-batches are then assumed on every rank); 1 for step(). Afterwards every
// rank's .grad must hold
//     g = sum_r weight_r g_r / sum_r weight_r
// which is the gradient of the mean loss over all ranks' items: with equal shares the plain mean over
// ranks, and when the ranks saw different numbers of items (an epoch's remainder, other micro-batch
// sizes) each weighs by its count — the item counts are summed across ranks, so the normalisation of
// the accumulation contract stays exact.
// Because every rank then holds the same gradients, everything after the hook (the GradScaler's
// found_inf, the norm and its clip coefficient, the update) is the same on every rank: an inf/NaN on
// one rank reaches every rank's sum, so all skip the step together.
#pragma once
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace reel::optim {

class GradSync {
 public:
  virtual ~GradSync() = default;
  virtual void sync(const std::vector<Tensor>& params, double weight) = 0;
  // One line for print_setup, e.g. "data parallel: 2 ranks (mpi ...), gradients all-reduced once per step ...".
  virtual std::string describe() const = 0;
};

}  // namespace reel::optim
