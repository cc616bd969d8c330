// Results written into new gradients (compile/passes/write_results_into_grads.cpp), on the CPU:
//   - on hand-made graphs: a result copied whole into a gradient that nothing touched before is
//     written there by the node that computes it, and the copy goes; a result read by another node,
//     copied in part or cast on the way, or a gradient touched before the copy keep the copy;
//   - cnn-small's and gpt-tiny's compiled steps (ACCUM 2) with the pass follow the steps without it
//     to the bit, with fewer kernels.
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
    for (const Node& n : g.nodes)
      if (n.op == OpKind::Sum) EXPECT_EQ(n.outputs[0].buffer, r);
  }
}

struct StepRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> state;
  size_t kernels = 0;
};

StepRun run_steps(const std::string& model, const char* precision, bool pass_on) {
  AutocastGuard amp(PrecisionPolicy::parse(precision));
  testing_util::SmallTraining t = testing_util::small_training(model, Device::cpu());
  compile::CompileOptions o(compile::Mode::Default);
  if (!pass_on) o.disabled_passes = {"results_into_grads"};
  compile::CompiledFunction step = compile::compile_train_step(*t.opt, t.loss, o);
  StepRun r;
  r.losses = testing_util::step_losses(*t.opt, t.loss, t.micro, 3, &step);
  r.state = t.state();
  if (step.last_plan()) r.kernels = step.last_plan()->kernels();
  return r;
}

TEST(ResultsIntoGrads, CompiledStepsFollowTheStepsWithoutThePassToTheBit) {
  for (const std::string model : {"cnn-small", "gpt-tiny"})
    for (const char* precision : {"fp32", "bf16"}) {
      SCOPED_TRACE(model + " " + precision);
      const StepRun off = run_steps(model, precision, false), on = run_steps(model, precision, true);
      ASSERT_GT(off.kernels, 0u);
      EXPECT_LT(on.kernels, off.kernels);
      EXPECT_TRUE(testing_util::same_bits(on.losses, off.losses));
      ASSERT_EQ(on.state.size(), off.state.size());
      for (size_t i = 0; i < off.state.size(); ++i)
        EXPECT_TRUE(testing_util::same_bits(on.state[i], off.state[i])) << "tensor " << i;
    }
}

}  // namespace
}  // namespace reel
