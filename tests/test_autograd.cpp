// The autograd engine: accumulation into .grad, graph shapes (shared inputs, diamonds, views),
// no_grad, detach, retain_graph, and the user mistakes it must refuse.
#include <gtest/gtest.h>

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
