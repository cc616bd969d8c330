// The benchmark models of MODELS.md: exact parameter counts, the PyTorch peer's parameter names,
// forward shapes, GPT causality, model_loss against a plain log-softmax, an end-to-end gradcheck of
// a tiny GPT and of a small CNN with every layer kind, a tiny GPT that learns, and the Fashion-MNIST CNN.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/nn.h"
#include "test_util.h"

using namespace reel;
using namespace reel::nn;
using reel::testing_util::expect_error;

TEST(NnModels, ParameterCountsMatchModelsMd) {
  EXPECT_EQ(cnn_small()->num_parameters(), 279466);
  EXPECT_EQ(gpt_tiny()->num_parameters(), 3323392);
  EXPECT_EQ(gpt_small()->num_parameters(), 25613312);
}

TEST(NnModels, NamesMatchThePyTorchPeer) {
  auto cnn = cnn_small()->named_parameters();
  EXPECT_EQ(cnn.front().first, "0.weight");
  EXPECT_EQ(cnn[1].first, "1.weight");
  EXPECT_EQ(cnn.back().first, "17.bias");
  auto g = gpt_tiny()->named_parameters();
  std::vector<std::string> first;
  for (size_t i = 0; i < 14; ++i) first.push_back(g[i].first);
  EXPECT_EQ(first, (std::vector<std::string>{"wte.weight", "wpe.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias",
                                             "blocks.0.qkv.weight", "blocks.0.qkv.bias", "blocks.0.proj.weight",
                                             "blocks.0.proj.bias", "blocks.0.ln2.weight", "blocks.0.ln2.bias",
                                             "blocks.0.fc.weight", "blocks.0.fc.bias", "blocks.0.fc2.weight",
                                             "blocks.0.fc2.bias"}));
  EXPECT_EQ(g.back().first, "head.weight");
  EXPECT_EQ(g[g.size() - 2].first, "lnf.bias");
}

TEST(NnModels, ForwardShapes) {
  auto cnn = cnn_small();
  EXPECT_EQ(cnn->forward(randn({2, 3, 32, 32})).shape(), (Shape{2, 10}));
  auto g = gpt_tiny();
  Tensor idx = tensor_i64({1, 2, 3, 255, 0, 9, 8, 7}, {2, 4});
  EXPECT_EQ(g->forward(idx).shape(), (Shape{2, 4, 256}));
  expect_error([&] { g->forward(zeros({2, 129}).to(DType::i64)); }, {"Gpt", "129", "block_size 128"});
  expect_error([&] { g->forward(zeros({2, 4})); }, {"Gpt", "i64", "f32"});
  auto f = fashion_cnn();
  EXPECT_EQ(f->forward(randn({3, 1, 28, 28})).shape(), (Shape{3, 10}));
  EXPECT_EQ(f->num_parameters(), 288 + 64 + 18432 + 128 + 31370);  // convs without bias
}

TEST(NnModels, ModelLossIsMeanCrossEntropyOverAllPositions) {
  GptConfig c{7, 5, 8, 2, 1};
  auto g = gpt(c);
  g->to(DType::f64);
  Tensor x = tensor_i64({1, 2, 3, 4, 5, 6, 0, 1}, {2, 4}), y = tensor_i64({2, 3, 4, 5, 6, 0, 1, 2}, {2, 4});
  auto logits = g->forward(x).to_vector<double>();
  auto yv = y.to_vector<int64_t>();
  double ref = 0;
  for (int r = 0; r < 8; ++r) {
    double mx = -1e300, z = 0;
    for (int k = 0; k < 7; ++k) mx = std::max(mx, logits[r * 7 + k]);
    for (int k = 0; k < 7; ++k) z += std::exp(logits[r * 7 + k] - mx);
    ref += -(logits[r * 7 + yv[r]] - mx - std::log(z)) / 8;
  }
  EXPECT_NEAR(model_loss(*g, x, y).item(), ref, 1e-12);
  expect_error([&] { model_loss(*g, x, tensor_i64({1, 2}, {2})); }, {"model_loss", "(2, 4, 7)", "(2,)"});
}

TEST(NnModels, GptIsCausal) {
  auto g = gpt({16, 6, 8, 2, 2});
  Tensor a = tensor_i64({1, 2, 3, 4, 5, 6}, {1, 6}), b = tensor_i64({1, 2, 3, 9, 9, 9}, {1, 6});
  auto la = g->forward(a).to_vector<float>(), lb = g->forward(b).to_vector<float>();
  for (int i = 0; i < 3 * 16; ++i) EXPECT_EQ(la[i], lb[i]);
  EXPECT_NE(la[3 * 16], lb[3 * 16]);
}

TEST(NnModels, TinyGptGradcheckEndToEnd) {
  auto g = gpt({5, 4, 4, 2, 2});
  g->to(DType::f64);
  Tensor x = tensor_i64({0, 1, 2, 3, 4, 0, 2, 1}, {2, 4}), y = tensor_i64({1, 2, 3, 4, 0, 2, 1, 3}, {2, 4});
  auto fn = [&](const std::vector<Tensor>&) { return model_loss(*g, x, y); };
  GradcheckResult r = gradcheck(fn, g->parameters());
  EXPECT_TRUE(r.ok) << r.str();
}

TEST(NnModels, SmallCnnGradcheckEndToEnd) {
  // cnn_small's layer kinds at a small size: conv, BatchNorm, GroupNorm, ReLU, pooling, Linear.
  Sequential s{std::make_shared<Conv2d>(2, 4, 3, 1, 1, false), std::make_shared<BatchNorm2d>(4),
               std::make_shared<ReLU>(), std::make_shared<Conv2d>(4, 4, 3, 2, 1, false),
               std::make_shared<GroupNorm>(2, 4), std::make_shared<ReLU>(), std::make_shared<GlobalAvgPool2d>(),
               std::make_shared<Linear>(4, 3)};
  s.to(DType::f64);
  Tensor x = randn({3, 2, 4, 4}, {DType::f64}), y = tensor_i64({0, 2, 1}, {3});
  auto fn = [&](const std::vector<Tensor>&) { return model_loss(s, x, y); };
  GradcheckResult r = gradcheck(fn, s.parameters());
  EXPECT_TRUE(r.ok) << r.str();
}

TEST(NnModels, TinyGptLearnsASequence) {
  Generator gen(0);
  auto g = gpt({8, 8, 16, 2, 1}, &gen);
  Tensor x = tensor_i64({0, 1, 2, 3, 4, 5, 6, 7}, {1, 8}), y = tensor_i64({1, 2, 3, 4, 5, 6, 7, 0}, {1, 8});
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor loss = model_loss(*g, x, y);
    if (step == 0) first = loss.item();
    last = loss.item();
    loss.backward();
    NoGradGuard ng;
    for (auto& p : g->parameters()) add_(p, p.grad() * -0.1);
    g->zero_grad();
  }
  EXPECT_LT(last, 0.25 * first) << "first " << first << " last " << last;
}
