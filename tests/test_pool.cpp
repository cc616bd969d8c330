// Pooling and embedding against plain reference loops: max/avg pooling with padding, stride != kernel
// and non-contiguous inputs, max-pooling ties (the first maximum in row-major window order wins),
// the backward ops against scatter/gather loops, embedding with repeated indices, 16-bit dtypes
// against f32, and every error message. Gradients are also covered by autograd/cases/pool_cases.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/cases/op_cases.h"
#include "test_util.h"

using namespace reel;
using namespace reel::testing_util;

namespace {

struct Pooled {
  std::vector<double> y;
  std::vector<int64_t> idx;  // max pooling only
};

// Reference pooling over x (N, C, H, W) given row-major; padding is skipped (-inf for max, 0 for avg
// with the divisor K^2). Strict > keeps the first maximum of a window.
Pooled ref_pool(const std::vector<double>& x, const Shape& s, int64_t k, int64_t st, int64_t p, bool is_max) {
  const int64_t H = s[2], W = s[3], Ho = (H + 2 * p - k) / st + 1, Wo = (W + 2 * p - k) / st + 1;
  Pooled r;
  for (int64_t nc = 0; nc < s[0] * s[1]; ++nc)
    for (int64_t oh = 0; oh < Ho; ++oh)
      for (int64_t ow = 0; ow < Wo; ++ow) {
        double best = 0, sum = 0;
        int64_t arg = -1;
        for (int64_t i = 0; i < k; ++i)
          for (int64_t j = 0; j < k; ++j) {
            int64_t h = oh * st - p + i, w = ow * st - p + j;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            double v = x[size_t((nc * H + h) * W + w)];
            if (arg < 0 || v > best) best = v, arg = h * W + w;
            sum += v;
          }
        r.y.push_back(is_max ? best : sum / double(k * k));
        r.idx.push_back(arg);
      }
  return r;
}

double tol(DType dt) { return dt == DType::f64 ? 1e-12 : 1e-5; }

Tensor random(const Shape& shape, DType dt, uint64_t seed) {
  Generator g(seed);
  return randn(shape, TensorOptions{dt}, &g);
}

// Inputs of shape (N, C, H, W) in three layouts: contiguous, H/W transposed (permute of an
// (N, C, W, H) buffer), and every other column of an (N, C, H, 2W) buffer.
std::vector<Tensor> layouts(const Shape& s, DType dt, uint64_t seed) {
  Tensor t = random({s[0], s[1], s[3], s[2]}, dt, seed + 1).permute({0, 1, 3, 2});
  Tensor sl = random({s[0], s[1], s[2], 2 * s[3]}, dt, seed + 2).slice(3, 0, 2 * s[3], 2);
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_FALSE(sl.is_contiguous());
  return {random(s, dt, seed), t, sl};
}

struct PoolConfig {
  Shape shape;
  int64_t kernel, stride, padding;
};

const PoolConfig kConfigs[] = {
    {{2, 3, 6, 6}, 2, 2, 0},   // non-overlapping
    {{1, 2, 7, 5}, 3, 2, 1},   // padding, stride != kernel, floor sizes
    {{2, 1, 5, 6}, 3, 1, 1},   // overlapping windows
    {{1, 2, 5, 7}, 2, 3, 1},   // stride > kernel: gaps between windows
    {{4, 8, 32, 32}, 2, 2, 0}, // large enough for the OpenMP path
};

}  // namespace

TEST(PoolMax, MatchesReferenceF64AndF32) {
  for (DType dt : {DType::f64, DType::f32})
    for (const PoolConfig& c : kConfigs)
      for (const Tensor& x : layouts(c.shape, dt, 10)) {
        auto out = dispatch(OpKind::MaxPool2d, {x},
                            Attrs().set("kernel", c.kernel).set("stride", c.stride).set("padding", c.padding));
        Pooled r = ref_pool(x.to_vector<double>(), c.shape, c.kernel, c.stride, c.padding, true);
        EXPECT_EQ(out[0].dtype(), dt);
        EXPECT_EQ(out[1].dtype(), DType::i64);
        EXPECT_EQ(out[0].shape(), out[1].shape());
        EXPECT_EQ(out[0].to_vector<double>(), r.y) << shape_str(c.shape) << " k" << c.kernel;
        EXPECT_EQ(out[1].to_vector<int64_t>(), r.idx) << shape_str(c.shape) << " k" << c.kernel;
        EXPECT_EQ(max_pool2d(x, c.kernel, c.stride, c.padding).to_vector<double>(), r.y);
      }
}

TEST(PoolMax, OutputShapeAndDefaultStride) {
  Tensor x = random({1, 2, 7, 5}, DType::f32, 1);
  EXPECT_EQ(max_pool2d(x, 3, 2, 1).shape(), (Shape{1, 2, 4, 3}));
  EXPECT_EQ(max_pool2d(x, 2).shape(), (Shape{1, 2, 3, 2}));  // stride -1 = kernel, floor
  EXPECT_EQ(max_pool2d(x, 2).to_vector<float>(), max_pool2d(x, 2, 2, 0).to_vector<float>());
}

// Ties: the first maximum in row-major window order wins (and receives the whole gradient).
TEST(PoolMax, TiesPickTheFirstMaximum) {
  Tensor x = tensor({1, 1, 2, 2,  //
                     1, 1, 2, 2,  //
                     0, 5, 3, 3,  //
                     5, 5, 3, 3},
                    {1, 1, 4, 4}, TensorOptions{DType::f64}.with_requires_grad());
  auto out = dispatch(OpKind::MaxPool2d, {x}, Attrs().set("kernel", 2).set("stride", 2).set("padding", 0));
  EXPECT_EQ(out[0].to_vector<double>(), (std::vector<double>{1, 2, 5, 3}));
  EXPECT_EQ(out[1].to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 9, 10}));
  max_pool2d(x, 2).backward(ones({1, 1, 2, 2}, TensorOptions{DType::f64}));
  EXPECT_EQ(x.grad().to_vector<double>(),
            (std::vector<double>{1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0}));
}

// Padding acts as -inf: an all-negative (even all -inf) window still picks a real element.
TEST(PoolMax, PaddingNeverWinsAndNaNPropagates) {
  double inf = std::numeric_limits<double>::infinity();
  Tensor x = tensor({-3, -inf, -inf, -inf}, {1, 1, 2, 2}, TensorOptions{DType::f64});
  auto out = dispatch(OpKind::MaxPool2d, {x}, Attrs().set("kernel", 3).set("stride", 1).set("padding", 1));
  EXPECT_EQ(out[0].to_vector<double>(), (std::vector<double>{-3, -3, -3, -3}));
  EXPECT_EQ(out[1].to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, 0}));
  Tensor y = tensor({-inf, -inf, -inf, -inf}, {1, 1, 2, 2}, TensorOptions{DType::f64});
  auto all_inf = dispatch(OpKind::MaxPool2d, {y}, Attrs().set("kernel", 2).set("stride", 1).set("padding", 1));
  EXPECT_EQ(all_inf[1].to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1, 0, 0, 1, 2, 2, 3}));
  Tensor z = tensor({1, NAN, 2, 3}, {1, 1, 2, 2}, TensorOptions{DType::f32});
  EXPECT_TRUE(std::isnan(max_pool2d(z, 2).item()));
}

TEST(PoolMax, BackwardOpMatchesScatterLoop) {
  // Overlapping windows: one element can win several windows, so the scatter must add. The second
  // shape is large enough for the OpenMP path.
  for (const Shape& s : {Shape{2, 3, 5, 5}, Shape{4, 8, 32, 32}}) {
    Tensor x = random(s, DType::f64, 20);
    auto out = dispatch(OpKind::MaxPool2d, {x}, Attrs().set("kernel", 3).set("stride", 1).set("padding", 1));
    Tensor g = random(out[0].shape(), DType::f64, 21);
    Tensor dx = dispatch1(OpKind::MaxPool2dBackward, {g, out[1]}, Attrs().set("input_shape", s));
    const size_t HW = size_t(s[2] * s[3]);
    std::vector<double> ref(size_t(x.numel()), 0.0), gv = g.to_vector<double>();
    std::vector<int64_t> iv = out[1].to_vector<int64_t>();
    for (size_t j = 0; j < gv.size(); ++j) ref[(j / HW) * HW + size_t(iv[j])] += gv[j];
    EXPECT_LT(max_abs_diff(dx.to_vector<double>(), ref), 1e-12) << shape_str(s);
    // A transposed (non-contiguous) gradient gives the same result.
    Tensor gt = g.transpose(2, 3).contiguous().transpose(2, 3);
    ASSERT_FALSE(gt.is_contiguous());
    Tensor dx_t = dispatch1(OpKind::MaxPool2dBackward, {gt, out[1]}, Attrs().set("input_shape", s));
    EXPECT_EQ(dx_t.to_vector<double>(), dx.to_vector<double>());
  }
}

TEST(PoolAvg, MatchesReferenceF64AndF32) {
  for (DType dt : {DType::f64, DType::f32})
    for (const PoolConfig& c : kConfigs)
      for (const Tensor& x : layouts(c.shape, dt, 30)) {
        Tensor y = avg_pool2d(x, c.kernel, c.stride, c.padding);
        Pooled r = ref_pool(x.to_vector<double>(), c.shape, c.kernel, c.stride, c.padding, false);
        EXPECT_EQ(y.dtype(), dt);
        EXPECT_LT(max_abs_diff(y.to_vector<double>(), r.y), tol(dt)) << shape_str(c.shape) << " k" << c.kernel;
      }
}

TEST(PoolAvg, CountsPaddingInTheMean) {
  Tensor x = ones({1, 1, 2, 2}, TensorOptions{DType::f64});
  // Each 3x3 window holds the 4 ones and 5 zeros of padding: 4/9 (PyTorch's count_include_pad).
  Tensor y = avg_pool2d(x, 3, 1, 1);
  for (double v : y.to_vector<double>()) EXPECT_NEAR(v, 4.0 / 9.0, 1e-15);
}

TEST(PoolAvg, BackwardOpMatchesScatterLoop) {
  for (const PoolConfig& c : kConfigs) {
    const Shape& s = c.shape;
    Tensor g = random(avg_pool2d(zeros(s, TensorOptions{DType::f64}), c.kernel, c.stride, c.padding).shape(),
                      DType::f64, 40);
    Attrs a = Attrs().set("kernel", c.kernel).set("stride", c.stride).set("padding", c.padding);
    Tensor dx = dispatch1(OpKind::AvgPool2dBackward, {g}, a.set("input_shape", s));
    const int64_t H = s[2], W = s[3], Ho = g.shape()[2], Wo = g.shape()[3];
    std::vector<double> ref(size_t(numel_of(s)), 0.0), gv = g.to_vector<double>();
    for (int64_t nc = 0; nc < s[0] * s[1]; ++nc)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow)
          for (int64_t i = 0; i < c.kernel; ++i)
            for (int64_t j = 0; j < c.kernel; ++j) {
              int64_t h = oh * c.stride - c.padding + i, w = ow * c.stride - c.padding + j;
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              ref[size_t((nc * H + h) * W + w)] += gv[size_t((nc * Ho + oh) * Wo + ow)] / double(c.kernel * c.kernel);
            }
    EXPECT_LT(max_abs_diff(dx.to_vector<double>(), ref), 1e-12) << shape_str(s) << " k" << c.kernel;
  }
}

TEST(PoolGlobalAvg, MeansOverHW) {
  Tensor x = random({2, 3, 4, 5}, DType::f64, 50).permute({0, 1, 3, 2});  // (2, 3, 5, 4), transposed
  Tensor y = global_avg_pool2d(x);
  ASSERT_EQ(y.shape(), (Shape{2, 3}));
  std::vector<double> xv = x.to_vector<double>(), ref(6, 0.0);
  for (size_t i = 0; i < xv.size(); ++i) ref[i / 20] += xv[i] / 20.0;
  EXPECT_LT(max_abs_diff(y.to_vector<double>(), ref), 1e-12);
}

TEST(PoolLowPrecision, F16AndBF16MatchF32) {
  Tensor x = random({2, 3, 9, 8}, DType::f32, 60);
  for (DType dt : {DType::f16, DType::bf16}) {
    double t = dt == DType::f16 ? 5e-3 : 3e-2;  // values ~N(0, 1): a few ulps of the 16-bit type
    Tensor xl = x.to(dt);
    Tensor ym = max_pool2d(xl, 3, 2, 1), ya = avg_pool2d(xl, 3, 2, 1);
    EXPECT_EQ(ym.dtype(), dt);
    EXPECT_LT(max_abs_diff(ym.to_vector<double>(), max_pool2d(x, 3, 2, 1).to_vector<double>()), t);
    EXPECT_LT(max_abs_diff(ya.to_vector<double>(), avg_pool2d(x, 3, 2, 1).to_vector<double>()), t);
    Tensor g = random(ya.shape(), DType::f32, 61);
    Attrs a = Attrs().set("kernel", 3).set("stride", 2).set("padding", 1).set("input_shape", x.shape());
    EXPECT_LT(max_abs_diff(dispatch1(OpKind::AvgPool2dBackward, {g.to(dt)}, a).to_vector<double>(),
                           dispatch1(OpKind::AvgPool2dBackward, {g}, a).to_vector<double>()),
              t);
  }
}

TEST(PoolEmbedding, MatchesReferenceWithRepeatsAndNonContiguousWeight) {
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor w_dense = random({6, 4}, dt, 70);
    Tensor w_t = random({4, 6}, dt, 71).t();  // (6, 4) stored transposed
    Tensor idx = tensor_i64({5, 0, 5, 2, 2, 2, 1, 0}, {2, 4});
    Tensor idx_t = idx.t();  // (4, 2), non-contiguous indices
    for (const Tensor& w : {w_dense, w_t})
      for (const Tensor& ix : {idx, idx_t}) {
        Tensor y = embedding(w, ix);
        Shape expect = ix.shape();
        expect.push_back(4);
        ASSERT_EQ(y.shape(), expect);
        std::vector<double> wv = w.to_vector<double>(), yv = y.to_vector<double>(), ref;
        for (int64_t v : ix.to_vector<int64_t>())
          for (int64_t d = 0; d < 4; ++d) ref.push_back(wv[size_t(v * 4 + d)]);
        EXPECT_EQ(yv, ref);
      }
  }
  // A 0-dim index gives one row of shape (D).
  Tensor w = random({3, 2}, DType::f64, 72);
  Tensor row = embedding(w, tensor_i64({2}, {}));
  EXPECT_EQ(row.shape(), (Shape{2}));
  EXPECT_EQ(row.to_vector<double>(), w.slice(0, 2, 3).to_vector<double>());
}

TEST(PoolEmbedding, LargeForwardAndBackwardOpMatchLoops) {
  // Big enough for the OpenMP paths; 2000 positions over 50 rows repeat every row many times.
  const int64_t V = 50, D = 32, n = 2000;
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor idx = cases::int_tensor({40, 50}, V, Device::cpu(), 80);
    Tensor g = random({40, 50, D}, dt, 81);
    Tensor dw = dispatch1(OpKind::EmbeddingBackward, {g, idx}, Attrs().set("num_weights", V));
    ASSERT_EQ(dw.shape(), (Shape{V, D}));
    std::vector<double> ref(size_t(V * D), 0.0), gv = g.to_vector<double>();
    std::vector<int64_t> iv = idx.to_vector<int64_t>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < D; ++d) ref[size_t(iv[size_t(i)] * D + d)] += gv[size_t(i * D + d)];
    EXPECT_LT(max_abs_diff(dw.to_vector<double>(), ref), dt == DType::f64 ? 1e-12 : 1e-4);
    // The forward at the same size (parallel copy of rows).
    Tensor w = random({V, D}, dt, 82);
    std::vector<double> wv = w.to_vector<double>(), y_ref;
    for (int64_t v : iv)
      for (int64_t d = 0; d < D; ++d) y_ref.push_back(wv[size_t(v * D + d)]);
    EXPECT_EQ(embedding(w, idx).to_vector<double>(), y_ref);
    // Deterministic: the same sums in the same order every time.
    Tensor again = dispatch1(OpKind::EmbeddingBackward, {g, idx}, Attrs().set("num_weights", V));
    EXPECT_EQ(again.to_vector<double>(), dw.to_vector<double>());
  }
}

TEST(PoolEmbedding, RepeatedIndicesAccumulateGradient) {
  Tensor w = random({4, 3}, DType::f64, 90).detach().set_requires_grad();
  Tensor idx = tensor_i64({1, 3, 1, 1, 0}, {5});
  embedding(w, idx).backward(ones({5, 3}, TensorOptions{DType::f64}));
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{1, 1, 1, 3, 3, 3, 0, 0, 0, 1, 1, 1}));
}

TEST(PoolEmbedding, F16AndBF16MatchF32) {
  Tensor w = random({10, 8}, DType::f32, 100);
  Tensor idx = cases::int_tensor({3, 7}, 10, Device::cpu(), 101);
  Tensor g = random({3, 7, 8}, DType::f32, 102);
  Attrs a = Attrs().set("num_weights", 10);
  for (DType dt : {DType::f16, DType::bf16}) {
    double t = dt == DType::f16 ? 1e-2 : 1e-1;
    Tensor y = embedding(w.to(dt), idx);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_LT(max_abs_diff(y.to_vector<double>(), embedding(w, idx).to_vector<double>()), t);
    EXPECT_LT(max_abs_diff(dispatch1(OpKind::EmbeddingBackward, {g.to(dt), idx}, a).to_vector<double>(),
                           dispatch1(OpKind::EmbeddingBackward, {g, idx}, a).to_vector<double>()),
              t);
  }
}

TEST(PoolErrors, PoolingMessages) {
  Tensor x = zeros({1, 1, 4, 4});
  expect_error([] { max_pool2d(zeros({2, 3, 4}), 2); }, {"max_pool2d", "4-D", "(2, 3, 4)"});
  expect_error([] { avg_pool2d(zeros({2, 3, 4, 4, 1}), 2); }, {"avg_pool2d", "4-D", "(2, 3, 4, 4, 1)"});
  expect_error([&] { max_pool2d(x, 0); }, {"max_pool2d", "kernel must be >= 1", "got 0", "(1, 1, 4, 4)"});
  expect_error([&] { max_pool2d(x, 2, 0); }, {"max_pool2d", "stride must be >= 1", "got 0"});
  expect_error([&] { avg_pool2d(x, 2, -3); }, {"avg_pool2d", "stride must be >= 1", "got -3"});
  expect_error([&] { max_pool2d(x, 3, 1, 2); }, {"max_pool2d", "padding", "[0, 1]", "kernel 3", "got 2"});
  expect_error([&] { avg_pool2d(x, 2, 1, -1); }, {"avg_pool2d", "padding", "got -1"});
  expect_error([&] { max_pool2d(zeros({1, 1, 2, 5}), 3); },
               {"max_pool2d", "(1, 1, 2, 5)", "too small", "kernel 3", "0x1"});
  expect_error([] { max_pool2d(tensor_i64({1, 2, 3, 4}, {1, 1, 2, 2}), 2); }, {"max_pool2d", "float", "i64"});
  expect_error([] { global_avg_pool2d(zeros({2, 3})); }, {"global_avg_pool2d", "4-D", "(2, 3)"});
}

TEST(PoolErrors, BackwardOpMessages) {
  Tensor g = zeros({1, 2, 2, 2});
  Tensor idx = tensor_i64({0, 1, 4, 16, 0, 0, 0, 0}, {1, 2, 2, 2});
  expect_error([&] { dispatch(OpKind::MaxPool2dBackward, {g, idx}, Attrs().set("input_shape", Shape{1, 2, 4, 4})); },
               {"max_pool2d_backward", "index 16", "position (0, 0, 1, 1)", "4x4", "< 16"});
  expect_error([&] { dispatch(OpKind::MaxPool2dBackward, {g, idx}, Attrs().set("input_shape", Shape{1, 3, 4, 4})); },
               {"max_pool2d_backward", "(1, 2, 2, 2)", "(1, 3, 4, 4)"});
  expect_error([&] { dispatch(OpKind::MaxPool2dBackward, {g, g}, Attrs().set("input_shape", Shape{1, 2, 4, 4})); },
               {"max_pool2d_backward", "indices must be i64", "f32"});
  Attrs a = Attrs().set("kernel", 2).set("stride", 2).set("padding", 0).set("input_shape", Shape{1, 2, 6, 4});
  expect_error([&] { dispatch(OpKind::AvgPool2dBackward, {g}, a); },
               {"avg_pool2d_backward", "(1, 2, 2, 2)", "(1, 2, 3, 2)", "(1, 2, 6, 4)"});
}

TEST(PoolErrors, EmbeddingMessages) {
  Tensor w = zeros({5, 3});
  expect_error([&] { embedding(w, tensor_i64({0, 4, 1, 7, 2, 3}, {2, 3})); },
               {"embedding", "index 7", "position (1, 0)", "(2, 3)", "(5, 3)", "V = 5"});
  expect_error([&] { embedding(w, tensor_i64({-1}, {1})); }, {"embedding", "index -1", "position (0,)", "V = 5"});
  expect_error([&] { embedding(w, zeros({2})); }, {"embedding", "indices must be i64", "f32", "(2,)"});
  expect_error([] { embedding(zeros({5, 3, 2}), tensor_i64({0}, {1})); }, {"embedding", "2-D", "(5, 3, 2)"});
  Attrs a = Attrs().set("num_weights", 5);
  expect_error([&] { dispatch(OpKind::EmbeddingBackward, {zeros({2, 3}), tensor_i64({0, 5}, {2})}, a); },
               {"embedding_backward", "index 5", "position (1,)", "V = 5"});
  expect_error([&] { dispatch(OpKind::EmbeddingBackward, {zeros({3, 3}), tensor_i64({0, 1}, {2})}, a); },
               {"embedding_backward", "(3, 3)", "(2,)"});
  // Accumulating: the gradient to add to must be dweight's shape and g's dtype.
  Attrs acc = Attrs().set("num_weights", 5).set("accumulate", true);
  expect_error(
      [&] {
        dispatch(OpKind::EmbeddingBackward, {zeros({2, 3}), tensor_i64({0, 1}, {2}), zeros({4, 3})}, acc);
      },
      {"embedding_backward", "(4, 3) f32", "(5, 3)"});
  expect_error(
      [&] {
        dispatch(OpKind::EmbeddingBackward, {zeros({2, 3}), tensor_i64({0, 1}, {2}), zeros({5, 3}).to(DType::f64)},
                 acc);
      },
      {"embedding_backward", "(5, 3) f64", "must be f32"});
  expect_error(
      [&] {
        dispatch(OpKind::EmbeddingBackward, {zeros({2, 3}), tensor_i64({0, 1}, {2})}, acc);
      },
      {"embedding_backward", "third input", "got 2 inputs"});
}
