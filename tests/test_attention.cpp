// Fused causal self-attention on the CPU: the op against the textbook chain of ops it replaces
// (split, heads, q k^T, mask, softmax, times v; nn::causal_attention_unfused) in f64, forward and every
// gradient; the 16-bit compute mode against the exact one; the schema's errors. Finite differences
// of the op itself run with every other op's (autograd/cases/attention_cases.cpp, test_gradcheck).
#include <gtest/gtest.h>

#include "autograd/autocast.h"
#include "kernels/dispatch.h"
#include "nn/attention.h"
#include "test_util.h"

using namespace reel;
using testing_util::expect_error;
using testing_util::max_abs_diff;

namespace {

Tensor qkv_leaf(const Shape& shape, DType dt, uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  Tensor x = (randn(shape, TensorOptions{DType::f64}, &gen) * scale).to(dt);
  x.set_requires_grad(true);
  return x;
}

// y and d(sum(y * w))/dqkv of an attention function, for a fixed random weighting w of y.
std::pair<Tensor, Tensor> value_and_grad(const std::function<Tensor(const Tensor&)>& f, const Tensor& qkv,
                                         uint64_t seed) {
  Tensor x = qkv.detach();
  x.set_requires_grad(true);
  Tensor y = f(x);
  Generator gen(seed);
  Tensor w = randn(y.shape(), TensorOptions{y.dtype()}, &gen);
  sum(y * w).backward();
  return {y.detach(), x.grad()};
}

}  // namespace

TEST(CausalAttention, MatchesTheUnfusedChainOfOpsAndItsGradients) {
  struct Case {
    int64_t B, T, d, H;
  };
  for (Case c : {Case{2, 7, 12, 3}, Case{1, 1, 8, 2}, Case{3, 16, 16, 1}, Case{2, 65, 32, 4}}) {
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " d " + std::to_string(c.d) + " H " +
                 std::to_string(c.H));
    Tensor qkv = qkv_leaf({c.B, c.T, 3 * c.d}, DType::f64, 7 + c.T, 1.5);
    auto [y, g] = value_and_grad([&](const Tensor& x) { return nn::causal_attention(x, c.H); }, qkv, 99);
    auto [y_ref, g_ref] = value_and_grad([&](const Tensor& x) { return nn::causal_attention_unfused(x, c.H); }, qkv, 99);
    ASSERT_EQ(y.shape(), (Shape{c.B, c.T, c.d}));
    EXPECT_LT(max_abs_diff(y.to_vector<double>(), y_ref.to_vector<double>()), 1e-12);
    EXPECT_LT(max_abs_diff(g.to_vector<double>(), g_ref.to_vector<double>()), 1e-11);
  }
}

TEST(CausalAttention, SixteenBitComputeStaysCloseToTheExactResult) {
  Tensor qkv = qkv_leaf({2, 40, 48}, DType::f32, 5);
  auto exact = [](const Tensor& x) { return scaled_causal_attention(x, 2); };
  auto [y, g] = value_and_grad(exact, qkv, 3);
  for (DType c : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(c));
    auto [y16, g16] = value_and_grad([&](const Tensor& x) { return scaled_causal_attention(x, 2, c); }, qkv, 3);
    const double tol = c == DType::bf16 ? 3e-2 : 5e-3;
    EXPECT_LT(max_abs_diff(y16.to_vector<double>(), y.to_vector<double>()), tol);
    EXPECT_LT(max_abs_diff(g16.to_vector<double>(), g.to_vector<double>()), 2 * tol);
    // ... and rounds: the 16-bit result is not the exact one.
    EXPECT_GT(max_abs_diff(y16.to_vector<double>(), y.to_vector<double>()), 0.0);
  }
}

TEST(CausalAttention, AutocastRunsTheProductsInTheComputeDtype) {
  Tensor qkv = qkv_leaf({1, 9, 24}, DType::f32, 11);
  Tensor exact = nn::causal_attention(qkv, 2);
  Tensor bf16;
  {
    AutocastGuard amp(PrecisionPolicy::parse("bf16"));
    bf16 = nn::causal_attention(qkv, 2);
  }
  Tensor direct = scaled_causal_attention(qkv, 2, DType::bf16);
  EXPECT_EQ(bf16.dtype(), DType::f32);
  EXPECT_EQ(bf16.to_vector<double>(), direct.to_vector<double>());
  EXPECT_GT(max_abs_diff(bf16.to_vector<double>(), exact.to_vector<double>()), 0.0);
}

TEST(CausalAttention, BadInputsNameTheOpAndTheShapes) {
  Tensor x = zeros({2, 5, 12});
  expect_error([&] { scaled_causal_attention(zeros({2, 5, 10}), 2); }, {"causal_attention", "(2, 5, 10)", "3d"});
  expect_error([&] { scaled_causal_attention(zeros({10, 12}), 2); }, {"causal_attention", "(10, 12)"});
  expect_error([&] { scaled_causal_attention(x, 3); }, {"causal_attention", "heads 3", "divide d 4"});
  expect_error([&] { scaled_causal_attention(x, 2, DType::f64); }, {"causal_attention", "compute dtype f64"});
  expect_error([&] { scaled_causal_attention(zeros({2, 5, 12}, TensorOptions{DType::f64}), 2, DType::bf16); },
               {"causal_attention", "compute dtype bf16"});
  std::vector<Tensor> out = dispatch(OpKind::CausalAttention, {x}, Attrs().set("heads", int64_t(2)).set("compute", DType::f32));
  expect_error(
      [&] {
        dispatch(OpKind::CausalAttentionBackward, {zeros({2, 5, 3}), x, out[0], out[1]},
                 Attrs().set("heads", int64_t(2)).set("compute", DType::f32));
      },
      {"causal_attention_backward", "gradient dy", "(2, 5, 3)", "(2, 5, 4)"});
}
