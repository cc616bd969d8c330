// Results written into new gradients (compile/passes/write_results_into_grads.cpp), on the CPU:
//   - on hand-made graphs: a result copied whole into a gradient that nothing touched before is
//     written there by the node that computes it, and the copy goes; a result read by another node,
//     copied in part or cast on the way, or a gradient touched before the copy keep the copy;
//   - cnn-small's and gpt-tiny's compiled steps (ACCUM 2) with the pass follow the steps without it
//     to the bit, with fewer kernels; in cnn-small (and resnet18-cifar, bf16) every batch and group
//     norm backward of the second micro-batch adds its dw and db into the gradients itself (attr
//     accumulate), on the CPU and on the GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compile/passes/passes.h"
#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "test_util.h"

namespace reel {
namespace {

using compile::BufferKind;
using compile::Graph;
using compile::Node;
using compile::TensorRef;

using testing_util::graph_floats;
using testing_util::graph_node;
using testing_util::graph_ref;

enum Case { kWhole, kReadTwice, kPart, kCast, kGradTouchedBefore };

// x (Input) -> sum over dim 0 into r (1, 8) [and a second output] -> grad (8) = copy(r).
Graph copy_graph(Case c, int& grad, int& r) {
  Graph g;
  const int x = graph_floats(g, BufferKind::Input, 32);
  r = graph_floats(g, BufferKind::Internal, 8);
  grad = graph_floats(g, BufferKind::External, 8);
  const int other = graph_floats(g, BufferKind::Internal, 8);
  if (c == kGradTouchedBefore)
    g.nodes.push_back(graph_node(OpKind::Neg, {graph_ref(grad, {8})}, {graph_ref(other, {8})}));
  Node sum = graph_node(OpKind::Sum, {graph_ref(x, {4, 8})}, {graph_ref(r, {1, 8})});
  sum.attrs.set("dims", std::vector<int64_t>{0}).set("keepdim", true);
  g.nodes.push_back(sum);
  if (c == kReadTwice) g.nodes.push_back(graph_node(OpKind::Neg, {graph_ref(r, {8})}, {graph_ref(other, {8})}));
  const TensorRef src = c == kPart ? graph_ref(r, {4}) : graph_ref(r, {8});
  const TensorRef dst = c == kCast   ? graph_ref(grad, {8}, DType::bf16)
                        : c == kPart ? graph_ref(grad, {4})
                                     : graph_ref(grad, {8});
  g.nodes.push_back(graph_node(OpKind::Copy, {src}, {dst}));
  g.outputs = {graph_ref(other, {8})};
  return g;
}

TEST(ResultsIntoGrads, AResultCopiedWholeIntoANewGradientIsWrittenThere) {
  int grad = -1, r = -1;
  Graph g = copy_graph(kWhole, grad, r);
  compile::PassStats st;
  compile::write_results_into_grads(g, st);
  EXPECT_EQ(st.fused, 1u);
  ASSERT_EQ(g.nodes.size(), 1u) << g.str();
  EXPECT_EQ(g.nodes[0].op, OpKind::Sum);
  // The sum's own geometry (1, 8), in the gradient's memory.
  EXPECT_TRUE(compile::same_ref(g.nodes[0].outputs[0], graph_ref(grad, {1, 8}))) << g.str();
}

TEST(ResultsIntoGrads, CopiesThatAreNotTheWholeResultIntoANewGradientStay) {
  for (Case c : {kReadTwice, kPart, kCast, kGradTouchedBefore}) {
    SCOPED_TRACE(int(c));
    int grad = -1, r = -1;
    Graph g = copy_graph(c, grad, r);
    const size_t before = g.nodes.size();
    compile::PassStats st;
    compile::write_results_into_grads(g, st);
    EXPECT_EQ(st.fused, 0u);
    ASSERT_EQ(g.nodes.size(), before) << g.str();
    EXPECT_EQ(g.nodes.back().op, OpKind::Copy);
    for (const Node& n : g.nodes) {
      if (n.op == OpKind::Sum) {
        EXPECT_EQ(n.outputs[0].buffer, r);
      }
    }
  }
}

struct StepRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> state;
  size_t kernels = 0;
};

size_t accumulating_norms(const compile::Plan& p) {
  size_t n = 0;
  for (const Node& node : p.graph().nodes)
    n += (node.op == OpKind::GroupNormBackward || node.op == OpKind::BatchNormBackward) &&
         node.attrs.b("accumulate", false);
  return n;
}

size_t norm_backwards(const compile::Plan& p) {
  return testing_util::count_op(p, OpKind::GroupNormBackward) + testing_util::count_op(p, OpKind::BatchNormBackward);
}

StepRun run_steps(const std::string& model, const char* precision, bool pass_on, Device device = Device::cpu(),
                  size_t* accumulating = nullptr) {
  AutocastGuard amp(PrecisionPolicy::parse(precision));
  testing_util::SmallTraining t = testing_util::small_training(model, device);
  compile::CompileOptions o(device.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default);
  if (!pass_on) o.disabled_passes = {"results_into_grads"};
  compile::CompiledFunction step = compile::compile_train_step(*t.opt, t.loss, o);
  StepRun r;
  r.losses = testing_util::step_losses(*t.opt, t.loss, t.micro, 3, &step);
  r.state = t.state();
  if (step.last_plan()) r.kernels = step.last_plan()->kernels();
  if (step.last_plan() && accumulating) {
    // Two micro-batches: the second's norm backwards add into the gradients the first's wrote.
    EXPECT_EQ(2 * accumulating_norms(*step.last_plan()), pass_on ? norm_backwards(*step.last_plan()) : 0u);
    *accumulating = accumulating_norms(*step.last_plan());
  }
  return r;
}

void expect_same_training(const StepRun& on, const StepRun& off) {
  EXPECT_TRUE(testing_util::same_bits(on.losses, off.losses));
  ASSERT_EQ(on.state.size(), off.state.size());
  for (size_t i = 0; i < off.state.size(); ++i)
    EXPECT_TRUE(testing_util::same_bits(on.state[i], off.state[i])) << "tensor " << i;
}

TEST(ResultsIntoGrads, CompiledStepsFollowTheStepsWithoutThePassToTheBit) {
  for (const std::string model : {"cnn-small", "gpt-tiny"})
    for (const char* precision : {"fp32", "bf16"}) {
      SCOPED_TRACE(model + " " + precision);
      size_t accumulating = 0;
      const StepRun off = run_steps(model, precision, false, Device::cpu(), &accumulating);
      const StepRun on = run_steps(model, precision, true, Device::cpu(), &accumulating);
      ASSERT_GT(off.kernels, 0u);
      EXPECT_LT(on.kernels, off.kernels);
      if (model == "cnn-small") {
        EXPECT_EQ(accumulating, 5u);  // three batch norms, two group norms
      }
      expect_same_training(on, off);
    }
}

TEST(ResultsIntoGrads, NormBackwardsAddIntoTheGradientsToTheBit) {
  size_t accumulating = 0;
  const StepRun off = run_steps("resnet18-cifar", "bf16", false, Device::cpu(), &accumulating);
  const StepRun on = run_steps("resnet18-cifar", "bf16", true, Device::cpu(), &accumulating);
  EXPECT_EQ(accumulating, 20u);  // resnet18's batch norms
  expect_same_training(on, off);
}

TEST(ResultsIntoGrads, NormBackwardsAddIntoTheGradientsToTheBitOnTheGpu) {
  REEL_REQUIRE_GPU();
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    size_t accumulating = 0;
    const StepRun off = run_steps("cnn-small", precision, false, Device::cuda(0), &accumulating);
    const StepRun on = run_steps("cnn-small", precision, true, Device::cuda(0), &accumulating);
    EXPECT_EQ(accumulating, 5u);
    EXPECT_LT(on.kernels, off.kernels);
    expect_same_training(on, off);
  }
}

}  // namespace
}  // namespace reel
