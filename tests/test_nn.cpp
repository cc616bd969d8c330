// nn layers: Module registration and naming, train/eval, to(dtype), init, each layer's forward
// against plain loops or closed forms, gradcheck of every layer in f64 (parameters and inputs),
// attention causality, BatchNorm running statistics, Dropout, and state_dict files (round trip and
// every error, with the module left untouched on failure).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "nn/nn.h"
#include "test_util.h"

using namespace reel;
using namespace reel::nn;
using reel::testing_util::expect_error;

namespace {

// A module with own parameters, a buffer and nested children, to check names and order.
struct Toy : Module {
  Toy() : Module("Toy") {
    register_parameter("a", zeros({2}));
    register_buffer("stat", ones({3}));
    inner = register_module("inner", std::make_shared<Linear>(2, 3));
    register_parameter("z", zeros({1}));
    auto seq = register_module("seq", std::make_shared<Sequential>());
    seq->push_back(std::make_shared<ReLU>());
    seq->push_back(std::make_shared<BatchNorm2d>(2));
  }
  std::shared_ptr<Linear> inner;
};

std::vector<std::string> names_of(const NamedTensors& nt) {
  std::vector<std::string> out;
  for (auto& [n, t] : nt) out.push_back(n);
  return out;
}

// gradcheck of sum(module(x) * w) for a fixed random w, over x (if float) and every parameter.
void expect_module_gradcheck(Module& m, Tensor x, const std::function<void()>& before = {}) {
  m.to(DType::f64);
  std::vector<Tensor> inputs{x};
  if (is_floating(x.dtype())) inputs[0] = x.to(DType::f64).detach().set_requires_grad();
  for (auto& p : m.parameters()) inputs.push_back(p);
  Generator g(99);
  Tensor y0;
  {
    NoGradGuard ng;
    if (before) before();
    y0 = m.forward(inputs[0]);
  }
  Tensor w = uniform(y0.shape(), -1, 1, {DType::f64}, &g);
  auto fn = [&](const std::vector<Tensor>& in) {
    if (before) before();
    return sum(m.forward(in[0]) * w);
  };
  GradcheckResult r = gradcheck(fn, inputs);
  EXPECT_TRUE(r.ok) << m.type_name() << "\n" << r.str();
}

std::string tmp_path(const std::string& name) { return ::testing::TempDir() + "reel_nn_" + name; }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_bytes(const std::string& path, const std::string& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(b.data(), std::streamsize(b.size()));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Module

TEST(NnModule, NamesAreDottedInRegistrationOrder) {
  Toy t;
  EXPECT_EQ(names_of(t.named_parameters()),
            (std::vector<std::string>{"a", "z", "inner.weight", "inner.bias", "seq.1.weight", "seq.1.bias"}));
  EXPECT_EQ(names_of(t.named_parameters(false)), (std::vector<std::string>{"a", "z"}));
  EXPECT_EQ(names_of(t.named_buffers()),
            (std::vector<std::string>{"stat", "seq.1.running_mean", "seq.1.running_var", "seq.1.num_batches_tracked"}));
  EXPECT_EQ(names_of(t.named_state()),
            (std::vector<std::string>{"a", "z", "stat", "inner.weight", "inner.bias", "seq.1.weight", "seq.1.bias",
                                      "seq.1.running_mean", "seq.1.running_var", "seq.1.num_batches_tracked"}));
  ASSERT_EQ(t.children().size(), 2u);
  EXPECT_EQ(t.named_children()[1].first, "seq");
  std::vector<std::string> mods;
  for (auto& [n, m] : t.named_modules()) mods.push_back(n + ":" + m->type_name());
  EXPECT_EQ(mods, (std::vector<std::string>{"inner:Linear", "seq:Sequential", "seq.0:ReLU", "seq.1:BatchNorm2d"}));
  EXPECT_EQ(t.num_parameters(), 2 + 1 + 6 + 3 + 2 + 2);
  for (auto& p : t.parameters()) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
  }
  for (auto& b : t.buffers()) EXPECT_FALSE(b.requires_grad());
  // The handle a layer keeps is the registered one.
  EXPECT_TRUE(t.inner->weight().is_same(t.named_parameters()[2].second));
}

// ModuleList as torch.nn.ModuleList: children "0", "1", ... whose parameters are the list's, under
// dotted keys; no forward of its own; at<M>(i) gives a child back as its type, or says what it is.
TEST(NnModule, ModuleListRegistersItsChildrenInOrder) {
  Generator gen(2);
  auto blocks = std::make_shared<ModuleList>(
      std::initializer_list<ModulePtr>{std::make_shared<Linear>(3, 4, true, &gen), std::make_shared<GELU>()});
  blocks->push_back(std::make_shared<Linear>(4, 2, false, &gen));
  Sequential owner;
  owner.push_back(blocks);
  std::vector<std::string> names;
  for (const auto& [name, t] : owner.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.0.weight", "0.0.bias", "0.2.weight"}));
  ASSERT_EQ(blocks->size(), 3u);
  EXPECT_EQ(blocks->at<Linear>(2)->parameters()[0].shape(), (Shape{2, 4}));
  size_t visited = 0;
  for (const ModulePtr& m : *blocks) visited += m != nullptr;
  EXPECT_EQ(visited, 3u);
  expect_error([&] { blocks->at<Linear>(1); }, {"ModuleList: module 1 is a GELU"});
  expect_error([&] { (*blocks)[3]; }, {"ModuleList: index 3 out of range for 3 modules"});
  expect_error([&] { blocks->forward(zeros({1, 3})); }, {"ModuleList.forward", "no single-input forward"});
  expect_error([&] { blocks->push_back(nullptr); }, {"ModuleList.push_back: module 3 is null"});
}

// GELU's two forms and SiLU as layers: GELU() is the tanh form (reel's default), GELU("none") the
// exact one (torch.nn.GELU's default); values against the definitions.
TEST(NnLayers, GeluFormsAndSiluFollowTheirDefinitions) {
  const std::vector<double> xs = {-3, -0.5, 0, 0.25, 2};
  Tensor x = tensor(xs, {5}, TensorOptions().with_dtype(DType::f64));
  std::vector<double> exact = GELU("none").forward(x).to_vector<double>(), tanh_form = GELU().forward(x).to_vector<double>(),
                      swish = SiLU().forward(x).to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    EXPECT_NEAR(exact[i], 0.5 * v * std::erfc(-v / std::sqrt(2.0)), 1e-15) << v;
    EXPECT_NEAR(tanh_form[i], 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))), 1e-15) << v;
    EXPECT_NEAR(swish[i], v / (1 + std::exp(-v)), 1e-15) << v;
  }
  EXPECT_NE(exact[0], tanh_form[0]) << "the two forms differ at -3";
  expect_error([] { GELU("erf"); }, {"GELU: approximate must be \"none\" or \"tanh\", got \"erf\""});
  expect_error([&] { gelu(x, "exact"); }, {"gelu: approximate must be"});
}

TEST(NnModule, RegistrationMistakesAreErrors) {
  Toy t;
  expect_error([&] { t.register_parameter("a", zeros({1})); }, {"Toy", "register_parameter", "'a'", "already"});
  expect_error([&] { t.register_buffer("inner", zeros({1})); }, {"register_buffer", "'inner'", "already"});
  expect_error([&] { t.register_parameter("x.y", zeros({1})); }, {"'x.y'", "'.'"});
  expect_error([&] { t.register_parameter("", zeros({1})); }, {"empty"});
  expect_error([&] { t.register_parameter("idx", tensor_i64({1}, {1})); }, {"'idx'", "i64", "float"});
  expect_error([&] { t.register_module("m", ModulePtr()); }, {"register_module", "null"});
  expect_error([&] { t.forward(zeros({2})); }, {"Toy.forward", "(2,)"});
}

TEST(NnModule, TrainEvalIsRecursive) {
  Toy t;
  EXPECT_TRUE(t.is_training());
  t.eval();
  EXPECT_FALSE(t.is_training());
  for (auto& [n, m] : t.named_modules()) EXPECT_FALSE(m->is_training()) << n;
  t.train();
  for (auto& [n, m] : t.named_modules()) EXPECT_TRUE(m->is_training()) << n;
}

TEST(NnModule, ToDtypeAndBackKeepsLeavesValuesAndGrads) {
  Toy t;
  std::vector<std::vector<double>> before;
  for (auto& p : t.parameters()) before.push_back(p.to_vector<double>());
  Tensor x = randn({4, 2});
  sum(t.inner->forward(x)).backward();
  std::vector<double> g_before = t.inner->weight().grad().to_vector<double>();

  t.to(DType::f64);
  for (auto& [n, p] : t.named_state())  // floating buffers follow; BatchNorm's count stays i64, as in torch
    EXPECT_EQ(p.dtype(), n == "seq.1.num_batches_tracked" ? DType::i64 : DType::f64) << n;
  for (auto& p : t.parameters()) {
    EXPECT_TRUE(p.is_leaf());
    EXPECT_TRUE(p.requires_grad());
  }
  EXPECT_TRUE(t.inner->weight().is_same(t.named_parameters()[2].second));  // layer sees the moved tensor
  EXPECT_EQ(t.inner->weight().grad().dtype(), DType::f64);
  EXPECT_EQ(t.inner->weight().grad().to_vector<double>(), g_before);
  EXPECT_EQ(t.inner->forward(x.to(DType::f64)).dtype(), DType::f64);

  t.to(DType::f32);
  auto params = t.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].dtype(), DType::f32);
    EXPECT_EQ(params[i].to_vector<double>(), before[i]);  // f32 -> f64 -> f32 is exact
  }
  expect_error([&] { t.to(DType::i64); }, {"Toy.to", "i64"});
}

TEST(NnModule, ZeroGradFreesOrZeroes) {
  Linear l(3, 2);
  sum(l.forward(ones({1, 3}))).backward();
  ASSERT_TRUE(l.weight().grad().defined());
  l.zero_grad(false);
  EXPECT_EQ(l.weight().grad().to_vector<float>(), std::vector<float>(6, 0.0f));
  l.zero_grad();
  EXPECT_FALSE(l.weight().grad().defined());
  EXPECT_FALSE(l.bias().grad().defined());
}

// ---------------------------------------------------------------------------------------------
// init

TEST(NnInit, PyTorchDefaults) {
  Generator g(5);
  Linear l(64, 200, true, &g);
  double bound = 1.0 / 8.0;
  auto w = l.weight().to_vector<double>();
  double ss = 0;
  for (double v : w) {
    EXPECT_LE(std::fabs(v), bound);
    ss += v * v;
  }
  EXPECT_NEAR(ss / double(w.size()), bound * bound / 3, 0.1 * bound * bound / 3);  // U(-b, b) variance
  for (double v : l.bias().to_vector<double>()) EXPECT_LE(std::fabs(v), bound);
  Conv2d c(4, 8, 3, 1, 0, true, &g);  // fan_in 36
  for (double v : c.weight().to_vector<double>()) EXPECT_LE(std::fabs(v), 1.0 / 6.0);
  for (double v : c.bias().to_vector<double>()) EXPECT_LE(std::fabs(v), 1.0 / 6.0);
  Embedding e(100, 100, &g);
  auto ev = e.weight().to_vector<double>();
  double m = 0, s2 = 0;
  for (double v : ev) m += v / double(ev.size());
  for (double v : ev) s2 += (v - m) * (v - m) / double(ev.size());
  EXPECT_NEAR(m, 0, 0.05);
  EXPECT_NEAR(std::sqrt(s2), 1, 0.05);
  BatchNorm2d bn(3);
  EXPECT_EQ(bn.weight().to_vector<float>(), std::vector<float>(3, 1));
  EXPECT_EQ(bn.bias().to_vector<float>(), std::vector<float>(3, 0));
  EXPECT_EQ(bn.running_mean().to_vector<float>(), std::vector<float>(3, 0));
  EXPECT_EQ(bn.running_var().to_vector<float>(), std::vector<float>(3, 1));
  // Same seed, same model.
  Generator g1(11), g2(11);
  EXPECT_EQ(Linear(5, 5, true, &g1).weight().to_vector<float>(), Linear(5, 5, true, &g2).weight().to_vector<float>());
}

// ---------------------------------------------------------------------------------------------
// Layers: forward against references

TEST(NnLayers, LinearMatchesLoops) {
  Linear l(3, 4);
  Tensor x = randn({2, 5, 3});
  auto y = l.forward(x).to_vector<double>();
  auto xv = x.to_vector<double>(), w = l.weight().to_vector<double>(), b = l.bias().to_vector<double>();
  for (int r = 0; r < 10; ++r)
    for (int o = 0; o < 4; ++o) {
      double ref = b[o];
      for (int i = 0; i < 3; ++i) ref += xv[r * 3 + i] * w[o * 3 + i];
      EXPECT_NEAR(y[r * 4 + o], ref, 1e-5);
    }
  EXPECT_EQ(l.forward(x).shape(), (Shape{2, 5, 4}));
  EXPECT_FALSE(Linear(3, 4, false).bias().defined());
  EXPECT_EQ(Linear(3, 4, false).num_parameters(), 12);
  expect_error([&] { l.forward(randn({2, 4})); }, {"Linear", "(2, 4)", "in_features 3"});
}

TEST(NnLayers, ShapesOfPoolingFlattenSequential) {
  Tensor x = randn({2, 3, 8, 8});
  EXPECT_EQ(MaxPool2d(2).forward(x).shape(), (Shape{2, 3, 4, 4}));
  EXPECT_EQ(AvgPool2d(3, 1, 1).forward(x).shape(), (Shape{2, 3, 8, 8}));
  EXPECT_EQ(GlobalAvgPool2d().forward(x).shape(), (Shape{2, 3}));
  EXPECT_EQ(Flatten().forward(x).shape(), (Shape{2, 192}));
  EXPECT_EQ(Conv2d(3, 5, 3, 2, 1).forward(x).shape(), (Shape{2, 5, 4, 4}));
  Sequential s{std::make_shared<Conv2d>(3, 4, 3, 1, 1), std::make_shared<ReLU>(), std::make_shared<GlobalAvgPool2d>(),
               std::make_shared<Linear>(4, 2)};
  EXPECT_EQ(s.size(), 4u);
  EXPECT_EQ(s.forward(x).shape(), (Shape{2, 2}));
  EXPECT_EQ(names_of(s.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias", "3.weight", "3.bias"}));
  auto r = relu(x).to_vector<float>();
  EXPECT_EQ(ReLU().forward(x).to_vector<float>(), r);
  expect_error([&] { s[7]; }, {"Sequential", "index 7"});
}

TEST(NnLayers, GeluIsTheTanhApproximation) {
  Tensor x = tensor({-3, -1, 0, 0.5, 2}, {5}, {DType::f64});
  auto y = GELU().forward(x).to_vector<double>();
  auto xv = x.to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) {
    double v = xv[i];
    double ref = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y[i], ref, 1e-12);
  }
}

TEST(NnLayers, CrossEntropyLossMatchesLogSoftmax) {
  Tensor logits = tensor({1, 2, 3, 0, 0, 5}, {2, 3}, {DType::f64});
  Tensor target = tensor_i64({2, 0}, {2});
  double l0 = -(3 - std::log(std::exp(1) + std::exp(2) + std::exp(3)));
  double l1 = -(0 - std::log(2 + std::exp(5)));
  EXPECT_NEAR(CrossEntropyLoss()(logits, target).item(), (l0 + l1) / 2, 1e-12);
  EXPECT_NEAR(CrossEntropyLoss("sum")(logits, target).item(), l0 + l1, 1e-12);
}

TEST(NnLayers, BatchNormTrainUsesBatchStatsAndUpdatesRunningStats) {
  BatchNorm2d bn(2, 1e-5, 0.1);
  Tensor x = randn({4, 2, 3, 3}, {DType::f64});
  bn.to(DType::f64);
  auto xv = x.to_vector<double>();
  auto y = bn.forward(x).to_vector<double>();
  auto rm = bn.running_mean().to_vector<double>(), rv = bn.running_var().to_vector<double>();
  for (int c = 0; c < 2; ++c) {
    double m = 0, v = 0, n = 36;
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 9; ++k) m += xv[(i * 2 + c) * 9 + k] / n;
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 9; ++k) v += std::pow(xv[(i * 2 + c) * 9 + k] - m, 2) / n;
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 9; ++k) {
        int j = (i * 2 + c) * 9 + k;
        EXPECT_NEAR(y[j], (xv[j] - m) / std::sqrt(v + 1e-5), 1e-10);
      }
    EXPECT_NEAR(rm[c], 0.1 * m, 1e-12);
    EXPECT_NEAR(rv[c], 0.9 + 0.1 * v * n / (n - 1), 1e-12);  // unbiased variance in the running stat
  }
  // eval: running statistics, no update.
  bn.eval();
  auto ye = bn.forward(x).to_vector<double>();
  for (int j = 0; j < 72; ++j) {
    int c = (j / 9) % 2;
    EXPECT_NEAR(ye[j], (xv[j] - rm[c]) / std::sqrt(rv[c] + 1e-5), 1e-10);
  }
  EXPECT_EQ(bn.running_mean().to_vector<double>(), rm);
  expect_error([&] { bn.forward(randn({2, 3, 4, 4}, {DType::f64})); }, {"BatchNorm2d", "(2, 3, 4, 4)"});
}

TEST(NnLayers, DropoutOnlyWhileTraining) {
  Generator g(3);
  Dropout d(0.25, &g);
  Tensor x = ones({100000});
  auto y = d.forward(x).to_vector<float>();
  int64_t zeros_n = 0;
  for (float v : y) {
    if (v == 0) ++zeros_n;
    else EXPECT_FLOAT_EQ(v, 1.0f / 0.75f);
  }
  EXPECT_NEAR(double(zeros_n) / 1e5, 0.25, 0.01);
  d.eval();
  EXPECT_TRUE(d.forward(x).is_same(x));
  expect_error([] { Dropout(1.5); }, {"Dropout", "1.5"});
}

// ---------------------------------------------------------------------------------------------
// Attention

// Plain-loop reference of CausalSelfAttention (f64).
std::vector<double> attention_reference(const Tensor& x, const Module& m, int64_t heads) {
  auto P = m.named_parameters();
  auto wq = P[0].second.to_vector<double>(), bq = P[1].second.to_vector<double>();
  auto wp = P[2].second.to_vector<double>(), bp = P[3].second.to_vector<double>();
  int64_t B = x.size(0), T = x.size(1), d = x.size(2), hd = d / heads;
  auto xv = x.to_vector<double>();
  std::vector<double> qkv(B * T * 3 * d), cat(B * T * d), out(B * T * d);
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t o = 0; o < 3 * d; ++o) {
      double s = bq[o];
      for (int64_t i = 0; i < d; ++i) s += xv[r * d + i] * wq[o * d + i];
      qkv[r * 3 * d + o] = s;
    }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> p(t + 1);
        double mx = -1e300, z = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t e = 0; e < hd; ++e)
            dot += qkv[(b * T + t) * 3 * d + h * hd + e] * qkv[(b * T + s) * 3 * d + d + h * hd + e];
          p[s] = dot / std::sqrt(double(hd));
          mx = std::max(mx, p[s]);
        }
        for (auto& v : p) z += (v = std::exp(v - mx));
        for (int64_t e = 0; e < hd; ++e) {
          double acc = 0;
          for (int64_t s = 0; s <= t; ++s) acc += p[s] / z * qkv[(b * T + s) * 3 * d + 2 * d + h * hd + e];
          cat[(b * T + t) * d + h * hd + e] = acc;
        }
      }
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t o = 0; o < d; ++o) {
      double s = bp[o];
      for (int64_t i = 0; i < d; ++i) s += cat[r * d + i] * wp[o * d + i];
      out[r * d + o] = s;
    }
  return out;
}

TEST(NnAttention, MatchesPlainLoops) {
  CausalSelfAttention a(8, 2);
  a.to(DType::f64);
  Tensor x = randn({2, 5, 8}, {DType::f64});
  EXPECT_LT(testing_util::max_abs_diff(a.forward(x).to_vector<double>(), attention_reference(x, a, 2)), 1e-12);
  EXPECT_EQ(names_of(a.named_parameters()),
            (std::vector<std::string>{"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}));
  expect_error([] { CausalSelfAttention(10, 3); }, {"CausalSelfAttention", "heads 3", "dim 10"});
  expect_error([&] { a.forward(randn({2, 5, 6}, {DType::f64})); }, {"CausalSelfAttention", "(2, 5, 6)"});
}

TEST(NnAttention, IsCausal) {
  CausalSelfAttention a(8, 4);
  Tensor x = randn({1, 6, 8});
  auto y = a.forward(x).to_vector<float>();
  for (int64_t t = 0; t < 5; ++t) {
    Tensor x2 = clone(x);
    { NoGradGuard ng; copy_(x2.slice(1, t + 1, 6), randn({1, 5 - t, 8})); }
    auto y2 = a.forward(x2).to_vector<float>();
    for (int64_t i = 0; i < (t + 1) * 8; ++i) EXPECT_EQ(y[i], y2[i]) << "t " << t;
    bool later_changed = false;
    for (int64_t i = (t + 1) * 8; i < 48; ++i) later_changed = later_changed || y[i] != y2[i];
    EXPECT_TRUE(later_changed);
  }
}

// ---------------------------------------------------------------------------------------------
// gradcheck of every layer (f64, inputs and parameters)

TEST(NnGradcheck, Linear) {
  Linear l(3, 4);
  expect_module_gradcheck(l, randn({2, 3}));
}
TEST(NnGradcheck, Conv2d) {
  Conv2d c(2, 3, 3, 2, 1);
  expect_module_gradcheck(c, randn({2, 2, 5, 5}));
}
TEST(NnGradcheck, BatchNorm2dTrainAndEval) {
  BatchNorm2d bn(3);
  expect_module_gradcheck(bn, randn({2, 3, 2, 2}));
  {
    NoGradGuard ng;
    copy_(bn.running_mean(), tensor({0.1, -0.2, 0.3}, {3}, {DType::f64}));
  }
  bn.eval();
  expect_module_gradcheck(bn, randn({2, 3, 2, 2}));
}
TEST(NnGradcheck, GroupNorm) {
  GroupNorm gn(2, 4);
  { NoGradGuard ng; copy_(gn.weight(), randn({4})); copy_(gn.bias(), randn({4})); }
  expect_module_gradcheck(gn, randn({2, 4, 2, 2}));
}
TEST(NnGradcheck, LayerNorm) {
  LayerNorm ln(5);
  { NoGradGuard ng; copy_(ln.weight(), randn({5})); copy_(ln.bias(), randn({5})); }
  expect_module_gradcheck(ln, randn({2, 3, 5}));
}
TEST(NnGradcheck, Embedding) {
  Embedding e(6, 3);
  expect_module_gradcheck(e, tensor_i64({0, 5, 2, 2, 1, 0}, {2, 3}));
}
TEST(NnGradcheck, DropoutWithAFixedMask) {
  Generator g(1);
  Dropout d(0.4, &g);
  expect_module_gradcheck(d, randn({3, 4}), [&] { g.manual_seed(1); });
}
TEST(NnGradcheck, ActivationsPoolingFlatten) {
  // Random inputs are tie-free and away from ReLU's kink with probability ~1.
  ReLU r;
  expect_module_gradcheck(r, randn({2, 5}));
  GELU g;
  expect_module_gradcheck(g, randn({2, 5}));
  MaxPool2d mp(2);
  expect_module_gradcheck(mp, randn({1, 2, 4, 4}));
  AvgPool2d ap(3, 2, 1);
  expect_module_gradcheck(ap, randn({1, 2, 5, 5}));
  GlobalAvgPool2d gp;
  expect_module_gradcheck(gp, randn({2, 2, 3, 3}));
  Flatten f;
  expect_module_gradcheck(f, randn({2, 2, 3}));
}
TEST(NnGradcheck, SequentialAndCrossEntropy) {
  Sequential s{std::make_shared<Linear>(4, 6), std::make_shared<GELU>(), std::make_shared<Linear>(6, 3)};
  expect_module_gradcheck(s, randn({2, 4}));
  Tensor logits = randn({4, 5}, {DType::f64}).set_requires_grad();
  Tensor target = tensor_i64({1, 4, 0, 2}, {4});
  CrossEntropyLoss ce;
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return ce(in[0], target); }, {logits}).ok);
}
TEST(NnGradcheck, CausalSelfAttention) {
  CausalSelfAttention a(6, 2);
  expect_module_gradcheck(a, randn({2, 4, 6}));
}

// ---------------------------------------------------------------------------------------------
// state_dict files

TEST(NnStateDict, RoundTrip) {
  Generator g1(1), g2(2);
  Sequential a{std::make_shared<Conv2d>(2, 3, 3, 1, 1, true, &g1), std::make_shared<BatchNorm2d>(3),
               std::make_shared<GlobalAvgPool2d>(), std::make_shared<Linear>(3, 2, false, &g1)};
  Sequential b{std::make_shared<Conv2d>(2, 3, 3, 1, 1, true, &g2), std::make_shared<BatchNorm2d>(3),
               std::make_shared<GlobalAvgPool2d>(), std::make_shared<Linear>(3, 2, false, &g2)};
  a.forward(randn({4, 2, 5, 5}));  // moves the running statistics away from their init
  std::string path = tmp_path("roundtrip.sd");
  save_state_dict(a, path);
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());  // written through .tmp and renamed
  load_state_dict(b, path);
  auto sa = a.named_state(), sb = b.named_state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_EQ(sa[i].second.to_vector<float>(), sb[i].second.to_vector<float>());
  for (auto& p : b.parameters()) EXPECT_TRUE(p.requires_grad());
  Tensor x = randn({1, 2, 5, 5});
  a.eval(), b.eval();
  EXPECT_EQ(a.forward(x).to_vector<float>(), b.forward(x).to_vector<float>());
  // f64: save, load into an f64 model, cast back: values survive exactly.
  a.to(DType::f64), b.to(DType::f64);
  { NoGradGuard ng; fill_(a.parameters()[0], 0.1); }  // a value f32 cannot hold exactly
  save_state_dict(a, path);
  load_state_dict(b, path);
  EXPECT_EQ(b.parameters()[0].to_vector<double>(), std::vector<double>(54, 0.1));
  // Layout: magic, count, first entry's name.
  std::string bytes = read_bytes(path);
  EXPECT_EQ(bytes.substr(0, 8), "REELSD01");
  EXPECT_EQ(bytes[8], char(sa.size()));
  EXPECT_EQ(bytes.substr(20, 8), "0.weight");
  std::remove(path.c_str());
}

TEST(NnStateDict, BadFilesAreErrorsAndChangeNothing) {
  Linear src(3, 2);
  std::string path = tmp_path("errors.sd");
  save_state_dict(src, path);
  std::string good = read_bytes(path);

  Generator g(77);
  Linear dst(3, 2, true, &g);
  auto before = dst.weight().to_vector<float>();
  auto untouched = [&] { EXPECT_EQ(dst.weight().to_vector<float>(), before); };

  expect_error([&] { load_state_dict(dst, path + ".none"); }, {"load_state_dict", "cannot open", ".none"});
  write_bytes(path, "NOTREEL0" + good.substr(8));
  expect_error([&] { load_state_dict(dst, path); }, {"load_state_dict", path, "bad magic"});
  untouched();
  write_bytes(path, good.substr(0, good.size() / 2));
  expect_error([&] { load_state_dict(dst, path); }, {path, "truncated"});
  untouched();
  write_bytes(path, good.substr(0, good.size() - 1));
  expect_error([&] { load_state_dict(dst, path); }, {path, "truncated"});
  std::string flipped = good;
  flipped[good.size() - 12] ^= 0x40;  // a data byte of the last tensor
  write_bytes(path, flipped);
  expect_error([&] { load_state_dict(dst, path); }, {path, "checksum"});
  untouched();

  // Key and shape mismatches, against a whole and valid file.
  Linear wide(4, 2);
  save_state_dict(wide, path);
  expect_error([&] { load_state_dict(dst, path); }, {path, "'weight'", "(2, 4)", "(2, 3)"});
  untouched();
  Linear nobias(3, 2, false);
  save_state_dict(nobias, path);
  expect_error([&] { load_state_dict(dst, path); }, {path, "lacks", "bias"});
  untouched();
  save_state_dict(src, path);
  expect_error([&] { load_state_dict(nobias, path); }, {path, "module lacks", "bias"});
  Linear f64(3, 2);
  f64.to(DType::f64);
  save_state_dict(f64, path);
  expect_error([&] { load_state_dict(dst, path); }, {path, "'weight'", "f64", "f32"});
  untouched();
  expect_error([&] { save_state_dict(src, "/nonexistent-dir/x.sd"); }, {"save_state_dict", "/nonexistent-dir/x.sd"});
  std::remove(path.c_str());
}

// Nearest upsampling against its definition by loops, with a transposed (strided) input too; its
// gradient by finite differences; on the GPU the same values as on the CPU.
TEST(NnUpsample, NearestRepeatsEachPixelOverAnSBySBlock) {
  Generator g(12);
  const Tensor x = randn({2, 3, 4, 5}, {}, &g);
  for (const Tensor& in : {x, x.transpose(2, 3).contiguous().transpose(2, 3)}) {
    const Tensor y = Upsample(3).forward(in);
    ASSERT_EQ(y.shape(), (Shape{2, 3, 12, 15}));
    const std::vector<double> xv = in.contiguous().to_vector<double>(), yv = y.to_vector<double>();
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t i = 0; i < 12; ++i)
          for (int64_t j = 0; j < 15; ++j)
            ASSERT_EQ(yv[size_t(((n * 3 + c) * 12 + i) * 15 + j)], xv[size_t(((n * 3 + c) * 4 + i / 3) * 5 + j / 3)])
                << n << c << i << j;
  }
  Upsample up(2);
  expect_module_gradcheck(up, randn({1, 2, 3, 2}, {}, &g));
  for (Device d : testing_util::test_devices())
    EXPECT_EQ(upsample_nearest2d(x.to(d), 2).to_vector<double>(), upsample_nearest2d(x, 2).to_vector<double>()) << d.str();
  testing_util::expect_error([] { Upsample(0); }, {"Upsample", "scale_factor", "got 0"});
  testing_util::expect_error([] { Upsample(2, "bilinear"); }, {"Upsample", "nearest", "bilinear"});
  testing_util::expect_error([&] { upsample_nearest2d(zeros({3, 4}), 2); }, {"upsample_nearest2d", "(3, 4)"});
}

// randint: every value in [low, high), every value of a small range drawn with about its share, and
// the same numbers on every device (a uniform draw underneath, so compiled plans replay it fresh).
TEST(NnRandint, IntegersInTheRangeWithTheirShareOnEveryDevice) {
  manual_seed(4);
  const Tensor r = randint(-3, 4, {7000});
  EXPECT_EQ(r.dtype(), DType::i64);
  std::vector<int> counts(7, 0);
  for (int64_t v : r.to_vector<int64_t>()) {
    ASSERT_TRUE(v >= -3 && v < 4) << v;
    counts[size_t(v + 3)] += 1;
  }
  for (int k = 0; k < 7; ++k) EXPECT_NEAR(counts[size_t(k)], 1000, 120) << "value " << k - 3;  // ~3.8 sigma
  for (Device d : testing_util::test_devices()) {
    Generator a(9), b(9);
    EXPECT_EQ(randint(0, 10, {64}, {DType::i64, d}, &a).to_vector<int64_t>(),
              randint(0, 10, {64}, {DType::i64}, &b).to_vector<int64_t>()) << d.str();
  }
  EXPECT_EQ(randint(5, 6, {3}).to_vector<int64_t>(), (std::vector<int64_t>{5, 5, 5}));
  testing_util::expect_error([] { randint(3, 3, {2}); }, {"randint", "[3, 3)", "empty"});
  testing_util::expect_error([] { randint(0, (int64_t(1) << 24) + 1, {2}); }, {"randint", "2^24"});
}
