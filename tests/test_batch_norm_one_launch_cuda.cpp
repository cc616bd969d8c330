// Batch norm's one-launch backward (kernels/cuda/batch_norm_tiles.cuh, switch in
// kernels/cuda/batch_norm_one_launch.h): on a channels-last plane whose grid fits on the GPU at once, the
// backward's sums and dx run as one kernel. Checked against the two-kernel path (the switch off) to
// the bit: the forward's outputs and running statistics (which the switch leaves alone), dx (and its
// 16-bit form), dw and db, with and without the fused relu, affine or not, a channel tile left
// partial (C = 40), f64 (64-pixel tiles), x and g 16-bit, eval; a second run gives the same bits (the
// counters are left ready); and a CUDA graph of the forward and backward has one kernel fewer where
// the path applies and as many where the plane is too large for it. The CPU comparisons of the norms
// (test_norm_cuda, the op harness) run the one-launch path too, since it is the default. Skips without
// a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/ops.h"
#include "batch_norm_cuda_call.h"
#include "kernels/cuda/batch_norm_one_launch.h"
#include "kernels/dispatch.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;

namespace {

using testing_util::BatchNormCall;
using Inputs = testing_util::BatchNormInputs;
using Outputs = testing_util::BatchNormOutputs;
constexpr auto run = testing_util::run_batch_norm;

struct Case {
  const char* name;
  BatchNormCall call;
  bool fits;  // whether the one-launch path takes it
};

std::vector<Case> cases() {
  return {
      {"cnn-small's first norm", {{32, 32, 32, 32}, DType::bf16, true, true, true, true}, true},
      {"cnn-small's second norm", {{32, 64, 16, 16}, DType::bf16, true, true, true, true}, true},
      {"a partial channel tile", {{6, 40, 7, 9}, DType::f32, false, false, true, false}, true},
      {"f64", {{4, 8, 5, 5}, DType::f64, true, true, true, false}, true},
      {"eval", {{8, 16, 6, 6}, DType::f32, false, true, false, false}, true},
      {"too large to be resident at once", {{64, 32, 64, 64}, DType::f32, true, true, true, false}, false},
  };
}

Inputs make_inputs(const Case& c) { return testing_util::make_batch_norm_inputs(c.call, 91); }

// Kernels (graph nodes) of one forward and backward, captured.
size_t captured_nodes(const Inputs& in) {
  cuda::Graph graph(0);
  graph.capture_begin();
  run(in);
  graph.capture_end();
  return graph.num_nodes();
}

// Sets the switch for a scope.
struct OneLaunch {
  explicit OneLaunch(bool on) : previous(cuda::set_batch_norm_one_launch(on)) {}
  ~OneLaunch() { cuda::set_batch_norm_one_launch(previous); }
  bool previous;
};

}  // namespace

TEST(BatchNormOneLaunchCuda, GivesTheTwoKernelPathsBits) {
  REEL_REQUIRE_GPU();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c);
    Outputs two, one;
    {
      OneLaunch off(false);
      two = run(in);
    }
    {
      OneLaunch on(true);
      one = run(in);
    }
    testing_util::expect_same_batch_norm_bits(one, two, "one launch against two");
    // A second run: the counters and flags were left ready for the next launch.
    OneLaunch on(true);
    testing_util::expect_same_batch_norm_bits(run(in), one, "one launch, the second run");
  }
}

TEST(BatchNormOneLaunchCuda, TakesOneKernelFewerWhereThePlaneFits) {
  REEL_REQUIRE_GPU();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c);
    size_t two = 0, one = 0;
    {
      OneLaunch off(false);
      two = captured_nodes(in);
    }
    {
      OneLaunch on(true);
      one = captured_nodes(in);
    }
    const size_t fewer = c.fits ? 1 : 0;
    EXPECT_EQ(one + fewer, two) << "kernels with the one-launch path " << one << ", without " << two;
  }
}

TEST(BatchNormOneLaunchCuda, TheSwitchSaysWhatWasSet) {
  REEL_REQUIRE_GPU();
  const bool before = cuda::batch_norm_one_launch();
  {
    OneLaunch off(false);
    EXPECT_FALSE(cuda::batch_norm_one_launch());
  }
  EXPECT_EQ(cuda::batch_norm_one_launch(), before);
}
