// Column sums folded into the elementwise kernel that writes what they sum
// (compile/passes/fuse_elementwise_column_sums.cpp, off by default), on the CPU:
//   - a traced chain and the column sums of its result become one fused_elementwise node when the
//     pass is asked for, and the plan gives eager's values to the bit (the CPU kernel is the program,
//     then the column_sums op); without it the column_sums node stays;
//   - sums added in place into a gradient accumulate over replays as eager's do;
//   - bad column-sum attrs are a reel::Error naming the op and showing the dtype or shapes.
// The CUDA kernel is tested in test_elementwise_column_sums_cuda.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/runtime/compile.h"
#include "kernels/dispatch.h"
#include "kernels/fused_expr.h"
#include "test_util.h"

using namespace reel;

namespace {

compile::CompiledFunction compiled(compile::StepFn fn, bool with_pass) {
  compile::CompileOptions o(compile::Mode::Default);
  if (with_pass) o.enabled_passes = {"elementwise_column_sums"};
  return compile::compile(std::move(fn), o);
}

size_t count(const compile::Plan& p, OpKind op) {
  size_t n = 0;
  for (const compile::Node& node : p.graph().nodes) n += node.op == op;
  return n;
}

TEST(ElementwiseColumnSumsPass, TheSumsJoinTheKernelThatWritesWhatTheySum) {
  Tensor bias = testing_util::random({16}, 1, DType::f32), scale = testing_util::random({6, 16}, 2, DType::f32);
  auto fn = [&](const std::vector<Tensor>& in) {
    Tensor y = gelu(in[0] + bias) * scale;  // (6, 16): one fused_elementwise kernel
    Tensor s = dispatch(OpKind::ColumnSums, {y})[0];
    return std::vector<Tensor>{y, s};
  };
  const Tensor x = testing_util::random({6, 16}, 3, DType::f32);
  const std::vector<Tensor> eager = fn({x});
  for (bool with_pass : {false, true}) {
    SCOPED_TRACE(with_pass ? "with the pass" : "without it");
    auto f = compiled(fn, with_pass);
    f({x});
    f({x});
    const std::vector<Tensor> out = f({x});
    const compile::Plan* plan = f.last_plan();
    ASSERT_NE(plan, nullptr);
    EXPECT_EQ(count(*plan, OpKind::ColumnSums), with_pass ? 0u : 1u) << plan->graph().str();
    EXPECT_EQ(plan->kernels(), with_pass ? 1u : 2u) << plan->graph().str();
    if (with_pass) {
      const compile::Node& n = plan->graph().nodes[0];
      EXPECT_EQ(fused_column_sums_of(n.attrs).output, 0);
      EXPECT_FALSE(fused_column_sums_of(n.attrs).accumulate);
      EXPECT_EQ(n.fused.back(), "column_sums");
    }
    EXPECT_EQ(out[0].to_vector<double>(), eager[0].to_vector<double>());
    EXPECT_EQ(out[1].to_vector<double>(), eager[1].to_vector<double>());
  }
}

TEST(ElementwiseColumnSumsPass, SumsAddedIntoAGradientAccumulateOverReplays) {
  // grad (8) += column sums of (x * w + 1): a bias gradient accumulated over micro-batches.
  auto step = [](Tensor grad) {
    return [grad](const std::vector<Tensor>& in) {
      Tensor y = in[0] * in[1] + 1.0;
      dispatch_out(OpKind::ColumnSums, {y, grad}, {grad}, Attrs().set("accumulate", true));
      return std::vector<Tensor>{y};
    };
  };
  const Tensor x = testing_util::random({5, 8}, 4, DType::f32), w = testing_util::random({5, 8}, 5, DType::f32);
  const Tensor start = testing_util::random({8}, 6, DType::f32);
  Tensor eager_grad = Tensor::empty({8}, DType::f32, Device::cpu());
  Tensor compiled_grad = Tensor::empty({8}, DType::f32, Device::cpu());
  dispatch_out(OpKind::Copy, {start}, {eager_grad});
  dispatch_out(OpKind::Copy, {start}, {compiled_grad});
  auto eager = step(eager_grad);
  auto f = compiled(step(compiled_grad), true);
  for (int k = 0; k < 4; ++k) {
    eager({x, w});
    f({x, w});
  }
  const compile::Plan* plan = f.last_plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(count(*plan, OpKind::ColumnSums), 0u) << plan->graph().str();
  ASSERT_EQ(count(*plan, OpKind::FusedElementwise), 1u) << plan->graph().str();
  EXPECT_TRUE(fused_column_sums_of(plan->graph().nodes[0].attrs).accumulate);
  EXPECT_EQ(compiled_grad.to_vector<double>(), eager_grad.to_vector<double>());
  EXPECT_NE(compiled_grad.to_vector<double>(), start.to_vector<double>()) << "the sums were added";
}

// y = 2 x, as a program of `out` dtype, with column sums of output `which`.
Attrs doubling(DType in, DType out, const Shape& shape, FusedColumnSums sums) {
  FusedExpr e;
  e.store(0, e.cast(e.op(OpKind::MulScalar, {e.load(0, in)}, in, 2.0), out), out);
  Attrs a = fused_elementwise_attrs(e, shape, Device::cpu());
  set_fused_column_sums(a, sums);
  return a;
}

void expect_error(const std::vector<Tensor>& in, const Attrs& a, const std::vector<std::string>& parts) {
  try {
    dispatch(OpKind::FusedElementwise, in, a);
    FAIL() << "expected reel::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << p << " not in: " << what;
  }
}

TEST(ElementwiseColumnSumsPass, BadColumnSumAttrsAreErrorsThatShowTheCall) {
  const Tensor x = testing_util::random({4, 8}, 7, DType::f32);
  expect_error({x}, doubling(DType::f32, DType::f32, {4, 8}, {3, false}),
               {"fused_elementwise", "output 3", "1 outputs"});
  expect_error({x.to(DType::f64)}, doubling(DType::f64, DType::f64, {4, 8}, {0, false}),
               {"fused_elementwise", "f64", "(4, 8)"});
  const Tensor wrong = testing_util::random({4}, 8, DType::f32);
  expect_error({x, wrong}, doubling(DType::f32, DType::f32, {4, 8}, {0, true}), {"fused_elementwise", "(4,)", "(8,)"});
}

}  // namespace
