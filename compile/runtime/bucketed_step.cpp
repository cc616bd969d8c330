// BucketedTrainStep (see bucketed_step.h).
#include "compile/runtime/bucketed_step.h"

#include "autograd/ops.h"

namespace reel::compile {

namespace {

CompileOptions with(CompileOptions o, std::shared_ptr<ArenaPool> arenas, std::optional<LengthBuckets> buckets) {
  o.arenas = std::move(arenas);
  o.buckets = std::move(buckets);
  o.cache_limit = std::max(o.cache_limit, o.buckets ? int(o.buckets->sizes.size()) : 1);
  return o;
}

// The micro-batch's piece: forward, the weighed backward, its part of the mean loss.
StepFn micro_batch_fn(optim::Optimizer* opt, optim::LossFn loss_fn) {
  return [opt, loss_fn = std::move(loss_fn)](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    REEL_CHECK(in.size() == 3, "bucketed step: a piece takes (inputs, targets, N), got ", in.size(), " tensors");
    Tensor loss = loss_fn(in[0], in[1]);
    return {optim::backward_share(*opt, loss, optim::real_targets(*opt, in[1]), in[2])};
  };
}

// The optimizer's piece: the boundary, with its results as device tensors.
StepFn optimizer_fn(optim::Optimizer* opt) {
  return [opt](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    optim::StepResult r = opt->step_accumulated();
    const Device device = r.grad_norm.defined() ? r.grad_norm.device() : in.at(0).device();
    Tensor scale = r.scale.defined() ? r.scale : ones({}, TensorOptions{DType::f32, device});
    return {r.grad_norm, r.found_inf, scale, r.lr_tensor};
  };
}

}  // namespace

BucketedTrainStep::BucketedTrainStep(optim::Optimizer& opt, optim::LossFn loss_fn, std::vector<int64_t> buckets,
                                     CompileOptions options, int64_t pad_token)
    : opt_(&opt),
      arenas_(std::make_shared<ArenaPool>()),
      piece_(micro_batch_fn(&opt, loss_fn),
             with(options, arenas_,
                  LengthBuckets{{0, 1}, 1, std::move(buckets),
                                {double(pad_token), double(opt.target_ignore_index())}})),
      optimizer_(optimizer_fn(&opt), with(options, arenas_, std::nullopt)) {
  REEL_CHECK(opt.counts_targets(), "bucketed step: the optimizer must count real targets "
             "(set_items_from_targets): each micro-batch weighs n_i / N");
  REEL_CHECK(!options.trace_without_running || opt.create_state_now(),
             "bucketed step: tracing without running needs the optimizer's state made before the first step, "
             "and this one (", opt.name(), ") makes it at its first update or talks to other ranks: leave "
             "CompileOptions::trace_without_running off");
  // The gradients outlive each piece: made now, zeroed in place at each boundary.
  opt.set_zero_grad_to_none(false);
  NoGradGuard no_grad;
  for (const Tensor& p : opt.parameters())
    if (!p.grad().defined()) p.set_grad(zeros_like(p));
}

std::vector<const Plan*> BucketedTrainStep::plans() const {
  std::vector<const Plan*> out = piece_.plans();
  for (const Plan* p : optimizer_.plans()) out.push_back(p);
  return out;
}

std::vector<Tensor> BucketedTrainStep::operator()(const std::vector<optim::MicroBatch>& micro) {
  REEL_CHECK(!micro.empty() && int64_t(micro.size()) == opt_->accum_steps(), "bucketed step: ", micro.size(),
             " micro-batches for an optimizer with ACCUM ", opt_->accum_steps());
  Tensor total;
  for (const optim::MicroBatch& m : micro) {
    Tensor n = optim::real_targets(*opt_, m.targets);
    total = total.defined() ? total + n : n;
  }
  Tensor mean_loss;
  for (const optim::MicroBatch& m : micro) {
    Tensor part = piece_({m.inputs, m.targets, total})[0];
    mean_loss = mean_loss.defined() ? mean_loss + part : part;
  }
  std::vector<Tensor> out = optimizer_({total});
  out.insert(out.begin(), mean_loss);
  return out;
}

}  // namespace reel::compile
