// The autograd engine: accumulation into .grad, graph shapes (shared inputs, diamonds, views),
// no_grad, detach, retain_graph, and the user mistakes it must refuse.
#include <gtest/gtest.h>

#include <cmath>

#include "compile/runtime/memory_budget.h"
#include "test_util.h"

using namespace reel;
using reel::testing_util::expect_error;

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor w = tensor({1, 2, 3}, {3}, {DType::f64}).set_requires_grad();
  (w * 2.0).sum().backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{2, 2, 2}));
  (w * w).sum().backward();  // params += : 2 + 2w
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{4, 6, 8}));
  w.set_grad(Tensor());  // zero_grad(set_to_none)
  (w * 3.0).sum().backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{3, 3, 3}));
}

TEST(Autograd, DiamondAndSharedInputs) {
  Tensor x = tensor({2}, {1}, {DType::f64}).set_requires_grad();
  Tensor a = x * 3.0, b = x * x;
  Tensor y = (a * b + a).sum();  // 3x^3 + 3x -> 9x^2 + 3 = 39
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 39.0);
}

TEST(Autograd, LeafGradientsAreNotAliased) {
  Tensor a = zeros({2}).set_requires_grad(), b = zeros({2}).set_requires_grad();
  (a + b).sum().backward();
  EXPECT_FALSE(a.grad().shares_storage(b.grad()));
  add_(a.grad(), ones({2}));
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{1, 1}));
}

TEST(Autograd, ThroughViewsIntoTheBase) {
  Tensor x = arange(6, {DType::f64}).reshape({2, 3}).detach().set_requires_grad();
  Tensor y = (x.t().slice(0, 1, 3) * 2.0).sum() + x.slice(1, 0, 1).expand({2, 4}).sum();
  y.backward();
  // d/dx: 2 on columns 1..2, 4 on column 0 (expanded 4 times).
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{4, 2, 2, 4, 2, 2}));
}

TEST(Autograd, NoGradGuardAndDetach) {
  Tensor x = ones({2}).set_requires_grad();
  {
    NoGradGuard guard;
    Tensor y = x * 2.0;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
  }
  EXPECT_TRUE(grad_enabled());
  Tensor z = (x * 2.0).detach();
  EXPECT_FALSE(z.requires_grad());
  Tensor y = x * 2.0;
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_EQ(y.grad_fn()->name(), "mul_scalar");
}

TEST(Autograd, ExplicitGradientForNonScalarOutput) {
  Tensor x = tensor({1, 2}, {2}, {DType::f64}).set_requires_grad();
  Tensor y = x * x;
  y.backward(tensor({1, 10}, {2}, {DType::f64}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 40}));
}

TEST(Autograd, RetainGraphAllowsASecondBackward) {
  Tensor x = tensor({3}, {1}, {DType::f64}).set_requires_grad();
  Tensor y = (x * x).sum();
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 12.0);
  expect_error([&] { y.backward(); }, {"backward", "retain_graph"});
}

TEST(Autograd, UserMistakesAreClearErrors) {
  Tensor x = ones({2, 3}).set_requires_grad();
  expect_error([&] { (x * 2.0).backward(); }, {"backward", "(2, 3)", "one-element"});
  expect_error([&] { ones({2}).sum().backward(); }, {"backward", "does not require grad"});
  expect_error([&] { (x * 2.0).sum().backward(ones({2})); }, {"backward", "(2,)", "does not match"});
  expect_error([&] { tensor_i64({1}, {1}).set_requires_grad(); }, {"requires_grad", "i64"});
  expect_error([&] { Tensor y = x * 2.0; y.set_requires_grad(false); }, {"requires_grad", "leaf"});
  expect_error([&] { add_(x, ones({2, 3})); }, {"add_", "requires grad", "NoGradGuard"});
  NoGradGuard ok;
  add_(x, ones({2, 3}));  // allowed under no_grad, like an optimizer step
  EXPECT_EQ(x.to_vector<float>()[0], 2.0f);
}

// A binary op saves only what its needed gradients read: a chain of adds holds nothing for its
// backward, so eager frees each intermediate when the program drops it; a multiply by a constant
// keeps the constant only, and by a tensor that requires grad keeps each intermediate (its gradient
// reads it). Measured with the CPU allocator's peak over the forward.
TEST(Autograd, BinaryOpsSaveOnlyWhatTheirGradientsRead) {
  const int64_t n = int64_t(1) << 18;  // 1 MiB of f32
  const size_t mib = size_t(1) << 20;
  Generator gen(1);
  auto forward_peak = [&](auto op, bool c_grad, Tensor& x, Tensor& c) {
    x = uniform({n}, 0.5, 1.5, {}, &gen);
    c = uniform({n}, 0.9, 1.1, {}, &gen);
    x.set_requires_grad();
    c.set_requires_grad(c_grad);
    compile::reset_peak_bytes(Device::cpu());
    const size_t base = compile::allocated_bytes(Device::cpu());
    Tensor h = x;
    for (int i = 0; i < 16; ++i) h = op(h, c);  // each intermediate dropped at the next assignment
    Tensor loss = sum(h);
    const size_t peak = compile::peak_bytes(Device::cpu()) - base;
    loss.backward();
    return peak;
  };
  Tensor x, c;
  EXPECT_LT(forward_peak([](const Tensor& a, const Tensor& b) { return a + b; }, true, x, c), 4 * mib);
  for (double g : x.grad().to_vector<double>()) ASSERT_EQ(g, 1.0);
  for (double g : c.grad().to_vector<double>()) ASSERT_EQ(g, 16.0);
  EXPECT_LT(forward_peak([](const Tensor& a, const Tensor& b) { return a - b; }, false, x, c), 4 * mib);
  EXPECT_LT(forward_peak([](const Tensor& a, const Tensor& b) { return a * b; }, false, x, c), 4 * mib);
  std::vector<double> cv = c.to_vector<double>(), gx = x.grad().to_vector<double>();
  for (size_t i = 0; i < cv.size(); i += 4099) EXPECT_NEAR(gx[i], std::pow(cv[i], 16), 1e-5 * std::pow(cv[i], 16));
  // c requires grad: dc reads every intermediate, so the forward holds all sixteen.
  EXPECT_GE(forward_peak([](const Tensor& a, const Tensor& b) { return a * b; }, true, x, c), 16 * mib);
}
