// A step's weight casts as one node (compile/passes/fuse_weight_casts.cpp): the casts of parameters to
// 16 bits, spread over the first forward, become one multi_tensor_cast at the first one's place. On
// the CPU always, on the GPU where visible:
//   - gpt-tiny and cnn-small (bf16 and fp16) compiled with the pass follow the step without it to the
//     bit, with one kernel for all the casts (every Copy of a parameter gone) and no larger arena;
//   - fp32 has no weight casts: the plan is the same with the pass on and off;
//   - under a memory limit the pass stays off, and says so under REEL_LOG=passes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "test_util.h"

namespace reel {
namespace {

// A plan's weight casts: multi_tensor_cast nodes of parameters (not grad_casts' of weight gradients,
// which read Internal buffers), the casts in them, the casts of a parameter left alone; and its
// arenas' bytes.
struct Census {
  size_t multi_casts = 0, casts_in_them = 0, parameter_casts = 0, arena = 0;
};
Census census(const compile::Plan& p) {
  Census c;
  for (const compile::Node& n : p.graph().nodes) {
    const bool weights = n.op == OpKind::MultiTensorCast && n.inputs[0] &&
                         p.graph().buffers[n.inputs[0]->buffer].kind == compile::BufferKind::External;
    c.multi_casts += weights;
    if (weights) c.casts_in_them += n.inputs.size();
    c.parameter_casts += n.op == OpKind::Copy && n.inputs[0] &&
                         p.graph().buffers[n.inputs[0]->buffer].kind == compile::BufferKind::External;
  }
  for (const compile::Arena& a : p.memory().arenas) c.arena += a.bytes;
  return c;
}

void expect_one_launch_for_the_casts(Device device) {
  for (const char* model : {"gpt-tiny", "cnn-small"})
    for (const char* precision : {"bf16", "fp16"}) {
      SCOPED_TRACE(std::string(model) + " " + precision);
      const testing_util::CompiledSteps off = testing_util::compiled_steps(model, device, precision, {"weight_casts"}),
                                        on = testing_util::compiled_steps(model, device, precision, {});
      ASSERT_NE(off.plan(), nullptr);
      ASSERT_NE(on.plan(), nullptr);
      const Census c_on = census(*on.plan()), c_off = census(*off.plan());
      EXPECT_GE(c_off.parameter_casts, 2u);
      EXPECT_EQ(c_on.parameter_casts, 0u);
      EXPECT_EQ(c_on.multi_casts, 1u);
      EXPECT_EQ(c_on.casts_in_them, c_off.parameter_casts);
      EXPECT_EQ(on.plan()->kernels() + c_off.parameter_casts - 1, off.plan()->kernels());
      EXPECT_LE(c_on.arena, c_off.arena);
      EXPECT_TRUE(testing_util::same_training(on, off));
    }
}

TEST(WeightCastsPass, OneKernelCastsEveryWeightToTheBitOnTheCpu) { expect_one_launch_for_the_casts(Device::cpu()); }

TEST(WeightCastsPass, OneKernelCastsEveryWeightToTheBitOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_one_launch_for_the_casts(Device::cuda(0));
}

TEST(WeightCastsPass, Fp32HasNoWeightCasts) {
  const Device cpu = Device::cpu();
  const testing_util::CompiledSteps off = testing_util::compiled_steps("gpt-tiny", cpu, "fp32", {"weight_casts"}),
                                    on = testing_util::compiled_steps("gpt-tiny", cpu, "fp32", {});
  ASSERT_NE(on.plan(), nullptr);
  EXPECT_EQ(census(*on.plan()).multi_casts, 0u);
  EXPECT_EQ(on.plan()->kernels(), off.plan()->kernels());
  EXPECT_TRUE(testing_util::same_training(on, off));
}

TEST(WeightCastsPass, StaysOffUnderAMemoryLimit) {
  std::string log;
  testing_util::CompiledSteps limited;
  {
    testing_util::ScopedEnv env("REEL_LOG", "passes");
    testing::internal::CaptureStderr();
    limited = testing_util::compiled_steps("gpt-tiny", Device::cpu(), "bf16", {}, size_t(1) << 40);  // a limit it meets
    log = testing::internal::GetCapturedStderr();
  }
  ASSERT_NE(limited.plan(), nullptr);
  EXPECT_EQ(census(*limited.plan()).multi_casts, 0u);
  EXPECT_GE(census(*limited.plan()).parameter_casts, 2u);
  EXPECT_NE(log.find("weight_casts: off under a memory limit"), std::string::npos) << log.substr(0, 2000);
}

}  // namespace
}  // namespace reel
