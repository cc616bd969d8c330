// `reel plan`: traces MODELS.md's training step of a benchmark model and prints the compiled plan —
// a summary (kernels, buffers, CUDA graphs), the memory plan (arena per device, the planned peak,
// against what no reuse would take) and every kernel with its buffers and bytes; --dot FILE writes
// the plan as Graphviz.
//
//   reel plan --model gpt-tiny --mode reduce-overhead [--precision bf16] [--device cpu|cuda]
//             [--micro-batch N] [--kernels N] [--dot plan.dot] [--memory-limit SIZE]
// --memory-limit: the step's own memory (the arena) may take at most SIZE ("512MiB"); the planner
// recomputes activations in the backward to fit (compile/passes/recompute.cpp) and says what.
#include <cstdio>
#include <fstream>

#include "compile/runtime/describe.h"
#include "compile/runtime/memory_budget.h"
#include "compile/runtime/train_step.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "tools/arg_numbers.h"
#include "tools/commands.h"

namespace reel::tools {

int plan_command(int argc, char** argv) {
  std::string model = "gpt-tiny", mode = "default", precision = "fp32", device_name = "auto", dot;
  int64_t micro_batch = -1, max_kernels = -1;
  size_t memory_limit = 0;
  for (int i = 0; i < argc; ++i) {
    std::string k = argv[i];
    REEL_CHECK(i + 1 < argc, "plan: ", k, " needs a value");
    std::string v = argv[++i];
    if (k == "--model") model = v;
    else if (k == "--mode") mode = v;
    else if (k == "--precision") precision = v;
    else if (k == "--device") device_name = v;
    else if (k == "--micro-batch") micro_batch = int_arg("plan", k, v, 1);
    else if (k == "--kernels") max_kernels = int_arg("plan", k, v, 0);
    else if (k == "--dot") dot = v;
    else if (k == "--memory-limit") memory_limit = size_arg("plan", k, v);
    else throw Error("plan: unknown option " + k +
                     " (expected --model, --mode, --precision, --device, --micro-batch, --kernels, --dot, "
                     "--memory-limit)");
  }
  compile::Mode m = compile::parse_mode(mode);
  Device device = device_name == "auto" ? (cuda::is_available() ? Device::cuda(0) : Device::cpu())
                                        : Device::parse(device_name);
  AutocastGuard amp(PrecisionPolicy::parse(precision));
  const int64_t accum = 4;
  nn::Workload w = nn::make_workload(model, device, accum, micro_batch);
  std::vector<optim::MicroBatch> micro;
  for (const auto& [x, y] : w.micro) micro.push_back({x, y});
  optim::AdamW opt(w.model->parameters(), optim::AdamWOptions(1e-3).weight_decay(0.01));
  opt.set_accum_steps(accum).set_max_grad_norm(1.0);
  if (autocast_policy().needs_grad_scaler()) opt.set_grad_scaler(std::make_shared<optim::GradScaler>());
  auto loss_fn = [&](const Tensor& x, const Tensor& y) { return nn::model_loss(*w.model, x, y); };
  compile::CompileOptions options(m);
  options.memory_limit = memory_limit;
  auto step = compile::compile_train_step(opt, loss_fn, options);
  std::vector<Tensor> flat = compile::flatten_micro(micro);
  for (int i = 0; i < 3; ++i) step(flat);  // warm-up, trace, first replay
  const compile::Plan* plan = step.last_plan();
  REEL_CHECK(plan != nullptr, "plan: the step did not compile (graph breaks: ", step.graph_breaks().size(), ")");
  std::printf("%s step, %s, %s, micro-batch x %lld (ACCUM %lld)\n", model.c_str(), precision.c_str(),
              device.str().c_str(), (long long)w.micro[0].first.size(0), (long long)accum);
  std::printf("%s\n", compile::plan_summary(*plan).c_str());
  const compile::PassStats& st = plan->stats();
  std::printf(
      "kernels per step: %zu traced -> %zu (gathers read in place %zu, dead code %zu, constants folded %zu, repeats "
      "%zu, fused away %zu)\n",
      st.traced, plan->kernels(), st.in_place, st.dead, st.folded, st.deduplicated, st.fused);
  std::printf("passes (compile/passes/pipeline.cpp), nodes after each:");
  for (const auto& [name, nodes] : st.after) std::printf(" %s %zu", name.c_str(), nodes);
  std::printf("\n");
  if (m != compile::Mode::Default) std::printf("CUDA graphs: %zu\n", plan->graphs());
  if (st.beside > 0) std::printf("side stream: %zu kernels beside the main stream (compile/passes/side_stream.h)\n", st.beside);
  if (st.ahead > 0)
    std::printf("side stream 2: %zu forward kernels run ahead, under the backward before them "
                "(compile/passes/overlap_micro_batches.h)\n",
                st.ahead);
  std::printf("%s\n", compile::memory_summary(*plan).c_str());
  if (const std::string r = compile::recompute_summary(*plan, memory_limit); !r.empty()) std::printf("%s\n", r.c_str());
  for (const compile::GraphBreak& b : step.graph_breaks())
    std::printf("graph break: %s (%s)\n", b.op.c_str(), b.reason.c_str());
  std::printf("kernels:\n%s", compile::plan_listing(*plan, max_kernels < 0 ? SIZE_MAX : size_t(max_kernels)).c_str());
  if (!dot.empty()) {
    std::string tmp = dot + ".tmp";
    {
      std::ofstream f(tmp);
      REEL_CHECK(f.good(), "plan: cannot write ", tmp);
      f << compile::plan_dot(*plan);
      REEL_CHECK(f.good(), "plan: writing ", tmp, " failed");
    }
    REEL_CHECK(std::rename(tmp.c_str(), dot.c_str()) == 0, "plan: cannot rename ", tmp, " to ", dot);
    std::printf("wrote %s\n", dot.c_str());
  }
  return 0;
}

}  // namespace reel::tools
