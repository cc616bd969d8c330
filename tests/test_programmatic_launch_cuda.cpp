// Programmatic dependent launch (kernels/cuda/launch.cuh): with it on, each reel kernel's launch is
// processed while the kernel before it still runs, and the kernel's opening griddepcontrol.wait keeps
// the order. These tests check that the order holds (a long chain of dependent kernels, eager and in a
// CUDA graph) and that whole training steps compute the same bits with it on and off. Every test skips
// where no GPU is visible; on devices before compute capability 9.0 the switch stays off.
#include <gtest/gtest.h>

#ifdef REEL_CUDA
#include <cuda_runtime.h>
#endif

#include <string>
#include <vector>

#include "compile_test_util.h"
#include "kernels/cuda/programmatic_launch.h"
#include "nn/nn.h"
#include "tensor/cuda.h"
#include "test_util.h"

namespace reel {
namespace {

using testing_util::same_bits;

using cuda::ScopedProgrammaticLaunch;

bool device_supports_it() {
  ScopedProgrammaticLaunch on(true);
  return cuda::programmatic_launch();
}

TEST(ProgrammaticLaunchCuda, TheSwitchTurnsItOffAndOnWhereTheDeviceHasIt) {
  REEL_REQUIRE_GPU();
  const bool before = cuda::programmatic_launch();
  {
    ScopedProgrammaticLaunch off(false);
    EXPECT_FALSE(cuda::programmatic_launch());
  }
  EXPECT_EQ(cuda::programmatic_launch(), before);  // the scope put the switch back
#ifdef REEL_CUDA
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  EXPECT_EQ(device_supports_it(), major >= 9);
#endif
}

// x += y, 1000 times, each add reading what the one before wrote: any add that started early would
// read a stale x and lose an increment somewhere among the 2^20 elements.
void expect_chain_adds_up(bool graphed) {
  const TensorOptions f32{DType::f32, Device::cuda(0)};
  constexpr int kChain = 1000;
  const int64_t n = int64_t(1) << 20;
  Tensor x = zeros({n}, f32), y = full({n}, 1.0, f32);
  ScopedProgrammaticLaunch on(true);
  if (graphed) {
    cuda::Graph graph(0);
    graph.capture_begin();
    for (int k = 0; k < kChain; ++k) add_(x, y);
    graph.capture_end();
    graph.replay();
    graph.replay();
  } else {
    for (int k = 0; k < 2 * kChain; ++k) add_(x, y);
  }
  const std::vector<float> v = x.to_vector<float>();
  int64_t wrong = 0;
  for (float e : v) wrong += e != float(2 * kChain);
  EXPECT_EQ(wrong, 0) << "elements that missed an add; first is " << v[0] << ", last " << v.back();
}

TEST(ProgrammaticLaunchCuda, AChainOfDependentKernelsKeepsItsOrder) {
  REEL_REQUIRE_GPU();
  if (!device_supports_it()) GTEST_SKIP() << "programmatic dependent launch needs compute capability 9.0";
  expect_chain_adds_up(/*graphed=*/false);
  expect_chain_adds_up(/*graphed=*/true);
}

struct StepRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> state;  // parameters, then buffers
};

// Three training steps of `model` (micro-batch 2 x ACCUM 2, AdamW, clipping; fp16 with the scaler):
// the compiled step in reduce-overhead mode (one CUDA graph) or eager, with the switch as given.
StepRun run_steps(const std::string& model, const char* precision, bool compiled, bool programmatic) {
  ScopedProgrammaticLaunch mode(programmatic);
  AutocastGuard amp(PrecisionPolicy::parse(precision));
  testing_util::SmallTraining t = testing_util::small_training(model, Device::cuda(0));
  StepRun r;
  if (compiled) {
    compile::CompiledFunction step =
        compile::compile_train_step(*t.opt, t.loss, compile::CompileOptions(compile::Mode::ReduceOverhead));
    r.losses = testing_util::step_losses(*t.opt, t.loss, t.micro, 3, &step);
  } else {
    r.losses = testing_util::step_losses(*t.opt, t.loss, t.micro, 3, nullptr);
  }
  r.state = t.state();
  return r;
}

TEST(ProgrammaticLaunchCuda, TrainingStepsComputeTheSameBitsWithItOnAndOff) {
  REEL_REQUIRE_GPU();
  if (!device_supports_it()) GTEST_SKIP() << "programmatic dependent launch needs compute capability 9.0";
  for (const char* model : {"gpt-tiny", "cnn-small"})
    for (const char* precision : {"bf16", "fp16"})
      for (bool compiled : {true, false}) {
        SCOPED_TRACE(std::string(model) + " " + precision + (compiled ? " compiled" : " eager"));
        const StepRun off = run_steps(model, precision, compiled, false);
        const StepRun on = run_steps(model, precision, compiled, true);
        EXPECT_TRUE(same_bits(on.losses, off.losses));
        ASSERT_EQ(on.state.size(), off.state.size());
        for (size_t i = 0; i < off.state.size(); ++i)
          EXPECT_TRUE(same_bits(on.state[i], off.state[i])) << "tensor " << i;
      }
}

}  // namespace
}  // namespace reel
