// Tracing without running (CompileOptions::trace_without_running, compile/runtime/compile.h): the
// first call is traced in meta mode and served by its plan, so no call runs at eager's footprint.
//   - a GPT with dropout (AdamW, clipping, ACCUM 2) and a CNN with BatchNorm train exactly as eagerly
//     from the first step: the same losses, parameters and running statistics to the bit on the CPU
//     (fused or not) and unfused on a GPU; no call runs eagerly, one trace, every call a plan's;
//   - fp16 with a GradScaler (its state made before the trace): the same bits as eager;
//   - the first call holds the plan's memory, not eager's: its peak is the steady replay's, below the
//     eager step's, and with a memory limit the limit holds from the first call;
//   - what cannot be traced without running is a clear error: an optimizer whose first update differs
//     (SGD with momentum), a value read on the host, state a function makes at its first call.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compile/runtime/compile.h"
#include "compile/runtime/memory_budget.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "test_util.h"

using namespace reel;
using reel::testing_util::expect_error;
using reel::testing_util::same_bits;

namespace {

compile::Mode mode_for(Device d) { return d.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default; }

struct TrainingRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> state;  // parameters, then buffers
  int traces = 0, replays = 0, eager = 0;
};

// `steps` steps of `model` over `micro` (ACCUM = micro.size()) with AdamW and clipping: eagerly, or
// compiled with the first calls traced in meta mode.
TrainingRun train(nn::Module& model, const std::vector<optim::MicroBatch>& micro, int steps, Device device, bool compiled,
          bool fuse, bool scaler = false, size_t memory_limit = 0) {
  optim::AdamW opt(model.parameters(), optim::AdamWOptions(3e-3).weight_decay(0.01));
  opt.set_accum_steps(int64_t(micro.size())).set_max_grad_norm(1.0);
  if (scaler) opt.set_grad_scaler(std::make_shared<optim::GradScaler>());
  optim::LossFn loss_fn = [&](const Tensor& a, const Tensor& b) { return nn::model_loss(model, a, b); };
  manual_seed(17);
  compile::CompileOptions options(mode_for(device), 8, fuse);
  options.trace_without_running = true;
  options.memory_limit = memory_limit;
  std::optional<compile::CompiledFunction> step;
  if (compiled) step.emplace(compile::compile_train_step(opt, loss_fn, options));
  TrainingRun r;
  r.losses = testing_util::step_losses(opt, loss_fn, micro, steps, step ? &*step : nullptr);
  if (step) r.traces = step->traces(), r.replays = step->replays(), r.eager = step->eager_calls();
  for (const auto& [name, p] : model.named_parameters()) r.state.push_back(p.to_vector<double>());
  for (const auto& [name, b] : model.named_buffers()) r.state.push_back(b.to_vector<double>());
  return r;
}

void expect_same_training(const TrainingRun& eager, const TrainingRun& compiled, int steps, bool bitwise) {
  EXPECT_EQ(compiled.traces, 1);
  EXPECT_EQ(compiled.replays, steps);  // the first call too: served by the plan its trace built
  EXPECT_EQ(compiled.eager, 0);
  ASSERT_EQ(eager.losses.size(), compiled.losses.size());
  ASSERT_EQ(eager.state.size(), compiled.state.size());
  if (bitwise) {
    EXPECT_TRUE(same_bits(compiled.losses, eager.losses))
        << "compiled " << ::testing::PrintToString(compiled.losses) << ", eager " << ::testing::PrintToString(eager.losses);
    for (size_t i = 0; i < eager.state.size(); ++i) EXPECT_TRUE(same_bits(compiled.state[i], eager.state[i])) << "tensor " << i;
    return;
  }
  // A GPU's fused GEMMs sum in other orders than eager's: within f32 tolerance.
  for (size_t i = 0; i < eager.losses.size(); ++i) EXPECT_NEAR(compiled.losses[i], eager.losses[i], 1e-4) << "step " << i;
}

std::vector<std::pair<Device, bool>> devices_and_fusion() {
  std::vector<std::pair<Device, bool>> runs{{Device::cpu(), false}, {Device::cpu(), true}};
  for (Device device : testing_util::test_devices())
    if (device.is_cuda()) runs.push_back({device, false}), runs.push_back({device, true});
  return runs;
}

const nn::GptConfig kGpt{32, 8, 16, 2, 2, 0.1};  // vocab 32, context 8, dim 16, 2 heads, 2 layers, dropout 0.1

}  // namespace

TEST(CompileTraceWithoutRunning, GptWithDropoutTrainsAsEagerFromTheFirstStep) {
  for (const auto& [device, fuse] : devices_and_fusion()) {
    SCOPED_TRACE(device.str() + (fuse ? " fused" : " unfused"));
    const auto micro = testing_util::token_batches(2, 2, 8, 32, device);
    auto run = [&](bool compiled) {
      Generator init(7);
      auto model = nn::gpt(kGpt, &init);
      model->to(device);
      return train(*model, micro, 5, device, compiled, fuse);
    };
    expect_same_training(run(false), run(true), 5, device.is_cpu() || !fuse);
  }
}

TEST(CompileTraceWithoutRunning, CnnWithBatchNormTrainsAsEagerFromTheFirstStep) {
  for (const auto& [device, fuse] : devices_and_fusion()) {
    SCOPED_TRACE(device.str() + (fuse ? " fused" : " unfused"));
    nn::Workload w = nn::make_workload("cnn-small", device, 2, 4, 5);
    std::vector<optim::MicroBatch> micro;
    for (const auto& [x, y] : w.micro) micro.push_back({x, y});
    auto run = [&](bool compiled) {
      Generator init(9);
      auto model = nn::make_benchmark_model("cnn-small", &init);
      model->to(device);
      return train(*model, micro, 4, device, compiled, fuse);
    };
    TrainingRun eager = run(false), compiled = run(true);
    expect_same_training(eager, compiled, 4, device.is_cpu() || !fuse);
    // The running statistics moved: BatchNorm's training forward ran in the traced plan.
    EXPECT_FALSE(compiled.state.empty());
  }
}

TEST(CompileTraceWithoutRunning, Fp16WithTheGradScalerTrainsAsEager) {
  AutocastGuard amp(PrecisionPolicy::parse("fp16"));
  const auto micro = testing_util::token_batches(2, 2, 8, 32);
  for (bool fuse : {false, true}) {
    SCOPED_TRACE(fuse ? "fused" : "unfused");
    auto run = [&](bool compiled) {
      Generator init(7);
      auto model = nn::gpt(kGpt, &init);
      return train(*model, micro, 4, Device::cpu(), compiled, fuse, /*scaler=*/true);
    };
    // Unfused, eager's kernels: the same bits. Fused, the plan's kernels round in other places than
    // eager's (a fused fp16 step traced the usual way leaves eager's bits at its first replay too):
    // within fp16's tolerance.
    TrainingRun eager = run(false), compiled = run(true);
    expect_same_training(eager, compiled, 4, !fuse);
    if (fuse) {
      for (size_t i = 0; i < eager.losses.size(); ++i) EXPECT_NEAR(compiled.losses[i], eager.losses[i], 1e-3);
    }
  }
}

// The first call's peak is the plan's (its arena, the state, the inputs): no call runs eagerly, so
// none holds eager's saved activations; under a memory limit, the limit's arena from the first call.
// Peaks are the allocator's absolute ones (the plan's arena is made in the first call and held after).
TEST(CompileTraceWithoutRunning, TheFirstCallHoldsThePlansMemoryNotEagers) {
  const Device cpu = Device::cpu();
  const auto micro = testing_util::token_batches(2, 4, 32, 64);
  const nn::GptConfig config{64, 32, 64, 2, 2, 0.0};
  auto peaks = [&](bool compiled, bool meta, size_t limit) {
    Generator init(3);
    auto model = nn::gpt(config, &init);
    optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3));
    opt.set_accum_steps(2).set_max_grad_norm(1.0);
    optim::LossFn loss_fn = [&](const Tensor& a, const Tensor& b) { return nn::model_loss(*model, a, b); };
    compile::CompileOptions options(compile::Mode::Default);
    options.trace_without_running = meta;
    options.memory_limit = limit;
    if (meta) opt.create_state_now();  // counted from before the first call, as the plan counts it
    std::optional<compile::CompiledFunction> step;
    if (compiled) step.emplace(compile::compile_train_step(opt, loss_fn, options));
    // The allocator's absolute peak within each call: what the process holds at the call's busiest.
    std::vector<size_t> out;
    for (int call = 0; call < 4; ++call) {
      compile::reset_peak_bytes(cpu);
      testing_util::step_losses(opt, loss_fn, micro, 1, step ? &*step : nullptr);
      out.push_back(compile::peak_bytes(cpu));
    }
    return out;
  };
  const std::vector<size_t> eager = peaks(false, false, 0), meta = peaks(true, true, 0),
                            limited = peaks(true, true, 150 << 10);
  // The steady state: call 3, a replay like every later one.
  EXPECT_LE(double(meta[0]), 1.02 * double(meta[3])) << "first call " << meta[0] << ", replay " << meta[3];
  EXPECT_LT(meta[0], eager[1]) << "eager step " << eager[1];
  EXPECT_LT(limited[0], meta[0]);
  EXPECT_LE(double(limited[0]), 1.02 * double(limited[3]));
}

TEST(CompileTraceWithoutRunning, WhatCannotBeTracedWithoutRunningIsAClearError) {
  Generator init(7);
  auto model = nn::gpt(kGpt, &init);
  optim::LossFn loss_fn = [&](const Tensor& a, const Tensor& b) { return nn::model_loss(*model, a, b); };
  compile::CompileOptions options;
  options.trace_without_running = true;
  // SGD with momentum copies the gradient into its buffer at its first update only.
  optim::SGD sgd(model->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  expect_error([&] { compile::compile_train_step(sgd, loss_fn, options); },
               {"compile_train_step", "SGD", "first update", "trace_without_running"});
  // Plain SGD has no state: it traces.
  optim::SGD plain(model->parameters(), optim::SGDOptions(0.1));
  EXPECT_NO_THROW(compile::compile_train_step(plain, loss_fn, options));

  const Tensor x = full({4}, 2.0);
  // A value read on the host: meta mode has none to give.
  auto reads = compile::compile(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{mul(in[0], in[0].sum().item())}; }, options);
  expect_error([&] { reads({x}); }, {"tracing without running", "failed"});
  // State the function makes at its first call would be a meta tensor.
  Tensor state;
  auto makes_state = compile::compile(
      [&](const std::vector<Tensor>& in) {
        if (!state.defined()) state = zeros({4});
        add_(state, in[0]);
        return std::vector<Tensor>{mul(state, 2.0)};
      },
      options);
  expect_error([&] { makes_state({x}); }, {"tracing without running", "made while tracing", "create it before"});
}

// A function that finds its state made traces without running and computes what it computes eagerly.
TEST(CompileTraceWithoutRunning, AFunctionWithItsStateMadeComputesAsEager) {
  Tensor state = zeros({4});
  compile::CompileOptions options;
  options.trace_without_running = true;
  auto step = compile::compile(
      [&](const std::vector<Tensor>& in) {
        add_(state, in[0]);
        return std::vector<Tensor>{mul(state, 2.0)};
      },
      options);
  const Tensor x = tensor({1.0, 2.0, 3.0, 4.0}, {4});
  for (int call = 1; call <= 3; ++call) {
    std::vector<Tensor> out = step({x});
    EXPECT_EQ(out[0].to_vector<double>(), (std::vector<double>{2.0 * call, 4.0 * call, 6.0 * call, 8.0 * call}));
  }
  EXPECT_EQ(step.traces(), 1);
  EXPECT_EQ(step.eager_calls(), 0);
}
