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

#include <cstring>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "kernels/cuda/batch_norm_one_launch.h"
#include "kernels/dispatch.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;

namespace {

struct Case {
  const char* name;
  Shape x;
  DType x_dtype;  // f32/f64 as is; bf16 read as f32 (attr dtype), the compiled step's mixed call
  bool relu, affine, training;
  bool copies16;  // cast_dtype bf16 (y's copy) and dx_dtype bf16
  bool fits;      // whether the one-launch path takes it
};

std::vector<Case> cases() {
  return {
      {"cnn-small's first norm", {32, 32, 32, 32}, DType::bf16, true, true, true, true, true},
      {"cnn-small's second norm", {32, 64, 16, 16}, DType::bf16, true, true, true, true, true},
      {"a partial channel tile", {6, 40, 7, 9}, DType::f32, false, false, true, false, true},
      {"f64", {4, 8, 5, 5}, DType::f64, true, true, true, false, true},
      {"eval", {8, 16, 6, 6}, DType::f32, false, true, false, false, true},
      {"too large to be resident at once", {64, 32, 64, 64}, DType::f32, true, true, true, false, false},
  };
}

struct Inputs {
  Tensor x, w, b, running_mean, running_var, g;
  Attrs forward, backward;
};

Inputs make_inputs(const Case& c) {
  const Device gpu = Device::cuda(0);
  const DType d = c.x_dtype == DType::f64 ? DType::f64 : DType::f32;
  Generator gen(91);
  Inputs in;
  const Shape channels{c.x[1]};
  in.x = to_dtype((randn(c.x, {}, &gen) * 1.5 + 0.25).to(gpu), c.x_dtype, MemoryFormat::ChannelsLast);
  in.g = to_dtype(randn(c.x, {}, &gen).to(gpu), c.copies16 ? DType::bf16 : d, MemoryFormat::ChannelsLast);
  if (c.affine)
    in.w = (randn(channels, {}, &gen) * 0.5 + 1.0).to(d).to(gpu),
    in.b = (randn(channels, {}, &gen) * 0.5).to(d).to(gpu);
  in.running_mean = (randn(channels, {}, &gen) * 0.5).to(d).to(gpu);
  in.running_var = (rand(channels, {}, &gen) + 0.5).to(d).to(gpu);
  in.forward = Attrs().set("eps", 1e-5).set("training", c.training).set("momentum", 0.1).set("relu", c.relu);
  in.backward = Attrs().set("training", c.training).set("relu", c.relu);
  if (c.x_dtype == DType::bf16) in.forward.set("dtype", DType::f32), in.backward.set("dtype", DType::f32);
  if (c.copies16) in.forward.set("cast_dtype", DType::bf16), in.backward.set("dx_dtype", DType::bf16);
  return in;
}

struct Outputs {
  std::vector<Tensor> forward, backward, running;
};

Outputs run(const Inputs& in) {
  Outputs o;
  o.running = {clone(in.running_mean), clone(in.running_var)};
  o.forward = dispatch(OpKind::BatchNorm, {in.x, in.w, in.b, o.running[0], o.running[1]}, in.forward);
  std::vector<Tensor> bwd_in = {in.g, in.x, in.w, o.forward[1], o.forward[2]};
  if (in.backward.b("relu", false)) bwd_in.push_back(o.forward[0]);
  o.backward = dispatch(OpKind::BatchNormBackward, bwd_in, in.backward);
  return o;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

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
  const char* forward_names[] = {"y", "mean", "rstd", "y16"};
  const char* backward_names[] = {"dx", "dw", "db"};
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
    ASSERT_EQ(one.forward.size(), two.forward.size());
    for (size_t i = 0; i < one.forward.size(); ++i)
      EXPECT_TRUE(same_bits(one.forward[i], two.forward[i])) << forward_names[i];
    for (size_t i = 0; i < one.backward.size(); ++i)
      EXPECT_TRUE(same_bits(one.backward[i], two.backward[i])) << backward_names[i];
    EXPECT_TRUE(same_bits(one.running[0], two.running[0])) << "running_mean";
    EXPECT_TRUE(same_bits(one.running[1], two.running[1])) << "running_var";
    // A second run: the counters and flags were left ready for the next launch.
    OneLaunch on(true);
    const Outputs again = run(in);
    for (size_t i = 0; i < one.forward.size(); ++i)
      EXPECT_TRUE(same_bits(again.forward[i], one.forward[i])) << forward_names[i] << " on the second run";
    for (size_t i = 0; i < one.backward.size(); ++i)
      EXPECT_TRUE(same_bits(again.backward[i], one.backward[i])) << backward_names[i] << " on the second run";
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
