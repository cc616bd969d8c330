// Google Benchmark suite of MODELS.md's training step (part of `make bench`): one benchmark per model
// and precision, eager, on the GPU when one is visible (timed with CUDA events, manual time) and on
// the CPU otherwise (wall time). Counters: items/s (images or tokens) and ops run per step.
// gpt-small, resnet18-cifar and vit-tiny are skipped on the CPU (seconds to tens of seconds a step on
// two cores); `reel bench` prints the same figures as a table and JSON lines for joining with the
// PyTorch peer.
#include <benchmark/benchmark.h>

#include "kernels/dispatch.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "reel.h"
#include "tensor/cuda.h"

namespace {

using namespace reel;

void BM_TrainStep(benchmark::State& state, const std::string& model, const std::string& prec) {
  Device device = cuda::is_available() ? Device::cuda(0) : Device::cpu();
  if (device.is_cpu() && (model == "gpt-small" || model == "resnet18-cifar" || model == "vit-tiny")) {
    state.SkipWithError((model + " is too slow for the CPU suite; run reel bench on a GPU").c_str());
    return;
  }
  AutocastGuard amp(PrecisionPolicy::parse(prec));
  nn::Workload w = nn::make_workload(model, device);
  std::vector<optim::MicroBatch> micro;
  for (const auto& [x, y] : w.micro) micro.push_back({x, y});
  optim::AdamW opt(w.model->parameters(), optim::AdamWOptions(1e-3).weight_decay(0.01));
  opt.set_accum_steps(int64_t(micro.size())).set_max_grad_norm(1.0);
  if (autocast_policy().needs_grad_scaler()) opt.set_grad_scaler(std::make_shared<optim::GradScaler>());
  auto loss_fn = [&](const Tensor& x, const Tensor& y) { return nn::model_loss(*w.model, x, y); };
  optim::train_step(opt, loss_fn, micro);  // warm-up: handles, algorithm choice, cached blocks
  if (device.is_cuda()) cuda::synchronize();
  uint64_t k0 = kernel_count();
  for (auto _ : state) {
    if (device.is_cuda()) {
      cuda::EventTimer timer;
      timer.start();
      optim::train_step(opt, loss_fn, micro);
      timer.stop();
      state.SetIterationTime(timer.elapsed_ms() / 1e3);
    } else {
      optim::train_step(opt, loss_fn, micro);
    }
  }
  state.counters["items"] = benchmark::Counter(double(w.items_per_step) * double(state.iterations()),
                                               benchmark::Counter::kIsRate);
  state.counters["ops/step"] = double(kernel_count() - k0) / double(state.iterations());
}

void register_train_benchmarks() {
  for (const std::string& model : nn::benchmark_model_names())
    for (const char* prec : {"fp32", "bf16", "fp16"}) {
      auto* b = benchmark::RegisterBenchmark(("BM_TrainStep/" + model + "/" + prec).c_str(), BM_TrainStep, model,
                                             std::string(prec));
      b->Unit(benchmark::kMillisecond);
      if (cuda::is_available()) b->UseManualTime()->MinTime(0.5);
      else b->UseRealTime()->Iterations(3);  // a CPU step takes a good fraction of a second
    }
}

const bool registered = (register_train_benchmarks(), true);

}  // namespace
