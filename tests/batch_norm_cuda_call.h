// One batch norm forward and backward on the GPU as the compiled step calls them (x and g
// channels-last, a bf16 x read as f32, the relu and 16-bit copies fused): what the tests of batch
// norm's kernel switches share (test_batch_norm_one_launch_cuda.cpp, test_batch_norm_stats_switch_cuda.cpp).
#pragma once
#include <gtest/gtest.h>

#include <vector>

#include "autograd/ops.h"
#include "kernels/dispatch.h"
#include "reel.h"
#include "test_util.h"

namespace reel::testing_util {

struct BatchNormCall {
  Shape x;        // (N, C, H, W)
  DType x_dtype;  // f32/f64 as is; bf16 read as f32 (attr dtype), the compiled step's mixed call
  bool relu, affine, training;
  bool copies16;  // cast_dtype bf16 (y's copy) and dx_dtype bf16
};

struct BatchNormInputs {
  Tensor x, w, b, running_mean, running_var, g;
  Attrs forward, backward;
};

inline BatchNormInputs make_batch_norm_inputs(const BatchNormCall& c, uint64_t seed) {
  const Device gpu = Device::cuda(0);
  const DType d = c.x_dtype == DType::f64 ? DType::f64 : DType::f32;
  Generator gen(seed);
  BatchNormInputs in;
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

struct BatchNormOutputs {
  std::vector<Tensor> forward, backward, running;  // y, mean, rstd[, y16]; dx, dw, db; running mean, var
};

// The forward on copies of the running statistics, then the backward from its mean and rstd.
inline BatchNormOutputs run_batch_norm(const BatchNormInputs& in) {
  BatchNormOutputs o;
  o.running = {clone(in.running_mean), clone(in.running_var)};
  o.forward = dispatch(OpKind::BatchNorm, {in.x, in.w, in.b, o.running[0], o.running[1]}, in.forward);
  std::vector<Tensor> bwd_in = {in.g, in.x, in.w, o.forward[1], o.forward[2]};
  if (in.backward.b("relu", false)) bwd_in.push_back(o.forward[0]);
  o.backward = dispatch(OpKind::BatchNormBackward, bwd_in, in.backward);
  return o;
}

// Every output of a to the bit of b's: y, mean, rstd[, y16]; dx, dw, db; the running statistics. A
// failure names the output and `what` (which run a is).
inline void expect_same_batch_norm_bits(const BatchNormOutputs& a, const BatchNormOutputs& b, const char* what) {
  const char* forward_names[] = {"y", "mean", "rstd", "y16"};
  const char* backward_names[] = {"dx", "dw", "db"};
  const char* running_names[] = {"running_mean", "running_var"};
  ASSERT_EQ(a.forward.size(), b.forward.size()) << what;
  ASSERT_EQ(a.backward.size(), b.backward.size()) << what;
  for (size_t i = 0; i < a.forward.size(); ++i)
    EXPECT_TRUE(same_tensor_bits(a.forward[i], b.forward[i])) << forward_names[i] << ", " << what;
  for (size_t i = 0; i < a.backward.size(); ++i)
    EXPECT_TRUE(same_tensor_bits(a.backward[i], b.backward[i])) << backward_names[i] << ", " << what;
  for (size_t i = 0; i < 2; ++i)
    EXPECT_TRUE(same_tensor_bits(a.running[i], b.running[i])) << running_names[i] << ", " << what;
}

}  // namespace reel::testing_util
