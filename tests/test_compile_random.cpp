// Random ops inside compiled functions (compile/ir/trace.h, Graph::random_sources): dropout, rand and
// randn are nodes of the plan, replayed in every mode and, on a GPU, inside the CUDA graph. Each run
// reserves its generator's counters and writes {seed, base} to the device before the kernels run, so
//   - every call draws fresh numbers (a mask that repeated would be a frozen trace);
//   - a compiled run equals an eager run from the same seed, draw for draw and to the bit, and leaves
//     the generator at the same offset;
//   - a training step with dropout traces once, without graph breaks, and matches eager's losses and
//     parameters over many steps.
// Each case runs on the CPU and, when one is usable, the GPU (reduce-overhead: one CUDA graph).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "compile_test_util.h"
#include "test_util.h"

using namespace reel;

namespace {

compile::Mode mode_for(Device d) { return d.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default; }

// y = dropout(x, 0.3) + rand * randn, and dropout again through a generator of the caller's own.
std::vector<Tensor> random_step(const std::vector<Tensor>& in, Generator& own) {
  const Tensor& x = in[0];
  const TensorOptions o{x.dtype(), x.device()};
  Tensor y = dropout(x, 0.3) + rand(x.shape(), o) * randn(x.shape(), o);
  return {y, dropout(x, 0.5, true, &own)};
}

std::vector<std::vector<double>> values(const std::vector<Tensor>& ts) {
  std::vector<std::vector<double>> out;
  for (const Tensor& t : ts) out.push_back(t.to_vector<double>());
  return out;
}

}  // namespace

TEST(CompileRandom, DropoutRandAndRandnDrawWhatEagerDrawsFreshOnEveryReplay) {
  for (Device device : testing_util::test_devices()) {
    SCOPED_TRACE(device.str());
    const Tensor x = to_device(arange(96).reshape({8, 12}) * 0.25 - 3.0, device);
    constexpr int kCalls = 6;
    manual_seed(41);
    Generator own_eager(5);
    std::vector<std::vector<std::vector<double>>> eager;
    for (int i = 0; i < kCalls; ++i) eager.push_back(values(random_step({x}, own_eager)));
    const uint64_t eager_offset = default_generator().offset();

    manual_seed(41);
    Generator own(5);
    auto f = compile::compile([&](const std::vector<Tensor>& in) { return random_step(in, own); }, {mode_for(device)});
    for (int i = 0; i < kCalls; ++i) EXPECT_EQ(values(f({x})), eager[size_t(i)]) << "call " << i;
    EXPECT_TRUE(f.graph_breaks().empty()) << f.graph_breaks()[0].op << ": " << f.graph_breaks()[0].reason;
    EXPECT_EQ(f.replays(), kCalls - 2);
    EXPECT_EQ(default_generator().offset(), eager_offset);
    EXPECT_EQ(own.offset(), own_eager.offset());
    for (int i = 1; i < kCalls; ++i) EXPECT_NE(eager[size_t(i)], eager[size_t(i - 1)]) << "the same numbers twice";
    ASSERT_NE(f.last_plan(), nullptr);
    const compile::Graph& g = f.last_plan()->graph();
    EXPECT_EQ(g.random_sources.size(), 2u);  // the default generator and `own`
    int random_nodes = 0;
    for (const compile::Node& n : g.nodes) random_nodes += compile::is_random_op(n.op) ? 1 : 0;
    EXPECT_EQ(random_nodes, 4);
    if (device.is_cuda()) {
      EXPECT_EQ(f.last_plan()->graphs(), 1u);
    }
  }
}

// A draw the plan did not make (someone else used the generator between calls) moves the numbers
// on, as it would eagerly: the plan reads the generator's offset on every run.
TEST(CompileRandom, DrawsBetweenCallsShiftTheNumbersAsEagerly) {
  for (Device device : testing_util::test_devices()) {
    SCOPED_TRACE(device.str());
    const Tensor x = to_device(ones({32}), device);
    auto step = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{dropout(in[0], 0.5)}; };
    manual_seed(3);
    std::vector<std::vector<double>> eager;
    for (int i = 0; i < 5; ++i) {
      eager.push_back(step({x})[0].to_vector<double>());
      rand({7});  // a draw outside the function
    }
    manual_seed(3);
    auto f = compile::compile(step, {mode_for(device)});
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(f({x})[0].to_vector<double>(), eager[size_t(i)]) << "call " << i;
      rand({7});
    }
    EXPECT_EQ(f.replays(), 3);
    manual_seed(99);  // a new seed reaches the replays too
    const std::vector<double> reseeded = f({x})[0].to_vector<double>();
    manual_seed(99);
    EXPECT_EQ(reseeded, step({x})[0].to_vector<double>());
  }
}

// A GPT with GPT-2's dropout, compiled as a whole training step (ACCUM 2, AdamW, clipping): one
// trace, no graph break, and the same losses and parameters as eager from the same seed. Fusion off
// on the CPU (the plan runs eager's kernels); on the GPU the default passes, as `reel bench` runs it.
TEST(CompileRandom, GptWithDropoutTrainsAsEagerStepForStep) {
  for (Device device : testing_util::test_devices()) {
    SCOPED_TRACE(device.str());
    const nn::GptConfig config{32, 8, 16, 2, 2, 0.1};
    const auto micro = testing_util::token_batches(2, 2, 8, 32, device);
    auto run = [&](bool compiled, std::vector<double>& losses) {
      Generator init(7);
      auto model = nn::gpt(config, &init);
      model->to(device);
      optim::AdamW opt(model->parameters(), optim::AdamWOptions(3e-3).weight_decay(0.01));
      opt.set_accum_steps(2).set_max_grad_norm(1.0);
      auto loss_fn = [&](const Tensor& a, const Tensor& b) { return nn::model_loss(*model, a, b); };
      manual_seed(17);
      auto step = compile::compile_train_step(opt, loss_fn, {mode_for(device), 8, device.is_cuda()});
      for (int s = 0; s < 8; ++s) {
        if (compiled) {
          losses.push_back(step(compile::flatten_micro(micro))[0].item());
        } else {
          Tensor mean_loss;
          optim::train_step(opt, loss_fn, micro, &mean_loss);
          losses.push_back(mean_loss.item());
        }
      }
      if (compiled) {
        EXPECT_EQ(step.traces(), 1);
        EXPECT_EQ(step.replays(), 6);
        EXPECT_TRUE(step.graph_breaks().empty());
      }
      return model->parameters();
    };
    std::vector<double> eager_losses, compiled_losses;
    std::vector<Tensor> pe = run(false, eager_losses), pc = run(true, compiled_losses);
    if (device.is_cpu()) {
      EXPECT_EQ(compiled_losses, eager_losses);
      for (size_t i = 0; i < pe.size(); ++i)
        EXPECT_EQ(pc[i].to_vector<double>(), pe[i].to_vector<double>()) << "parameter " << i;
    } else {
      // Fused kernels round differently from eager's: the same masks, within f32 tolerance.
      for (size_t i = 0; i < eager_losses.size(); ++i) EXPECT_NEAR(compiled_losses[i], eager_losses[i], 1e-4) << "step " << i;
    }
    // The masks are really applied: in training the loss differs from eval's (dropout off).
    Generator init(7);
    auto model = nn::gpt(config, &init);
    model->to(device);
    const double training = nn::model_loss(*model, micro[0].inputs, micro[0].targets).item();
    model->eval();
    EXPECT_NE(training, nn::model_loss(*model, micro[0].inputs, micro[0].targets).item());
  }
}
