// What the training loops share (see train_common.h).
#include "tools/train_common.h"

#include "compile/runtime/describe.h"

namespace reel::tools {

bool traces_without_running(const TrainOptions& o, const optim::Optimizer& opt) {
  return o.compile != "none" && opt.can_create_state_now();
}

compile::CompileOptions compile_options(const TrainOptions& o, const optim::Optimizer& opt) {
  compile::CompileOptions options(compile::parse_mode(o.compile));
  options.memory_limit = o.memory_limit;
  options.trace_without_running = traces_without_running(o, opt);
  return options;
}

void report_recompute(const std::optional<compile::CompiledFunction>& compiled, const TrainOptions& o) {
  if (!compiled || o.memory_limit == 0 || !compiled->last_plan()) return;
  std::printf("memory: %s\n", compile::recompute_summary(*compiled->last_plan(), o.memory_limit).c_str());
}

void report_log(MetricsLog& log, const std::string& title) {
  if (!log.enabled()) return;
  const std::string png = log.plot(title);
  if (!png.empty()) std::printf("log: loss curve drawn to %s\n", png.c_str());
}

MetricsLog::Step step_metrics(int64_t step, double loss, const optim::StepResult& r) {
  return {step, loss, r.lr, r.grad_norm_value(), r.loss_scale(), !r.skipped(), 0, 0};
}

MetricsLog::Step step_metrics(int64_t step, const std::vector<Tensor>& out) {
  return {step, out[0].item(), out[4].item(), out[1].item(), out[3].item(), out[2].item() == 0, 0, 0};
}

}  // namespace reel::tools
