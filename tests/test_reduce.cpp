// Reductions (sum, mean, max), softmax, log-softmax and their backward ops, cross-entropy and the
// global norm: forward against plain reference loops (f64, f32, non-contiguous inputs, the threaded
// paths of large inputs), 16-bit dtypes against f32, hand-computed gradients (ties of max, ignored
// cross-entropy rows) and every error message. Gradients in general are covered by the gradcheck
// cases in autograd/cases/reduce_cases.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "reel.h"

using namespace reel;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// fn must throw reel::Error (a user error, not an InternalError) whose message contains every piece.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& pieces) {
  try {
    fn();
  } catch (const InternalError& e) {
    ADD_FAILURE() << "internal error instead of a user error: " << e.what();
    return;
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const std::string& p : pieces)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << msg << "' lacks '" << p << "'";
    return;
  }
  ADD_FAILURE() << "expected a reel::Error";
}

enum class Layout { contiguous, transposed, sliced };
const Layout kLayouts[] = {Layout::contiguous, Layout::transposed, Layout::sliced};

// Random values of `shape` in `dtype`, stored as `layout`: the same logical values whatever the layout.
Tensor make_input(const Shape& shape, DType dtype, Layout layout, uint64_t seed, double scale = 1.0,
                  double shift = 0.0) {
  Generator gen(seed);
  Tensor x = to_dtype(normal(shape, shift, scale, TensorOptions{DType::f64}, &gen), dtype);
  if (layout == Layout::transposed && shape.size() >= 2) {
    Tensor stored = contiguous(transpose(x, -1, -2));  // storage in the swapped order
    return transpose(stored, -1, -2);
  }
  if (layout == Layout::sliced && !shape.empty()) {
    Shape bigger = shape;
    bigger[0] *= 2;
    Tensor buf = zeros(bigger, TensorOptions{dtype});
    Tensor view = slice(buf, 0, 0, bigger[0], 2);  // every other row
    copy_(view, x);
    return view;
  }
  return x;
}

void expect_near_values(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " [" << i << "]";
      continue;
    }
    EXPECT_NEAR(got[i], want[i], rtol * (1.0 + std::fabs(want[i]))) << what << " [" << i << "]";
  }
}

// ---- reference reductions: plain loops over the row-major values ----

// Output shape of a reduction over `dims` (empty = all).
Shape ref_reduced_shape(const Shape& shape, std::vector<int64_t> dims, bool keepdim) {
  int64_t nd = int64_t(shape.size());
  std::vector<bool> red(shape.size(), dims.empty());
  for (int64_t d : dims) red[size_t(d < 0 ? d + nd : d)] = true;
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!red[d]) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

// op is 's' (sum), 'm' (mean) or 'x' (max); output in row-major order of the kept dims.
std::vector<double> ref_reduce(const std::vector<double>& v, const Shape& shape, std::vector<int64_t> dims, char op) {
  int64_t nd = int64_t(shape.size());
  std::vector<bool> red(shape.size(), dims.empty());
  for (int64_t d : dims) red[size_t(d < 0 ? d + nd : d)] = true;
  int64_t n_out = 1;
  for (int64_t d = 0; d < nd; ++d)
    if (!red[size_t(d)]) n_out *= shape[size_t(d)];
  std::vector<double> acc(size_t(n_out), op == 'x' ? -INFINITY : 0.0), count(size_t(n_out), 0.0);
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t rem = int64_t(i), o = 0, mult = 1;
    for (int64_t d = nd - 1; d >= 0; --d) {
      int64_t idx = rem % shape[size_t(d)];
      rem /= shape[size_t(d)];
      if (!red[size_t(d)]) {
        o += idx * mult;
        mult *= shape[size_t(d)];
      }
    }
    acc[size_t(o)] = op == 'x' ? std::max(acc[size_t(o)], v[i]) : acc[size_t(o)] + v[i];
    count[size_t(o)] += 1;
  }
  if (op == 'm')
    for (size_t o = 0; o < acc.size(); ++o) acc[o] = count[o] > 0 ? acc[o] / count[o] : kNaN;
  return acc;
}

using ReduceFn = Tensor (*)(const Tensor&, const std::vector<int64_t>&, bool);

struct ReduceConfig {
  Shape shape;
  std::vector<int64_t> dims;
  bool keepdim;
};

const ReduceConfig kReduceConfigs[] = {
    {{2, 3, 4}, {}, false},      {{2, 3, 4}, {0}, false},    {{2, 3, 4}, {1}, true},   {{2, 3, 4}, {2}, false},
    {{2, 3, 4}, {0, 2}, false},  {{2, 3, 4}, {-1, 0}, true}, {{2, 3, 4}, {1, 2}, false}, {{5, 1, 3}, {0, 2}, false},
    {{3, 1}, {1}, false},        {{6}, {0}, false},          {{4, 5}, {}, true},
};

// op over every config, dtype (f64, f32) and layout, against ref_reduce.
void check_reduce(ReduceFn fn, char op) {
  uint64_t seed = 1;
  for (DType dt : {DType::f64, DType::f32})
    for (const ReduceConfig& c : kReduceConfigs)
      for (Layout layout : kLayouts) {
        Tensor x = make_input(c.shape, dt, layout, seed++);
        Tensor y = fn(x, c.dims, c.keepdim);
        std::string what = std::string(1, op) + " " + shape_str(c.shape) + " dims " + shape_str(c.dims) + " " +
                           dtype_name(dt) + " layout " + std::to_string(int(layout));
        EXPECT_EQ(y.shape(), ref_reduced_shape(c.shape, c.dims, c.keepdim)) << what;
        EXPECT_EQ(y.dtype(), dt) << what;
        EXPECT_TRUE(y.is_contiguous()) << what;
        expect_near_values(y.to_vector<double>(), ref_reduce(x.to_vector<double>(), c.shape, c.dims, op),
                           dt == DType::f64 ? 1e-12 : 1e-5, what);
      }
}

// ---- reference softmax along `dim` of row-major values ----

std::vector<double> ref_softmax(const std::vector<double>& v, const Shape& shape, int64_t dim, bool log) {
  int64_t d = dim < 0 ? dim + int64_t(shape.size()) : dim;
  int64_t outer = 1, C = shape[size_t(d)], inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= shape[size_t(i)];
  for (size_t i = size_t(d) + 1; i < shape.size(); ++i) inner *= shape[i];
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t c) { return size_t((o * C + c) * inner + i); };
      double m = -INFINITY, s = 0;
      for (int64_t c = 0; c < C; ++c) m = std::max(m, v[at(c)]);
      for (int64_t c = 0; c < C; ++c) s += std::exp(v[at(c)] - m);
      for (int64_t c = 0; c < C; ++c) out[at(c)] = log ? v[at(c)] - m - std::log(s) : std::exp(v[at(c)] - m) / s;
    }
  return out;
}

// ---- reference cross-entropy ----

struct RefCrossEntropy {
  double loss;
  std::vector<double> lse, dlogits;  // dlogits for an upstream gradient of 1
};

RefCrossEntropy ref_cross_entropy(const std::vector<double>& x, int64_t N, int64_t C, const std::vector<int64_t>& t,
                                  bool mean, int64_t ignore = -100) {
  RefCrossEntropy r{0.0, std::vector<double>(size_t(N)), std::vector<double>(size_t(N * C), 0.0)};
  double count = 0;
  for (int64_t n = 0; n < N; ++n) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[size_t(n * C + c)]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[size_t(n * C + c)] - m);
    r.lse[size_t(n)] = m + std::log(s);
    if (t[size_t(n)] == ignore) continue;
    r.loss += r.lse[size_t(n)] - x[size_t(n * C + t[size_t(n)])];
    count += 1;
  }
  double scale = mean ? 1.0 / count : 1.0;
  if (mean) r.loss /= count;
  for (int64_t n = 0; n < N; ++n) {
    if (t[size_t(n)] == ignore) continue;
    for (int64_t c = 0; c < C; ++c)
      r.dlogits[size_t(n * C + c)] =
          (std::exp(x[size_t(n * C + c)] - r.lse[size_t(n)]) - (c == t[size_t(n)] ? 1.0 : 0.0)) * scale;
  }
  return r;
}

double rtol_for(DType dt) { return dt == DType::f64 ? 1e-12 : 1e-5; }

}  // namespace

// ---------------------------------------------------------------- sum, mean, max

TEST(ReduceSum, MatchesReferenceAllLayouts) { check_reduce(sum, 's'); }
TEST(ReduceMean, MatchesReferenceAllLayouts) { check_reduce(mean, 'm'); }
TEST(ReduceMax, MatchesReferenceAllLayouts) { check_reduce(max, 'x'); }

// Shapes large enough for the threaded paths: one long row, many rows, one column block over many
// rows (split by rows), many column blocks.
TEST(ReduceSum, LargeInputsUseEveryPath) {
  const ReduceConfig configs[] = {{{100003}, {}, false},  {{40, 2000}, {1}, false}, {{5000, 40}, {0}, false},
                                  {{4, 300, 700}, {1}, false}, {{60, 50, 30}, {0, 2}, true}};
  uint64_t seed = 100;
  for (const ReduceConfig& c : configs)
    for (DType dt : {DType::f64, DType::f32}) {
      Tensor x = make_input(c.shape, dt, Layout::contiguous, seed++, 1.0, 0.5);
      std::vector<double> v = x.to_vector<double>();
      std::string what = shape_str(c.shape) + " dims " + shape_str(c.dims) + " " + dtype_name(dt);
      double tol = dt == DType::f64 ? 1e-11 : 2e-5;
      auto check = [&](ReduceFn fn, char op, double rtol) {
        expect_near_values(fn(x, c.dims, c.keepdim).to_vector<double>(), ref_reduce(v, c.shape, c.dims, op), rtol,
                           what + " " + op);
      };
      check(sum, 's', tol);
      check(mean, 'm', tol);
      check(max, 'x', 0);
    }
}

TEST(ReduceSum, IntegersSumExactlyInI64) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < 24; ++i) v.push_back((int64_t(1) << 40) + i * 7 - 50);
  Tensor x = transpose(tensor_i64(v, {4, 6}), 0, 1);  // (6, 4), non-contiguous
  Tensor y = sum(x, {1});
  EXPECT_EQ(y.dtype(), DType::i64);
  std::vector<int64_t> got = y.to_vector<int64_t>();
  for (int64_t r = 0; r < 6; ++r) {
    int64_t want = 0;
    for (int64_t c = 0; c < 4; ++c) want += v[size_t(c * 6 + r)];
    EXPECT_EQ(got[size_t(r)], want);
  }
  EXPECT_EQ(max(x).to_vector<int64_t>()[0], *std::max_element(v.begin(), v.end()));
}

TEST(ReduceSum, EmptySelectionsAndZeroDimInputs) {
  Tensor e = zeros({0, 3});
  EXPECT_EQ(sum(e, {0}).to_vector<double>(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(sum(e).item(), 0.0);
  for (double v : mean(e, {0}).to_vector<double>()) EXPECT_TRUE(std::isnan(v));  // mean of nothing is NaN
  EXPECT_TRUE(std::isnan(mean(e).item()));
  EXPECT_EQ(sum(e, {1}).shape(), (Shape{0}));
  EXPECT_EQ(max(zeros({3, 0}), {0}).shape(), (Shape{0}));  // empty output, non-empty selection size
  Tensor s = full({}, 2.5, TensorOptions{DType::f64});
  EXPECT_EQ(sum(s).shape(), Shape{});
  EXPECT_EQ(sum(s, {0}).item(), 2.5);
  EXPECT_EQ(mean(s, {-1}, true).item(), 2.5);
  EXPECT_EQ(sum(full({3, 4}, 1.0), {}, false).shape(), Shape{});  // all dims: 0-dim result
  EXPECT_EQ(sum(full({3, 4}, 1.0), {}, true).shape(), (Shape{1, 1}));
}

TEST(ReduceMax, NaNPropagates) {
  Tensor x = tensor({1, kNaN, 3, 4, 5, 6}, {2, 3});
  std::vector<double> m = max(x, {1}).to_vector<double>();
  EXPECT_TRUE(std::isnan(m[0]));
  EXPECT_EQ(m[1], 6.0);
}

TEST(ReduceSum, HalfPrecisionMatchesF32) {
  Tensor x32 = make_input({8, 33}, DType::f32, Layout::transposed, 7, 1.0, 0.25);
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor x = to_dtype(x32, dt);
    Tensor xr = to_dtype(x, DType::f32);  // the exact values the 16-bit kernel sees
    double tol = dt == DType::f16 ? 2e-3 : 1e-2;
    for (ReduceFn fn : {ReduceFn(sum), ReduceFn(mean), ReduceFn(max)}) {
      Tensor y = fn(x, {1}, false);
      EXPECT_EQ(y.dtype(), dt);
      expect_near_values(y.to_vector<double>(), fn(xr, {1}, false).to_vector<double>(), tol, dtype_name(dt));
    }
  }
}

// dispatch_out may hand the kernel a strided output; the result must land through its strides.
TEST(ReduceSum, IntoStridedOutput) {
  Tensor x = make_input({3, 4, 5}, DType::f64, Layout::contiguous, 9);
  Tensor buf = zeros({4, 3}, TensorOptions{DType::f64});
  Tensor out = transpose(buf, 0, 1);  // (3, 4) view, not contiguous
  dispatch_out(OpKind::Sum, {x}, {out}, Attrs().set("dims", std::vector<int64_t>{2}).set("keepdim", false));
  expect_near_values(out.to_vector<double>(), ref_reduce(x.to_vector<double>(), {3, 4, 5}, {2}, 's'), 1e-12, "out");
}

TEST(ReduceSum, GradientsOfSumAndMean) {
  Tensor x = make_input({2, 3}, DType::f64, Layout::contiguous, 10).set_requires_grad();
  sum(x, {1}).backward(tensor({2, 5}, {2}, TensorOptions{DType::f64}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 2, 2, 5, 5, 5}));
  x.set_grad(Tensor());
  mean(x).backward();
  for (double g : x.grad().to_vector<double>()) EXPECT_DOUBLE_EQ(g, 1.0 / 6.0);
}

TEST(ReduceMax, TiesShareTheGradient) {
  Tensor x = tensor({1, 3, 3, 2, 7, 0, 7, 7}, {2, 4}, TensorOptions{DType::f64, Device::cpu(), true});
  max(x, {1}).backward(tensor({6, 9}, {2}, TensorOptions{DType::f64}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 3, 3, 0, 3, 0, 3, 3}));
  x.set_grad(Tensor());
  max(x).backward();  // the global maximum 7 appears three times
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 0, 1.0 / 3, 0, 1.0 / 3, 1.0 / 3}));
}

// ---------------------------------------------------------------- softmax and log-softmax

TEST(ReduceSoftmax, MatchesReferenceAllDimsAndLayouts) {
  uint64_t seed = 200;
  for (bool log : {false, true})
    for (DType dt : {DType::f64, DType::f32})
      for (int64_t dim : {-1, 0, 1, 2})
        for (Layout layout : kLayouts) {
          Shape shape{2, 3, 4};
          Tensor x = make_input(shape, dt, layout, seed++, 2.0);
          Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
          EXPECT_EQ(y.shape(), shape);
          expect_near_values(y.to_vector<double>(), ref_softmax(x.to_vector<double>(), shape, dim, log), rtol_for(dt),
                             std::string(log ? "log_softmax" : "softmax") + " dim " + std::to_string(dim));
        }
}

TEST(ReduceSoftmax, StableForLargeAndMaskedLogits) {
  // exp(1000) overflows: only the max-subtracted form gets this right.
  Tensor x = tensor({1000, 1001, 999, -INFINITY, 5, 5, 5, 5}, {2, 4});
  expect_near_values(softmax(x, 1).to_vector<double>(), ref_softmax(x.to_vector<double>(), {2, 4}, 1, false), 1e-6,
                     "softmax");
  std::vector<double> ls = log_softmax(x, 1).to_vector<double>();
  EXPECT_NEAR(ls[1], -std::log(1 + std::exp(-1.0) + std::exp(-2.0)), 1e-5);
  EXPECT_EQ(softmax(x, 1).to_vector<double>()[3], 0.0);   // masked entry
  EXPECT_EQ(ls[3], -INFINITY);
  EXPECT_NEAR(softmax(x, 1).to_vector<double>()[4], 0.25, 1e-7);
  EXPECT_EQ(softmax(full({}, 3.0), 0).item(), 1.0);  // 0-dim: one row of one element
  // The same along dim 0 of the transpose (the column-panel path).
  std::vector<double> pt = softmax(transpose(x, 0, 1), 0).to_vector<double>();  // (4, 2)
  EXPECT_EQ(pt[3 * 2 + 0], 0.0);
  EXPECT_NEAR(pt[1 * 2 + 0], softmax(x, 1).to_vector<double>()[1], 1e-7);
  EXPECT_EQ(log_softmax(transpose(x, 0, 1), 0).to_vector<double>()[3 * 2 + 0], -INFINITY);
}

TEST(ReduceSoftmax, LargeRowsThreaded) {
  Shape shape{64, 1024};
  Tensor x = make_input(shape, DType::f32, Layout::contiguous, 300, 3.0);
  std::vector<double> v = x.to_vector<double>();
  expect_near_values(softmax(x, 1).to_vector<double>(), ref_softmax(v, shape, 1, false), 1e-5, "softmax dim 1");
  expect_near_values(log_softmax(x, 0).to_vector<double>(), ref_softmax(v, shape, 0, true), 1e-5, "log_softmax dim 0");
  // Panels of 256 columns and a partial one (inner = 300).
  Shape shape3{3, 5, 300};
  Tensor x3 = make_input(shape3, DType::f32, Layout::contiguous, 301, 3.0);
  std::vector<double> v3 = x3.to_vector<double>();
  expect_near_values(softmax(x3, 1).to_vector<double>(), ref_softmax(v3, shape3, 1, false), 1e-5, "softmax panels");
  expect_near_values(log_softmax(x3, 1).to_vector<double>(), ref_softmax(v3, shape3, 1, true), 1e-5, "log panels");
}

TEST(ReduceSoftmax, BackwardOpsMatchFormulas) {
  Shape shape{3, 4, 2};
  for (DType dt : {DType::f64, DType::f32})
    for (int64_t dim : {1, -1}) {
      Tensor x = make_input(shape, dt, Layout::contiguous, 400);
      Tensor g = make_input(shape, dt, Layout::transposed, 401);
      Attrs a = Attrs().set("dim", dim);
      std::vector<double> gv = g.to_vector<double>();
      std::vector<double> p = ref_softmax(x.to_vector<double>(), shape, dim, false);
      std::vector<double> lp = ref_softmax(x.to_vector<double>(), shape, dim, true);
      // Reference: dx_i = p_i (g_i - sum_j g_j p_j) and dx_i = g_i - p_i sum_j g_j, row by row.
      std::vector<double> gp(gv.size());
      for (size_t i = 0; i < gv.size(); ++i) gp[i] = gv[i] * p[i];
      std::vector<int64_t> dims{dim};
      std::vector<double> dot = ref_reduce(gp, shape, dims, 's'), gs = ref_reduce(gv, shape, dims, 's');
      std::vector<double> want_s(gv.size()), want_l(gv.size());
      int64_t d = dim < 0 ? dim + 3 : dim;
      for (int64_t i0 = 0; i0 < 3; ++i0)
        for (int64_t i1 = 0; i1 < 4; ++i1)
          for (int64_t i2 = 0; i2 < 2; ++i2) {
            size_t i = size_t((i0 * 4 + i1) * 2 + i2), r = size_t(d == 1 ? i0 * 2 + i2 : i0 * 4 + i1);
            want_s[i] = p[i] * (gv[i] - dot[r]);
            want_l[i] = gv[i] - p[i] * gs[r];
          }
      Tensor y = softmax(x, dim), ly = log_softmax(x, dim);
      expect_near_values(dispatch1(OpKind::SoftmaxBackward, {g, y}, a).to_vector<double>(), want_s, rtol_for(dt), "sb");
      expect_near_values(dispatch1(OpKind::LogSoftmaxBackward, {g, ly}, a).to_vector<double>(), want_l, rtol_for(dt),
                         "lsb");
    }
}

TEST(ReduceSoftmax, HalfPrecisionMatchesF32) {
  Tensor x32 = make_input({6, 10}, DType::f32, Layout::contiguous, 500, 2.0);
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor x = to_dtype(x32, dt), xr = to_dtype(x, DType::f32);
    double tol = dt == DType::f16 ? 2e-3 : 1e-2;
    expect_near_values(softmax(x, 1).to_vector<double>(), softmax(xr, 1).to_vector<double>(), tol, "softmax");
    expect_near_values(log_softmax(x, 0).to_vector<double>(), log_softmax(xr, 0).to_vector<double>(), tol,
                       "log_softmax");
    Tensor g = to_dtype(make_input({6, 10}, DType::f32, Layout::contiguous, 501), dt), gr = to_dtype(g, DType::f32);
    for (int64_t dim : {0, 1}) {
      Attrs a = Attrs().set("dim", dim);
      for (auto [fwd, bwd] : {std::pair{OpKind::Softmax, OpKind::SoftmaxBackward},
                              std::pair{OpKind::LogSoftmax, OpKind::LogSoftmaxBackward}}) {
        Tensor y = dispatch1(fwd, {x}, a), yr = to_dtype(y, DType::f32);
        Tensor dx = dispatch1(bwd, {g, y}, a);
        EXPECT_EQ(dx.dtype(), dt);
        expect_near_values(dx.to_vector<double>(), dispatch1(bwd, {gr, yr}, a).to_vector<double>(), tol * 4,
                           std::string(op_name(bwd)) + " dim " + std::to_string(dim));
      }
    }
  }
}

// ---------------------------------------------------------------- cross-entropy

TEST(ReduceCrossEntropy, MatchesReference) {
  const std::vector<int64_t> t{2, -100, 0, 4, 1, -100};
  uint64_t seed = 600;
  for (DType dt : {DType::f64, DType::f32})
    for (Layout layout : kLayouts)
      for (bool mean : {true, false}) {
        Tensor logits = make_input({6, 5}, dt, layout, seed++, 2.0);
        Tensor target = tensor_i64(t, {6});
        RefCrossEntropy r = ref_cross_entropy(logits.to_vector<double>(), 6, 5, t, mean);
        std::string what = std::string(dtype_name(dt)) + (mean ? " mean" : " sum");
        // The op's outputs: the 0-dim loss in logits' dtype and the row log-sum-exps in AccType.
        Attrs a = Attrs().set("ignore_index", int64_t(-100)).set("reduction", int64_t(mean ? 0 : 1));
        std::vector<Tensor> out = dispatch(OpKind::CrossEntropy, {logits, target}, a);
        EXPECT_EQ(out[0].shape(), Shape{});
        EXPECT_EQ(out[0].dtype(), dt);
        EXPECT_EQ(out[1].dtype(), dt == DType::f64 ? DType::f64 : DType::f32);
        expect_near_values(out[1].to_vector<double>(), r.lse, rtol_for(dt), what + " lse");
        // The autograd function: loss and dlogits.
        Tensor leaf = logits.detach().set_requires_grad();
        Tensor loss = cross_entropy(leaf, target, mean ? "mean" : "sum");
        EXPECT_NEAR(loss.item(), r.loss, rtol_for(dt) * (1 + std::fabs(r.loss))) << what;
        loss.backward();
        expect_near_values(leaf.grad().to_vector<double>(), r.dlogits, rtol_for(dt), what + " dlogits");
      }
}

TEST(ReduceCrossEntropy, LargeBatchThreadedAndCustomIgnoreIndex) {
  const int64_t N = 512, C = 100;
  Tensor logits = make_input({N, C}, DType::f32, Layout::contiguous, 700, 3.0);
  std::vector<int64_t> t;
  // Targets in [0, 99); every 7th row is 99, the ignore_index of this call.
  for (int64_t n = 0; n < N; ++n) t.push_back(n % 7 == 3 ? 99 : (n * 37) % 99);
  Tensor leaf = logits.detach().set_requires_grad();
  Tensor loss = cross_entropy(leaf, tensor_i64(t, {N}), "mean", 99);
  RefCrossEntropy r = ref_cross_entropy(logits.to_vector<double>(), N, C, t, true, 99);
  EXPECT_NEAR(loss.item(), r.loss, 1e-5 * (1 + r.loss));
  loss.backward();
  expect_near_values(leaf.grad().to_vector<double>(), r.dlogits, 1e-6, "dlogits");
}

TEST(ReduceCrossEntropy, EveryTargetIgnored) {
  Tensor logits = make_input({3, 4}, DType::f64, Layout::contiguous, 800).set_requires_grad();
  Tensor target = tensor_i64({-100, -100, -100}, {3});
  Tensor loss = cross_entropy(logits, target);
  EXPECT_TRUE(std::isnan(loss.item()));  // mean over no rows: 0/0, as in PyTorch
  loss.backward();
  for (double g : logits.grad().to_vector<double>()) EXPECT_EQ(g, 0.0);  // no row contributes
  EXPECT_EQ(cross_entropy(logits, target, "sum").item(), 0.0);
}

TEST(ReduceCrossEntropy, HalfPrecisionMatchesF32) {
  Tensor x32 = make_input({5, 7}, DType::f32, Layout::contiguous, 900, 2.0);
  Tensor target = tensor_i64({0, 6, 3, -100, 2}, {5});
  for (DType dt : {DType::f16, DType::bf16}) {
    Tensor x = to_dtype(x32, dt), xr = to_dtype(x, DType::f32);
    double tol = dt == DType::f16 ? 2e-3 : 1e-2;
    Tensor leaf = x.detach().set_requires_grad(), leaf_r = xr.detach().set_requires_grad();
    Tensor loss = cross_entropy(leaf, target), loss_r = cross_entropy(leaf_r, target);
    EXPECT_EQ(loss.dtype(), dt);
    EXPECT_NEAR(loss.item(), loss_r.item(), tol * 4);
    loss.backward();
    loss_r.backward();
    EXPECT_EQ(leaf.grad().dtype(), dt);
    expect_near_values(leaf.grad().to_vector<double>(), leaf_r.grad().to_vector<double>(), tol, "dlogits");
  }
}

TEST(ReduceCrossEntropy, OutOfRangeTargetsAreErrors) {
  Tensor logits = zeros({4, 5});
  expect_error([&] { cross_entropy(logits, tensor_i64({0, 1, 7, 2}, {4})); },
               {"cross_entropy", "target 7", "position 2", "5 classes", "(4, 5)"});
  expect_error([&] { cross_entropy(logits, tensor_i64({0, -3, 1, 2}, {4})); },
               {"cross_entropy", "target -3", "position 1", "ignore_index -100"});
  expect_error([&] { cross_entropy(logits, tensor_i64({0, -100, 1, 5}, {4}), "sum", 4); },
               {"cross_entropy", "target -100", "position 1"});
  Attrs a = Attrs().set("ignore_index", int64_t(-100)).set("reduction", int64_t(0));
  expect_error([&] {
    dispatch(OpKind::CrossEntropyBackward, {zeros({}), logits, tensor_i64({0, 9, 1, 2}, {4}), zeros({4})}, a);
  }, {"cross_entropy_backward", "target 9", "position 1", "5 classes"});
}

// ---------------------------------------------------------------- global norm

TEST(ReduceGlobalNorm, MatchesReference) {
  for (DType dt : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    std::vector<Tensor> xs = {make_input({3, 4}, dt, Layout::transposed, 1000),
                              make_input({5}, dt, Layout::contiguous, 1001),
                              make_input({}, dt, Layout::contiguous, 1002),
                              make_input({2, 3}, dt, Layout::sliced, 1003), zeros({0, 2}, TensorOptions{dt})};
    double want = 0;
    for (const Tensor& x : xs)
      for (double v : x.to_vector<double>()) want += v * v;  // the values as stored (16-bit rounded)
    Tensor n = global_norm(xs);
    EXPECT_EQ(n.shape(), Shape{});
    EXPECT_EQ(n.dtype(), dt == DType::f64 ? DType::f64 : DType::f32);
    EXPECT_NEAR(n.item(), std::sqrt(want), rtol_for(dt) * std::sqrt(want)) << dtype_name(dt);
  }
  Tensor big = make_input({300, 500}, DType::f32, Layout::contiguous, 1004);  // threaded partial sums
  double want = 0;
  for (double v : big.to_vector<double>()) want += v * v;
  EXPECT_NEAR(global_norm({big, big}).item(), std::sqrt(2 * want), 1e-5 * std::sqrt(2 * want));
  EXPECT_EQ(global_norm({}).item(), 0.0);
  Tensor p = make_input({3}, DType::f64, Layout::contiguous, 1005).set_requires_grad();
  EXPECT_FALSE(global_norm({p}).requires_grad());  // not differentiable: records nothing
}

// ---------------------------------------------------------------- errors

TEST(ReduceErrors, MessagesNameTheOpAndShapes) {
  Tensor x = zeros({2, 3});
  expect_error([&] { sum(x, {2}); }, {"sum", "dim 2", "(2, 3)", "-2 to 1"});
  expect_error([&] { mean(x, {-3}); }, {"mean", "dim -3", "(2, 3)"});
  expect_error([&] { sum(x, {1, -1}); }, {"sum", "repeats a dim"});
  expect_error([&] { mean(tensor_i64({1, 2}, {2})); }, {"mean", "i64", "float"});
  expect_error([&] { max(zeros({0, 3}), {0}); }, {"max", "empty", "(0, 3)"});
  expect_error([&] { max(zeros({0, 3})); }, {"max", "empty", "(0, 3)"});
  expect_error([&] { softmax(tensor_i64({1, 2}, {2}), 0); }, {"softmax", "i64"});
  expect_error([&] { log_softmax(x, 2); }, {"log_softmax", "dim 2", "(2, 3)"});
  expect_error([&] { dispatch(OpKind::SoftmaxBackward, {zeros({2, 3}), zeros({3, 2})}, Attrs().set("dim", 0)); },
               {"softmax_backward", "(2, 3)", "(3, 2)"});
  expect_error([&] {
    dispatch(OpKind::LogSoftmaxBackward, {zeros({2, 3}, TensorOptions{DType::f64}), x}, Attrs().set("dim", 0));
  }, {"log_softmax_backward", "f64", "f32"});
}

TEST(ReduceErrors, CrossEntropyAndGlobalNormMessages) {
  Tensor logits = zeros({4, 5});
  Tensor t = tensor_i64({0, 1, 2, 3}, {4});
  expect_error([&] { cross_entropy(zeros({2, 4, 5}), t); }, {"cross_entropy", "2 dims", "(2, 4, 5)"});
  expect_error([&] { cross_entropy(logits, tensor_i64({0, 1, 2}, {3})); }, {"cross_entropy", "(3,)", "(4, 5)"});
  expect_error([&] { cross_entropy(logits, zeros({4})); }, {"cross_entropy", "i64", "(4,) f32"});
  expect_error([&] { cross_entropy(tensor_i64({0, 1}, {1, 2}), tensor_i64({0}, {1})); }, {"cross_entropy", "i64"});
  expect_error([&] { cross_entropy(zeros({4, 0}), t); }, {"cross_entropy", "(4, 0)", "no classes"});
  expect_error([&] { cross_entropy(logits, t, "none"); }, {"cross_entropy", "'none'", "'mean', 'sum'"});
  expect_error([&] { dispatch(OpKind::CrossEntropy, {logits, t}, Attrs().set("reduction", int64_t(2))); },
               {"cross_entropy", "reduction 2"});
  Attrs a = Attrs().set("ignore_index", int64_t(-100)).set("reduction", int64_t(0));
  expect_error([&] { dispatch(OpKind::CrossEntropyBackward, {zeros({}), logits, t, zeros({3})}, a); },
               {"cross_entropy_backward", "lse", "(3,) f32"});
  expect_error([&] { dispatch(OpKind::CrossEntropyBackward, {zeros({2}), logits, t, zeros({4})}, a); },
               {"cross_entropy_backward", "gradient", "(2,) f32"});
  // The fused op: the same checks of logits and targets, its gradient, and the dtype it writes.
  expect_error(
      [&] {
        dispatch(OpKind::CrossEntropyWithGrad, {logits, tensor_i64({0, 1, 2}, {3}), zeros({})}, a);
      },
      {"cross_entropy_with_grad", "(3,)", "(4, 5)"});
  expect_error(
      [&] {
        dispatch(OpKind::CrossEntropyWithGrad, {logits, t, zeros({2})}, a);
      },
      {"cross_entropy_with_grad", "gradient", "(2,) f32"});
  expect_error(
      [&] {
        dispatch(OpKind::CrossEntropyWithGrad, {logits, t, zeros({})}, Attrs(a).set("dtype", DType::f64));
      },
      {"cross_entropy_with_grad", "dtype f64", "(4, 5) f32", "bf16 or f16"});
  expect_error(
      [&] {
        Tensor l16 = to_dtype(logits, DType::bf16);
        dispatch(OpKind::CrossEntropyWithGrad, {l16, t, to_dtype(zeros({}), DType::bf16)},
                 Attrs(a).set("dtype", DType::f16));
      },
      {"cross_entropy_with_grad", "dtype f16", "(4, 5) bf16"});
  expect_error([&] { global_norm({zeros({2}), zeros({3}, TensorOptions{DType::f64})}); },
               {"global_norm", "input 1", "(3,) f64", "(2,) f32"});
  expect_error([&] { global_norm({tensor_i64({1}, {1})}); }, {"global_norm", "i64"});
  expect_error([&] { global_norm({zeros({2}), Tensor()}); }, {"global_norm", "input 1", "undefined"});
}
