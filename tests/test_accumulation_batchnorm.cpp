// Gradient accumulation with BatchNorm: the documented difference. Each micro-batch is normalised
// with its own batch statistics, so ACCUM micro-batches of b items give the mean of the micro-batches'
// gradients — which is not the gradient of one batch of ACCUM*b items (whose statistics span all of
// them) — and the running statistics take one momentum update per micro-batch.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/nn.h"
#include "optim/optim.h"
#include "test_util.h"

using namespace reel;

namespace {

constexpr double kMomentum = 0.1;

// loss(x) = mean over items of sum(bn(x) * c): depends on the batch statistics of x.
Tensor bn_loss(nn::BatchNorm2d& bn, const Tensor& x, const Tensor& c) { return mean((bn.forward(x) * c).sum({1, 2, 3})); }

std::vector<double> grads_of(const std::vector<Tensor>& params) {
  std::vector<double> out;
  for (const Tensor& p : params)
    for (double v : p.grad().to_vector<double>()) out.push_back(v);
  return out;
}

}  // namespace

TEST(OptimAccumulation, BatchNormUsesPerMicroBatchStatistics) {
  Generator gen(11);
  Tensor x = randn({8, 2, 3, 3}, {DType::f64}, &gen), c = randn({1, 2, 3, 3}, {DType::f64}, &gen);
  auto make_bn = [] {
    auto bn = std::make_shared<nn::BatchNorm2d>(2, 1e-5, kMomentum);
    bn->to(DType::f64);
    return bn;
  };

  // Accumulated through the optimizer's contract: two micro-batches of 4.
  auto bn = make_bn();
  optim::SGD opt(bn->parameters(), optim::SGDOptions(0.0));
  opt.set_accum_steps(2);
  opt.scale_loss(bn_loss(*bn, x.slice(0, 0, 4), c)).backward();
  opt.micro_step();
  opt.scale_loss(bn_loss(*bn, x.slice(0, 4, 8), c)).backward();
  std::vector<double> accumulated = grads_of(bn->parameters());

  // The documented meaning: the mean of each micro-batch's own gradient.
  std::vector<double> expected(accumulated.size(), 0.0);
  for (int half = 0; half < 2; ++half) {
    auto one = make_bn();
    bn_loss(*one, x.slice(0, 4 * half, 4 * half + 4), c).backward();
    std::vector<double> g = grads_of(one->parameters());
    for (size_t i = 0; i < g.size(); ++i) expected[i] += g[i] / 2;
  }
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(accumulated[i], expected[i], 1e-12 * (1 + std::fabs(expected[i])));

  // ... which is not one batch of 8: the statistics differ.
  auto whole = make_bn();
  bn_loss(*whole, x, c).backward();
  std::vector<double> big = grads_of(whole->parameters());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < big.size(); ++i) diff += std::pow(big[i] - accumulated[i], 2), norm += big[i] * big[i];
  EXPECT_GT(std::sqrt(diff / norm), 1e-3) << "with BatchNorm, accumulation must not equal the large batch";

  // Running mean: one momentum update per micro-batch, each with that micro-batch's channel means.
  std::vector<double> rm = bn->running_mean().to_vector<double>();
  for (int ch = 0; ch < 2; ++ch) {
    double r = 0;
    for (int half = 0; half < 2; ++half) {
      double m = select(x.slice(0, 4 * half, 4 * half + 4), 1, ch).mean().item();
      r = (1 - kMomentum) * r + kMomentum * m;
    }
    EXPECT_NEAR(rm[ch], r, 1e-12);
  }
}
