// The norm_16bit_input pass (compile/passes/read_norm_input_16bit.cpp): under bf16/fp16 autocast a
// convolution's 16-bit result is cast to f32 for the batch or group norm after it, and the step kept
// that f32 copy until the norm's backward. The pass has the norms read the 16-bit result instead.
//   - A small conv + BatchNorm + ReLU + conv + GroupNorm + ReLU net, compiled as MODELS.md's training
//     step (ACCUM 2, AdamW): losses, parameters and running statistics equal to the bit with the pass
//     on and off; no f32 cast of a convolution's result left; a smaller planned arena. On the GPU too
//     (reduce-overhead, channels-last convolutions: the norms read the NHWC 16-bit result, summing in
//     another order, so equal within rounding there; skips without a GPU).
//   - resnet18-cifar (20 conv + BatchNorm layers, small images): the same, in bf16.
//   - Where a cast's result has a reader besides the norms (a residual taking the convolution's result
//     as it is), the pass leaves it and says why under REEL_LOG=fusion.
#include <gtest/gtest.h>

#include <memory>
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

constexpr const char* kPass = "norm_16bit_input";

std::shared_ptr<nn::Module> conv_norm_net() {
  Generator gen(5);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1, false, &gen));
  m->push_back(std::make_shared<nn::BatchNorm2d>(8));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Conv2d>(8, 8, 3, 1, 1, true, &gen));
  m->push_back(std::make_shared<nn::GroupNorm>(2, 8));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::GlobalAvgPool2d>());
  m->push_back(std::make_shared<nn::Linear>(8, 5, true, &gen));
  return m;
}

// A convolution whose result both a BatchNorm and a residual add read: relu(bn(conv(x)) + conv(x)).
class ConvResidual : public nn::Module {
 public:
  explicit ConvResidual(Generator* gen)
      : nn::Module("ConvResidual"),
        conv_(register_module("conv", std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1, false, gen))),
        bn_(register_module("bn", std::make_shared<nn::BatchNorm2d>(8))),
        head_(register_module("head", std::make_shared<nn::Linear>(8, 5, true, gen))) {}
  Tensor forward(const Tensor& x) override {
    Tensor z = conv_->forward(x);
    return head_->forward(mean(relu(bn_->forward(z) + z), {2, 3}));
  }

 private:
  std::shared_ptr<nn::Conv2d> conv_;
  std::shared_ptr<nn::BatchNorm2d> bn_;
  std::shared_ptr<nn::Linear> head_;
};

std::vector<optim::MicroBatch> image_batches(int accum, int64_t B, int64_t side) {
  Generator gen(31);
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < accum; ++i) {
    std::vector<int64_t> labels;
    for (int64_t b = 0; b < B; ++b) labels.push_back((3 * i + 7 * b + 1) % 5);
    micro.push_back({randn({B, 3, side, side}, {}, &gen), tensor_i64(labels, {B})});
  }
  return micro;
}

struct Trained {
  std::vector<double> losses, state;  // state: every parameter and buffer after the steps
  compile::Graph graph;
  size_t arena = 0;
};

// `steps` compiled training steps of a fresh model, with `disabled` passes off (call 0 runs eagerly,
// call 1 traces, the later ones replay the plan: steps >= 3).
Trained train(const std::function<std::shared_ptr<nn::Module>()>& make, std::vector<optim::MicroBatch> micro,
              int steps, const std::vector<std::string>& disabled, Device device = Device::cpu()) {
  std::shared_ptr<nn::Module> model = make();
  model->to(device);
  for (optim::MicroBatch& b : micro) b.inputs = b.inputs.to(device), b.targets = b.targets.to(device);
  const compile::Mode mode = device.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default;
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(3e-3));
  opt.set_accum_steps(int(micro.size()));
  auto loss_fn = [&](const Tensor& x, const Tensor& y) { return nn::model_loss(*model, x, y); };
  compile::CompiledFunction step =
      compile::compile_train_step(opt, loss_fn, {mode, 8, true, disabled});
  Trained t;
  for (int s = 0; s < steps; ++s) t.losses.push_back(step(compile::flatten_micro(micro))[0].item());
  for (const auto& [name, v] : model->named_state())
    for (double x : v.to_vector<double>()) t.state.push_back(x);
  const compile::Plan* plan = step.last_plan();
  EXPECT_NE(plan, nullptr);
  if (plan) {
    t.graph = plan->graph();
    t.arena = plan->memory().arena_for(device)->bytes;
  }
  return t;
}

bool is_norm(OpKind op) {
  return op == OpKind::BatchNorm || op == OpKind::BatchNormBackward || op == OpKind::GroupNorm ||
         op == OpKind::GroupNormBackward;
}

struct Census {
  int widened_norms = 0;    // norms reading a 16-bit x (attr dtype)
  int casts_to_norms = 0;   // casts of a 16-bit value to f32 that a norm reads
};
Census census(const compile::Graph& g) {
  Census c;
  std::vector<int> cast_of(g.buffers.size(), 0);  // buffers written by a 16-bit -> f32 cast
  for (const compile::Node& n : g.nodes)
    if (n.op == OpKind::Copy && n.inputs.size() == 1 && n.inputs[0] &&
        (n.inputs[0]->dtype == DType::bf16 || n.inputs[0]->dtype == DType::f16) &&
        n.outputs[0].dtype == DType::f32)
      cast_of[size_t(n.outputs[0].buffer)] = 1;
  for (const compile::Node& n : g.nodes) {
    if (!is_norm(n.op)) continue;
    c.widened_norms += n.attrs.has("dtype") ? 1 : 0;
    for (const auto& in : n.inputs) c.casts_to_norms += in && cast_of[size_t(in->buffer)] ? 1 : 0;
  }
  return c;
}

void expect_conv_norm_step_equal_and_smaller(Device device) {
  const auto micro = image_batches(2, 4, 8);
  for (const char* precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(std::string(precision) + " on " + device.str());
    AutocastGuard amp(PrecisionPolicy::parse(precision));
    // norm_relu off in both: it folds the casts around the relus only where the norms read 16 bits.
    const Trained on = train(conv_norm_net, micro, 3, {"norm_relu"}, device),
                  off = train(conv_norm_net, micro, 3, {kPass, "norm_relu"}, device);
    if (device.is_cpu()) {
      EXPECT_TRUE(testing_util::same_bits(on.losses, off.losses));
      EXPECT_TRUE(testing_util::same_bits(on.state, off.state)) << "parameters, running statistics, counters";
    } else {
      // The GPU's batch norm reads the channels-last 16-bit result in place, in tiles of pixels
      // (kernels/cuda/batch_norm.cu): its sums run in another order than over the f32 cast in
      // (N, C, H, W) order, so the two steps agree to rounding, not to the bit.
      EXPECT_LT(testing_util::max_abs_diff(on.losses, off.losses), 2e-3);
      EXPECT_LT(testing_util::max_abs_diff(on.state, off.state), 2e-2) << "parameters, running statistics, counters";
    }
    // 2 micro-batches x (BatchNorm + GroupNorm) x (forward + backward), each reading the 16-bit result.
    EXPECT_EQ(census(on.graph).widened_norms, 8);
    EXPECT_EQ(census(on.graph).casts_to_norms, 0);
    EXPECT_EQ(census(off.graph).casts_to_norms, 8);
    EXPECT_LT(on.arena, off.arena);
    EXPECT_EQ(off.graph.nodes.size() - on.graph.nodes.size(), 4u) << "one cast a norm a micro-batch";
  }
}

}  // namespace

TEST(CompileNorm16BitInput, ConvNormStepEqualsTheUnrewrittenStepToTheBitAndPlansLess) {
  expect_conv_norm_step_equal_and_smaller(Device::cpu());
}

TEST(CompileNorm16BitInputCuda, ConvNormStepEqualsTheUnrewrittenStepToTheBitAndPlansLess) {
  REEL_REQUIRE_GPU();
  expect_conv_norm_step_equal_and_smaller(Device::cuda(0));
}

TEST(CompileNorm16BitInput, Resnet18CifarStepEqualsTheUnrewrittenStepToTheBit) {
  const auto micro = image_batches(2, 2, 16);
  AutocastGuard amp(PrecisionPolicy::parse("bf16"));
  auto make = [] {
    Generator gen(3);
    return nn::make_benchmark_model("resnet18-cifar", &gen);
  };
  const Trained on = train(make, micro, 3, {}), off = train(make, micro, 3, {kPass});
  EXPECT_TRUE(testing_util::same_bits(on.losses, off.losses));
  EXPECT_TRUE(testing_util::same_bits(on.state, off.state));
  // 20 convolutions, each with its BatchNorm, forward and backward, in 2 micro-batches.
  EXPECT_EQ(census(on.graph).widened_norms, 80);
  EXPECT_EQ(census(on.graph).casts_to_norms, 0);
  EXPECT_LT(on.arena, off.arena);
}

// The norm_grad_16bit pass (compile/passes/write_norm_grad_16bit.cpp): a batch or group norm's
// backward writes the 16-bit dx the convolution's backward reads, instead of an f32 dx and autocast's
// cast of it.
struct GradCensus {
  int dx16 = 0;         // batch/group_norm_backward nodes writing a 16-bit dx (attr dx_dtype)
  int casts_of_dx = 0;  // f32 -> 16-bit casts of such a node's dx
};
GradCensus grad_census(const compile::Graph& g) {
  GradCensus c;
  std::vector<int> dx_of_norm(g.buffers.size(), 0);
  for (const compile::Node& n : g.nodes)
    if (n.op == OpKind::BatchNormBackward || n.op == OpKind::GroupNormBackward) {
      c.dx16 += n.attrs.has("dx_dtype") ? 1 : 0;
      dx_of_norm[size_t(n.outputs[0].buffer)] = 1;
    }
  for (const compile::Node& n : g.nodes)
    if (n.op == OpKind::Copy && n.inputs.size() == 1 && n.inputs[0] && dx_of_norm[size_t(n.inputs[0]->buffer)])
      c.casts_of_dx += 1;
  return c;
}

void expect_norm_grad_16bit_equal_and_fewer(Device device) {
  const auto micro = image_batches(2, 4, 8);
  for (const char* precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(std::string(precision) + " on " + device.str());
    AutocastGuard amp(PrecisionPolicy::parse(precision));
    const Trained on = train(conv_norm_net, micro, 3, {}, device),
                  off = train(conv_norm_net, micro, 3, {"norm_grad_16bit"}, device);
    // One rounding of the same f32 dx, in the kernel or by the cast: the same bits on either device.
    EXPECT_TRUE(testing_util::same_bits(on.losses, off.losses));
    EXPECT_TRUE(testing_util::same_bits(on.state, off.state)) << "parameters, running statistics, counters";
    // The BatchNorm's and the GroupNorm's backward in each of the 2 micro-batches.
    EXPECT_EQ(grad_census(on.graph).dx16, 4);
    EXPECT_EQ(grad_census(on.graph).casts_of_dx, 0);
    EXPECT_EQ(grad_census(off.graph).casts_of_dx, 4);
    EXPECT_EQ(off.graph.nodes.size() - on.graph.nodes.size(), 4u) << "one cast a norm a micro-batch";
  }
}

TEST(CompileNormGrad16Bit, ConvNormStepEqualsTheUnrewrittenStepToTheBitWithTwoCastsFewer) {
  expect_norm_grad_16bit_equal_and_fewer(Device::cpu());
}

TEST(CompileNormGrad16BitCuda, ConvNormStepEqualsTheUnrewrittenStepToTheBitWithTwoCastsFewer) {
  REEL_REQUIRE_GPU();
  expect_norm_grad_16bit_equal_and_fewer(Device::cuda(0));
}

TEST(CompileNormGrad16Bit, Resnet18CifarEveryBatchNormWritesItsConvolutionsGradient) {
  const auto micro = image_batches(2, 2, 16);
  AutocastGuard amp(PrecisionPolicy::parse("bf16"));
  auto make = [] {
    Generator gen(3);
    return nn::make_benchmark_model("resnet18-cifar", &gen);
  };
  const Trained on = train(make, micro, 3, {}), off = train(make, micro, 3, {"norm_grad_16bit"});
  EXPECT_TRUE(testing_util::same_bits(on.losses, off.losses));
  EXPECT_TRUE(testing_util::same_bits(on.state, off.state));
  // 20 BatchNorms, each after a convolution whose backward takes dx in bf16, in 2 micro-batches.
  EXPECT_EQ(grad_census(on.graph).dx16, 40);
  EXPECT_EQ(grad_census(on.graph).casts_of_dx, 0);
  EXPECT_LE(on.arena, off.arena);
}

TEST(CompileNormGrad16Bit, DeclinesADxOtherOpsReadAndSaysWhy) {
  // f32: the first convolution's weight gradient reads the f32 dx itself, no cast; the log says so.
  const auto micro = image_batches(2, 4, 8);
  std::string log;
  {
    testing_util::ScopedEnv env("REEL_LOG", "fusion");
    testing::internal::CaptureStderr();
    const Trained on = train(conv_norm_net, micro, 3, {});
    log = testing::internal::GetCapturedStderr();
    EXPECT_EQ(grad_census(on.graph).dx16, 0);
  }
  EXPECT_NE(log.find("norm_grad_16bit: batch_norm_backward k"), std::string::npos) << log.substr(0, 2000);
  EXPECT_NE(log.find("not fused with the cast of dx: dx is read by conv2d_backward_weight, not by a cast of all of it"),
            std::string::npos)
      << log.substr(0, 3000);
}

TEST(CompileNorm16BitInput, DeclinesAResultOtherOpsReadAndSaysWhy) {
  const auto micro = image_batches(2, 4, 8);
  AutocastGuard amp(PrecisionPolicy::parse("bf16"));
  auto make = [] {
    Generator gen(9);
    return std::static_pointer_cast<nn::Module>(std::make_shared<ConvResidual>(&gen));
  };
  std::string log;
  Trained on;
  {
    testing_util::ScopedEnv env("REEL_LOG", "fusion");
    testing::internal::CaptureStderr();
    on = train(make, micro, 3, {});
    log = testing::internal::GetCapturedStderr();
  }
  const Trained off = train(make, micro, 3, {kPass});
  EXPECT_TRUE(testing_util::same_bits(on.losses, off.losses));
  EXPECT_EQ(census(on.graph).widened_norms, 0);
  EXPECT_NE(log.find("norm_16bit_input: copy k"), std::string::npos) << log.substr(0, 2000);
  EXPECT_NE(log.find("not fused with its norms: t is also read by add, which needs it in f32"), std::string::npos)
      << log.substr(0, 2000);
}
