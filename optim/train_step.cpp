#include "optim/train_step.h"

#include "autograd/ops.h"

namespace reel::optim {

StepResult train_step(Optimizer& opt, const LossFn& loss_fn, const std::vector<MicroBatch>& micro, Tensor* mean_loss) {
  REEL_CHECK(!micro.empty(), "train_step: no micro-batches");
  StepResult result;
  Tensor loss_sum;
  for (const MicroBatch& mb : micro) {
    Tensor loss = loss_fn(mb.inputs, mb.targets);
    opt.scale_loss(loss, mb.items).backward();
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
    result = opt.micro_step();
  }
  REEL_CHECK(result.stepped, "train_step: ", micro.size(), " micro-batches did not reach the optimizer's step "
             "boundary (set its ACCUM to the number of micro-batches)");
  if (mean_loss) *mean_loss = loss_sum * (1.0 / double(micro.size()));
  return result;
}

}  // namespace reel::optim
