// write_train_trace (see train_trace.h).
#include "tools/train_trace.h"

#include <cstdio>

#include "compile/runtime/chrome_trace.h"
#include "compile/runtime/train_step.h"
#include "distributed/communicator.h"

namespace reel::tools {

void write_train_trace(const std::string& path, std::optional<compile::CompiledFunction>& compiled,
                       nn::Module& model, optim::Optimizer& opt, const std::vector<optim::MicroBatch>& micro,
                       Device device) {
  const std::vector<Tensor> flat = compile::flatten_micro(micro);
  // The plan the training steps replayed for this signature; none yet (a run of fewer steps than
  // compiling takes, or a graph break that keeps it eager): the step eagerly, with the same optimizer.
  const compile::Plan* plan = nullptr;
  if (compiled)
    for (const compile::Plan* p : compiled->plans())
      if (compile::plan_takes(*p, flat)) plan = p;
  nn::Module* m = &model;
  auto eager_step = [&] {
    optim::train_step(opt, [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); }, micro);
  };
  const compile::ChromeTrace trace = plan ? compile::trace_plan_call(const_cast<compile::Plan&>(*plan), flat)
                                          : compile::trace_eager_call(eager_step, device);
  if (dist::rank() != 0) return;
  trace.write(path);
  std::printf("trace: one more step written to %s (%zu %s)\n", path.c_str(),
              plan ? trace.count("kernel") : trace.count("op"), plan ? "kernels of the plan" : "ops run eagerly");
}

}  // namespace reel::tools
