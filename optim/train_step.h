// train_step — one optimizer step of MODELS.md over a list of micro-batches:
//
//   for each micro-batch i:  loss_i = loss_fn(x_i, y_i)            (under the caller's autocast policy)
//                            backward(opt.scale_loss(loss_i, items_i))   (1/ACCUM or the item share, x scale)
//                            opt.micro_step()   -> at the last: unscale, check, clip, update, schedule, zero
//
// The optimizer must be set to ACCUM = micro.size() (or to count items summing to the step's). Returns
// the boundary's StepResult and, through `mean_loss`, the micro-batches' mean loss as a device scalar
// (no host read: a benchmark or a captured step can time it without a sync).
#pragma once
#include <functional>
#include <vector>

#include "optim/optimizer.h"

namespace reel::optim {

struct MicroBatch {
  Tensor inputs;
  Tensor targets;
  int64_t items = -1;  // items in it, when the optimizer counts items
};

using LossFn = std::function<Tensor(const Tensor& inputs, const Tensor& targets)>;

StepResult train_step(Optimizer& opt, const LossFn& loss_fn, const std::vector<MicroBatch>& micro,
                      Tensor* mean_loss = nullptr);

// Counting real targets (Optimizer::set_items_from_targets), the pieces train_step is made of, for a
// step run in pieces (compile/runtime/bucketed_step.h):
//   n_i = the targets of one micro-batch that are not the optimizer's ignore_index, a 0-dim f64
//         device tensor (no host read);
//   backward_share: the backward of loss_i weighed by n_i / N (x the GradScaler's scale), returning
//         loss_i's part of the step's mean loss, loss_i n_i / N, detached.
Tensor real_targets(const Optimizer& opt, const Tensor& targets);
Tensor backward_share(Optimizer& opt, const Tensor& loss, const Tensor& count, const Tensor& total);

}  // namespace reel::optim
