// Identity gathers (compile/passes/identity_gathers.cpp) and their gradients, on the CPU:
//   - a GPT's compiled training step (ACCUM 3) reads its position table in place: one embedding and
//     one embedding_backward a micro-batch (the tokens'), not two, and the batch sum of the position
//     gradient writes the table's gradient; with the pass off, two of each. The
//     losses, parameters and optimizer state after the steps are eager's to the bit, with the
//     sequence as long as the table and shorter (then the backward's scatter stays);
//   - lookups the pass must leave: ids that do not start at 0, a table written between the lookup
//     and its reader, a lookup that is the step's output. Each gives eager's values.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "kernels/dispatch.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "test_util.h"

using namespace reel;

namespace {

size_t count(const compile::Plan& p, OpKind op) {
  size_t n = 0;
  for (const compile::Node& node : p.graph().nodes) n += node.op == op;
  return n;
}

struct Trained {
  std::shared_ptr<nn::Gpt> model;
  std::unique_ptr<optim::AdamW> opt;
  std::optional<compile::CompiledFunction> step;
  std::vector<double> losses;
};

// Four MODELS.md steps (AdamW, clipping, ACCUM 3) of a one-layer GPT on sequences of length T,
// eagerly or compiled with `options`.
Trained train(int64_t T, std::optional<compile::CompileOptions> options) {
  Generator init(7);
  Trained t{nn::gpt(nn::GptConfig{16, 8, 16, 2, 1, 0.0}, &init), nullptr, std::nullopt, {}};
  t.opt = std::make_unique<optim::AdamW>(t.model->parameters(), optim::AdamWOptions(3e-3).weight_decay(0.01));
  const int accum = 3;
  t.opt->set_accum_steps(accum).set_max_grad_norm(1.0);
  nn::Module* m = t.model.get();
  auto loss_fn = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < accum; ++i) {
    std::vector<int64_t> ids(size_t(2 * T)), next(size_t(2 * T));
    for (size_t k = 0; k < ids.size(); ++k) {
      ids[k] = int64_t((k * 5 + size_t(i) * 3) % 16);
      next[k] = int64_t((k * 7 + size_t(i)) % 16);
    }
    micro.push_back({tensor_i64(ids, {2, T}), tensor_i64(next, {2, T})});
  }
  if (options) t.step.emplace(compile::compile_train_step(*t.opt, loss_fn, *options));
  t.losses = testing_util::step_losses(*t.opt, loss_fn, micro, 4, t.step ? &*t.step : nullptr);
  return t;
}

void expect_same_state(const Trained& a, const Trained& b) {
  EXPECT_EQ(a.losses, b.losses);
  auto sa = a.model->named_state(), sb = b.model->named_state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_EQ(sa[i].second.to_vector<double>(), sb[i].second.to_vector<double>()) << sa[i].first;
  auto oa = a.opt->state_dict(), ob = b.opt->state_dict();
  ASSERT_EQ(oa.size(), ob.size());
  for (size_t i = 0; i < oa.size(); ++i)
    EXPECT_EQ(oa[i].second.to_vector<double>(), ob[i].second.to_vector<double>()) << oa[i].first;
}

TEST(IdentityGathers, AGptStepReadsItsPositionTableInPlace) {
  for (int64_t T : {8, 6}) {
    SCOPED_TRACE("T " + std::to_string(T) + " of a table of 8 positions");
    const Trained eager = train(T, std::nullopt);
    const Trained on = train(T, compile::CompileOptions());
    const Trained off = train(T, compile::CompileOptions(compile::Mode::Default, 8, true, {"identity_gathers"}));
    const compile::Plan *p_on = on.step->last_plan(), *p_off = off.step->last_plan();
    ASSERT_NE(p_on, nullptr);
    ASSERT_NE(p_off, nullptr);
    EXPECT_EQ(count(*p_off, OpKind::Embedding), 6u);
    EXPECT_EQ(count(*p_off, OpKind::EmbeddingBackward), 6u);
    EXPECT_EQ(count(*p_on, OpKind::Embedding), 3u) << p_on->graph().str();
    // A table longer than the sequence gets zero gradients in the rows past it: the scatter stays.
    EXPECT_EQ(count(*p_on, OpKind::EmbeddingBackward), T == 8 ? 3u : 6u) << p_on->graph().str();
    EXPECT_EQ(count(*p_on, OpKind::Arange), 0u) << "the ids' arange goes with dead code (or stays constant)";
    // With the scatter gone, the batch sum of the position gradient writes the table's gradient
    // itself (compile/passes/write_sums_into_grads.cpp): one f32 column-sums over (B, T * d) a micro-batch.
    size_t position_sums = 0;
    for (const compile::Node& n : p_on->graph().nodes)
      position_sums +=
          n.op == OpKind::ColumnSums && n.inputs[0]->dtype == DType::f32 && n.inputs[0]->shape == Shape{2, T * 16};
    EXPECT_EQ(position_sums, T == 8 ? 3u : 0u) << p_on->graph().str();
    EXPECT_EQ(p_on->stats().in_place, T == 8 ? 6u : 3u);
    EXPECT_LT(p_on->kernels(), p_off->kernels());
    expect_same_state(eager, on);
    expect_same_state(eager, off);
  }
}

// ids made inside the traced function (an arange node there, as a GPT makes its positions).
using MakeIds = std::function<Tensor()>;
Tensor count_up(double start, double end, double step) {
  return arange(start, end, step, TensorOptions{}.with_dtype(DType::i64));
}

// y = embedding(table, ids()) through `between` (run after the lookup), then y * x and y itself when
// `return_y`: the compiled function's results beside eager's, and the lookup left in the plan.
void expect_lookup_kept(const MakeIds& ids, const std::function<void(Tensor&)>& between, bool return_y) {
  const Tensor start = testing_util::random({6, 4}, 11, DType::f32);
  auto make = [&](Tensor table) {
    return [table, ids, between, return_y](const std::vector<Tensor>& in) mutable {
      Tensor y = embedding(table, ids());
      between(table);
      std::vector<Tensor> out{y * in[0]};
      if (return_y) out.push_back(y);
      return out;
    };
  };
  Tensor eager_table = clone(start), compiled_table = clone(start);
  auto eager = make(eager_table);
  compile::CompiledFunction f = compile::compile(make(compiled_table));
  const Tensor two = full({}, 2.0);
  for (int k = 0; k < 4; ++k) {
    const std::vector<Tensor> want = eager({two}), got = f({two});
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].to_vector<double>(), want[i].to_vector<double>()) << i;
  }
  const compile::Plan* plan = f.last_plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(count(*plan, OpKind::Embedding), 1u) << plan->graph().str();
  EXPECT_EQ(plan->stats().in_place, 0u);
}

TEST(IdentityGathers, LookupsThatAreNotTheTablesRowsStay) {
  auto nothing = [](Tensor&) {};
  {
    SCOPED_TRACE("ids 1..4");
    expect_lookup_kept([] { return count_up(1, 5, 1); }, nothing, false);
  }
  {
    SCOPED_TRACE("ids 0, 2, 4");
    expect_lookup_kept([] { return count_up(0, 6, 2); }, nothing, false);
  }
  const MakeIds first_four = [] { return count_up(0, 4, 1); };
  {
    SCOPED_TRACE("the table updated in place before y is read");
    expect_lookup_kept(
        first_four, [](Tensor& t) { dispatch_out(OpKind::AddScalar, {t}, {t}, Attrs().set("value", 1.0)); }, false);
  }
  {
    SCOPED_TRACE("y is the step's output");
    expect_lookup_kept(first_four, nothing, true);
  }
}

TEST(IdentityGathers, ALookupOfTheFirstRowsReadsThemWhereTheyLie) {
  // The counterpart of the cases above: ids 0..3 of a 6-row table, nothing in between.
  const Tensor table = testing_util::random({6, 4}, 12, DType::f32);
  auto fn = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{embedding(table, count_up(0, 4, 1)) * in[0]};
  };
  compile::CompiledFunction f = compile::compile(fn);
  const Tensor x = testing_util::random({4, 4}, 13, DType::f32);
  const std::vector<double> want = fn({x})[0].to_vector<double>();
  for (int k = 0; k < 3; ++k) EXPECT_EQ(f({x})[0].to_vector<double>(), want);
  const compile::Plan* plan = f.last_plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(count(*plan, OpKind::Embedding), 0u) << plan->graph().str();
  EXPECT_EQ(plan->kernels(), 1u) << plan->graph().str();
  EXPECT_EQ(plan->stats().in_place, 1u);
}

}  // namespace
