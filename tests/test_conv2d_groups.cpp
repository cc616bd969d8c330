// Grouped and depthwise conv2d (PyTorch's `groups`): the forward and both gradients against plain
// nested loops in long double, for 1 and 2 groups, depthwise with channel multiplier 1 and 2, with
// stride, padding and non-square kernels; grouped convolution equal to the bit to its groups run
// one by one as plain convolutions (the CPU runs each group as its own im2col + GEMM); 16-bit and
// non-contiguous operands; nn::Conv2d's groups option (weight shape, PyTorch's init, gradcheck); a
// compiled training step of a depthwise-separable CNN equal to the bit to eager; and the errors for
// groups that do not fit the channels. Gradchecks of the op: autograd/cases/linalg_cases.cpp; the
// CPU-vs-CUDA comparison: tests/op_harness/cases_linalg.cpp.
//
// Reference: y[n, o, oh, ow] = b[o] + sum_{c < C/G, i, j} w[o, c, i, j] x[n, q*C/G + c, oh*s - p + i, ow*s - p + j]
// with q = o / (O/G), o's group; dx and dw are the adjoints of the same loop.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <vector>

#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "reel.h"
#include "tests/compile_test_util.h"
#include "tests/test_util.h"

using namespace reel;
using testing_util::expect_error;

namespace {

using testing_util::random;

struct GroupCfg {
  int64_t N, C, H, W, O, kH, kW, stride, pad, groups;
  bool bias;
  Shape x() const { return {N, C, H, W}; }
  Shape w() const { return {O, C / groups, kH, kW}; }
  Shape y() const { return {N, O, (H + 2 * pad - kH) / stride + 1, (W + 2 * pad - kW) / stride + 1}; }
};

void PrintTo(const GroupCfg& c, std::ostream* os) {
  *os << "x (" << c.N << ", " << c.C << ", " << c.H << ", " << c.W << "), O " << c.O << ", kernel " << c.kH << "x"
      << c.kW << ", stride " << c.stride << ", padding " << c.pad << ", groups " << c.groups
      << (c.bias ? ", bias" : "");
}

// y, dx, dw (and db) of one convolution, in long double, by nested loops over every tap; and for each
// value the sum of the absolute values of its terms, which bounds the rounding error of any order of
// summation in a lower precision (an f32 sum of n terms is within about n eps of it, and in practice
// sqrt(n) eps): im2col and oneDNN sum in different orders, both within that bound.
struct Reference {
  std::vector<long double> y, dx, dw, db;
  std::vector<long double> y_abs, dx_abs, dw_abs, db_abs;
};

Reference reference(const GroupCfg& c, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& g) {
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(), gv = g.to_vector<double>();
  const std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>(size_t(c.O), 0.0);
  const Shape ys = c.y();
  const int64_t Ho = ys[2], Wo = ys[3], Cg = c.C / c.groups, Og = c.O / c.groups;
  Reference r{std::vector<long double>(size_t(numel_of(ys))), std::vector<long double>(xv.size()),
              std::vector<long double>(wv.size()), std::vector<long double>(size_t(c.O)),
              std::vector<long double>(size_t(numel_of(ys))), std::vector<long double>(xv.size()),
              std::vector<long double>(wv.size()), std::vector<long double>(size_t(c.O))};
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < c.O; ++o)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          const size_t yi = size_t(((n * c.O + o) * Ho + oh) * Wo + ow);
          const long double gg = gv[yi];
          long double acc = bv[size_t(o)], acc_abs = std::fabs(static_cast<long double>(bv[size_t(o)]));
          r.db[size_t(o)] += gg;
          r.db_abs[size_t(o)] += std::fabs(gg);
          for (int64_t cl = 0; cl < Cg; ++cl)
            for (int64_t i = 0; i < c.kH; ++i)
              for (int64_t j = 0; j < c.kW; ++j) {
                const int64_t ch = o / Og * Cg + cl, ih = oh * c.stride - c.pad + i, iw = ow * c.stride - c.pad + j;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                const size_t xi = size_t(((n * c.C + ch) * c.H + ih) * c.W + iw);
                const size_t wi = size_t(((o * Cg + cl) * c.kH + i) * c.kW + j);
                acc += static_cast<long double>(xv[xi]) * wv[wi];
                acc_abs += std::fabs(static_cast<long double>(xv[xi]) * wv[wi]);
                r.dx[xi] += gg * wv[wi];
                r.dx_abs[xi] += std::fabs(gg * wv[wi]);
                r.dw[wi] += gg * xv[xi];
                r.dw_abs[wi] += std::fabs(gg * xv[xi]);
              }
          r.y[yi] = acc;
          r.y_abs[yi] = acc_abs;
        }
  return r;
}

// Within tol of (1 + the sum of |terms|) (see Reference).
void expect_close(const Tensor& got, const std::vector<long double>& want, const std::vector<long double>& abs_sum,
                  double tol, const char* what) {
  std::vector<double> g = got.to_vector<double>();
  ASSERT_EQ(g.size(), want.size()) << what;
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], double(want[i]), tol * (1.0 + double(abs_sum[i]))) << what << ", element " << i;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>()) << what;
}

Attrs attrs_of(const GroupCfg& c) {
  return Attrs()
      .set("stride", std::vector<int64_t>{c.stride, c.stride})
      .set("padding", std::vector<int64_t>{c.pad, c.pad})
      .set("groups", c.groups);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// the op against the loops, through autograd and through the backward ops themselves

class Conv2dGroups : public testing::TestWithParam<std::tuple<DType, GroupCfg>> {};

TEST_P(Conv2dGroups, ForwardAndGradientsMatchTheLoops) {
  auto [t, c] = GetParam();
  const double tol = t == DType::f64 ? 1e-12 : 1e-5;
  Tensor x = random(c.x(), 1, t).set_requires_grad(), w = random(c.w(), 2, t).set_requires_grad();
  Tensor b = c.bias ? random({c.O}, 3, t).set_requires_grad() : Tensor();
  Tensor y = conv2d(x, w, b, c.stride, c.pad, c.groups);
  ASSERT_EQ(y.shape(), c.y());
  Tensor g = random(c.y(), 4, t);
  const Reference r = reference(c, x, w, b, g);
  expect_close(y, r.y, r.y_abs, tol, "y");
  sum(y * g).backward();
  expect_close(x.grad(), r.dx, r.dx_abs, tol, "dx");
  expect_close(w.grad(), r.dw, r.dw_abs, tol, "dw");
  if (c.bias) expect_close(b.grad(), r.db, r.db_abs, tol, "db");
  // The backward ops called directly, with the attrs autograd gives them.
  expect_close(dispatch1(OpKind::Conv2dBackwardInput, {g, w.detach()}, attrs_of(c).set("input_shape", c.x())), r.dx,
               r.dx_abs, tol, "conv2d_backward_input");
  expect_close(dispatch1(OpKind::Conv2dBackwardWeight, {g, x.detach()}, attrs_of(c).set("weight_shape", c.w())), r.dw,
               r.dw_abs, tol, "conv2d_backward_weight");
}

INSTANTIATE_TEST_SUITE_P(
    Linalg, Conv2dGroups,
    testing::Combine(testing::Values(DType::f64, DType::f32),
                     testing::Values(GroupCfg{2, 3, 5, 5, 4, 3, 3, 1, 1, 1, true},    // one group: the plain path
                                     GroupCfg{2, 4, 5, 6, 6, 3, 3, 1, 1, 2, true},    // 2 groups of 2 -> 3
                                     GroupCfg{1, 4, 7, 6, 2, 3, 2, 2, 0, 2, false},   // 2 groups, stride 2, 3x2
                                     GroupCfg{2, 6, 6, 5, 6, 1, 1, 1, 0, 3, true},    // 3 groups, 1x1
                                     GroupCfg{2, 3, 5, 5, 3, 3, 3, 1, 1, 3, true},    // depthwise
                                     GroupCfg{2, 4, 7, 7, 4, 3, 3, 2, 1, 4, false},   // depthwise, stride 2
                                     GroupCfg{1, 3, 6, 5, 6, 3, 3, 2, 0, 3, true},    // depthwise x2
                                     GroupCfg{2, 2, 4, 4, 4, 2, 2, 1, 1, 2, false},   // depthwise x2, padding
                                     GroupCfg{1, 5, 3, 3, 5, 3, 3, 1, 2, 5, true},    // depthwise, padding 2
                                     GroupCfg{4, 16, 16, 16, 32, 3, 3, 1, 1, 4, true},  // threaded over items
                                     GroupCfg{3, 32, 10, 10, 32, 5, 5, 1, 2, 32, false} // depthwise 5x5, threaded
                                     )));

// Each group is its own convolution: the grouped op equals, to the bit, conv2d of each group's
// channels by its rows of the weight, and so do both gradients.
TEST(Conv2dGroupsBits, EachGroupIsAPlainConvolution) {
  for (const GroupCfg& c :
       {GroupCfg{2, 6, 6, 5, 4, 3, 3, 1, 1, 2, true}, GroupCfg{3, 4, 5, 5, 8, 3, 3, 2, 1, 4, true}}) {
    Tensor x = random(c.x(), 5, DType::f32).set_requires_grad(), w = random(c.w(), 6, DType::f32).set_requires_grad();
    Tensor b = random({c.O}, 7, DType::f32), g = random(c.y(), 8, DType::f32);
    Tensor y = conv2d(x, w, b, c.stride, c.pad, c.groups);
    sum(y * g).backward();
    const int64_t Cg = c.C / c.groups, Og = c.O / c.groups;
    for (int64_t q = 0; q < c.groups; ++q) {
      Tensor xq = x.detach().slice(1, q * Cg, (q + 1) * Cg).contiguous().set_requires_grad();
      Tensor wq = w.detach().slice(0, q * Og, (q + 1) * Og).contiguous().set_requires_grad();
      Tensor yq = conv2d(xq, wq, b.slice(0, q * Og, (q + 1) * Og), c.stride, c.pad);
      sum(yq * g.slice(1, q * Og, (q + 1) * Og)).backward();
      expect_same_bits(y.detach().slice(1, q * Og, (q + 1) * Og), yq, "y");
      expect_same_bits(x.grad().slice(1, q * Cg, (q + 1) * Cg), xq.grad(), "dx");
      expect_same_bits(w.grad().slice(0, q * Og, (q + 1) * Og), wq.grad(), "dw");
    }
  }
}

TEST(Conv2dGroupsLayouts, NonContiguousOperands) {
  // x stored NHWC and viewed NCHW; w (O, 1, 3, 3) from a (3, 3, 1, O) buffer; g transposed.
  const GroupCfg c{2, 4, 5, 6, 8, 3, 3, 1, 1, 4, false};
  Tensor x = random({2, 5, 6, 4}, 9).permute({0, 3, 1, 2});
  Tensor w = random({3, 3, 1, 8}, 10).permute({3, 2, 0, 1});
  Tensor g = random({2, 8, 6, 5}, 11).transpose(2, 3);
  ASSERT_FALSE(x.is_contiguous());
  ASSERT_FALSE(w.is_contiguous());
  const Reference r = reference(c, x, w, Tensor(), g);
  expect_close(conv2d(x, w, Tensor(), 1, 1, 4), r.y, r.y_abs, 1e-12, "y");
  expect_close(dispatch1(OpKind::Conv2dBackwardInput, {g, w}, attrs_of(c).set("input_shape", c.x())), r.dx, r.dx_abs,
               1e-12, "dx");
  expect_close(dispatch1(OpKind::Conv2dBackwardWeight, {g, x}, attrs_of(c).set("weight_shape", c.w())), r.dw, r.dw_abs,
               1e-12, "dw");
}

TEST(Conv2dGroupsLowPrecision, HalfAndBFloat16MatchTheLoops) {
  const GroupCfg c{2, 6, 6, 5, 6, 3, 3, 1, 1, 3, true};
  for (DType lp : {DType::f16, DType::bf16}) {
    const double tol = lp == DType::f16 ? 1e-2 : 6e-2;
    Tensor x = random(c.x(), 12, DType::f32).to(lp), w = random(c.w(), 13, DType::f32).to(lp);
    Tensor b = random({c.O}, 14, DType::f32).to(lp), g = random(c.y(), 15, DType::f32).to(lp);
    const Reference r = reference(c, x, w, b, g);  // of the rounded values
    Tensor y = conv2d(x, w, b, 1, 1, 3);
    EXPECT_EQ(y.dtype(), lp);
    expect_close(y, r.y, r.y_abs, tol, "y");
    expect_close(dispatch1(OpKind::Conv2dBackwardInput, {g, w}, attrs_of(c).set("input_shape", c.x())), r.dx,
                 r.dx_abs, 3 * tol, "dx");
    expect_close(dispatch1(OpKind::Conv2dBackwardWeight, {g, x}, attrs_of(c).set("weight_shape", c.w())), r.dw,
                 r.dw_abs, 3 * tol, "dw");
  }
}

// The attr is written only when it says something: a plain convolution's node is what it was.
TEST(Conv2dGroupsAttrs, GroupsOneIsNotStored) {
  Tensor x = random({1, 2, 4, 4}, 16), w = random({2, 2, 3, 3}, 17);
  Tensor a = conv2d(x, w, Tensor(), 1, 1, 1);
  Tensor b = dispatch1(OpKind::Conv2d, {x, w, Tensor()},
                       Attrs().set("stride", std::vector<int64_t>{1, 1}).set("padding", std::vector<int64_t>{1, 1}));
  expect_same_bits(a, b, "groups 1 vs no attr");
}

// ---------------------------------------------------------------------------------------------
// nn::Conv2d with groups

TEST(Conv2dGroupsModule, WeightShapeInitAndForward) {
  Generator gen(3);
  nn::Conv2d dw(nn::Conv2dOptions(8, 16, 3).padding(1).groups(8), &gen);  // depthwise, multiplier 2
  EXPECT_EQ(dw.groups(), 8);
  EXPECT_EQ(dw.weight().shape(), (Shape{16, 1, 3, 3}));
  EXPECT_EQ(dw.bias().shape(), (Shape{16}));
  // PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = C/groups * k * k = 9.
  for (double v : dw.weight().to_vector<double>()) EXPECT_LE(std::fabs(v), 1.0 / 3.0);
  for (double v : dw.bias().to_vector<double>()) EXPECT_LE(std::fabs(v), 1.0 / 3.0);
  double max_abs = 0;
  for (double v : dw.weight().to_vector<double>()) max_abs = std::max(max_abs, std::fabs(v));
  EXPECT_GT(max_abs, 0.25) << "drawn with fan_in 9, not 72";
  Tensor x = random({2, 8, 5, 5}, 18, DType::f32);
  expect_same_bits(dw.forward(x), conv2d(x, dw.weight(), dw.bias(), 1, 1, 8), "forward");
  EXPECT_EQ(dw.forward(x).shape(), (Shape{2, 16, 5, 5}));

  nn::Conv2d g2(nn::Conv2dOptions(4, 6, 3).stride(2).groups(2).bias(false));
  EXPECT_EQ(g2.weight().shape(), (Shape{6, 2, 3, 3}));
  EXPECT_FALSE(g2.bias().defined());
  EXPECT_EQ(g2.forward(random({1, 4, 7, 7}, 19, DType::f32)).shape(), (Shape{1, 6, 3, 3}));
  // The positional constructor is Conv2dOptions with groups 1: the same draws.
  Generator a(5), b(5);
  expect_same_bits(nn::Conv2d(3, 4, 3, 1, 1, true, &a).weight(),
                   nn::Conv2d(nn::Conv2dOptions(3, 4, 3).padding(1), &b).weight(), "positional vs options");
}

TEST(Conv2dGroupsModule, Gradcheck) {
  nn::Conv2d m(nn::Conv2dOptions(4, 4, 3).stride(2).padding(1).groups(2));
  m.to(DType::f64);
  Tensor x = random({2, 4, 5, 5}, 20).set_requires_grad();
  Tensor wsum = random({2, 4, 3, 3}, 21);
  std::vector<Tensor> inputs{x};
  for (auto& p : m.parameters()) inputs.push_back(p);
  GradcheckResult r = gradcheck([&](const std::vector<Tensor>& in) { return sum(m.forward(in[0]) * wsum); }, inputs);
  EXPECT_TRUE(r.ok) << r.str();
}

// A depthwise-separable block through the compiled training step (fusion off, so the plan runs
// eager's kernels): the groups attr travels through the tracer and the replay, to the bit.
TEST(Conv2dGroupsCompile, DepthwiseSeparableStepMatchesEagerToTheBit) {
  auto make = [] {
    Generator gen(4);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(3, 6, 3).padding(1).groups(3), &gen));
    m->push_back(std::make_shared<nn::ReLU>());
    m->push_back(std::make_shared<nn::Conv2d>(6, 8, 1, 1, 0, false, &gen));
    m->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(8, 8, 3).stride(2).padding(1).groups(2), &gen));
    m->push_back(std::make_shared<nn::GlobalAvgPool2d>());
    m->push_back(std::make_shared<nn::Linear>(8, 5, true, &gen));
    return std::static_pointer_cast<nn::Module>(m);
  };
  Generator gen(12);
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < 2; ++i) micro.push_back({randn({2, 3, 6, 6}, {}, &gen), tensor_i64({i % 5, (i + 2) % 5}, {2})});
  auto run = [&](bool compiled) {
    auto model = make();
    optim::AdamW opt(model->parameters(), optim::AdamWOptions(3e-3));
    opt.set_accum_steps(int64_t(micro.size()));
    nn::Module* m = model.get();
    auto loss_fn = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
    auto step = compile::compile_train_step(opt, loss_fn, {compile::Mode::Default, 8, false});
    std::vector<double> losses = testing_util::step_losses(opt, loss_fn, micro, 5, compiled ? &step : nullptr);
    if (compiled) {
      EXPECT_EQ(step.replays(), 3);
    }
    std::vector<double> params;
    for (const Tensor& p : model->parameters())
      for (double v : p.to_vector<double>()) params.push_back(v);
    return std::make_pair(losses, params);
  };
  auto eager = run(false), compiled = run(true);
  EXPECT_EQ(eager.first, compiled.first);
  EXPECT_EQ(eager.second, compiled.second);
}

// ---------------------------------------------------------------------------------------------
// bad input: groups that do not fit the channels, named with the shapes and the groups

TEST(BadInput, Conv2dGroupsThatDoNotFitTheChannelsAreRefused) {
  TensorOptions f32{DType::f32};
  Tensor x = zeros({2, 6, 5, 5}, f32);
  expect_error([&] { conv2d(x, zeros({4, 1, 3, 3}, f32), Tensor(), 1, 0, 4); },
               {"conv2d", "(2, 6, 5, 5)", "(4, 1, 3, 3)", "groups 4", "6 channels"});
  expect_error([&] { conv2d(x, zeros({4, 3, 3, 3}, f32), Tensor(), 1, 0, 3); },
               {"conv2d", "(2, 6, 5, 5)", "(4, 3, 3, 3)", "groups 3", "4 output channels"});
  expect_error([&] { conv2d(x, zeros({6, 2, 3, 3}, f32), Tensor(), 1, 0, 2); },
               {"conv2d", "(2, 6, 5, 5)", "(6, 2, 3, 3)", "groups 2", "6 / 2 = 3"});
  expect_error([&] { conv2d(x, zeros({6, 6, 3, 3}, f32), Tensor(), 1, 0, 0); },
               {"conv2d", "groups", ">= 1", "(2, 6, 5, 5)", "(6, 6, 3, 3)"});
  expect_error([&] { conv2d(x, zeros({6, 1, 3, 3}, f32), zeros({3}, f32), 1, 0, 6); }, {"conv2d", "bias", "(3,)"});
  // The backward ops check the same, with their own names.
  const GroupCfg c{2, 6, 5, 5, 4, 3, 3, 1, 0, 4, false};
  const Attrs a = attrs_of(c);
  expect_error([&] { dispatch1(OpKind::Conv2dBackwardInput, {zeros({2, 4, 3, 3}, f32), zeros({4, 1, 3, 3}, f32)},
                               Attrs(a).set("input_shape", Shape{2, 6, 5, 5})); },
               {"conv2d_backward_input", "(2, 6, 5, 5)", "(4, 1, 3, 3)", "groups 4"});
  expect_error([&] { dispatch1(OpKind::Conv2dBackwardWeight, {zeros({2, 4, 3, 3}, f32), x},
                               Attrs(a).set("weight_shape", Shape{4, 1, 3, 3})); },
               {"conv2d_backward_weight", "(2, 6, 5, 5)", "(4, 1, 3, 3)", "groups 4"});
  // The layer refuses at construction.
  expect_error([] { nn::Conv2d(nn::Conv2dOptions(6, 4, 3).groups(4)); },
               {"Conv2d", "in_channels 6", "out_channels 4", "groups 4"});
  expect_error([] { nn::Conv2d(nn::Conv2dOptions(6, 4, 3).groups(0)); }, {"Conv2d", "groups", "positive"});
  // A layer whose input has other channels than it was built for: the op names both shapes.
  nn::Conv2d depthwise(nn::Conv2dOptions(4, 4, 3).groups(4));
  expect_error([&] { depthwise.forward(zeros({1, 6, 5, 5})); }, {"conv2d", "(1, 6, 5, 5)", "(4, 1, 3, 3)", "groups 4"});
}
