// Column sums inside a fused elementwise kernel (kernels/fused_expr.h FusedColumnSums, the CUDA build
// in kernels/jit/codegen_cuda.h, the pass compile/passes/fuse_elementwise_column_sums.cpp). The op
// harness checks the op against plain loops on every backend (cases_fused.cpp); here, on the GPU:
// operands that are not 16-byte aligned (the kernel's element-by-element path), the same bits on
// every run and in a CUDA graph, and a GPT's training step with the pass on against the pass off.
// Every test skips where no GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "kernels/dispatch.h"
#include "kernels/fused_expr.h"
#include "tensor/cuda.h"
#include "test_util.h"

namespace reel {
namespace {

using testing_util::rel_l2;
using testing_util::same_bits;

// dx = t(gelu_backward(f32(g), f32(z))) with the column sums of dx, as a GPT's MLP backward has it.
Attrs gelu_backward_sums(DType t, const Shape& shape, bool accumulate) {
  FusedExpr e;
  const int g = e.cast(e.load(0, t), DType::f32), z = e.cast(e.load(1, t), DType::f32);
  e.store(0, e.cast(e.op(OpKind::GeluBackward, {g, z}, DType::f32), t), t);
  Attrs a = fused_elementwise_attrs(e, shape, Device::cuda(0));
  set_fused_column_sums(a, {0, accumulate});
  return a;
}

// A contiguous (rows, cols) tensor of N(0, 1) values starting `skip` elements into its storage.
Tensor values_at(int64_t rows, int64_t cols, int64_t skip, DType t, uint64_t seed, Device d) {
  Tensor base = testing_util::random({rows * cols + skip}, seed, DType::f32).to(t).to(d);
  return Tensor::make_view(base, {rows, cols}, {cols, 1}, skip);
}

// The op on the GPU and on the CPU, for operands `skip` elements into their storage (skip 1: no
// 16-byte alignment, the column-sums kernel's element-by-element path), added to the same sums.
void expect_matches_cpu(int64_t rows, int64_t cols, int64_t skip, DType t) {
  SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " skip " + std::to_string(skip) + " " +
               dtype_name(t));
  const Attrs a = gelu_backward_sums(t, {rows, cols}, true);
  std::vector<Tensor> out;
  for (Device d : {Device::cuda(0), Device::cpu()}) {
    const Tensor sums = testing_util::random({cols}, 9, DType::f32).to(d);
    Tensor dx = Tensor::empty({rows, cols}, t, d);
    dispatch_out(OpKind::FusedElementwise,
                 {values_at(rows, cols, skip, t, 1, d), values_at(rows, cols, skip, t, 2, d), sums}, {dx, sums}, a);
    out.push_back(dx.to(Device::cpu()));
    out.push_back(sums.to(Device::cpu()));
  }
  // dx: one formula, rounded to 16 bits on both (the device's libm may move a value by one 16-bit ulp).
  EXPECT_LT(rel_l2(out[0].to_vector<double>(), out[2].to_vector<double>()), 1e-2);
  // The sums of those values in f32, in two orders.
  EXPECT_LT(rel_l2(out[1].to_vector<double>(), out[3].to_vector<double>()), 1e-3);
}

TEST(ElementwiseColumnSumsCuda, AlignedAndMisalignedOperandsMatchTheCpu) {
  REEL_REQUIRE_GPU();
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t skip : {0, 1}) {
      expect_matches_cpu(300, 264, skip, t);  // two column tiles, the second of 8 columns; chunks of rows
      expect_matches_cpu(4096, 512, skip, t);
    }
}

TEST(ElementwiseColumnSumsCuda, TheSameBitsOnEveryCallAndInACudaGraph) {
  REEL_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const Attrs a = gelu_backward_sums(DType::bf16, {2048, 1024}, false);
  const Tensor g = values_at(2048, 1024, 0, DType::bf16, 3, gpu), z = values_at(2048, 1024, 0, DType::bf16, 4, gpu);
  std::vector<std::vector<double>> runs;
  for (int k = 0; k < 3; ++k) {
    const std::vector<Tensor> r = dispatch(OpKind::FusedElementwise, {g, z}, a);
    runs.push_back(r[1].to(Device::cpu()).to_vector<double>());
  }
  EXPECT_TRUE(same_bits(runs[0], runs[1]));
  EXPECT_TRUE(same_bits(runs[0], runs[2]));
  // The column_sums op sums the same 16-bit values in another fixed order.
  const std::vector<Tensor> r = dispatch(OpKind::FusedElementwise, {g, z}, a);
  const Tensor s = dispatch(OpKind::ColumnSums, {r[0]}, {})[0];
  EXPECT_LT(rel_l2(runs[0], s.to(Device::cpu()).to_vector<double>()), 1e-5);
}

// The fc layers' bias gradients (GELU's backward feeds them) are summed in the GELU-backward
// kernel: no column_sums node reads a fused_elementwise node's output in the plan.
size_t fused_with_sums(const compile::Plan& p) {
  size_t n = 0;
  for (const compile::Node& node : p.graph().nodes)
    n += node.op == OpKind::FusedElementwise && fused_column_sums_of(node.attrs).on();
  return n;
}

struct StepRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> state;
  size_t kernels_with_sums = 0;
};

StepRun run_steps(const char* precision, bool pass_on) {
  AutocastGuard amp(PrecisionPolicy::parse(precision));
  testing_util::SmallTraining t = testing_util::small_training("gpt-tiny", Device::cuda(0));
  compile::CompileOptions o(compile::Mode::ReduceOverhead);
  if (pass_on) o.enabled_passes = {"elementwise_column_sums"};  // off by default (pipeline.cpp says why)
  compile::CompiledFunction step = compile::compile_train_step(*t.opt, t.loss, o);
  StepRun r;
  r.losses = testing_util::step_losses(*t.opt, t.loss, t.micro, 3, &step);
  r.state = t.state();
  if (step.last_plan()) r.kernels_with_sums = fused_with_sums(*step.last_plan());
  return r;
}

TEST(ElementwiseColumnSumsCuda, AGptStepWithThePassFollowsTheStepWithout) {
  REEL_REQUIRE_GPU();
  for (const char* precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const StepRun off = run_steps(precision, false), on = run_steps(precision, true),
                  again = run_steps(precision, true);
    EXPECT_EQ(off.kernels_with_sums, 0u);
    // gpt-tiny's 4 layers, ACCUM 2: an fc bias gradient per layer and micro-batch.
    EXPECT_GE(on.kernels_with_sums, 8u);
    ASSERT_EQ(on.state.size(), off.state.size());
    for (size_t i = 0; i < off.state.size(); ++i) {
      EXPECT_LT(rel_l2(on.state[i], off.state[i]), 1e-5) << "tensor " << i;
      EXPECT_TRUE(same_bits(on.state[i], again.state[i])) << "tensor " << i << ": not the same bits run to run";
    }
    for (size_t k = 0; k < off.losses.size(); ++k)
      EXPECT_NEAR(on.losses[k], off.losses[k], 1e-4 * std::abs(off.losses[k]));
  }
}

}  // namespace
}  // namespace reel
