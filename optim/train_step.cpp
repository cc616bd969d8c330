#include "optim/train_step.h"

#include "autograd/ops.h"
#include "kernels/phase.h"

namespace reel::optim {

Tensor real_targets(const Optimizer& opt, const Tensor& targets) {
  NoGradGuard no_grad;
  Tensor ignore = full({}, double(opt.target_ignore_index()), TensorOptions{targets.dtype(), targets.device()});
  return sum(to_dtype(ne(targets, ignore), DType::f64));
}

Tensor backward_share(Optimizer& opt, const Tensor& loss, const Tensor& count, const Tensor& total) {
  Tensor share;
  {
    NoGradGuard no_grad;
    share = to_dtype(count / total, loss.dtype());
  }
  opt.scale_loss_share(loss, share).backward();
  return loss.detach() * share;
}

StepResult train_step(Optimizer& opt, const LossFn& loss_fn, const std::vector<MicroBatch>& micro, Tensor* mean_loss) {
  REEL_CHECK(!micro.empty(), "train_step: no micro-batches");
  // Counting real targets (set_items_from_targets): n_i, the micro-batch's real targets, and N, their
  // sum over the step, as device values (a replay weighs its own call's counts); each loss, a mean
  // over its n_i, weighs n_i / N, and so does its part of the reported mean.
  std::vector<Tensor> counts;
  Tensor total;
  if (opt.counts_targets()) {
    NoGradGuard no_grad;
    PhaseScope phase("count targets");
    for (const MicroBatch& mb : micro) {
      counts.push_back(real_targets(opt, mb.targets));
      total = total.defined() ? total + counts.back() : counts.back();
    }
  }
  StepResult result;
  Tensor loss_sum;
  for (size_t i = 0; i < micro.size(); ++i) {
    // Phase labels (kernels/phase.h) for traces of the step: each micro-batch's forward and backward,
    // then the boundary the last micro_step reaches (unscale, clip, update, schedule, zero).
    const std::string label = "micro-batch " + std::to_string(i);
    {
      PhaseScope phase(label);
      Tensor loss = loss_fn(micro[i].inputs, micro[i].targets), part;
      if (counts.empty()) {
        opt.scale_loss(loss, micro[i].items).backward();
        part = loss.detach();
      } else {
        part = backward_share(opt, loss, counts[i], total);
      }
      loss_sum = loss_sum.defined() ? loss_sum + part : part;
    }
    PhaseScope phase(i + 1 == micro.size() ? "optimizer" : label);
    result = opt.micro_step();
  }
  REEL_CHECK(result.stepped, "train_step: ", micro.size(), " micro-batches did not reach the optimizer's step "
             "boundary (set its ACCUM to the number of micro-batches)");
  if (mean_loss) *mean_loss = counts.empty() ? loss_sum * (1.0 / double(micro.size())) : loss_sum;
  return result;
}

}  // namespace reel::optim
