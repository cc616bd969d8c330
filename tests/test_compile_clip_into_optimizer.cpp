// The clip folded into the optimizer's update (compile/passes/fuse_clip_into_optimizer.cpp): the multi-tensor AdamW reads each gradient times the clip coefficient, rounded as
// unscale_check stores it, and the GradScaler step's inf/NaN check of the clip moves into the norm.
//   - gpt-tiny's and cnn-small's compiled steps (ACCUM 2, clip 1.0) with the pass turned on follow
//     the steps without it to the bit on the CPU and on the GPU (kernels/optim_math.h writes AdamW's
//     multiply-adds explicitly, so the fused kernel rounds as the per-tensor one does), in fp32, bf16,
//     fp16 and fp16 with a GradScaler, one kernel fewer: no unscale_check left but the GradScaler's,
//     the norm checking inf/NaN where the step keeps a flag (the GradScaler's);
//   - a step that drops its gradients after the update does not store the clipped ones;
//   - hand-made graphs: the pass declines when a node between the clip and the update reads a
//     gradient, when the coefficient changes in between, and when found_inf is read between the norm
//     and the clip; it moves the flag into the norm otherwise;
//   - eager, unscaled: the clip passes no flag, and a non-finite gradient still skips the step (the
//     norm's flag covers it).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "compile/passes/passes.h"
#include "compile_test_util.h"
#include "optim/adamw.h"
#include "test_util.h"

namespace reel {
namespace {

using testing_util::count_op;

size_t count_attr(const compile::Graph& g, OpKind op, const char* attr) {
  size_t n = 0;
  for (const compile::Node& node : g.nodes) n += node.op == op && node.attrs.b(attr, false);
  return n;
}

void expect_the_clip_folded(const testing_util::CompiledSteps& on, const testing_util::CompiledSteps& off,
                            bool scaled) {
  ASSERT_NE(on.plan(), nullptr);
  ASSERT_NE(off.plan(), nullptr);
  const compile::Graph &a = on.plan()->graph(), &b = off.plan()->graph();
  // The GradScaler's unscale_check stays: the norm reads what it writes.
  EXPECT_EQ(count_op(a, OpKind::UnscaleCheck), scaled ? 1u : 0u);
  EXPECT_EQ(count_op(b, OpKind::UnscaleCheck), scaled ? 2u : 1u);
  EXPECT_EQ(count_attr(a, OpKind::MultiTensorAdamW, "clip"), 1u);
  EXPECT_EQ(count_attr(b, OpKind::MultiTensorAdamW, "clip"), 0u);
  // The flag is kept only where the clip checked one: the GradScaler's step.
  EXPECT_EQ(count_attr(a, OpKind::GlobalNorm, "check_finite"), scaled ? 1u : 0u);
  // The step drops its gradients (zero_grad(set_to_none)): nothing reads the clipped values.
  EXPECT_EQ(count_attr(a, OpKind::MultiTensorAdamW, "clip_writes_grad"), 0u);
  EXPECT_EQ(on.plan()->kernels() + 1, off.plan()->kernels());
}

struct StepSetup {
  const char* precision;
  bool scaler;
};
constexpr StepSetup kSetups[] = {{"fp32", false}, {"bf16", false}, {"fp16", false}, {"fp16", true}};

// The model's compiled steps with every pass on and with this one off.
testing_util::PassAB with_and_without(const char* model, Device device, const StepSetup& s) {
  return testing_util::pass_on_and_off(model, device, s.precision, "clip_into_optimizer", s.scaler);
}

TEST(ClipIntoOptimizerPass, TheStepsFollowTheStepsWithoutItToTheBitOnTheCpu) {
  for (const char* model : {"gpt-tiny", "cnn-small"})
    for (const StepSetup& s : kSetups) {
      SCOPED_TRACE(std::string(model) + " " + s.precision + (s.scaler ? " with a GradScaler" : ""));
      const auto [on, off] = with_and_without(model, Device::cpu(), s);
      expect_the_clip_folded(on, off, s.scaler);
      EXPECT_TRUE(testing_util::same_training(on, off));
    }
}

TEST(ClipIntoOptimizerPass, TheStepsFollowTheStepsWithoutItToTheBitOnTheGpu) {
  REEL_REQUIRE_GPU();
  for (const char* model : {"gpt-tiny", "cnn-small"})
    for (const StepSetup& s : kSetups) {
      SCOPED_TRACE(std::string(model) + " " + s.precision + (s.scaler ? " with a GradScaler" : ""));
      const auto [on, off] = with_and_without(model, Device::cuda(0), s);
      expect_the_clip_folded(on, off, s.scaler);
      EXPECT_TRUE(testing_util::same_training(on, off));
    }
}

// The tail of a clipped step on two gradients g0 (6) and g1 (4), hand-made on the CPU:
//   total = global_norm(g0, g1); [found read]; coef = clamp_scalar(total); unscale_check(g0, g1, coef, found);
//   [g0 read | coef rewritten]; multi_tensor_adamw(p0 g0 m0 v0 p1 g1 m1 v1, found, lr, step)
enum class Between { Nothing, FlagReadAfterTheNorm, GradientRead, CoefficientWritten };

compile::Graph clip_graph(Between between, bool keep_flag, bool keep_grads = false) {
  using compile::BufferKind;
  using testing_util::graph_buffer, testing_util::graph_floats, testing_util::graph_node, testing_util::graph_ref;
  compile::Graph g;
  const BufferKind grads = keep_grads ? BufferKind::External : BufferKind::Internal;
  const int g0 = graph_floats(g, grads, 6), g1 = graph_floats(g, grads, 4);
  std::vector<int> state;
  for (int64_t n : {6, 6, 6, 4, 4, 4}) state.push_back(graph_floats(g, BufferKind::External, n));  // p0 m0 v0 p1 m1 v1
  const int found = graph_floats(g, keep_flag ? BufferKind::External : BufferKind::Internal, 1);
  const int total = graph_floats(g, BufferKind::Internal, 1), coef = graph_floats(g, BufferKind::Internal, 1);
  const int spare = graph_floats(g, BufferKind::Internal, 1);
  const int lr = graph_buffer(g, BufferKind::External, 8), step = graph_buffer(g, BufferKind::External, 8);
  const compile::TensorRef G0 = graph_ref(g0, {6}), G1 = graph_ref(g1, {4}), F = graph_ref(found, {});
  const compile::TensorRef T = graph_ref(total, {}), C = graph_ref(coef, {});
  g.nodes.push_back(graph_node(OpKind::GlobalNorm, {G0, G1}, T));
  if (between == Between::FlagReadAfterTheNorm)
    g.nodes.push_back(graph_node(OpKind::ClampScalar, {F}, graph_ref(spare, {})));
  compile::Node clamp = graph_node(OpKind::ClampScalar, {T}, C);
  clamp.attrs.set("min", -INFINITY).set("max", 1.0);
  g.nodes.push_back(clamp);
  g.nodes.push_back(graph_node(OpKind::UnscaleCheck, {G0, G1, C, F}, {G0, G1, F}, true));
  if (between == Between::GradientRead) g.nodes.push_back(graph_node(OpKind::GlobalNorm, {G0}, graph_ref(spare, {})));
  if (between == Between::CoefficientWritten) g.nodes.push_back(graph_node(OpKind::ClampScalar, {T}, C));
  std::vector<compile::TensorRef> in, out;
  for (int t = 0; t < 2; ++t) {
    const Shape s{t == 0 ? 6 : 4};
    const compile::TensorRef p = graph_ref(state[3 * t], s), m = graph_ref(state[3 * t + 1], s),
                             v = graph_ref(state[3 * t + 2], s);
    in.insert(in.end(), {p, t == 0 ? G0 : G1, m, v});
    out.insert(out.end(), {p, m, v});
  }
  in.insert(in.end(), {F, graph_ref(lr, {}, DType::f64), graph_ref(step, {}, DType::f64)});
  compile::Node adamw = graph_node(OpKind::MultiTensorAdamW, in, out, true);
  adamw.attrs.set("beta1", 0.9)
      .set("beta2", 0.999)
      .set("eps", 1e-8)
      .set("weight_decay", 0.0)
      .set("tensors", int64_t(2));
  g.nodes.push_back(adamw);
  return g;
}

struct Folded {
  bool clip = false, flag_in_norm = false;
};

Folded fold(compile::Graph g) {
  compile::PassStats st;
  compile::fuse_clip_into_optimizer(g, st);
  return {count_op(g, OpKind::UnscaleCheck) == 0 && count_attr(g, OpKind::MultiTensorAdamW, "clip") == 1,
          count_attr(g, OpKind::GlobalNorm, "check_finite") == 1};
}

TEST(ClipIntoOptimizerPass, FoldsOnlyWhereNothingBetweenSeesTheDifference) {
  const Folded plain = fold(clip_graph(Between::Nothing, true));
  EXPECT_TRUE(plain.clip);
  EXPECT_TRUE(plain.flag_in_norm);  // found_inf is External: kept, so its check moves into the norm
  EXPECT_FALSE(fold(clip_graph(Between::FlagReadAfterTheNorm, true)).clip);  // it would see the flag early
  EXPECT_FALSE(fold(clip_graph(Between::GradientRead, true)).clip);          // it would see unclipped values
  EXPECT_FALSE(fold(clip_graph(Between::CoefficientWritten, true)).clip);    // the update would read another c
}

TEST(ClipIntoOptimizerPass, TheCheckedValuesReachTheUpdate) {
  compile::Graph g = clip_graph(Between::Nothing, true);
  compile::PassStats st;
  compile::fuse_clip_into_optimizer(g, st);
  ASSERT_EQ(g.nodes.size(), 3u);  // norm, clamp, update
  const compile::Node& norm = g.nodes[0];
  const compile::Node& update = g.nodes[2];
  EXPECT_EQ(norm.inputs.size(), 3u);   // g0, g1, found_inf
  EXPECT_EQ(norm.outputs.size(), 2u);  // total, found_inf
  EXPECT_EQ(norm.outputs[1].buffer, norm.inputs[2]->buffer);
  EXPECT_EQ(update.inputs.back()->buffer, g.nodes[1].outputs[0].buffer);  // the coefficient
  // g0 and g1 are Internal and nothing reads them after the update: the clipped values are not stored.
  EXPECT_FALSE(update.attrs.b("clip_writes_grad"));
  EXPECT_EQ(update.outputs.size(), 6u);
  EXPECT_EQ(st.fused, 1u);
}

// Gradients the step keeps (External: p.grad after the step) get the clipped values stored: each
// tensor's gradient is one more output of the update, after its p, m, v.
TEST(ClipIntoOptimizerPass, StoresTheClippedGradientsWhereTheyAreKept) {
  compile::Graph g = clip_graph(Between::Nothing, false, true);
  compile::PassStats st;
  compile::fuse_clip_into_optimizer(g, st);
  ASSERT_EQ(count_op(g, OpKind::UnscaleCheck), 0u);
  const compile::Node& update = g.nodes.back();
  EXPECT_TRUE(update.attrs.b("clip_writes_grad"));
  ASSERT_EQ(update.outputs.size(), 8u);  // p0 m0 v0 g0 p1 m1 v1 g1
  EXPECT_EQ(update.outputs[3].buffer, update.inputs[1]->buffer);
  EXPECT_EQ(update.outputs[7].buffer, update.inputs[5]->buffer);
  EXPECT_EQ(count_attr(g, OpKind::GlobalNorm, "check_finite"), 1u);  // the update reads found_inf
}

// Eager, unscaled: the clip gets no flag; a NaN gradient makes the norm NaN, whose flag skips the step.
TEST(ClipIntoOptimizerEager, AnUnscaledClipLeavesTheSkipToTheNormsFlag) {
  Tensor p = tensor({1, 2, 3}, {3}).set_requires_grad();
  optim::AdamW opt({p}, optim::AdamWOptions(0.1));
  opt.set_max_grad_norm(1.0);
  p.set_grad(tensor({0.5, NAN, 1}, {3}));
  optim::StepResult r = opt.micro_step();
  EXPECT_TRUE(r.skipped());
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  p.set_grad(tensor({3, 4, 0}, {3}));  // norm 5: clipped to 1
  r = opt.micro_step();
  EXPECT_FALSE(r.skipped());
  EXPECT_NEAR(r.grad_norm_value(), 5.0, 1e-6);
}

}  // namespace
}  // namespace reel
