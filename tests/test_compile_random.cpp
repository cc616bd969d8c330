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
#include "kernels/fused_expr.h"
#include "kernels/philox_args.h"
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

// The random draws of a plan's graph: random nodes, and the dropout masks that fused kernels draw
// (fused_elementwise's random instructions, the norms' dropout attrs).
int random_draws(const compile::Graph& g) {
  int n = 0;
  for (const compile::Node& node : g.nodes) {
    n += compile::is_random_op(node.op) || has_fused_dropout(node.attrs) ? 1 : 0;
    if (node.op != OpKind::FusedElementwise) continue;
    for (const Instr& i : fused_expr_of(node.attrs).code) n += i.kind == InstrKind::Random ? 1 : 0;
  }
  return n;
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
    EXPECT_EQ(random_draws(g), 4);
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
// trace, no graph break, and the same losses and parameters as eager from the same seed. On the CPU
// with fusion off (the plan runs eager's kernels) and on (the masks drawn inside fused kernels, f32
// arithmetic as eager's): to the bit both; on the GPU to the bit with fusion off, and with the
// default passes, as `reel bench` runs them, within tolerance.
TEST(CompileRandom, GptWithDropoutTrainsAsEagerStepForStep) {
  std::vector<std::pair<Device, bool>> runs{{Device::cpu(), false}, {Device::cpu(), true}};
  for (Device device : testing_util::test_devices())
    if (device.is_cuda()) {
      runs.push_back({device, false});
      runs.push_back({device, true});
    }
  for (const auto& run_on : runs) {
    const Device device = run_on.first;
    const bool fuse = run_on.second;
    SCOPED_TRACE(device.str() + (fuse ? " fused" : " unfused"));
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
      auto step = compile::compile_train_step(opt, loss_fn, {mode_for(device), 8, fuse});
      losses = testing_util::step_losses(opt, loss_fn, micro, 8, compiled ? &step : nullptr);
      if (compiled) {
        EXPECT_EQ(step.traces(), 1);
        EXPECT_EQ(step.replays(), 6);
        EXPECT_TRUE(step.graph_breaks().empty());
      }
      return model->parameters();
    };
    std::vector<double> eager_losses, compiled_losses;
    std::vector<Tensor> pe = run(false, eager_losses), pc = run(true, compiled_losses);
    if (device.is_cpu() || !fuse) {
      EXPECT_EQ(compiled_losses, eager_losses);
      for (size_t i = 0; i < pe.size(); ++i)
        EXPECT_EQ(pc[i].to_vector<double>(), pe[i].to_vector<double>()) << "parameter " << i;
    } else {
      // The GPU's fused GEMMs (cuBLASLt's epilogues, other algorithms) sum in other orders than
      // eager's: the same masks, within f32 tolerance.
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

// The dropout_masks pass: no dropout node and no stored mask is left in a fused GPT step; each mask
// is drawn inside the kernel that reads it, the losses are the bits of the plan without the pass,
// and the planned arena is smaller by the masks it no longer keeps from the forward to the backward.
// In fp32 the masks go into elementwise kernels (the forward's multiply, the backward's); in bf16 the
// residual branches' into the norms' (layer_norm_cast draws it for the add before the norm,
// layer_norm_backward_add for the branch's 16-bit gradient), the others into elementwise ones.
TEST(CompileRandom, DropoutMasksAreDrawnWhereTheyAreReadNotStored) {
  const nn::GptConfig config{32, 8, 16, 2, 2, 0.1};
  const auto micro = testing_util::token_batches(2, 2, 8, 32);
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    AutocastGuard amp(PrecisionPolicy::parse(precision));
    auto run = [&](std::vector<std::string> disabled, std::vector<double>& losses, size_t& arena) {
      Generator init(7);
      auto model = nn::gpt(config, &init);
      optim::AdamW opt(model->parameters(), optim::AdamWOptions(3e-3));
      opt.set_accum_steps(2);
      auto loss_fn = [&](const Tensor& a, const Tensor& b) { return nn::model_loss(*model, a, b); };
      manual_seed(23);
      auto step = compile::compile_train_step(opt, loss_fn, {compile::Mode::Default, 8, true, disabled});
      for (int s = 0; s < 4; ++s) losses.push_back(step(compile::flatten_micro(micro))[0].item());
      const compile::Plan* plan = step.last_plan();
      arena = plan->memory().arena_for(Device::cpu())->bytes;
      return plan->graph();
    };
    std::vector<double> with, without;
    size_t arena_with = 0, arena_without = 0;
    const compile::Graph g = run({}, with, arena_with);
    const compile::Graph kept = run({"dropout_masks"}, without, arena_without);
    EXPECT_EQ(with, without);
    // 5 dropouts a micro-batch (embeddings, and attention's and the MLP's outputs in 2 layers),
    // ACCUM 2: 10 masks drawn in the forward's kernels and 10 again in the backward's.
    int dropouts = 0, masks = 0, in_norms = 0;
    for (const compile::Node& n : g.nodes) {
      dropouts += n.op == OpKind::Dropout ? 1 : 0;
      masks += n.op == OpKind::DropoutMask ? 1 : 0;
      in_norms += (n.op == OpKind::LayerNormCast || testing_util::is_norm_backward_node(n)) && has_fused_dropout(n.attrs);
    }
    EXPECT_EQ(dropouts, 0);
    EXPECT_EQ(masks, 0) << "a mask drawn by a kernel of its own";
    EXPECT_EQ(random_draws(g), 20);
    EXPECT_EQ(random_draws(kept), 10);
    // bf16: the 4 residual branches a micro-batch in the forward's norms, and in the backward's all
    // but the last (the final norm's gradient reaches the last branch with no residual add to fuse).
    EXPECT_EQ(in_norms, std::string(precision) == "bf16" ? 2 * (4 + 3) : 0);
    EXPECT_LT(arena_with, arena_without);
  }
}
