// The norm_relu pass (compile/passes/fuse_norm_relu.cpp): a batch or group norm writes the relu after
// it (and the relu's 16-bit copy, the next convolution's input under autocast), and its backward
// computes relu_backward as it loads the gradient (read in 16 bits where a widening cast made it).
//   - cnn-small (batch and group norms) and resnet18-cifar (batch norms, residual adds between some
//     norms and their relus), bf16, fp16 and fp32, two micro-batches: the same losses, parameters and
//     running statistics to the bit with the pass on and off; every relu and relu_backward a norm
//     took gone from the rest of the plan, the plan shorter, its arena no larger (to 1%: the
//     planner's packing at two samples a micro-batch);
//   - a norm whose y another node also reads keeps its relu (the relu's pass declines it);
//   - the schema's errors for the new attrs and input name the op and show the shapes.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "compile/passes/passes.h"
#include "compile/runtime/compile.h"
#include "compile_test_util.h"
#include "kernels/dispatch.h"
#include "test_util.h"

namespace reel {
namespace {

bool is_norm(OpKind op) { return op == OpKind::BatchNorm || op == OpKind::GroupNorm; }
bool is_norm_backward(OpKind op) { return op == OpKind::BatchNormBackward || op == OpKind::GroupNormBackward; }

struct Census {
  size_t forward = 0, copies = 0;        // norms writing the relu; of them, also its 16-bit copy
  size_t backward = 0, grads_16bit = 0;  // backward norms with relu; of them, reading a 16-bit g
};
Census census(const compile::Plan& p) {
  Census c;
  for (const compile::Node& n : p.graph().nodes) {
    if (!n.attrs.b("relu", false)) continue;
    if (is_norm(n.op)) {
      c.forward += 1;
      c.copies += n.attrs.has("cast_dtype");
    } else if (is_norm_backward(n.op)) {
      c.backward += 1;
      c.grads_16bit += n.inputs[0]->dtype != n.outputs[1].dtype;
    }
  }
  return c;
}

// How many of `op` the plan runs outside the norms: nodes of that op and members of fused nodes.
size_t ops_outside_norms(const compile::Plan& p, const char* op) {
  size_t count = 0;
  for (const compile::Node& n : p.graph().nodes) {
    if (is_norm(n.op) || is_norm_backward(n.op)) continue;
    if (n.fused.empty()) count += op_name(n.op) == std::string(op);
    for (const std::string& f : n.fused) count += f == op;
  }
  return count;
}

struct Expect {
  size_t forward, copies, backward, grads_16bit;  // at least, over the two micro-batches
};

void expect_same_training_fewer_kernels(const std::string& model, Device device, Expect want) {
  for (const char* precision : {"bf16", "fp16", "fp32"}) {
    SCOPED_TRACE(model + ", " + precision + ", " + device.str());
    const bool autocast = std::string(precision) != "fp32";
    const testing_util::CompiledSteps on = testing_util::compiled_steps(model, device, precision, {}),
                                      off = testing_util::compiled_steps(model, device, precision, {"norm_relu"});
    ASSERT_NE(on.plan(), nullptr);
    ASSERT_NE(off.plan(), nullptr);
    EXPECT_TRUE(testing_util::same_training(on, off)) << "the relu's, the casts' and the gradients' bits";
    const Census c = census(*on.plan()), none = census(*off.plan());
    EXPECT_EQ(none.forward + none.backward, 0u);
    EXPECT_GE(c.forward, want.forward);
    EXPECT_GE(c.backward, want.backward);
    if (autocast) {
      EXPECT_GE(c.copies, want.copies);
      EXPECT_GE(c.grads_16bit, want.grads_16bit) << "fused backward norms reading a convolution's 16-bit gradient";
    } else {
      EXPECT_EQ(c.copies + c.grads_16bit, 0u);
    }
    // Every relu and relu_backward a norm took is gone from the rest of the plan.
    EXPECT_EQ(ops_outside_norms(*on.plan(), "relu") + c.forward, ops_outside_norms(*off.plan(), "relu"));
    EXPECT_EQ(ops_outside_norms(*on.plan(), "relu_backward") + c.backward,
              ops_outside_norms(*off.plan(), "relu_backward"));
    // The relus and their casts, relu_backward and the widening casts were kernels of their own, or
    // with their neighbours in the elementwise fuser's kernels (whose grouping then changes too).
    EXPECT_LT(on.plan()->kernels(), off.plan()->kernels());
    std::printf(
        "[ census   ] %s %s: %zu norms with relu (%zu with the copy), %zu backward (%zu reading 16 bits); "
        "%zu -> %zu kernels\n",
        model.c_str(), precision, c.forward, c.copies, c.backward, c.grads_16bit, off.plan()->kernels(),
        on.plan()->kernels());
    // At two samples a micro-batch the planner's packing may move by a few KiB either way (cnn-small
    // fp32: 16 KiB of 3.2 MiB more); the benchmark models' arenas are as before or smaller.
    const auto arena = [&](const testing_util::CompiledSteps& s) {
      return s.plan()->memory().arena_for(device)->bytes;
    };
    EXPECT_LE(arena(on), arena(off) + arena(off) / 100);
  }
}

// cnn-small, per micro-batch: five norms with a relu after them, four of them feeding a convolution
// (the last one feeds the mean); the last one's relu_backward reads the mean's broadcast gradient,
// which the norm does not take.
constexpr Expect kCnnSmall{10, 8, 8, 8};
// resnet18-cifar, per micro-batch: the stem's and each of the eight blocks' first norm feed a relu
// (the second norms' relu comes after the residual add); the stem's relu also feeds the first block's
// shortcut, so its gradient is a sum in f32, not a convolution's 16-bit gradient.
constexpr Expect kResnet18{2 * 9, 2 * 9, 2 * 9, 2 * 8};

TEST(NormReluPass, CnnSmallTrainsToTheSameBitsWithFewerKernelsOnTheCpu) {
  expect_same_training_fewer_kernels("cnn-small", Device::cpu(), kCnnSmall);
}
TEST(NormReluPass, Resnet18CifarTrainsToTheSameBitsWithFewerKernelsOnTheCpu) {
  expect_same_training_fewer_kernels("resnet18-cifar", Device::cpu(), kResnet18);
}
TEST(NormReluPass, CnnSmallTrainsToTheSameBitsWithFewerKernelsOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_same_training_fewer_kernels("cnn-small", Device::cuda(0), kCnnSmall);
}
TEST(NormReluPass, Resnet18CifarTrainsToTheSameBitsWithFewerKernelsOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_same_training_fewer_kernels("resnet18-cifar", Device::cuda(0), kResnet18);
}

// A hand-made group_norm -> relu: fused when the relu alone reads y; kept apart when y has another
// reader (a copy that is a result of the step), which still needs y itself.
TEST(NormReluPass, FusesOnlyAReluThatAloneReadsY) {
  using compile::BufferKind;
  using testing_util::graph_floats;
  using testing_util::graph_node;
  using testing_util::graph_ref;
  for (bool other_reader : {false, true}) {
    SCOPED_TRACE(other_reader ? "y also copied" : "y read by the relu alone");
    const Shape shape{2, 4, 3, 3}, stats{2, 2};
    compile::Graph g;
    const int x = graph_floats(g, BufferKind::Input, 72), w = graph_floats(g, BufferKind::External, 4),
              b = graph_floats(g, BufferKind::External, 4), y = graph_floats(g, BufferKind::Internal, 72),
              mean = graph_floats(g, BufferKind::Internal, 4), rstd = graph_floats(g, BufferKind::Internal, 4),
              r = graph_floats(g, BufferKind::Internal, 72), z = graph_floats(g, BufferKind::Internal, 72);
    compile::Node norm = graph_node(
        OpKind::GroupNorm, {graph_ref(x, shape), graph_ref(w, {4}), graph_ref(b, {4})},
        std::vector<compile::TensorRef>{graph_ref(y, shape), graph_ref(mean, stats), graph_ref(rstd, stats)});
    norm.attrs.set("groups", int64_t(2)).set("eps", 1e-5);
    g.nodes.push_back(norm);
    g.nodes.push_back(graph_node(OpKind::Relu, {graph_ref(y, shape)}, graph_ref(r, shape)));
    g.outputs = {graph_ref(r, shape), graph_ref(mean, stats), graph_ref(rstd, stats)};
    if (other_reader) {
      g.nodes.push_back(graph_node(OpKind::Copy, {graph_ref(y, shape)}, graph_ref(z, shape)));
      g.outputs.push_back(graph_ref(z, shape));
    }
    compile::PassStats stats_out;
    compile::fuse_norm_relu(g, stats_out);
    if (other_reader) {
      ASSERT_EQ(g.nodes.size(), 3u);
      EXPECT_FALSE(g.nodes[0].attrs.b("relu", false));
      EXPECT_EQ(g.nodes[1].op, OpKind::Relu);
      EXPECT_EQ(stats_out.fused, 0u);
      continue;
    }
    ASSERT_EQ(g.nodes.size(), 1u);
    EXPECT_EQ(g.nodes[0].op, OpKind::GroupNorm);
    EXPECT_TRUE(g.nodes[0].attrs.b("relu", false));
    EXPECT_EQ(g.nodes[0].outputs[0].buffer, r) << "the norm writes the relu's output";
    EXPECT_FALSE(g.nodes[0].attrs.has("cast_dtype")) << "nothing casts r";
    EXPECT_EQ(stats_out.fused, 1u);
  }
}

// The schema's errors for the fused relu's attrs and input.
TEST(NormReluPass, SchemaErrorsNameTheOpAndShapes) {
  const Tensor x = randn({2, 4, 3, 3}), w = ones({4}), b = zeros({4});
  testing_util::expect_error(
      [&] {
        dispatch(OpKind::GroupNorm, {x, w, b},
                 Attrs().set("groups", int64_t(2)).set("eps", 1e-5).set("relu", true).set("cast_dtype", DType::f32));
      },
      {"group_norm", "cast_dtype f32", "bf16/f16"});
  const Tensor x16 = randn({2, 4, 3, 3}).to(DType::bf16);
  const Attrs bn = Attrs().set("training", true).set("momentum", 0.1).set("eps", 1e-5).set("dtype", DType::f32);
  const std::vector<Tensor> f = dispatch(OpKind::BatchNorm, {x16, w, b, Tensor(), Tensor()}, bn);
  const Attrs bwd = Attrs().set("training", true).set("dtype", DType::f32).set("relu", true);
  const Tensor g16 = randn({2, 4, 3, 3}).to(DType::bf16);
  testing_util::expect_error(
      [&] {
        dispatch(OpKind::BatchNormBackward, {g16, x16, w, f[1], f[2]}, bwd);
      },
      {"batch_norm_backward", "relu's output y: 6 inputs", "got 5"});
  testing_util::expect_error(
      [&] {
        dispatch(OpKind::BatchNormBackward, {g16, x16, w, f[1], f[2], randn({2, 4, 3})}, bwd);
      },
      {"batch_norm_backward", "relu output y", "(2, 4, 3)", "(2, 4, 3, 3)"});
  testing_util::expect_error(
      [&] {
        dispatch(OpKind::BatchNormBackward, {g16.to(DType::f16), x16, w, f[1], f[2], f[0]}, bwd);
      },
      {"batch_norm_backward", "gradient", "f16", "bf16"});
}

}  // namespace
}  // namespace reel
