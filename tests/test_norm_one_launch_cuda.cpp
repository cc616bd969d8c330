// The norms' one-launch backwards (kernels/cuda/norm_one_launch.h), each against its two-kernel path
// (the switch off) to the bit, and by the kernels a CUDA graph of it holds: one fewer where the path
// applies, as many where it does not. The CPU comparisons of the norms (test_norm_cuda, the op harness)
// run the one-launch paths too, since they are the default. Skips without a GPU.
//   - Batch norm (batch_norm_tiles.cuh: the sums and dx in one kernel, on a channels-last plane whose
//     grid fits on the GPU at once): the forward's outputs and running statistics (which the switch
//     leaves alone), dx (and its 16-bit form), dw and db, with and without the fused relu, affine or
//     not, a channel tile left partial (C = 40), f64 (64-pixel tiles), x and g 16-bit, eval, and a
//     plane too large for it.
//   - Layer norm's row-in-registers backward (layer_norm_rows.cuh: dx and the partial sums of dw and
//     db, then their finish, in one kernel): plain (f32) and with the fused residual add, 16-bit g and
//     dx copy and the copy's column sums, at gpt-small's and gpt-tiny's rows, at fewer rows than the
//     finish has column blocks (one block finishes them all), and at many rows.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "kernels/cuda/norm_one_launch.h"
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

// Sets a switch for a scope.
template <bool (*kSet)(bool)>
struct Switch {
  explicit Switch(bool on) : previous(kSet(on)) {}
  ~Switch() { kSet(previous); }
  bool previous;
};
using OneLaunch = Switch<cuda::set_batch_norm_one_launch>;
using LayerNormOneLaunch = Switch<cuda::set_layer_norm_one_launch>;

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

TEST(NormOneLaunchCuda, TheSwitchesSayWhatWasSet) {
  REEL_REQUIRE_GPU();
  const bool bn = cuda::batch_norm_one_launch(), ln = cuda::layer_norm_one_launch();
  {
    OneLaunch off(false);
    LayerNormOneLaunch ln_off(false);
    EXPECT_FALSE(cuda::batch_norm_one_launch());
    EXPECT_FALSE(cuda::layer_norm_one_launch());
  }
  EXPECT_EQ(cuda::batch_norm_one_launch(), bn);
  EXPECT_EQ(cuda::layer_norm_one_launch(), ln);
}

namespace {

struct RowsCase {
  int64_t rows, cols;
  bool fused;  // layer_norm_backward_add: residual, 16-bit g and dx copy, the copy's column sums
};

// The backward's outputs of one call, on the GPU.
std::vector<Tensor> layer_norm_backward(const RowsCase& c) {
  const Device gpu = Device::cuda(0);
  Generator gen(uint64_t(c.rows * 131 + c.cols));
  Tensor x = (randn({c.rows, c.cols}, {}, &gen) * 2.0 + 0.5).to(gpu),
         w = (randn({c.cols}, {}, &gen) * 0.5 + 1.0).to(gpu);
  std::vector<Tensor> f =
      dispatch(OpKind::LayerNorm, {x, w, Tensor()}, Attrs().set("eps", 1e-5).set("normalized_ndim", int64_t(1)));
  Tensor g = randn({c.rows, c.cols}, {}, &gen).to(gpu);
  if (!c.fused) return dispatch(OpKind::LayerNormBackward, {g, x, w, f[1], f[2]});
  Tensor residual = randn({c.rows, c.cols}, {}, &gen).to(gpu);
  return dispatch(OpKind::LayerNormBackwardAdd, {g.to(DType::bf16), x, w, f[1], f[2], residual},
                  Attrs().set("dtype", DType::bf16).set("column_sums", true).set("accumulate", false));
}

size_t captured_layer_norm_nodes(const RowsCase& c) {
  cuda::Graph graph(0);
  graph.capture_begin();
  layer_norm_backward(c);
  graph.capture_end();
  return graph.num_nodes();
}

const RowsCase kRowsCases[] = {{4096, 512, true}, {4096, 512, false}, {2048, 256, true},
                               {7, 384, false},   {7, 384, true},     {40000, 128, false}};

}  // namespace

TEST(LayerNormOneLaunchCuda, GivesTheTwoKernelPathsBits) {
  REEL_REQUIRE_GPU();
  for (const RowsCase& c : kRowsCases) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols) + (c.fused ? ", fused" : ", plain"));
    std::vector<Tensor> two, one, again;
    {
      LayerNormOneLaunch off(false);
      two = layer_norm_backward(c);
    }
    {
      LayerNormOneLaunch on(true);
      one = layer_norm_backward(c);
      again = layer_norm_backward(c);  // the counters and flags were left ready for the next launch
    }
    ASSERT_EQ(one.size(), two.size());
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_TRUE(same_bits(one[i], two[i])) << "output " << i;
      EXPECT_TRUE(same_bits(again[i], one[i])) << "output " << i << " on the second run";
    }
  }
}

TEST(LayerNormOneLaunchCuda, TakesOneKernelFewer) {
  REEL_REQUIRE_GPU();
  for (const RowsCase& c : kRowsCases) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols) + (c.fused ? ", fused" : ", plain"));
    size_t two = 0, one = 0;
    {
      LayerNormOneLaunch off(false);
      two = captured_layer_norm_nodes(c);
    }
    {
      LayerNormOneLaunch on(true);
      one = captured_layer_norm_nodes(c);
    }
    EXPECT_EQ(one + 1, two) << "kernels with the one-launch path " << one << ", without " << two;
  }
}
