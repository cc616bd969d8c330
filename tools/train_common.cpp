// What the training loops share (see train_common.h).
#include "tools/train_common.h"

#include "compile/runtime/describe.h"

namespace reel::tools {

bool traces_without_running(const TrainOptions& o, const optim::Optimizer& opt) {
  return o.compile != "none" && (o.memory_budget != 0 || o.memory_limit != 0) && opt.can_create_state_now();
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

}  // namespace reel::tools
