// The two states that threads share in reel, and what each must guarantee:
// - tracing: a compiled function traces the ops of its own thread only (the dispatch observer is
//   per thread), and on a GPU captures its graph on a stream of its own thread, so eager work
//   another thread does meanwhile on the same device neither enters the plan nor the CUDA graph;
// - the default generator hands out each counter once, whichever thread asks.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "compile_test_util.h"
#include "test_util.h"

using namespace reel;

// Threads drawing from the default generator get disjoint counters, and one thread sees the offsets
// a plain counter would give.
TEST(Threads, TheDefaultGeneratorHandsOutEachCounterOnce) {
  Generator g(7);
  constexpr int kThreads = 4, kDraws = 20000;
  std::vector<std::vector<uint64_t>> starts(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      for (int i = 0; i < kDraws; ++i) starts[t].push_back(g.advance(3));
    });
  for (auto& th : pool) th.join();
  std::set<uint64_t> all;
  for (const auto& s : starts) all.insert(s.begin(), s.end());
  EXPECT_EQ(all.size(), size_t(kThreads * kDraws)) << "a counter was handed out twice";
  EXPECT_EQ(g.offset(), uint64_t(3) * kThreads * kDraws);
  Generator one(7);
  EXPECT_EQ(one.advance(5), 0u);
  EXPECT_EQ(one.advance(2), 5u);
}

// One thread compiles and replays a step while another runs eager ops on the same device: the
// trace records its own thread's ops only, so every plan is the single-threaded plan and every
// result is eager's.
TEST(Threads, AnotherThreadsEagerOpsDoNotEnterATrace) {
  auto step = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{relu(in[0] * 2.0 + 1.0).sum()}; };
  compile::CompiledFunction alone = compile::compile(step);
  Generator gen(5);
  const Tensor x = randn({64, 32}, {}, &gen);
  for (int i = 0; i < 3; ++i) alone({x});
  const std::string reference = alone.last_plan()->graph().str();
  const double expected = step({x})[0].item();
  std::atomic<bool> stop{false};
  std::thread noise([&] {
    Tensor a = ones({16, 16});
    while (!stop) a = exp(a * 0.5) - 1.0;
  });
  for (int round = 0; round < 20; ++round) {
    compile::CompiledFunction f = compile::compile(step);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(f({x})[0].item(), expected) << "round " << round << " call " << i;
    ASSERT_NE(f.last_plan(), nullptr);
    EXPECT_EQ(f.last_plan()->graph().str(), reference) << "round " << round;
  }
  stop = true;
  noise.join();
}

namespace {

// Eager work on `device` until `stop`: elementwise ops, a matmul and a host read (which waits for the
// device) each round, as a data loader or a metrics thread would do beside training.
void eager_noise(Device device, const std::atomic<bool>& stop, std::atomic<long>& rounds) {
  Tensor a = ones({64, 64}, {DType::f32, device});
  while (!stop) {
    a = exp(a * 0.5) - 1.0;
    a = matmul(a, a) * (1.0 / 64);
    if (rounds++ % 8 == 0) (void)a.sum().item();
  }
}

struct StepRun {
  std::vector<double> losses;             // each call's mean loss
  std::vector<std::vector<double>> params;  // after the last call
  std::string plan;                       // the plan's graph ("" when eager)
};

// Three MODELS.md steps (ACCUM 2, AdamW with clipping) of a fresh, identically initialised MLP on
// `device`: compiled (warm-up, trace, replay) or eagerly.
StepRun three_steps(Device device, bool compiled, const std::vector<optim::MicroBatch>& micro) {
  auto model = testing_util::f64_mlp(21, 6, 16, 3);
  model->to(DType::f32).to(device);
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.01));
  opt.set_accum_steps(2).set_max_grad_norm(0.5);
  nn::Module* m = model.get();
  auto loss_fn = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
  // Fusion off, so that the plan runs eager's own kernels and results agree to the bit; on a GPU the
  // replay is one captured CUDA graph.
  const compile::Mode mode = device.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default;
  std::optional<compile::CompiledFunction> step;
  if (compiled) step.emplace(compile::compile_train_step(opt, loss_fn, {mode, 8, false}));
  StepRun run;
  for (int s = 0; s < 3; ++s) {
    if (step) {
      run.losses.push_back((*step)(compile::flatten_micro(micro))[0].item());
    } else {
      Tensor mean_loss;
      optim::train_step(opt, loss_fn, micro, &mean_loss);
      run.losses.push_back(mean_loss.item());
    }
  }
  if (step) {
    EXPECT_EQ(step->traces(), 1);
    EXPECT_EQ(step->replays(), 1);
    EXPECT_TRUE(step->graph_breaks().empty());
    if (step->last_plan()) run.plan = step->last_plan()->graph().str();
  }
  for (const Tensor& p : model->parameters()) run.params.push_back(p.to_vector<double>());
  return run;
}

void compiled_steps_beside_eager_work(Device device) {
  Generator gen(4);
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < 2; ++i)
    micro.push_back({randn({8, 6}, {DType::f32, device}, &gen),
                     tensor_i64({0, 1, 2, 0, 1, 2, 2, 1}, {8}, device)});
  const StepRun eager = three_steps(device, false, micro);
  const StepRun alone = three_steps(device, true, micro);
  ASSERT_FALSE(alone.plan.empty());
  ASSERT_TRUE(testing_util::same_bits(alone.losses, eager.losses)) << "compiled differs from eager on one thread";

  std::atomic<bool> stop{false};
  std::atomic<long> noise_rounds{0};
  std::thread noise([&] { eager_noise(device, stop, noise_rounds); });
  int mismatches = 0;
  for (int round = 0; round < 200 && mismatches < 5; ++round) {
    const StepRun r = three_steps(device, true, micro);
    bool same = r.plan == alone.plan && testing_util::same_bits(r.losses, eager.losses) && r.params.size() == eager.params.size();
    for (size_t i = 0; same && i < r.params.size(); ++i) same = testing_util::same_bits(r.params[i], eager.params[i]);
    EXPECT_EQ(r.plan, alone.plan) << "round " << round << ": the plan differs from the single-threaded plan";
    EXPECT_TRUE(same) << "round " << round << ": losses or parameters differ from eager";
    mismatches += same ? 0 : 1;
  }
  stop = true;
  noise.join();
  EXPECT_GT(noise_rounds.load(), 0) << "the other thread never ran";
}

}  // namespace

// 200 times: one thread compiles, traces and replays a training step while another thread runs eager
// ops on the same device; every plan is the single-threaded plan, every loss and parameter eager's.
TEST(Threads, CompiledTrainStepsBesideEagerWorkOnTheCpu) { compiled_steps_beside_eager_work(Device::cpu()); }

TEST(Threads, CompiledTrainStepsBesideEagerWorkOnTheGpu) {
  REEL_REQUIRE_GPU();
  compiled_steps_beside_eager_work(Device::cuda());
}
