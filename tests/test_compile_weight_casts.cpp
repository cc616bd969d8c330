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

using testing_util::same_bits;

struct StepRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> state;
  size_t kernels = 0, multi_casts = 0, casts_in_them = 0, parameter_casts = 0, arena = 0;
};

StepRun run_steps(const char* model, Device device, const char* precision, bool pass_on, size_t memory_limit = 0) {
  AutocastGuard amp(PrecisionPolicy::parse(precision));
  testing_util::SmallTraining t = testing_util::small_training(model, device);
  compile::CompileOptions o(device.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default);
  if (!pass_on) o.disabled_passes = {"weight_casts"};
  o.memory_limit = memory_limit;
  compile::CompiledFunction step = compile::compile_train_step(*t.opt, t.loss, o);
  StepRun r;
  r.losses = testing_util::step_losses(*t.opt, t.loss, t.micro, 3, &step);
  r.state = t.state();
  if (!step.last_plan()) return r;
  const compile::Plan& p = *step.last_plan();
  r.kernels = p.kernels();
  for (const compile::Node& n : p.graph().nodes) {
    r.multi_casts += n.op == OpKind::MultiTensorCast;
    if (n.op == OpKind::MultiTensorCast) r.casts_in_them += n.inputs.size();
    r.parameter_casts += n.op == OpKind::Copy && n.inputs[0] &&
                         p.graph().buffers[n.inputs[0]->buffer].kind == compile::BufferKind::External;
  }
  for (const compile::Arena& a : p.memory().arenas) r.arena += a.bytes;
  return r;
}

void expect_one_launch_for_the_casts(Device device) {
  for (const char* model : {"gpt-tiny", "cnn-small"})
    for (const char* precision : {"bf16", "fp16"}) {
      SCOPED_TRACE(std::string(model) + " " + precision);
      const StepRun off = run_steps(model, device, precision, false), on = run_steps(model, device, precision, true);
      ASSERT_GT(off.kernels, 0u);
      EXPECT_GE(off.parameter_casts, 2u);
      EXPECT_EQ(on.parameter_casts, 0u);
      EXPECT_EQ(on.multi_casts, 1u);
      EXPECT_EQ(on.casts_in_them, off.parameter_casts);
      EXPECT_EQ(on.kernels + off.parameter_casts - 1, off.kernels);
      EXPECT_LE(on.arena, off.arena);
      EXPECT_TRUE(same_bits(on.losses, off.losses));
      ASSERT_EQ(on.state.size(), off.state.size());
      for (size_t i = 0; i < off.state.size(); ++i) EXPECT_TRUE(same_bits(on.state[i], off.state[i])) << "tensor " << i;
    }
}

TEST(WeightCastsPass, OneKernelCastsEveryWeightToTheBitOnTheCpu) { expect_one_launch_for_the_casts(Device::cpu()); }

TEST(WeightCastsPass, OneKernelCastsEveryWeightToTheBitOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_one_launch_for_the_casts(Device::cuda(0));
}

TEST(WeightCastsPass, Fp32HasNoWeightCasts) {
  const StepRun off = run_steps("gpt-tiny", Device::cpu(), "fp32", false),
                on = run_steps("gpt-tiny", Device::cpu(), "fp32", true);
  EXPECT_EQ(on.multi_casts, 0u);
  EXPECT_EQ(on.kernels, off.kernels);
  EXPECT_TRUE(same_bits(on.losses, off.losses));
}

TEST(WeightCastsPass, StaysOffUnderAMemoryLimit) {
  std::string log;
  StepRun limited;
  {
    testing_util::ScopedEnv env("REEL_LOG", "passes");
    testing::internal::CaptureStderr();
    limited = run_steps("gpt-tiny", Device::cpu(), "bf16", true, size_t(1) << 40);  // a limit it meets
    log = testing::internal::GetCapturedStderr();
  }
  EXPECT_EQ(limited.multi_casts, 0u);
  EXPECT_GE(limited.parameter_casts, 2u);
  EXPECT_NE(log.find("weight_casts: off under a memory limit"), std::string::npos) << log.substr(0, 2000);
}

}  // namespace
}  // namespace reel
