// Group norm before a global average pool (compile/passes/fuse_norm_pool.cpp): the norm writes the
// pool (attr pool), and its backward reads the pool's (N, C) gradient behind the expand, with the
// mean's 1/S as attr grad_scale and the head's 16-bit gradient read in place of its widening.
//   - cnn-small's compiled step (ACCUM 2) with the pass on follows the step with it off to the bit,
//     on the CPU (whose kernels run the mean and mul_scalar ops) and on the GPU (whose kernels sum
//     the pool as the mean's kernel does and round the scale as mul_scalar does), in fp32, bf16 and
//     fp16, with two kernels fewer a micro-batch (the mean; the scale, after autocast's cast);
//   - the GPU's kernel takes the pool for the rows the mean's warp-per-row kernel takes, and refuses
//     other calls by name;
//   - the schema names the op: batch norm takes neither attr, a pool needs spatial dims.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/passes/passes.h"
#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "kernels/dispatch.h"
#include "test_util.h"

namespace reel {
namespace {

using testing_util::count_op;

size_t count_attr(const compile::Plan& p, OpKind op, const char* attr) {
  size_t n = 0;
  for (const compile::Node& node : p.graph().nodes) n += node.op == op && node.attrs.has(attr);
  return n;
}

void expect_the_pool_fused(const testing_util::CompiledSteps& on, const testing_util::CompiledSteps& off,
                           bool autocast) {
  ASSERT_NE(on.plan(), nullptr);
  ASSERT_NE(off.plan(), nullptr);
  const size_t micro_batches = 2;
  EXPECT_EQ(count_attr(*on.plan(), OpKind::GroupNorm, "pool"), micro_batches);
  EXPECT_EQ(count_attr(*on.plan(), OpKind::GroupNormBackward, "grad_scale"), micro_batches);
  EXPECT_EQ(count_op(*on.plan(), OpKind::Mean), 0u);
  EXPECT_EQ(count_op(*off.plan(), OpKind::Mean), micro_batches);
  EXPECT_EQ(count_attr(*off.plan(), OpKind::GroupNorm, "pool"), 0u);
  // Per micro-batch the mean goes, and the elementwise kernel of the scale (with autocast's widening
  // cast of the head's 16-bit gradient before it): relu_backward is the norm's with the pass off too.
  EXPECT_EQ(on.plan()->kernels() + 2 * micro_batches, off.plan()->kernels());
  EXPECT_EQ(count_op(*off.plan(), OpKind::ReluBackward), 0u);
  if (autocast) {
    EXPECT_EQ(count_op(*on.plan(), OpKind::FusedElementwise),
              count_op(*off.plan(), OpKind::FusedElementwise) - micro_batches);
  }
}

TEST(NormPoolPass, CnnSmallFollowsTheStepWithoutItToTheBitOnTheCpu) {
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const auto [on, off] = testing_util::pass_on_and_off("cnn-small", Device::cpu(), precision, "norm_pool");
    expect_the_pool_fused(on, off, std::string(precision) != "fp32");
    EXPECT_TRUE(testing_util::same_training(on, off));
  }
}

TEST(NormPoolPass, CnnSmallFollowsTheStepWithoutItToTheBitOnTheGpu) {
  REEL_REQUIRE_GPU();
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const Device gpu = Device::cuda(0);
    const auto [on, off] = testing_util::pass_on_and_off("cnn-small", gpu, precision, "norm_pool");
    expect_the_pool_fused(on, off, std::string(precision) != "fp32");
    EXPECT_TRUE(testing_util::same_training(on, off));
  }
}

// x (2, 4, 3, 3) -> group_norm -> y [-> relu_(y), in place] -> mean(y, dims) -> p (2, 4): a
// hand-made graph on the CPU for the pass's declines.
compile::Graph pool_graph(bool relu_in_place_between, std::optional<std::vector<int64_t>> dims) {
  using compile::BufferKind;
  using testing_util::graph_floats, testing_util::graph_node, testing_util::graph_ref;
  compile::Graph g;
  const int x = graph_floats(g, BufferKind::Input, 72), y = graph_floats(g, BufferKind::Internal, 72);
  const int mean = graph_floats(g, BufferKind::Internal, 4), rstd = graph_floats(g, BufferKind::Internal, 4);
  const int p = graph_floats(g, BufferKind::Internal, 8);
  compile::Node norm = graph_node(OpKind::GroupNorm, {graph_ref(x, {2, 4, 3, 3})},
                                  {graph_ref(y, {2, 4, 3, 3}), graph_ref(mean, {2, 2}), graph_ref(rstd, {2, 2})});
  norm.inputs.push_back(std::nullopt), norm.inputs.push_back(std::nullopt);  // no w, b
  norm.attrs.set("groups", int64_t(2)).set("eps", 1e-5);
  g.nodes.push_back(norm);
  if (relu_in_place_between)
    g.nodes.push_back(graph_node(OpKind::Relu, {graph_ref(y, {2, 4, 3, 3})}, graph_ref(y, {2, 4, 3, 3}), true));
  compile::Node m = graph_node(OpKind::Mean, {graph_ref(y, {2, 4, 3, 3})}, graph_ref(p, {2, 4}));
  if (dims) m.attrs.set("dims", *dims);
  m.attrs.set("keepdim", false);
  g.nodes.push_back(m);
  g.outputs = {graph_ref(p, {2, 4})};
  return g;
}

TEST(NormPoolPass, TakesTheSpatialMeanOfAFreshYOnly) {
  auto pooled = [](compile::Graph g) {
    compile::PassStats st;
    compile::fuse_norm_pool(g, st);
    return g.nodes.front().attrs.b("pool", false) && testing_util::count_op(g, OpKind::Mean) == 0;
  };
  EXPECT_TRUE(pooled(pool_graph(false, std::vector<int64_t>{2, 3})));
  EXPECT_TRUE(pooled(pool_graph(false, std::vector<int64_t>{-1, -2})));
  EXPECT_FALSE(pooled(pool_graph(true, std::vector<int64_t>{2, 3})));  // y changed before the mean
  EXPECT_FALSE(pooled(pool_graph(false, std::vector<int64_t>{1, 2, 3})));
  EXPECT_FALSE(pooled(pool_graph(false, std::nullopt)));  // a mean over all of y
}

// The pool's call: x (N, C, *spatial) f32 on `device`, groups 2, relu and pool.
std::vector<Tensor> pool_call_outputs(const Shape& x, Device device) {
  const Shape pooled{x[0], x[1]};
  return {Tensor::empty(x, DType::f32, device), Tensor::empty({x[0], 2}, DType::f32, device),
          Tensor::empty({x[0], 2}, DType::f32, device), Tensor::empty(pooled, DType::f32, device)};
}

TEST(NormPoolKernel, TheGpuTakesThePoolForTheMeansWarpRows) {
  REEL_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const Attrs a = Attrs().set("groups", int64_t(2)).set("eps", 1e-5).set("relu", true).set("pool", true);
  auto takes = [&](const Shape& x) {
    const std::vector<Tensor> in = {Tensor::empty(x, DType::f32, gpu), Tensor(), Tensor()};
    return supports_call(OpKind::GroupNorm, in, pool_call_outputs(x, gpu), a);
  };
  EXPECT_TRUE(takes({4, 8, 8, 8}));     // 64 positions: cnn-small's last norm
  EXPECT_TRUE(takes({2, 4, 17}));       // 17: the shortest row the mean gives a warp
  EXPECT_TRUE(takes({2, 4, 32, 32}));   // 1024: the longest
  EXPECT_FALSE(takes({2, 4, 4, 4}));    // 16: the mean's column kernel sums these
  EXPECT_FALSE(takes({2, 4, 33, 32}));  // 1056: its block kernel does
  try {
    dispatch(OpKind::GroupNorm, {randn({2, 4, 4, 4}).to(gpu), Tensor(), Tensor()}, a);
    ADD_FAILURE() << "a pool over 16 positions ran on the GPU";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("group_norm: attr pool on the GPU takes 17 to 1024 positions per channel, got x (2, 4, 4, 4)"),
              std::string::npos)
        << m;
  }
}

std::string message_of(OpKind op, const std::vector<Tensor>& in, const Attrs& a) {
  try {
    dispatch(op, in, a);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(NormPoolSchema, NamesTheOpAndTheShapes) {
  const Attrs gn = Attrs().set("groups", int64_t(2)).set("eps", 1e-5);
  // A pool needs positions to average over.
  const std::string m1 =
      message_of(OpKind::GroupNorm, {randn({3, 4}), Tensor(), Tensor()}, Attrs(gn).set("pool", true));
  EXPECT_NE(
      m1.find("group_norm: attr pool (the mean over the spatial dims) needs x (N, C, *spatial), got x (3, 4) f32"),
      std::string::npos)
      << m1;
  // Batch norm takes neither attr.
  const Attrs bn = Attrs().set("training", true).set("momentum", 0.1).set("eps", 1e-5);
  const std::string m2 = message_of(OpKind::BatchNorm, {randn({3, 4, 5}), Tensor(), Tensor(), Tensor(), Tensor()},
                                    Attrs(bn).set("pool", true));
  EXPECT_NE(m2.find("batch_norm: attr pool is not supported (group_norm and its backward take it)"), std::string::npos)
      << m2;
  const std::vector<Tensor> fwd = dispatch(OpKind::GroupNorm, {randn({3, 4, 5}), Tensor(), Tensor()}, gn);
  const std::string m3 =
      message_of(OpKind::GroupNormBackward, {randn({3, 4, 5}), randn({3, 4, 5}), Tensor(), fwd[1], fwd[2]},
                 Attrs().set("groups", int64_t(2)).set("grad_scale", INFINITY));
  EXPECT_NE(m3.find("group_norm_backward: attr grad_scale must be finite, got inf"), std::string::npos) << m3;
  // With the attr the backward is its plain call with g scaled first (a broadcast g as the pool's).
  const Tensor g2 = randn({3, 4});
  const Tensor g = expand(reshape(g2, {3, 4, 1}), {3, 4, 5});
  const Tensor x = randn({3, 4, 5});
  const std::vector<Tensor> stats = dispatch(OpKind::GroupNorm, {x, Tensor(), Tensor()}, gn);
  const std::vector<Tensor> fused = dispatch(OpKind::GroupNormBackward, {g, x, Tensor(), stats[1], stats[2]},
                                             Attrs().set("groups", int64_t(2)).set("grad_scale", 0.2));
  const std::vector<Tensor> plain =
      dispatch(OpKind::GroupNormBackward,
               {dispatch1(OpKind::MulScalar, {g}, Attrs().set("value", 0.2)), x, Tensor(), stats[1], stats[2]},
               Attrs().set("groups", int64_t(2)));
  for (size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(testing_util::same_bits(fused[i].to_vector<double>(), plain[i].to_vector<double>())) << i;
}

}  // namespace
}  // namespace reel
