// matmul and conv2d (and conv2d's two backward ops): forward against plain reference loops written
// here, in f64 and f32, with transposed, sliced and permuted (non-contiguous) operands, broadcast
// batch dims, NumPy 1-D operands, the threaded paths, f16/bf16 against f32, and every error message.
// Gradients are checked by the gradcheck cases in autograd/cases/linalg_cases.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "reel.h"
#include "tests/test_util.h"

using namespace reel;
using testing_util::expect_error;

namespace {

using testing_util::random;

struct Ref {
  Shape shape;
  std::vector<double> v;
};

// a (..., M, K) @ b (..., K, N) with broadcast batch dims, by triple loop over the logical values.
Ref ref_matmul(const Tensor& a, const Tensor& b) {
  std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  int64_t M = sa[sa.size() - 2], K = sa.back(), N = sb.back();
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  size_t nb = std::max(ba.size(), bb.size());
  Shape batch(nb);
  for (size_t d = 0; d < nb; ++d) {
    int64_t x = d < nb - ba.size() ? 1 : ba[d - (nb - ba.size())];
    int64_t y = d < nb - bb.size() ? 1 : bb[d - (nb - bb.size())];
    batch[d] = std::max(x, y);
  }
  Ref r{batch, {}};
  r.shape.push_back(M);
  r.shape.push_back(N);
  int64_t nbatch = numel_of(batch);
  r.v.assign(size_t(nbatch * M * N), 0.0);
  for (int64_t i = 0; i < nbatch; ++i) {
    std::vector<int64_t> idx = testing_util::unravel(i, batch);
    const double* pa = av.data() + testing_util::broadcast_flat(idx, ba) * M * K;
    const double* pb = bv.data() + testing_util::broadcast_flat(idx, bb) * K * N;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += pa[m * K + k] * pb[k * N + n];
        r.v[size_t((i * M + m) * N + n)] = s;
      }
  }
  return r;
}

void expect_close(const Tensor& got, const Ref& want, double tol) {
  ASSERT_EQ(got.shape(), want.shape);
  std::vector<double> g = got.to_vector<double>();
  ASSERT_EQ(g.size(), want.v.size());
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], want.v[i], tol * (1.0 + std::fabs(want.v[i]))) << "element " << i;
}

double tol_for(DType t) { return t == DType::f64 ? 1e-12 : 1e-5; }

// ---- conv2d references ----

struct ConvCfg {
  int64_t N, C, H, W, O, k, stride, pad;
  bool bias;
};

// GoogleTest names a failing configuration by this.
void PrintTo(const ConvCfg& c, std::ostream* os) {
  *os << "x (" << c.N << ", " << c.C << ", " << c.H << ", " << c.W << "), w (" << c.O << ", " << c.C << ", " << c.k
      << ", " << c.k << "), stride " << c.stride << ", padding " << c.pad << (c.bias ? ", bias" : ", no bias");
}

int64_t out_size(int64_t n, int64_t k, int64_t s, int64_t p) { return (n + 2 * p - k) / s + 1; }

// y[n,o,oh,ow] = bias[o] + sum_{c,i,j} x[n,c,oh*s-p+i,ow*s-p+j] w[o,c,i,j]
Ref ref_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t s, int64_t p) {
  std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> bv = bias.defined() ? bias.to_vector<double>() : std::vector<double>();
  int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), O = w.size(0), kH = w.size(2), kW = w.size(3);
  int64_t Ho = out_size(H, kH, s, p), Wo = out_size(W, kW, s, p);
  Ref r{{N, O, Ho, Wo}, std::vector<double>(size_t(N * O * Ho * Wo), 0.0)};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          double acc = bv.empty() ? 0.0 : bv[size_t(o)];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t i = 0; i < kH; ++i)
              for (int64_t j = 0; j < kW; ++j) {
                int64_t ih = oh * s - p + i, iw = ow * s - p + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += xv[size_t(((n * C + c) * H + ih) * W + iw)] * wv[size_t(((o * C + c) * kH + i) * kW + j)];
              }
          r.v[size_t(((n * O + o) * Ho + oh) * Wo + ow)] = acc;
        }
  return r;
}

// The adjoints of the same loop: dx[n,c,ih,iw] += g w and dw[o,c,i,j] += g x.
void ref_conv2d_backward(const Tensor& g, const Tensor& x, const Tensor& w, int64_t s, int64_t p, Ref& dx, Ref& dw) {
  std::vector<double> gv = g.to_vector<double>(), xv = x.to_vector<double>(), wv = w.to_vector<double>();
  int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), O = w.size(0), kH = w.size(2), kW = w.size(3);
  int64_t Ho = g.size(2), Wo = g.size(3);
  dx = {x.shape(), std::vector<double>(xv.size(), 0.0)};
  dw = {w.shape(), std::vector<double>(wv.size(), 0.0)};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          double gg = gv[size_t(((n * O + o) * Ho + oh) * Wo + ow)];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t i = 0; i < kH; ++i)
              for (int64_t j = 0; j < kW; ++j) {
                int64_t ih = oh * s - p + i, iw = ow * s - p + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                size_t xi = size_t(((n * C + c) * H + ih) * W + iw), wi = size_t(((o * C + c) * kH + i) * kW + j);
                dx.v[xi] += gg * wv[wi];
                dw.v[wi] += gg * xv[xi];
              }
        }
}

Attrs conv_attrs(int64_t s, int64_t p) {
  return Attrs().set("stride", std::vector<int64_t>{s, s}).set("padding", std::vector<int64_t>{p, p});
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// matmul

class LinalgMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(LinalgMatmul, Plain2D) {
  DType t = GetParam();
  Tensor a = random({5, 7}, 1, t), b = random({7, 3}, 2, t);
  expect_close(matmul(a, b), ref_matmul(a, b), tol_for(t));
}

TEST_P(LinalgMatmul, TransposedOperandsAllLayouts) {
  DType t = GetParam();
  Tensor a = random({5, 7}, 3, t), at = random({7, 5}, 4, t).t();
  Tensor b = random({7, 3}, 5, t), bt = random({3, 7}, 6, t).t();
  ASSERT_FALSE(at.is_contiguous());
  for (const Tensor& x : {a, at})
    for (const Tensor& y : {b, bt}) expect_close(matmul(x, y), ref_matmul(x, y), tol_for(t));
}

TEST_P(LinalgMatmul, SlicedOperands) {
  DType t = GetParam();
  Tensor a = random({10, 7}, 7, t).slice(0, 0, 10, 2);        // row stride 14: mapped in place
  Tensor b = random({7, 6}, 8, t).slice(1, 0, 6, 2);          // column stride 2: copied
  Tensor c = random({5, 12}, 9, t).slice(1, 2, 9).t();        // (7, 5) transposed slice: column-major
  Tensor d = random({5, 4}, 10, t).slice(0, 1, 3).t();        // a (4, 2) column-major view of a slice
  expect_close(matmul(a, b), ref_matmul(a, b), tol_for(t));
  expect_close(matmul(c, a), ref_matmul(c, a), tol_for(t));
  Tensor e = random({2, 4}, 11, t);
  expect_close(matmul(e, d), ref_matmul(e, d), tol_for(t));
}

TEST_P(LinalgMatmul, BroadcastBatchDims) {
  DType t = GetParam();
  Tensor a = random({2, 1, 3, 4}, 12, t), b = random({5, 4, 2}, 13, t);
  Tensor y = matmul(a, b);
  EXPECT_EQ(y.shape(), (Shape{2, 5, 3, 2}));
  expect_close(y, ref_matmul(a, b), tol_for(t));
  // The same with a transposed (column-major) b and a batch-sliced a.
  Tensor bt = random({5, 2, 4}, 14, t).transpose(-1, -2);
  Tensor as = random({4, 1, 3, 4}, 15, t).slice(0, 0, 4, 2);
  expect_close(matmul(as, bt), ref_matmul(as, bt), tol_for(t));
  // Broadcast on the other side: (3, 4) @ (2, 4, 5).
  Tensor c = random({3, 4}, 16, t), d = random({2, 4, 5}, 17, t);
  expect_close(matmul(c, d), ref_matmul(c, d), tol_for(t));
}

TEST_P(LinalgMatmul, SharedRightOperandFoldsBatch) {
  DType t = GetParam();
  // (3, 4, 5) @ (5, 2): folded into one (12, 5) GEMM; also with b of batch shape (1, 1).
  Tensor a = random({3, 4, 5}, 18, t), b = random({5, 2}, 19, t), b11 = random({1, 1, 5, 2}, 20, t);
  expect_close(matmul(a, b), ref_matmul(a, b), tol_for(t));
  Tensor y = matmul(a, b11);
  EXPECT_EQ(y.shape(), (Shape{1, 3, 4, 2}));
  expect_close(y, ref_matmul(a, b11), tol_for(t));
  // A batch-sliced a cannot fold (its rows are not evenly spaced) and takes the batched path.
  Tensor as = random({6, 4, 5}, 21, t).slice(0, 0, 6, 2);
  expect_close(matmul(as, b), ref_matmul(as, b), tol_for(t));
}

TEST_P(LinalgMatmul, OneDimensionalOperands) {
  DType t = GetParam();
  Tensor v = random({4}, 22, t), m = random({4, 3}, 23, t), mt = random({3, 4}, 24, t), w = random({4}, 25, t);
  std::vector<double> vv = v.to_vector<double>(), mv = m.to_vector<double>(), mtv = mt.to_vector<double>(),
                      wv = w.to_vector<double>();
  Ref vm{{3}, std::vector<double>(3, 0.0)}, mv_{{3}, std::vector<double>(3, 0.0)}, dot{{}, {0.0}};
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t k = 0; k < 4; ++k) {
      vm.v[n] += vv[k] * mv[k * 3 + n];
      mv_.v[n] += mtv[n * 4 + k] * vv[k];
    }
  for (int64_t k = 0; k < 4; ++k) dot.v[0] += vv[k] * wv[k];
  expect_close(matmul(v, m), vm, tol_for(t));    // (4) @ (4, 3) -> (3)
  expect_close(matmul(mt, v), mv_, tol_for(t));  // (3, 4) @ (4) -> (3)
  expect_close(matmul(v, w), dot, tol_for(t));   // (4) @ (4) -> ()
  // Batched: (4) @ (2, 4, 3) -> (2, 3) and (2, 3, 4) @ (4) -> (2, 3).
  Tensor bm = random({2, 4, 3}, 26, t), bmt = random({2, 3, 4}, 27, t);
  Ref r1 = ref_matmul(v.reshape({1, 4}), bm), r2 = ref_matmul(bmt, v.reshape({4, 1}));
  r1.shape = {2, 3};
  r2.shape = {2, 3};
  expect_close(matmul(v, bm), r1, tol_for(t));
  expect_close(matmul(bmt, v), r2, tol_for(t));
}

TEST_P(LinalgMatmul, ThreadedSizes) {
  DType t = GetParam();
  // One large GEMM (Eigen threads it), a batch split over threads, a folded batch.
  Tensor a = random({96, 130}, 28, t), b = random({130, 70}, 29, t).t().contiguous().t();
  expect_close(matmul(a, b), ref_matmul(a, b), tol_for(t) * 10);
  Tensor c = random({6, 33, 40}, 30, t), d = random({6, 40, 27}, 31, t);
  expect_close(matmul(c, d), ref_matmul(c, d), tol_for(t) * 10);
  Tensor e = random({4, 50, 64}, 32, t), f = random({64, 48}, 33, t);
  expect_close(matmul(e, f), ref_matmul(e, f), tol_for(t) * 10);
}

TEST_P(LinalgMatmul, EmptyInnerDimGivesZeros) {
  DType t = GetParam();
  Tensor a = zeros({3, 0}, TensorOptions{t}), b = zeros({0, 4}, TensorOptions{t});
  expect_close(matmul(a, b), Ref{{3, 4}, std::vector<double>(12, 0.0)}, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Linalg, LinalgMatmul, ::testing::Values(DType::f64, DType::f32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(LinalgMatmulLowPrecision, HalfAndBFloat16MatchF32) {
  Tensor a = random({2, 9, 16}, 34, DType::f32), b = random({16, 11}, 35, DType::f32);
  Tensor bt = random({2, 11, 16}, 36, DType::f32).transpose(-1, -2);
  for (DType lp : {DType::f16, DType::bf16}) {
    double tol = lp == DType::f16 ? 1e-2 : 6e-2;
    // The reference sees the same rounded inputs, so only the output rounding and f32 sums differ.
    Tensor al = a.to(lp), bl = b.to(lp), btl = bt.to(lp);
    Tensor y = matmul(al, bl);
    EXPECT_EQ(y.dtype(), lp);
    expect_close(y, ref_matmul(al, bl), tol);
    expect_close(matmul(al, btl), ref_matmul(al, btl), tol);
  }
}

TEST(LinalgMatmulErrors, Messages) {
  TensorOptions f32{DType::f32};
  expect_error([&] { matmul(zeros({4, 3}, f32), zeros({5, 2}, f32)); },
               {"matmul", "(4, 3)", "(5, 2)", "inner dims 3 and 5"});
  expect_error([&] { matmul(zeros({2, 3, 4}, f32), zeros({5, 4, 2}, f32)); },
               {"matmul", "(2, 3, 4)", "(5, 4, 2)", "batch"});
  expect_error([&] { matmul(zeros({3}, f32), zeros({4, 2}, f32)); }, {"matmul", "(3,)", "(4, 2)", "inner dims"});
  expect_error([&] { matmul(zeros({2, 3}, f32), zeros({4}, f32)); }, {"matmul", "(2, 3)", "(4,)"});
  expect_error([&] { matmul(zeros({}, f32), zeros({3}, f32)); }, {"matmul", "()", "(3,)", "at least 1 dim"});
  expect_error([&] { matmul(zeros({2, 3}, f32), zeros({3, 2}, TensorOptions{DType::f64})); },
               {"matmul", "f32", "f64"});
  expect_error([&] { matmul(zeros({2, 3}, TensorOptions{DType::i64}), zeros({3, 2}, TensorOptions{DType::i64})); },
               {"matmul", "i64", "(2, 3)", "(3, 2)"});
  expect_error([&] { dispatch1(OpKind::Matmul, {zeros({3}, f32), zeros({3, 2}, f32)}); },
               {"matmul", "(3,)", "(3, 2)", "at least 2 dims"});
}

// ---------------------------------------------------------------------------------------------
// conv2d

class LinalgConv2d : public ::testing::TestWithParam<std::tuple<DType, ConvCfg>> {};

TEST_P(LinalgConv2d, ForwardAndBackwardOpsMatchReference) {
  auto [t, cfg] = GetParam();
  Tensor x = random({cfg.N, cfg.C, cfg.H, cfg.W}, 40, t);
  Tensor w = random({cfg.O, cfg.C, cfg.k, cfg.k}, 41, t);
  Tensor bias = cfg.bias ? random({cfg.O}, 42, t) : Tensor();
  Tensor y = conv2d(x, w, bias, cfg.stride, cfg.pad);
  EXPECT_EQ(y.shape(), (Shape{cfg.N, cfg.O, out_size(cfg.H, cfg.k, cfg.stride, cfg.pad),
                              out_size(cfg.W, cfg.k, cfg.stride, cfg.pad)}));
  expect_close(y, ref_conv2d(x, w, bias, cfg.stride, cfg.pad), tol_for(t));

  Tensor g = random(y.shape(), 43, t);
  Ref dx, dw;
  ref_conv2d_backward(g, x, w, cfg.stride, cfg.pad, dx, dw);
  Attrs a = conv_attrs(cfg.stride, cfg.pad);
  expect_close(dispatch1(OpKind::Conv2dBackwardInput, {g, w}, Attrs(a).set("input_shape", x.shape())), dx,
               tol_for(t));
  expect_close(dispatch1(OpKind::Conv2dBackwardWeight, {g, x}, Attrs(a).set("weight_shape", w.shape())), dw,
               tol_for(t));
}

INSTANTIATE_TEST_SUITE_P(
    Linalg, LinalgConv2d,
    ::testing::Combine(::testing::Values(DType::f64, DType::f32),
                       ::testing::Values(ConvCfg{2, 3, 5, 5, 4, 3, 1, 0, true},   // 3x3, valid
                                         ConvCfg{2, 3, 5, 7, 4, 3, 1, 1, false},  // 3x3, same, non-square
                                         ConvCfg{1, 2, 6, 5, 3, 3, 2, 1, true},   // stride 2, padding 1
                                         ConvCfg{3, 2, 7, 4, 2, 3, 2, 0, false},  // stride 2, no padding
                                         ConvCfg{2, 4, 3, 5, 3, 1, 1, 0, true},   // 1x1
                                         ConvCfg{2, 3, 4, 6, 5, 1, 2, 1, false},  // 1x1, stride 2, padding 1
                                         ConvCfg{1, 1, 2, 3, 1, 3, 1, 1, true},   // tiny: mostly padding
                                         ConvCfg{4, 8, 12, 10, 6, 3, 1, 1, true}  // threaded over images
                                         )));

TEST(LinalgConv2dLayouts, NonContiguousInputsAndWeights) {
  for (DType t : {DType::f64, DType::f32}) {
    // x stored NHWC and viewed NCHW; w stored (kH, kW, C, O) and permuted to (O, C, kH, kW);
    // bias a strided slice.
    Tensor x = random({2, 6, 5, 3}, 50, t).permute({0, 3, 1, 2});
    Tensor w = random({3, 3, 3, 4}, 51, t).permute({3, 2, 0, 1});
    Tensor bias = random({8}, 52, t).slice(0, 0, 8, 2);
    ASSERT_FALSE(x.is_contiguous());
    expect_close(conv2d(x, w, bias, 1, 1), ref_conv2d(x, w, bias, 1, 1), tol_for(t));
    expect_close(conv2d(x, w, bias, 2, 0), ref_conv2d(x, w, bias, 2, 0), tol_for(t));
    // A non-contiguous gradient into both backward ops.
    // y is (2, 4, 6, 5); g of that shape from a (2, 5, 6, 4) buffer: permuted, then transposed.
    Tensor g = random({2, 5, 6, 4}, 53, t).permute({0, 3, 1, 2}).transpose(2, 3);
    Ref dx, dw;
    ref_conv2d_backward(g, x, w, 1, 1, dx, dw);
    Attrs a = conv_attrs(1, 1);
    expect_close(dispatch1(OpKind::Conv2dBackwardInput, {g, w}, Attrs(a).set("input_shape", x.shape())), dx,
                 tol_for(t));
    expect_close(dispatch1(OpKind::Conv2dBackwardWeight, {g, x}, Attrs(a).set("weight_shape", w.shape())), dw,
                 tol_for(t));
  }
}

TEST(LinalgConv2dLowPrecision, HalfAndBFloat16MatchF32) {
  Tensor x = random({3, 4, 7, 6}, 60, DType::f32), w = random({5, 4, 3, 3}, 61, DType::f32);
  Tensor bias = random({5}, 62, DType::f32);
  for (DType lp : {DType::f16, DType::bf16}) {
    double tol = lp == DType::f16 ? 1e-2 : 6e-2;
    Tensor xl = x.to(lp), wl = w.to(lp), bl = bias.to(lp);
    Tensor y = conv2d(xl, wl, bl, 1, 1);
    EXPECT_EQ(y.dtype(), lp);
    expect_close(y, ref_conv2d(xl, wl, bl, 1, 1), tol);
    Tensor g = random(y.shape(), 63, DType::f32).to(lp);
    Ref dx, dw;
    ref_conv2d_backward(g, xl, wl, 1, 1, dx, dw);
    Attrs a = conv_attrs(1, 1);
    expect_close(dispatch1(OpKind::Conv2dBackwardInput, {g, wl}, Attrs(a).set("input_shape", x.shape())), dx,
                 tol * 3);
    expect_close(dispatch1(OpKind::Conv2dBackwardWeight, {g, xl}, Attrs(a).set("weight_shape", w.shape())), dw,
                 tol * 3);
  }
}

TEST(LinalgConv2dErrors, Messages) {
  TensorOptions f32{DType::f32};
  Tensor x = zeros({2, 3, 5, 5}, f32), w = zeros({4, 3, 3, 3}, f32);
  expect_error([&] { conv2d(x, zeros({4, 2, 3, 3}, f32)); }, {"conv2d", "(2, 3, 5, 5)", "(4, 2, 3, 3)", "channels"});
  expect_error([&] { conv2d(zeros({1, 3, 2, 2}, f32), w); },
               {"conv2d", "(1, 3, 2, 2)", "(4, 3, 3, 3)", "larger than the padded input"});
  expect_error([&] { conv2d(x, zeros({4, 3, 7, 7}, f32), Tensor(), 1, 0); }, {"conv2d", "7x7", "5x5"});
  expect_error([&] { conv2d(x, w, Tensor(), 0, 0); }, {"conv2d", "stride", "(0, 0)", "(2, 3, 5, 5)"});
  expect_error([&] { conv2d(x, w, Tensor(), 1, -1); }, {"conv2d", "padding", "(-1, -1)", "(4, 3, 3, 3)"});
  expect_error([&] { conv2d(x, w, zeros({3}, f32)); }, {"conv2d", "bias", "(3,)", "(4,)", "(4, 3, 3, 3)"});
  expect_error([&] { conv2d(x, w, zeros({4, 1}, f32)); }, {"conv2d", "bias", "(4, 1)"});
  expect_error([&] { conv2d(zeros({3, 5, 5}, f32), w); }, {"conv2d", "(N, C, H, W)", "(3, 5, 5)"});
  expect_error([&] { conv2d(x, zeros({4, 3, 3}, f32)); }, {"conv2d", "(O, C, kH, kW)", "(4, 3, 3)"});
  expect_error([&] { conv2d(x, zeros({4, 3, 3, 3}, TensorOptions{DType::f64})); }, {"conv2d", "f32", "f64"});
  expect_error([&] { conv2d(zeros({2, 3, 5, 5}, TensorOptions{DType::i64}), zeros({4, 3, 3, 3}, TensorOptions{DType::i64})); },
               {"conv2d", "i64"});
  // The backward ops check the gradient against the shapes they are told.
  Attrs a = conv_attrs(1, 0).set("input_shape", Shape{2, 3, 5, 5});
  expect_error([&] { dispatch1(OpKind::Conv2dBackwardInput, {zeros({2, 4, 2, 2}, f32), w}, a); },
               {"conv2d_backward_input", "(2, 4, 2, 2)", "(2, 4, 3, 3)"});
  Attrs b = conv_attrs(1, 0).set("weight_shape", Shape{4, 3, 3, 3});
  expect_error([&] { dispatch1(OpKind::Conv2dBackwardWeight, {zeros({2, 4, 3, 3}, f32), zeros({2, 2, 5, 5}, f32)}, b); },
               {"conv2d_backward_weight", "(2, 2, 5, 5)", "(4, 3, 3, 3)", "channels"});
}

// dispatch_out may hand the kernels a strided output view; they must fill it through its strides.
TEST(LinalgDispatchOut, StridedOutputViews) {
  Tensor a = random({2, 3, 4}, 70), b = random({4, 5}, 71);
  Tensor buf = zeros({2, 5, 3}, TensorOptions{DType::f64});
  Tensor out = buf.transpose(1, 2);  // (2, 3, 5), not contiguous
  dispatch_out(OpKind::Matmul, {a, b}, {out});
  expect_close(out, ref_matmul(a, b), 1e-12);

  Tensor x = random({2, 3, 5, 4}, 72), w = random({4, 3, 3, 3}, 73), bias = random({4}, 74);
  Tensor ybuf = zeros({2, 5, 4, 4}, TensorOptions{DType::f64});  // y (2, 4, 5, 4) stored NHWC
  Tensor y = ybuf.permute({0, 3, 1, 2});
  dispatch_out(OpKind::Conv2d, {x, w, bias}, {y}, conv_attrs(1, 1));
  expect_close(y, ref_conv2d(x, w, bias, 1, 1), 1e-12);
}
