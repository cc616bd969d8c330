// The compiled training step (see train_step.h).
#include "compile/runtime/train_step.h"

#include "autograd/ops.h"

namespace reel::compile {

std::vector<Tensor> flatten_micro(const std::vector<optim::MicroBatch>& micro) {
  std::vector<Tensor> flat;
  for (const optim::MicroBatch& m : micro) {
    flat.push_back(m.inputs);
    flat.push_back(m.targets);
  }
  return flat;
}

CompiledFunction compile_train_step(optim::Optimizer& opt, optim::LossFn loss_fn, CompileOptions options) {
  REEL_CHECK(!options.trace_without_running || opt.create_state_now(),
             "compile_train_step: tracing without running needs the optimizer's state made before the first step, "
             "and this one (", opt.name(), ") makes it at its first update or talks to other ranks: run "
             "one step eagerly first, or leave CompileOptions::trace_without_running off");
  optim::Optimizer* o = &opt;
  StepFn fn = [o, loss_fn = std::move(loss_fn)](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    REEL_CHECK(!in.empty() && in.size() % 2 == 0, "compiled train step: expected (inputs, targets) pairs, got ",
               in.size(), " tensors");
    // An optimizer that counts items weighs each micro-batch by its leading dim (its images or
    // sequences): a step whose last micro-batch is smaller has its own input signature, so its own
    // plan, with that micro-batch's share traced in.
    const bool by_items = o->items_per_step() > 0;
    std::vector<optim::MicroBatch> micro;
    for (size_t i = 0; i < in.size(); i += 2)
      micro.push_back({in[i], in[i + 1], by_items && in[i].dim() > 0 ? in[i].size(0) : -1});
    Tensor mean_loss;
    optim::StepResult r = optim::train_step(*o, loss_fn, micro, &mean_loss);
    Tensor scale = r.scale.defined() ? r.scale : ones({}, TensorOptions{DType::f32, mean_loss.device()});
    return {mean_loss, r.grad_norm, r.found_inf, scale, r.lr_tensor};
  };
  return compile(std::move(fn), options);
}

}  // namespace reel::compile
