// Sums written into gradients (compile/passes/write_sums_into_grads.cpp), on the CPU:
//   - on hand-made graphs: a sum over leading dims copied (or added) into a gradient becomes one
//     column_sums node over the (rows, columns) view of its input that writes (adds to) the
//     gradient, and an embedding backward writes (adds to) the table's gradient itself; sums over
//     other dims, of strided inputs, read twice, or of a gradient something touches in between stay
//     as they are;
//   - a compiled f32 training step (ACCUM 3) whose position table is added with a broadcast and whose
//     Linear has a bias: each gradient's sum writes it, one kernel fewer per parameter and
//     micro-batch, and the losses, parameters and optimizer state are eager's to the bit.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/passes/passes.h"
#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "test_util.h"

using namespace reel;

namespace {

using compile::BufferKind;
using compile::Graph;
using compile::Node;
using compile::TensorRef;

// ---- hand-made graphs ----

int add_buffer(Graph& g, BufferKind kind, const Shape& shape) {
  return testing_util::graph_buffer(g, kind, size_t(numel_of(shape)) * sizeof(float));
}
using testing_util::graph_node;
using testing_util::graph_ref;

// in (2, 3, 4) -> x = neg(in) -> s = sum(x, dims) -> grad = s (a copy) or grad += s; `x_ref`
// (default: all of x) is how the sum reads x.
struct SumGraph {
  Graph g;
  int x = -1, s = -1, grad = -1;
};
SumGraph sum_graph(const std::vector<int64_t>& dims, const Shape& s_shape, bool add,
                   std::optional<TensorRef> x_ref = std::nullopt) {
  SumGraph t;
  const int in = add_buffer(t.g, BufferKind::Input, {2, 3, 4});
  t.x = add_buffer(t.g, BufferKind::Internal, {2, 3, 4});
  t.s = add_buffer(t.g, BufferKind::Internal, s_shape);
  t.grad = add_buffer(t.g, BufferKind::External, s_shape);
  t.g.nodes.push_back(graph_node(OpKind::Neg, {graph_ref(in, {2, 3, 4})}, graph_ref(t.x, {2, 3, 4})));
  Node sum = graph_node(OpKind::Sum, {x_ref ? *x_ref : graph_ref(t.x, {2, 3, 4})}, graph_ref(t.s, s_shape));
  sum.attrs.set("dims", dims).set("keepdim", true);
  t.g.nodes.push_back(sum);
  if (add)
    t.g.nodes.push_back(graph_node(OpKind::Add, {graph_ref(t.grad, s_shape), graph_ref(t.s, s_shape)},
                                   graph_ref(t.grad, s_shape), true));
  else
    t.g.nodes.push_back(graph_node(OpKind::Copy, {graph_ref(t.s, s_shape)}, graph_ref(t.grad, s_shape)));
  return t;
}

size_t run_pass(Graph& g) {
  compile::PassStats st;
  compile::write_sums_into_grads(g, st);
  return st.fused;
}

TEST(SumsIntoGrads, ALeadingDimsSumWritesTheGradientItself) {
  for (bool add : {false, true}) {
    SCOPED_TRACE(add ? "grad += s" : "grad = s");
    SumGraph t = sum_graph({0}, {1, 3, 4}, add);
    EXPECT_EQ(run_pass(t.g), 1u);
    ASSERT_EQ(t.g.nodes.size(), 2u) << t.g.str();
    const Node& n = t.g.nodes[1];
    EXPECT_EQ(n.op, OpKind::ColumnSums);
    EXPECT_EQ(n.attrs.b("accumulate"), add);
    EXPECT_EQ(n.in_place, add);
    ASSERT_EQ(n.inputs.size(), add ? 2u : 1u);
    // x (2, 3, 4) as 2 rows of 12 columns, the gradient as its 12 columns.
    EXPECT_TRUE(compile::same_ref(*n.inputs[0], TensorRef{t.x, {2, 12}, {12, 1}, 0, DType::f32})) << t.g.str();
    EXPECT_TRUE(compile::same_ref(n.outputs[0], TensorRef{t.grad, {12}, {1}, 0, DType::f32})) << t.g.str();
    if (add) {
      EXPECT_TRUE(compile::same_ref(*n.inputs[1], n.outputs[0]));
    }
  }
  // Dims 0 and 1: 6 rows of 4 (a bias's sum in f32).
  SumGraph t = sum_graph({0, 1}, {1, 1, 4}, true);
  EXPECT_EQ(run_pass(t.g), 1u);
  ASSERT_EQ(t.g.nodes.size(), 2u);
  EXPECT_TRUE(compile::same_ref(*t.g.nodes[1].inputs[0], TensorRef{t.x, {6, 4}, {4, 1}, 0, DType::f32}));
}

TEST(SumsIntoGrads, AnEmbeddingBackwardWritesTheTablesGradientItself) {
  for (bool add : {false, true}) {
    SCOPED_TRACE(add ? "grad += dW" : "grad = dW");
    Graph g;
    const int gy = add_buffer(g, BufferKind::Input, {2, 3, 4});
    const int ids = add_buffer(g, BufferKind::Input, {2, 3});
    const int dw = add_buffer(g, BufferKind::Internal, {5, 4});
    const int grad = add_buffer(g, BufferKind::External, {5, 4});
    TensorRef ids_ref = graph_ref(ids, {2, 3});
    ids_ref.dtype = DType::i64;
    Node scatter = graph_node(OpKind::EmbeddingBackward, {graph_ref(gy, {2, 3, 4}), ids_ref}, graph_ref(dw, {5, 4}));
    scatter.attrs.set("num_weights", 5);
    g.nodes.push_back(scatter);
    if (add)
      g.nodes.push_back(
          graph_node(OpKind::Add, {graph_ref(grad, {5, 4}), graph_ref(dw, {5, 4})}, graph_ref(grad, {5, 4}), true));
    else
      g.nodes.push_back(graph_node(OpKind::Copy, {graph_ref(dw, {5, 4})}, graph_ref(grad, {5, 4})));
    EXPECT_EQ(run_pass(g), 1u);
    ASSERT_EQ(g.nodes.size(), 1u) << g.str();
    const Node& n = g.nodes[0];
    EXPECT_EQ(n.op, OpKind::EmbeddingBackward);
    EXPECT_EQ(n.attrs.i("num_weights"), 5);
    EXPECT_EQ(n.attrs.b("accumulate"), add);
    EXPECT_EQ(n.in_place, add);
    EXPECT_TRUE(compile::same_ref(n.outputs[0], graph_ref(grad, {5, 4}))) << g.str();
    ASSERT_EQ(n.inputs.size(), add ? 3u : 2u);
    if (add) {
      EXPECT_TRUE(compile::same_ref(*n.inputs[2], graph_ref(grad, {5, 4})));
    }
  }
}

TEST(SumsIntoGrads, SumsThatAreNotRowsOfColumnsOrNotTheGradientsAloneStay) {
  {
    SCOPED_TRACE("dims 0 and 2: not rows of contiguous columns");
    SumGraph t = sum_graph({0, 2}, {1, 3, 1}, true);
    EXPECT_EQ(run_pass(t.g), 0u);
    EXPECT_EQ(t.g.nodes[1].op, OpKind::Sum);
  }
  {
    SCOPED_TRACE("x read transposed");
    SumGraph t = sum_graph({0}, {1, 3, 4}, true);
    t.g.nodes[1].inputs[0] = TensorRef{t.x, {2, 3, 4}, {1, 2, 6}, 0, DType::f32};
    EXPECT_EQ(run_pass(t.g), 0u);
    EXPECT_EQ(t.g.nodes[1].op, OpKind::Sum);
  }
  {
    SCOPED_TRACE("s read by another node too");
    SumGraph t = sum_graph({0}, {1, 3, 4}, true);
    const int other = add_buffer(t.g, BufferKind::Internal, {1, 3, 4});
    t.g.nodes.push_back(graph_node(OpKind::Neg, {graph_ref(t.s, {1, 3, 4})}, graph_ref(other, {1, 3, 4})));
    EXPECT_EQ(run_pass(t.g), 0u);
    EXPECT_EQ(t.g.nodes[1].op, OpKind::Sum);
  }
  {
    SCOPED_TRACE("the gradient read between the sum and its add");
    SumGraph t = sum_graph({0}, {1, 3, 4}, true);
    const int other = add_buffer(t.g, BufferKind::Internal, {1, 3, 4});
    t.g.nodes.insert(t.g.nodes.begin() + 2,
                     graph_node(OpKind::Neg, {graph_ref(t.grad, {1, 3, 4})}, graph_ref(other, {1, 3, 4})));
    EXPECT_EQ(run_pass(t.g), 0u);
    EXPECT_EQ(t.g.nodes[1].op, OpKind::Sum);
  }
  {
    SCOPED_TRACE("a copy into a gradient that exists already");
    SumGraph t = sum_graph({0}, {1, 3, 4}, false);
    const int other = add_buffer(t.g, BufferKind::Internal, {1, 3, 4});
    t.g.nodes.insert(t.g.nodes.begin(),
                     graph_node(OpKind::Neg, {graph_ref(t.grad, {1, 3, 4})}, graph_ref(other, {1, 3, 4})));
    EXPECT_EQ(run_pass(t.g), 0u);
    EXPECT_EQ(t.g.nodes[2].op, OpKind::Sum);
  }
}

// ---- a compiled training step ----

// logits = fc(x + pos): pos (1, T, d) broadcast over the batch, fc with a bias.
class PositionMixer : public nn::Module {
 public:
  explicit PositionMixer(Generator* gen) : Module("PositionMixer") {
    pos_ = &register_parameter("pos", randn({1, 4, 6}, {}, gen));
    fc_ = register_module("fc", std::make_shared<nn::Linear>(6, 5, true, gen));
  }
  Tensor forward(const Tensor& x) override { return fc_->forward(x + *pos_); }

 private:
  Tensor* pos_ = nullptr;
  std::shared_ptr<nn::Linear> fc_;
};

struct Trained {
  std::shared_ptr<PositionMixer> model;
  std::unique_ptr<optim::AdamW> opt;
  std::optional<compile::CompiledFunction> step;
  std::vector<double> losses;
};

Trained train(std::optional<compile::CompileOptions> options) {
  Generator gen(21);
  Trained t{std::make_shared<PositionMixer>(&gen), nullptr, std::nullopt, {}};
  t.opt = std::make_unique<optim::AdamW>(t.model->parameters(), optim::AdamWOptions(3e-3).weight_decay(0.01));
  const int accum = 3;
  t.opt->set_accum_steps(accum).set_max_grad_norm(1.0);
  nn::Module* m = t.model.get();
  auto loss_fn = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < accum; ++i) {
    std::vector<int64_t> y(8);
    for (size_t k = 0; k < y.size(); ++k) y[k] = int64_t((k * 3 + size_t(i)) % 5);
    micro.push_back({randn({2, 4, 6}, {}, &gen), tensor_i64(y, {2, 4})});
  }
  if (options) t.step.emplace(compile::compile_train_step(*t.opt, loss_fn, *options));
  t.losses = testing_util::step_losses(*t.opt, loss_fn, micro, 4, t.step ? &*t.step : nullptr);
  return t;
}

size_t count(const compile::Plan& p, OpKind op) {
  size_t n = 0;
  for (const Node& node : p.graph().nodes) n += node.op == op;
  return n;
}

TEST(SumsIntoGrads, ACompiledStepsSumsWriteTheGradientsAndMatchEagerToTheBit) {
  const Trained eager = train(std::nullopt);
  const Trained on = train(compile::CompileOptions());
  // Off, with results_into_grads too: it would have the first micro-batch's sums write the new
  // gradients (the copies), where this pass does that and the adds.
  const Trained off =
      train(compile::CompileOptions(compile::Mode::Default, 8, true, {"sums_into_grads", "results_into_grads"}));
  const compile::Plan *p_on = on.step->last_plan(), *p_off = off.step->last_plan();
  ASSERT_NE(p_on, nullptr);
  ASSERT_NE(p_off, nullptr);
  // pos's and the bias's gradients, each micro-batch: written (the first) or added to by their sums.
  size_t accumulating = 0;
  for (const Node& n : p_on->graph().nodes) accumulating += n.op == OpKind::ColumnSums && n.attrs.b("accumulate");
  EXPECT_EQ(count(*p_on, OpKind::ColumnSums), 6u) << p_on->graph().str();
  EXPECT_EQ(accumulating, 4u) << p_on->graph().str();
  EXPECT_EQ(count(*p_off, OpKind::ColumnSums), 0u) << p_off->graph().str();
  EXPECT_EQ(p_on->kernels() + 6, p_off->kernels()) << "one copy or add fewer per sum";
  for (const Trained* c : {&on, &off}) {
    EXPECT_EQ(c->losses, eager.losses);
    auto se = eager.model->named_state(), sc = c->model->named_state();
    ASSERT_EQ(se.size(), sc.size());
    for (size_t i = 0; i < se.size(); ++i)
      EXPECT_EQ(sc[i].second.to_vector<double>(), se[i].second.to_vector<double>()) << se[i].first;
    auto oe = eager.opt->state_dict(), oc = c->opt->state_dict();
    ASSERT_EQ(oe.size(), oc.size());
    for (size_t i = 0; i < oe.size(); ++i)
      EXPECT_EQ(oc[i].second.to_vector<double>(), oe[i].second.to_vector<double>()) << oe[i].first;
  }
}

}  // namespace
