// Recomputation for a memory limit (compile/passes/recompute.cpp): a compiled step under a limit
// clones nodes into the backward, its arena shrinks, and it computes the same bits as the step
// without a limit (losses, parameters and BatchNorm's running statistics), since every clone is the
// same kernel on the same input values.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compile/runtime/describe.h"
#include "compile_test_util.h"
#include "test_util.h"
#include "nn/nn.h"

namespace reel {
namespace {

using testing_util::same_bits;

struct RecomputeRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> state;  // parameters, then buffers
  size_t arena = 0, recomputed = 0;
  size_t listed = 0;  // kernels the plan listing marks "(recomputed)"
  std::string summary;
};

// Four compiled steps (fused) of `model` at micro-batch 2 x ACCUM 2: default mode on the CPU,
// reduce-overhead (the whole step one CUDA graph) on a GPU.
RecomputeRun run_steps(const std::string& model, const char* precision, size_t limit,
                       Device device = Device::cpu()) {
  AutocastGuard amp(PrecisionPolicy::parse(precision));
  testing_util::SmallTraining t = testing_util::small_training(model, device);
  compile::CompileOptions options(device.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default);
  options.memory_limit = limit;
  compile::CompiledFunction step = compile::compile_train_step(*t.opt, t.loss, options);
  RecomputeRun r;
  r.losses = testing_util::step_losses(*t.opt, t.loss, t.micro, 4, &step);
  const compile::Plan* plan = step.last_plan();
  EXPECT_NE(plan, nullptr);
  if (!plan) return r;
  r.arena = plan->memory().arena_for(device)->bytes;
  r.recomputed = plan->stats().recomputed.size();
  r.summary = compile::recompute_summary(*plan, limit);
  const std::string listing = compile::plan_listing(*plan);
  for (size_t at = listing.find("(recomputed)"); at != std::string::npos; at = listing.find("(recomputed)", at + 1))
    ++r.listed;
  r.state = t.state();
  return r;
}

void expect_same_step_under_a_limit(const std::string& model, const char* precision,
                                    Device device = Device::cpu()) {
  SCOPED_TRACE(model + " " + precision + " " + device.str());
  const RecomputeRun free = run_steps(model, precision, 0, device);
  EXPECT_EQ(free.recomputed, 0u);
  EXPECT_EQ(free.summary, "");
  const size_t limit = free.arena * 3 / 4;
  const RecomputeRun tight = run_steps(model, precision, limit, device);
  EXPECT_GT(tight.recomputed, 0u) << tight.summary;
  EXPECT_EQ(tight.listed, tight.recomputed);
  EXPECT_EQ(free.listed, 0u);
  EXPECT_LT(tight.arena, free.arena) << tight.summary;
  EXPECT_NE(tight.summary.find("nodes cloned into the backward"), std::string::npos) << tight.summary;
  EXPECT_TRUE(same_bits(tight.losses, free.losses));
  ASSERT_EQ(tight.state.size(), free.state.size());
  for (size_t i = 0; i < free.state.size(); ++i) EXPECT_TRUE(same_bits(tight.state[i], free.state[i])) << "tensor " << i;
}

TEST(CompileRecompute, GptUnderALimitComputesTheSameBits) {
  expect_same_step_under_a_limit("gpt-tiny", "fp32");
  expect_same_step_under_a_limit("gpt-tiny", "bf16");
}

TEST(CompileRecompute, CnnWithBatchNormUnderALimitComputesTheSameBits) {
  // BatchNorm's training forward updates its running statistics: never cloned, and the buffers
  // (running statistics, num_batches_tracked) end equal.
  expect_same_step_under_a_limit("cnn-small", "fp32");
  expect_same_step_under_a_limit("cnn-small", "bf16");
}

TEST(CompileRecomputeCuda, GptAndCnnUnderALimitComputeTheSameBits) {
  // The same kernels on the same values inside one CUDA graph: equal to the bit on the GPU too.
  REEL_REQUIRE_GPU();
  for (const char* precision : {"fp32", "bf16"}) {
    expect_same_step_under_a_limit("gpt-tiny", precision, Device::cuda(0));
    expect_same_step_under_a_limit("cnn-small", precision, Device::cuda(0));
  }
}

TEST(CompileRecompute, ALimitThatFitsClonesNothing) {
  const RecomputeRun free = run_steps("cnn-small", "fp32", 0);
  const RecomputeRun roomy = run_steps("cnn-small", "fp32", free.arena * 2);
  EXPECT_EQ(roomy.recomputed, 0u);
  EXPECT_EQ(roomy.arena, free.arena);
  EXPECT_NE(roomy.summary.find("nothing"), std::string::npos) << roomy.summary;
}

TEST(CompileRecompute, AnUnreachableLimitSaysSoAndStillComputesTheSameBits) {
  // One byte: the planner recomputes what helps, stops where nothing more does, and says the step
  // stayed above the limit; the step is still exact.
  const RecomputeRun free = run_steps("cnn-small", "fp32", 0);
  const RecomputeRun tiny = run_steps("cnn-small", "fp32", 1);
  EXPECT_GT(tiny.recomputed, 0u);
  EXPECT_LT(tiny.arena, free.arena);
  EXPECT_NE(tiny.summary.find("above the limit"), std::string::npos) << tiny.summary;
  EXPECT_TRUE(same_bits(tiny.losses, free.losses));
}

}  // namespace
}  // namespace reel
