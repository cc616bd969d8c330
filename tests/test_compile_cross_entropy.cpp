// The classifier's loss and gradient as one node (compile/passes/fuse_cross_entropy.cpp): cross_entropy,
// its backward and, under autocast, the gradient's 16-bit cast become cross_entropy_with_grad. On the
// CPU always, on the GPU where visible:
//   - gpt-tiny's compiled step (ACCUM 2) with the pass on follows the step with it off to the bit,
//     in fp32, bf16 (the cast folded in) and fp16 (the seed made by the loss scale between the two),
//     with one node a micro-batch in place of two or three, and no cross_entropy left;
//   - a loss read before its backward (a scaled loss) keeps the nodes apart, with the reason logged.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "kernels/dispatch.h"
#include "test_util.h"

namespace reel {
namespace {

using testing_util::same_bits;

// Cross-entropy nodes of a plan: fused, fused with the cast, unfused.
struct Census {
  size_t fused = 0, with_cast = 0, unfused = 0;
};
Census census(const compile::Plan& p) {
  Census c;
  for (const compile::Node& n : p.graph().nodes) {
    c.fused += n.op == OpKind::CrossEntropyWithGrad;
    c.with_cast += n.op == OpKind::CrossEntropyWithGrad && n.attrs.has("dtype");
    c.unfused += n.op == OpKind::CrossEntropy || n.op == OpKind::CrossEntropyBackward;
  }
  return c;
}

void expect_pass_keeps_the_bits(Device device) {
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const bool autocast = std::string(precision) != "fp32";
    const testing_util::CompiledSteps off = testing_util::compiled_steps("gpt-tiny", device, precision,
                                                                         {"cross_entropy"}),
                                      on = testing_util::compiled_steps("gpt-tiny", device, precision, {});
    ASSERT_NE(off.plan(), nullptr);
    ASSERT_NE(on.plan(), nullptr);
    const Census c_on = census(*on.plan()), c_off = census(*off.plan());
    const size_t micro_batches = 2;
    EXPECT_EQ(c_on.fused, micro_batches);
    EXPECT_EQ(c_on.with_cast, autocast ? micro_batches : 0u);
    EXPECT_EQ(c_on.unfused, 0u);
    EXPECT_EQ(c_off.unfused, 2 * micro_batches);
    // Per micro-batch the forward goes, and under autocast the cast too.
    EXPECT_EQ(on.plan()->kernels() + micro_batches * (autocast ? 2 : 1), off.plan()->kernels());
    EXPECT_TRUE(testing_util::same_training(on, off));
  }
}

TEST(CrossEntropyPass, GptTinyFollowsTheStepWithoutItToTheBitOnTheCpu) { expect_pass_keeps_the_bits(Device::cpu()); }

TEST(CrossEntropyPass, GptTinyFollowsTheStepWithoutItToTheBitOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_pass_keeps_the_bits(Device::cuda(0));
}

// loss2 = 2 * cross_entropy(...) returned beside the gradient: the scaled loss reads the loss before
// the backward runs, so the two nodes stay apart, and REEL_LOG=fusion says why.
TEST(CrossEntropyPass, ALossReadBeforeItsBackwardKeepsTheNodesApart) {
  Generator gen(5);
  Tensor logits = randn({6, 10}, {}, &gen);
  Tensor target = tensor_i64({1, 0, 9, 3, 3, 7}, {6});
  auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    std::vector<Tensor> f = dispatch(OpKind::CrossEntropy, {in[0], target});
    Tensor scaled = f[0] * 2.0;
    Tensor d = dispatch(OpKind::CrossEntropyBackward, {in[1], in[0], target, f[1]})[0];
    return {scaled, d};
  };
  const std::vector<Tensor> in = {logits, full({}, 0.5)};
  const std::vector<Tensor> eager = fn(in);
  compile::CompiledFunction f = compile::compile(fn, compile::CompileOptions(compile::Mode::Default));
  std::vector<Tensor> out;
  std::string log;
  {
    testing_util::ScopedEnv env("REEL_LOG", "fusion");
    testing::internal::CaptureStderr();
    for (int i = 0; i < 3; ++i) out = f(in);  // eager, traced, replayed
    log = testing::internal::GetCapturedStderr();
  }
  ASSERT_NE(f.last_plan(), nullptr);
  size_t fused = 0;
  for (const compile::Node& n : f.last_plan()->graph().nodes) fused += n.op == OpKind::CrossEntropyWithGrad;
  EXPECT_EQ(fused, 0u) << f.last_plan()->graph().str();
  EXPECT_NE(log.find("cross_entropy: cross_entropy k"), std::string::npos) << log;
  EXPECT_NE(log.find("the loss is read before the backward"), std::string::npos) << log;
  for (size_t k = 0; k < out.size(); ++k) EXPECT_EQ(out[k].to_vector<double>(), eager[k].to_vector<double>());
}

// Without the scaled loss, the same two nodes fuse, and give eager's bits.
TEST(CrossEntropyPass, AHandWrittenPairFusesWithEagerBits) {
  Generator gen(6);
  Tensor logits = randn({6, 10}, {}, &gen);
  Tensor target = tensor_i64({1, -100, 9, 3, 3, 7}, {6});
  for (int64_t reduction : {0, 1}) {
    SCOPED_TRACE(reduction);
    const Attrs a = Attrs().set("reduction", reduction);
    auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
      std::vector<Tensor> f = dispatch(OpKind::CrossEntropy, {in[0], target}, a);
      Tensor d = dispatch(OpKind::CrossEntropyBackward, {in[1], in[0], target, f[1]}, a)[0];
      return {f[0], to_dtype(d, DType::bf16)};
    };
    const std::vector<Tensor> in = {logits, full({}, 0.5)};
    const std::vector<Tensor> eager = fn(in);
    compile::CompiledFunction f = compile::compile(fn, compile::CompileOptions(compile::Mode::Default));
    std::vector<Tensor> out;
    for (int i = 0; i < 3; ++i) out = f(in);  // eager, traced, replayed
    ASSERT_NE(f.last_plan(), nullptr);
    size_t fused = 0;
    for (const compile::Node& n : f.last_plan()->graph().nodes) fused += n.op == OpKind::CrossEntropyWithGrad;
    EXPECT_EQ(fused, 1u) << f.last_plan()->graph().str();
    EXPECT_EQ(f.last_plan()->kernels(), 1u) << f.last_plan()->graph().str();
    for (size_t k = 0; k < out.size(); ++k)
      EXPECT_TRUE(same_bits(out[k].to_vector<double>(), eager[k].to_vector<double>()));
  }
}

}  // namespace
}  // namespace reel
