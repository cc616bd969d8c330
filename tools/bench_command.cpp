// `reel bench`: times MODELS.md's training step (ACCUM = 4 fixed micro-batches, AdamW lr 1e-3 wd 0.01,
// clip 1.0, fp16 with the GradScaler) for each model, precision and mode (eager, or a compile mode
// with --compile default,reduce-overhead) on one device.
//
// Per configuration: the first step (warm-up: handles, cuDNN algorithm choice, cached blocks) timed
// alone, then `warmup` untimed steps, then `steps` timed ones — with CUDA events on the GPU, the host
// clock on the CPU — reported as median and min step ms, items/s (images, or tokens for the GPTs),
// peak device memory from the caching allocator (GPU), and ops run per step (kernel_count(): each is
// at least one kernel launch). Output: a table, and JSON lines with the peer scripts' field names
// (peer/torch_anchor.py) so the two can be joined. --dropout P gives the GPTs GPT-2's dropout: the
// compiled step then draws fresh masks on every replay (compile/ir/trace.h), and any graph break a
// compiled configuration met is printed under its row. --trace FILE writes one more step, after the
// timed ones, as a Chrome trace (compile/runtime/chrome_trace.h): FILE itself for a single
// configuration, FILE with "-model-prec-mode" before its extension for each of several.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include "compile/runtime/chrome_trace.h"
#include "compile/runtime/describe.h"
#include "compile/runtime/memory_budget.h"
#include "compile/runtime/train_step.h"
#include "kernels/autotune.h"
#include "kernels/cpu/thread_binding.h"
#include "kernels/dispatch.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "tools/arg_numbers.h"
#include "tools/commands.h"
#include "tools/flop_count.h"
#include "tools/op_profile.h"

namespace reel::tools {
namespace {

constexpr int64_t kAccum = 4;

struct BenchOptions {
  std::vector<std::string> models = nn::benchmark_model_names();  // MODELS.md's six
  std::vector<std::string> precisions{"fp32", "bf16", "fp16"};
  std::vector<std::string> modes{"eager"};  // eager, or compile modes (compile/runtime/plan.h)
  std::string device = "auto";
  int64_t steps = 30, warmup = 5, micro_batch = -1;
  int64_t profile_steps = 0;  // > 0: profile this many extra steps op by op (tools/op_profile.h)
  int64_t profiler_steps = 0;  // > 0: run this many extra steps inside a CUDA profiler range (ncu)
  bool plan_memory = false;   // also plan each step's peak without running it (compile/runtime/memory_budget.h)
  size_t memory_limit = 0;    // compiled: CompileOptions::memory_limit (recomputation to fit it)
  // --effective-batch N --memory-budget SIZE: the micro-batch, ACCUM and (compiled) recomputation
  // chosen by the planner for the budget, as `reel train` chooses them, then timed.
  int64_t effective_batch = 0;
  size_t memory_budget = 0;
  double dropout = 0;         // the GPTs' dropout (GptConfig::dropout); the timed steps train, so it draws
  int64_t threads = 0;        // --threads N: the CPU kernels' OpenMP threads (0: OMP_NUM_THREADS, or every core)
  bool bind_threads = false;  // --bind-threads 1: those threads pinned one to a core (kernels/cpu/thread_binding.h)
  std::string json_path;
  std::string trace_path;     // --trace FILE: one step after the timed ones as a Chrome trace (see the top)
  bool one_run = true;        // a single model, precision and mode: the trace is written to trace_path itself
};

const char* bench_usage() {
  return "reel bench [options]   MODELS.md's training step (ACCUM 4, AdamW, clip 1.0), timed\n"
         "  --models a,b,...       benchmark models (default: all six)\n"
         "  --precisions a,b,...   fp32, bf16, fp16 (default: all three)\n"
         "  --compile a,b,...      eager and/or compile modes: default, reduce-overhead, max-autotune (default eager)\n"
         "  --device auto|cpu|cuda[:N]   --steps N (default 30)   --warmup N (default 5)   --micro-batch N\n"
         "  --threads N            the CPU kernels' threads (default: OMP_NUM_THREADS, else every core)\n"
         "  --bind-threads 0|1     pin those threads one to a core, as OMP_PROC_BIND=close OMP_PLACES=cores (default 0)\n"
         "  --json FILE            one JSON line per configuration\n"
         "  --profile N            N more steps profiled op by op (compiled: kernel by kernel)\n"
         "  --profiler-range N     N more steps inside a CUDA profiler range (ncu --profile-from-start off)\n"
         "  --trace FILE.json      one more step, after the timed ones, as a Chrome trace (chrome://tracing,\n"
         "                         ui.perfetto.dev): host and device rows, each kernel (compiled) or op (eager)\n"
         "                         inside its micro-batch's or the optimizer's span. One configuration: FILE.json;\n"
         "                         several: one file each, FILE-model-prec-mode.json\n"
         "  --deterministic 0|1    --channels-last 0|1   --dropout P (the GPTs)\n"
         "  --plan-memory 0|1      also plan each step's peak without running it\n"
         "  --memory-limit SIZE    compiled: the step's arena at most SIZE (recomputation)\n"
         "  --effective-batch N --memory-budget SIZE   the micro-batch, ACCUM and recomputation planned for SIZE\n";
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

BenchOptions parse(int argc, char** argv) {
  BenchOptions o;
  for (int i = 0; i < argc; ++i) {
    std::string k = argv[i];
    REEL_CHECK(i + 1 < argc, "bench: ", k, " needs a value");
    std::string v = argv[++i];
    if (k == "--models") o.models = split_list(v);
    else if (k == "--precisions") o.precisions = split_list(v);
    else if (k == "--compile") o.modes = split_list(v);
    else if (k == "--device") o.device = v;
    else if (k == "--steps") o.steps = int_arg("bench", k, v, 1);
    else if (k == "--warmup") o.warmup = int_arg("bench", k, v, 0);
    else if (k == "--micro-batch") o.micro_batch = int_arg("bench", k, v, 1);
    else if (k == "--threads") o.threads = int_arg("bench", k, v, 1, 1024);
    else if (k == "--bind-threads") {
      REEL_CHECK(v == "0" || v == "1", "bench: --bind-threads expects 0 or 1, got \"", v, "\"");
      o.bind_threads = v == "1";
    }
    else if (k == "--json") o.json_path = v;
    else if (k == "--trace") o.trace_path = v;
    else if (k == "--profile") o.profile_steps = int_arg("bench", k, v, 0);
    else if (k == "--profiler-range") o.profiler_steps = int_arg("bench", k, v, 0);
    else if (k == "--deterministic") set_deterministic_algorithms(v != "0");
    else if (k == "--channels-last") set_autocast_channels_last(v != "0");
    else if (k == "--plan-memory") o.plan_memory = v != "0";
    else if (k == "--dropout") o.dropout = real_arg("bench", k, v, 0, 0.99);
    else if (k == "--memory-limit") o.memory_limit = size_arg("bench", k, v);
    else if (k == "--effective-batch") o.effective_batch = int_arg("bench", k, v, 1);
    else if (k == "--memory-budget") o.memory_budget = size_arg("bench", k, v);
    else throw Error("bench: unknown option " + k +
                     " (expected --models, --precisions, --compile, --device, --steps, --warmup, --micro-batch, --json, "
                     "--threads N, --bind-threads 0|1, --profile, --profiler-range N, --trace FILE, --deterministic 0|1, --channels-last 0|1, --plan-memory 0|1, --dropout P, "
                     "--memory-limit SIZE, --effective-batch N --memory-budget SIZE)");
  }
  REEL_CHECK((o.effective_batch == 0) == (o.memory_budget == 0),
             "bench: --effective-batch and --memory-budget go together");
  REEL_CHECK(o.memory_budget == 0 || (o.micro_batch < 0 && o.memory_limit == 0),
             "bench: --memory-budget chooses the micro-batch and the memory limit; drop --micro-batch and --memory-limit");
  for (const std::string& m : o.models)  // a typo fails before any run
    if (!nn::is_benchmark_model(m)) nn::make_benchmark_model(m);  // throws, naming the known models
  REEL_CHECK(o.steps > 0 && o.warmup >= 0 && o.profile_steps >= 0,
             "bench: --steps must be positive, --warmup and --profile non-negative");
  o.one_run = o.models.size() * o.precisions.size() * o.modes.size() == 1;
  // As torch.set_num_threads: every later parallel region (reel's kernels, oneDNN's, Eigen's) uses N.
  if (o.threads > 0) omp_set_num_threads(int(o.threads));
  if (o.bind_threads) {
    const std::vector<int> cpus = cpu::bind_threads_to_cores();
    REEL_CHECK(!cpus.empty(), "bench: --bind-threads 1: cannot pin ", omp_get_max_threads(),
               " threads one to a CPU: the process may run on ", cpu::binding_order().size(), " CPUs");
    std::printf("CPU threads pinned to CPUs %s\n", cpu::cpu_list(cpus).c_str());
  }
  return o;
}

// --trace's file for one configuration: the path itself for a single one; for several, each its own,
// "-model-prec-mode" before the extension (t.json -> t-gpt-tiny-fp32-default.json).
std::string trace_file(const BenchOptions& o, const std::string& model, const std::string& prec,
                       const std::string& mode) {
  if (o.one_run) return o.trace_path;
  const std::filesystem::path p(o.trace_path);
  return (p.parent_path() / (p.stem().string() + "-" + model + "-" + prec + "-" + mode + p.extension().string()))
      .string();
}

struct Result {
  std::string model, prec, dev, mode = "eager";
  int64_t params = 0, items_per_step = 0;
  std::string micro_batch = "default";  // as the peer scripts print B
  double median_ms = 0, min_ms = 0, first_s = 0, peak_mib = -1, kernels_per_step = 0;
  double planned_mib = -1;  // --plan-memory: the planner's peak for this step (compile/runtime/memory_budget.h)
  int64_t accum = 0;
  double budget_mib = -1, memory_limit_mib = 0;  // --memory-budget, and the arena limit chosen for it
  double host_ms = 0;  // median host time to run step() without waiting for the device: the launch cost
  double dropout = 0;
  int threads = omp_get_max_threads();  // the CPU threads the step ran with
  size_t graph_breaks = 0;  // compiled: breaks the trace reported (a break that runs eagerly shows here)
  size_t recomputed = 0;    // compiled under --memory-limit: nodes cloned into the backward
  double flops_per_step = 0;  // the step's model FLOPs (tools/flop_count.h)
};

// The model FLOPs of one step of this configuration (tools/flop_count.h), counted over an eager step of
// a fresh copy of the workload (a compiled plan's kernels do not pass the dispatch door one op at a
// time, and the timed model's state stays as the timed steps left it). Counted once per model and
// batch geometry: the precision and the mode do not change the products a step computes.
double step_flops(const std::string& name, Device device, int64_t accum, int64_t micro_batch) {
  static std::map<std::tuple<std::string, int64_t, int64_t>, double> counted;
  const auto key = std::make_tuple(name, accum, micro_batch);
  if (const auto it = counted.find(key); it != counted.end()) return it->second;
  nn::Workload w = nn::make_workload(name, device, accum, micro_batch);
  std::vector<optim::MicroBatch> micro;
  for (const auto& [x, y] : w.micro) micro.push_back({x, y});
  optim::AdamW opt(w.model->parameters(), optim::AdamWOptions(1e-3));
  opt.set_accum_steps(accum);
  FlopCounter counter;
  {
    ScopedDispatchObserver observing(&counter);
    optim::train_step(opt, [&](const Tensor& x, const Tensor& y) { return nn::model_loss(*w.model, x, y); }, micro);
  }
  return counted[key] = counter.flops();
}

// For --plan-memory: what each op's kernel allocates for itself beyond its outputs (scratch the
// trace does not see), measured over one eager step from the allocator's peak between ops.
class ScratchObserver : public DispatchObserver {
 public:
  explicit ScratchObserver(Device device) : device_(device), last_(compile::allocated_bytes(device)) {
    compile::reset_peak_bytes(device);
  }
  void on_dispatch(OpKind op, const std::vector<Tensor>&, const std::vector<Tensor>&, const Attrs&, bool) override {
    const size_t now = compile::allocated_bytes(device_), peak = compile::peak_bytes(device_);
    const size_t scratch = peak - std::max(last_, now);
    if (peak > step_peak_) step_peak_ = peak, peak_op_ = op_name(op), peak_scratch_ = scratch;
    size_t& worst = worst_[op_name(op)];
    worst = std::max(worst, scratch);
    last_ = now;
    compile::reset_peak_bytes(device_);
  }
  void print() const {
    std::vector<std::pair<size_t, std::string>> by;
    for (const auto& [op, bytes] : worst_)
      if (bytes) by.push_back({bytes, op});
    std::sort(by.rbegin(), by.rend());
    std::printf("scratch: the step peaked at %s during %s (%s of it the op's own scratch); largest scratch by op:",
                compile::bytes_str(step_peak_).c_str(), peak_op_.c_str(), compile::bytes_str(peak_scratch_).c_str());
    for (size_t i = 0; i < by.size() && i < 8; ++i)
      std::printf(" %s %s%s", by[i].second.c_str(), compile::bytes_str(by[i].first).c_str(), i + 1 < std::min<size_t>(by.size(), 8) ? "," : "");
    std::printf("\n");
  }

 private:
  Device device_;
  size_t last_ = 0, step_peak_ = 0, peak_scratch_ = 0;
  std::string peak_op_ = "-";
  std::map<std::string, size_t> worst_;
};

double time_step_ms(const std::function<void()>& step, Device device) {
  if (device.is_cuda()) {
    cuda::EventTimer timer(device.index);
    timer.start();
    step();
    timer.stop();
    return timer.elapsed_ms();
  }
  auto t0 = std::chrono::steady_clock::now();
  step();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The step of `w` as the memory planner sees it: micro-batches shaped as w's, a fresh AdamW like the
// timed one, the compiled mode and its options.
compile::BudgetSetup budget_setup(const nn::Workload& w, Device device, const std::string& mode,
                                  int64_t effective_batch, const compile::CompileOptions& options) {
  compile::BudgetSetup setup;
  setup.device = device;
  setup.effective_batch = effective_batch;
  nn::Module* model = w.model.get();
  setup.loss_fn = [model](const Tensor& x, const Tensor& y) { return nn::model_loss(*model, x, y); };
  if (mode != "eager") setup.compile_mode = compile::parse_mode(mode);
  setup.memory_limit = options.memory_limit;
  setup.trace_without_running = options.trace_without_running;
  setup.make_optimizer = [model]() -> std::unique_ptr<optim::Optimizer> {
    auto fresh = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions(1e-3).weight_decay(0.01));
    fresh->set_max_grad_norm(1.0);
    if (autocast_policy().needs_grad_scaler()) fresh->set_grad_scaler(std::make_shared<optim::GradScaler>());
    return fresh;
  };
  const Tensor x = w.micro[0].first, y = w.micro[0].second;
  setup.make_micro = [x, y, device](int64_t b, int64_t count) {
    std::vector<optim::MicroBatch> out;
    for (int64_t i = 0; i < count; ++i) {
      Shape xs = x.shape(), ys = y.shape();
      xs[0] = ys[0] = b;
      out.push_back({zeros(xs, {x.dtype(), device}), zeros(ys, {y.dtype(), device})});
    }
    return out;
  };
  return setup;
}

Result run_config(const std::string& name, const std::string& prec, const std::string& mode, Device device,
                  const BenchOptions& o) {
  AutocastGuard amp(PrecisionPolicy::parse(prec));
  const bool compiled = mode != "eager";
  compile::CompileOptions options(compiled ? compile::parse_mode(mode) : compile::Mode::Default);
  options.memory_limit = o.memory_limit;
  // Under a memory limit or budget the first calls do not run eagerly (compile.h): they would hold
  // eager's footprint, above what the plan fits.
  options.trace_without_running = compiled && (o.memory_limit > 0 || o.memory_budget > 0);
  int64_t accum = kAccum, micro_batch = o.micro_batch;
  std::optional<compile::BudgetChoice> choice;
  if (o.memory_budget > 0) {
    const nn::Workload shapes = nn::make_workload(name, device, 1, 1);
    choice = compile::pick_micro_batch(
        compile::plan_candidates_for(budget_setup(shapes, device, mode, o.effective_batch, options), o.memory_budget),
        o.effective_batch, o.memory_budget);
    std::printf("%s %s %s: %s", name.c_str(), prec.c_str(), mode.c_str(), compile::budget_table(*choice).c_str());
    REEL_CHECK(!choice->counts_items(), "bench: the chosen micro-batch ", choice->choice().micro_batch,
               " does not divide --effective-batch ", o.effective_batch, "; give an effective batch of a power of two");
    micro_batch = choice->choice().micro_batch;
    accum = choice->choice().accum;
    options.memory_limit = choice->choice().memory_limit;
  }
  nn::Workload w = nn::make_workload(name, device, accum, micro_batch);
  if (o.dropout > 0) {
    auto gpt = std::dynamic_pointer_cast<nn::Gpt>(w.model);
    REEL_CHECK(gpt != nullptr, "bench: --dropout applies to the GPT models, not ", name);
    gpt->set_dropout(o.dropout);
  }
  std::vector<optim::MicroBatch> micro;
  for (const auto& [x, y] : w.micro) micro.push_back({x, y});
  optim::AdamW opt(w.model->parameters(), optim::AdamWOptions(1e-3).weight_decay(0.01));
  opt.set_accum_steps(accum).set_max_grad_norm(1.0);
  if (autocast_policy().needs_grad_scaler()) opt.set_grad_scaler(std::make_shared<optim::GradScaler>());
  auto loss_fn = [&](const Tensor& x, const Tensor& y) { return nn::model_loss(*w.model, x, y); };
  std::optional<compile::CompiledFunction> compiled_step;
  std::vector<Tensor> flat = compile::flatten_micro(micro);
  if (compiled) compiled_step.emplace(compile::compile_train_step(opt, loss_fn, options));
  auto step = [&] {
    if (compiled) (*compiled_step)(flat);
    else optim::train_step(opt, loss_fn, micro);
  };
  auto sync = [&] { if (device.is_cuda()) cuda::synchronize(device.index); };

  Result r{name, prec, device.str(), mode, w.model->num_parameters(), w.items_per_step};
  r.dropout = o.dropout;
  r.accum = accum;
  if (micro_batch > 0) r.micro_batch = std::to_string(micro_batch);
  if (choice) {
    r.planned_mib = double(choice->choice().steady_peak()) / (1 << 20);
    r.budget_mib = double(o.memory_budget) / (1 << 20);
    r.memory_limit_mib = double(choice->choice().memory_limit) / (1 << 20);
  }
  if (o.plan_memory) {
    // The same step planned in meta mode before it runs: the workload's shapes, a fresh AdamW like opt.
    const int64_t B = w.micro[0].first.shape()[0];
    compile::BudgetSetup setup = budget_setup(w, device, mode, B * accum, options);
    const compile::BudgetCandidate c = compile::plan_candidate(setup, B);
    r.planned_mib = double(c.steady_peak()) / (1 << 20);  // the timed steps are steady
    std::printf("planned %s %s %s B=%lld: step %s + external %s + inputs %s + workspaces %s = %s\n", name.c_str(),
                prec.c_str(), mode.c_str(), (long long)B, compile::bytes_str(c.arena_bytes).c_str(),
                compile::bytes_str(c.external_bytes).c_str(), compile::bytes_str(c.input_bytes).c_str(),
                compile::bytes_str(c.workspace_bytes).c_str(), compile::bytes_str(c.steady_peak()).c_str());
  }
  // The first step: eagerly, the warm-up; compiled, until the first replay (warm-up, trace, plan and
  // capture): what a user waits before the steady state.
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < (compiled ? 3 : 1); ++i) step();
  sync();
  r.first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int64_t i = 0; i < o.warmup; ++i) step();
  sync();
  compile::reset_peak_bytes(device);
  std::vector<double> ms, host_ms;
  uint64_t k0 = kernel_count();
  for (int64_t i = 0; i < o.steps; ++i) {
    auto h0 = std::chrono::steady_clock::now();
    ms.push_back(time_step_ms([&] {
      step();
      host_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count());
    }, device));
  }
  r.kernels_per_step = double(kernel_count() - k0) / double(o.steps);
  if (compiled) r.graph_breaks = compiled_step->graph_breaks().size();
  if (compiled && compiled_step->last_plan()) {
    // A replayed CUDA graph launches no kernel from the host: count the plan's (and the copies of
    // inputs in and outputs out).
    const compile::Plan& plan = *compiled_step->last_plan();
    r.kernels_per_step = double(plan.kernels() + plan.graph().inputs.size() + plan.graph().outputs.size());
    r.recomputed = plan.stats().recomputed.size();
    if (const std::string rs = compile::recompute_summary(plan, options.memory_limit); !rs.empty())
      std::printf("%s %s %s: %s\n", name.c_str(), prec.c_str(), mode.c_str(), rs.c_str());
  }
  std::sort(ms.begin(), ms.end());
  std::sort(host_ms.begin(), host_ms.end());
  r.median_ms = ms[ms.size() / 2];
  r.min_ms = ms.front();
  r.host_ms = host_ms[host_ms.size() / 2];
  r.peak_mib = double(compile::peak_bytes(device)) / (1 << 20);
  r.flops_per_step = step_flops(name, device, accum, micro_batch);
  if (o.plan_memory && !compiled) {
    sync();
    ScratchObserver scratch(device);
    {
      ScopedDispatchObserver observing(&scratch);
      step();
      sync();
    }
    scratch.print();
  }
  if (o.profiler_steps > 0 && device.is_cuda()) {
    // Steady steps as they run (a compiled step replays its CUDA graph), for a profiler that collects
    // only inside the range: `ncu --profile-from-start off ... reel bench --profiler-range 1`.
    sync();
    cuda::profiler_start();
    for (int64_t i = 0; i < o.profiler_steps; ++i) step();
    sync();
    cuda::profiler_stop();
  }
  if (o.profile_steps > 0 && compiled && compiled_step->last_plan()) {
    // A replayed plan bypasses the dispatch door: the plan times its own kernels, one at a time.
    OpProfiler prof(device);
    compile::Plan& plan = const_cast<compile::Plan&>(*compiled_step->last_plan());
    for (int64_t i = 0; i < o.profile_steps; ++i)
      for (const compile::Plan::KernelTime& k : plan.profile(flat)) prof.record(k.label, k.key, k.ms);
    std::printf("profile of %s %s %s on %s (%lld steps, kernel by kernel: device time without launch gaps):\n",
                name.c_str(), prec.c_str(), mode.c_str(), device.str().c_str(), (long long)o.profile_steps);
    print_profile(prof, o.profile_steps, r.median_ms, 25);
  }
  if (o.profile_steps > 0 && !compiled) {
    sync();
    OpProfiler prof(device);
    for (int64_t i = 0; i < o.profile_steps; ++i) {
      prof.begin();
      step();
      prof.end();
    }
    std::printf("profile of %s %s on %s (%lld steps):\n", name.c_str(), prec.c_str(), device.str().c_str(),
                (long long)o.profile_steps);
    print_profile(prof, o.profile_steps, r.median_ms, 25);
  }
  if (!o.trace_path.empty()) {
    // One more step: compiled, the plan kernel by kernel outside any CUDA graph (its replay bypasses
    // the dispatch door); eager (or a compiled step that runs eagerly), op by op at the door.
    sync();
    const compile::Plan* plan = compiled ? compiled_step->last_plan() : nullptr;
    const compile::ChromeTrace trace = plan ? compile::trace_plan_call(const_cast<compile::Plan&>(*plan), flat)
                                            : compile::trace_eager_call(step, device);
    const std::string path = trace_file(o, name, prec, mode);
    trace.write(path);
    std::printf("trace of %s %s %s: %s (%zu %s)\n", name.c_str(), prec.c_str(), mode.c_str(), path.c_str(),
                plan ? trace.count("kernel") : trace.count("op"), plan ? "kernels of the plan" : "ops run eagerly");
  }
  return r;
}

std::string to_json(const Result& r) {
  char buf[1024];
  auto mib = [](double v) { return v < 0 ? std::string("null") : std::to_string(std::lround(v * 10) / 10.0); };
  std::string peak = mib(r.peak_mib);
  std::snprintf(buf, sizeof buf,
                "{\"engine\": \"reel\", \"model\": \"%s\", \"mode\": \"%s\", \"prec\": \"%s\", \"dev\": \"%s\", "
                "\"params\": %lld, \"items_per_step\": %lld, \"step_ms_median\": %.3f, \"step_ms_min\": %.3f, "
                "\"items_per_s\": %.0f, \"first_step_s\": %.2f, \"peak_mib\": %s, \"kernels_per_step\": %.0f, "
                "\"host_ms_median\": %.3f, \"B\": \"%s\", \"planned_peak_mib\": %s, \"dropout\": %g, "
                "\"graph_breaks\": %zu, \"recomputed\": %zu, \"accum\": %lld, \"budget_mib\": %s, "
                "\"memory_limit_mib\": %s, \"threads\": %d, \"gflop_per_step\": %.3f, \"tflops\": %.3f}",
                r.model.c_str(), r.mode.c_str(), r.prec.c_str(), r.dev.c_str(), (long long)r.params, (long long)r.items_per_step,
                r.median_ms, r.min_ms, double(r.items_per_step) / (r.median_ms / 1e3), r.first_s, peak.c_str(),
                r.kernels_per_step, r.host_ms, r.micro_batch.c_str(), mib(r.planned_mib).c_str(), r.dropout,
                r.graph_breaks, r.recomputed, (long long)r.accum, mib(r.budget_mib).c_str(),
                mib(r.memory_limit_mib).c_str(), r.threads, r.flops_per_step / 1e9,
                r.flops_per_step / (r.median_ms / 1e3) / 1e12);
  return buf;
}

}  // namespace

int bench_command(int argc, char** argv) {
  if (argc > 0 && (std::string(argv[0]) == "--help" || std::string(argv[0]) == "-h")) {
    std::printf("%s", bench_usage());
    return 0;
  }
  BenchOptions o = parse(argc, argv);
  Device device = o.device == "auto" ? (cuda::is_available() ? Device::cuda(0) : Device::cpu()) : Device::parse(o.device);
  std::vector<Result> results;
  std::ofstream json;
  if (!o.json_path.empty()) {
    json.open(o.json_path);  // before any run: a path that cannot be written fails now, not silently later
    REEL_CHECK(json.good(), "bench: cannot write --json ", o.json_path);
  }
  if (!o.trace_path.empty()) {  // likewise the trace's folder, though the file comes after the timed steps
    const std::filesystem::path dir = std::filesystem::path(o.trace_path).parent_path();
    REEL_CHECK(dir.empty() || std::filesystem::is_directory(dir), "bench: --trace ", o.trace_path, ": no folder ",
               dir.string());
  }
  std::printf("%-14s %-5s %-16s %-7s %10s %10s %12s %9s %10s %8s\n", "model", "prec", "mode", "device", "median ms",
              "min ms", "items/s", "peak MiB", "ops/step", "first s");
  for (const std::string& mode : o.modes)
    if (mode != "eager") compile::parse_mode(mode);  // a typo fails before any run
  for (const std::string& m : o.models)
    for (const std::string& p : o.precisions)
      for (const std::string& mode : o.modes) {
        Result r = run_config(m, p, mode, device, o);
        std::printf("%-14s %-5s %-16s %-7s %10.3f %10.3f %12.0f %9s %10.0f %8.2f\n", r.model.c_str(), r.prec.c_str(),
                    r.mode.c_str(), r.dev.c_str(), r.median_ms, r.min_ms,
                    double(r.items_per_step) / (r.median_ms / 1e3),
                    r.peak_mib < 0 ? "-" : std::to_string(std::lround(r.peak_mib)).c_str(), r.kernels_per_step,
                    r.first_s);
        std::printf("  model FLOPs: %.2f GFLOP a step (GEMMs, convolutions, attention), %.2f TFLOP/s at the median\n",
                    r.flops_per_step / 1e9, r.flops_per_step / (r.median_ms / 1e3) / 1e12);
        if (r.graph_breaks) std::printf("  (%zu graph breaks: REEL_LOG=graph_breaks names them)\n", r.graph_breaks);
        std::fflush(stdout);
        if (json.is_open()) {
          json << to_json(r) << "\n" << std::flush;
          REEL_CHECK(json.good(), "bench: writing --json ", o.json_path, " failed");
        }
      }
  return 0;
}

}  // namespace reel::tools
