// optim::train_step — MODELS.md's step as a function: ACCUM micro-batches through it update the
// parameters exactly as one batch of ACCUM times the size (f64, no BatchNorm), and a mismatch between
// the micro-batches given and the optimizer's ACCUM is a clear error.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/nn.h"
#include "optim/optim.h"
#include "test_util.h"

using namespace reel;
using reel::testing_util::expect_error;
using reel::testing_util::f64_mlp;

TEST(OptimTrainStep, AccumulatedStepEqualsOneLargeBatch) {
  Generator gen(9);
  Tensor x = randn({12, 6}, {DType::f64}, &gen);
  Tensor y = tensor_i64({0, 1, 2, 2, 1, 0, 0, 0, 1, 2, 1, 1}, {12});
  auto loss_of = [](nn::Module& m) {
    return [&m](const Tensor& a, const Tensor& b) { return nn::model_loss(m, a, b); };
  };

  auto accumulated = f64_mlp(5);
  optim::AdamW opt_a(accumulated->parameters(), optim::AdamWOptions(1e-2));
  opt_a.set_accum_steps(3).set_max_grad_norm(1.0);
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < 3; ++i) micro.push_back({x.slice(0, 4 * i, 4 * i + 4), y.slice(0, 4 * i, 4 * i + 4)});
  Tensor mean_loss;
  optim::StepResult r = optim::train_step(opt_a, loss_of(*accumulated), micro, &mean_loss);
  EXPECT_TRUE(r.stepped);

  auto whole = f64_mlp(5);
  optim::AdamW opt_w(whole->parameters(), optim::AdamWOptions(1e-2));
  opt_w.set_max_grad_norm(1.0);
  optim::train_step(opt_w, loss_of(*whole), {{x, y}});

  EXPECT_NEAR(mean_loss.item(), nn::model_loss(*f64_mlp(5), x, y).item(), 1e-12);
  auto pa = accumulated->parameters(), pw = whole->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    std::vector<double> a = pa[i].to_vector<double>(), w = pw[i].to_vector<double>();
    for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], w[k], 1e-12) << "parameter " << i;
  }
}

TEST(OptimTrainStep, MicroBatchesMustReachTheBoundary) {
  auto m = f64_mlp(5);
  optim::SGD opt(m->parameters(), optim::SGDOptions(0.1));
  opt.set_accum_steps(4);
  Tensor x = zeros({2, 6}, {DType::f64});
  Tensor y = tensor_i64({0, 1}, {2});
  expect_error([&] { optim::train_step(opt, [&](const Tensor& a, const Tensor& b) { return nn::model_loss(*m, a, b); },
                                       {{x, y}, {x, y}}); },
               {"train_step", "2 micro-batches", "ACCUM"});
}
