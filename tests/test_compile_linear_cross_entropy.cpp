// A small classifier head as one node (compile/passes/fuse_linear_cross_entropy.cpp): the logits'
// GEMM, cross_entropy_with_grad and the input gradient's matmul (and under autocast the cast of the
// GEMM's input) become linear_cross_entropy_with_grad.
//   - cnn-small's compiled step (ACCUM 2) with the pass on follows the step with it off to the bit on
//     the CPU (whose kernel runs the ops in turn), in fp32, bf16 and fp16, one node a micro-batch in
//     place of three (four under autocast);
//   - on the GPU (one kernel, other orders of the same sums) within f32 rounding of it;
//   - a head the GPU's kernel does not take (a GPT's vocabulary over 4096 rows) is refused there, and
//     the schema names the op and the shapes of a call it cannot run.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "kernels/dispatch.h"
#include "test_util.h"

namespace reel {
namespace {

using testing_util::count_op;

// The largest relative L2 difference between two runs' state tensors, and between their losses.
double largest_difference(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double num = 0, den = 0;
    for (size_t k = 0; k < a[i].size() && k < b[i].size(); ++k) {
      num += (a[i][k] - b[i][k]) * (a[i][k] - b[i][k]);
      den += b[i][k] * b[i][k];
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

// Under autocast the cast of the pooled features into the GEMM's 16-bit input goes into the node too.
void expect_the_head_fused(const testing_util::CompiledSteps& on, const testing_util::CompiledSteps& off,
                           bool autocast) {
  ASSERT_NE(on.plan(), nullptr);
  ASSERT_NE(off.plan(), nullptr);
  const size_t micro_batches = 2;
  EXPECT_EQ(count_op(*on.plan(), OpKind::LinearCrossEntropyWithGrad), micro_batches);
  EXPECT_EQ(count_op(*on.plan(), OpKind::CrossEntropyWithGrad), 0u);
  EXPECT_EQ(count_op(*off.plan(), OpKind::LinearCrossEntropyWithGrad), 0u);
  // Per micro-batch the GEMM and the input gradient's matmul go, and under autocast the cast.
  EXPECT_EQ(on.plan()->kernels() + (autocast ? 3 : 2) * micro_batches, off.plan()->kernels());
}

TEST(LinearCrossEntropyPass, CnnSmallFollowsTheStepWithoutItToTheBitOnTheCpu) {
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const auto [on, off] = testing_util::pass_on_and_off("cnn-small", Device::cpu(), precision, "linear_cross_entropy");
    expect_the_head_fused(on, off, std::string(precision) != "fp32");
    EXPECT_TRUE(testing_util::same_training(on, off));
  }
}

TEST(LinearCrossEntropyPass, CnnSmallFollowsTheStepWithoutItOnTheGpu) {
  REEL_REQUIRE_GPU();
  // fp32 within f32 rounding of the GEMMs' other sum orders over three steps; bf16 within a 16-bit
  // rounding of the gradient (a dlogit that rounds the other way moves the step by one ulp of bf16).
  for (const auto& [precision, bound] : {std::pair{"fp32", 1e-5}, std::pair{"bf16", 1e-2}}) {
    SCOPED_TRACE(precision);
    const Device gpu = Device::cuda(0);
    const auto [on, off] = testing_util::pass_on_and_off("cnn-small", gpu, precision, "linear_cross_entropy");
    expect_the_head_fused(on, off, std::string(precision) != "fp32");
    ASSERT_EQ(on.losses.size(), off.losses.size());
    for (size_t i = 0; i < on.losses.size(); ++i)
      EXPECT_NEAR(on.losses[i], off.losses[i], bound * std::abs(off.losses[i])) << "step " << i;
    EXPECT_LE(largest_difference(on.state, off.state), bound);
  }
}

TEST(LinearCrossEntropyPass, TheGpuKernelRefusesAHeadForTheTensorCores) {
  REEL_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  auto call = [&](int64_t N, int64_t C, int64_t K) {
    const std::vector<Tensor> in = {Tensor::empty({N, C}, DType::bf16, gpu), Tensor::empty({C, K}, DType::bf16, gpu),
                                    Tensor::empty({K}, DType::f32, gpu), Tensor::empty({N}, DType::i64, gpu),
                                    Tensor::empty({}, DType::f32, gpu)};
    const std::vector<Tensor> out = {Tensor::empty({}, DType::f32, gpu), Tensor::empty({N, K}, DType::bf16, gpu),
                                     Tensor::empty({N, C}, DType::bf16, gpu)};
    return supports_call(OpKind::LinearCrossEntropyWithGrad, in, out, {});
  };
  EXPECT_TRUE(call(32, 128, 10));      // cnn-small's head
  EXPECT_FALSE(call(4096, 512, 256));  // gpt-small's: 537 M multiply-adds
  EXPECT_FALSE(call(8, 4096, 10));     // a feature row wider than the kernel stages
}

TEST(LinearCrossEntropySchema, NamesTheOpAndTheShapes) {
  const std::vector<Tensor> good = {zeros({4, 6}), zeros({6, 3}), zeros({3}), tensor_i64({0, 1, 2, 1}, {4}),
                                    full({}, 1.0)};
  EXPECT_EQ(dispatch(OpKind::LinearCrossEntropyWithGrad, good).size(), 3u);
  auto message = [&](std::vector<Tensor> in) {
    try {
      dispatch(OpKind::LinearCrossEntropyWithGrad, in);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::vector<Tensor> w_rows = good;
  w_rows[1] = zeros({5, 3});
  const std::string m1 = message(w_rows);
  EXPECT_NE(m1.find("linear_cross_entropy_with_grad: w (5, 3) f32 must be (6, K) f32"), std::string::npos) << m1;
  std::vector<Tensor> bias16 = good;
  bias16[2] = zeros({3}, TensorOptions{}.with_dtype(DType::bf16));
  const std::string m2 = message(bias16);
  EXPECT_NE(m2.find("bias (3,) bf16 must be (3) f32"), std::string::npos) << m2;
  std::vector<Tensor> targets = good;
  targets[3] = tensor_i64({0, 1}, {2});
  const std::string m3 = message(targets);
  EXPECT_NE(m3.find("target of shape (2,) does not match logits of shape (4, 3)"), std::string::npos) << m3;
}

}  // namespace
}  // namespace reel
