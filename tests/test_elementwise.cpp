// Elementwise ops forward against plain loops: every unary op, binary ops with broadcasting and
// non-contiguous operands, comparisons, where/masked_fill, and 16-bit dtypes against f32.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/cases/op_cases.h"
#include "test_util.h"

using namespace reel;
using namespace reel::testing_util;

namespace {

double gelu_ref(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

struct UnaryRef {
  const char* name;
  Tensor (*op)(const Tensor&);
  double (*ref)(double);
  bool positive;
};

const UnaryRef kUnary[] = {
    {"neg", neg, [](double x) { return -x; }, false},
    {"exp", exp, [](double x) { return std::exp(x); }, false},
    {"log", log, [](double x) { return std::log(x); }, true},
    {"sqrt", sqrt, [](double x) { return std::sqrt(x); }, true},
    {"rsqrt", rsqrt, [](double x) { return 1 / std::sqrt(x); }, true},
    {"abs", abs, [](double x) { return std::fabs(x); }, false},
    {"tanh", tanh, [](double x) { return std::tanh(x); }, false},
    {"sigmoid", sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, false},
    {"relu", relu, [](double x) { return x > 0 ? x : 0.0; }, false},
    {"gelu", gelu, gelu_ref, false},
};

Tensor input(bool positive, DType dt) {
  Generator g(3);
  // (5, 7) stored transposed: the kernels see a non-contiguous operand.
  Tensor base = positive ? uniform({7, 5}, 0.2, 3.0, {dt}, &g) : normal({7, 5}, 0, 2, {dt}, &g);
  return base.t();
}

}  // namespace

TEST(Elementwise, UnaryMatchesReferenceF64AndF32) {
  for (const UnaryRef& u : kUnary) {
    for (DType dt : {DType::f64, DType::f32}) {
      Tensor x = input(u.positive, dt);
      ASSERT_FALSE(x.is_contiguous());
      std::vector<double> xs = x.to_vector<double>(), ys = u.op(x).to_vector<double>(), ref;
      for (double v : xs) ref.push_back(u.ref(v));
      double tol = dt == DType::f64 ? 1e-12 : 1e-5;
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_NEAR(ys[i], ref[i], tol * (1 + std::fabs(ref[i]))) << u.name << " " << dtype_name(dt) << " at " << i;
    }
  }
}

TEST(Elementwise, UnaryIn16BitTracksF32) {
  for (const UnaryRef& u : kUnary) {
    Tensor x32 = input(u.positive, DType::f32);
    for (DType dt : {DType::f16, DType::bf16}) {
      Tensor x16 = x32.to(dt);
      std::vector<double> y16 = u.op(x16).to_vector<double>();
      std::vector<double> y32 = u.op(x16.to(DType::f32)).to_vector<double>();  // same rounded inputs
      double rel = dt == DType::f16 ? 2e-3 : 1.6e-2;
      for (size_t i = 0; i < y16.size(); ++i)
        EXPECT_NEAR(y16[i], y32[i], rel * (1 + std::fabs(y32[i]))) << u.name << " " << dtype_name(dt);
    }
  }
}

TEST(Elementwise, PowAndScalars) {
  Tensor x = tensor({0.5, 1, 2, 3}, {4}, {DType::f64});
  EXPECT_EQ(pow(x, 2).to_vector<double>(), (std::vector<double>{0.25, 1, 4, 9}));
  EXPECT_EQ((x * 2.0 + 1.0).to_vector<double>(), (std::vector<double>{2, 3, 5, 7}));
  EXPECT_EQ((1.0 - x).to_vector<double>(), (std::vector<double>{0.5, 0, -1, -2}));
  EXPECT_EQ((x / 2.0).to_vector<double>(), (std::vector<double>{0.25, 0.5, 1, 1.5}));
}

TEST(Elementwise, BinaryBroadcastsAgainstReferenceLoops) {
  struct Case { Shape a, b; };
  const Case shapes[] = {{{3, 1}, {4}}, {{2, 3, 4}, {3, 1}}, {{4, 1, 3}, {2, 3}}, {{5}, {}}, {{1, 1}, {2, 1, 3}}};
  for (const Case& c : shapes) {
    Generator g(5);
    Tensor a = normal(c.a, 0, 1, {DType::f64}, &g), b = uniform(c.b, 0.5, 2, {DType::f64}, &g);
    Shape out_shape = broadcast_shapes(c.a, c.b, "test");
    std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
    auto check = [&](Tensor y, double (*f)(double, double), const char* name) {
      ASSERT_EQ(y.shape(), out_shape) << name;
      std::vector<double> yv = y.to_vector<double>();
      for (int64_t k = 0; k < numel_of(out_shape); ++k) {
        auto idx = unravel(k, out_shape);
        double ref = f(av[broadcast_flat(idx, c.a)], bv[broadcast_flat(idx, c.b)]);
        EXPECT_DOUBLE_EQ(yv[k], ref) << name << " " << shape_str(c.a) << " with " << shape_str(c.b) << " at " << k;
      }
    };
    check(a + b, [](double x, double y) { return x + y; }, "add");
    check(a - b, [](double x, double y) { return x - y; }, "sub");
    check(a * b, [](double x, double y) { return x * y; }, "mul");
    check(a / b, [](double x, double y) { return x / y; }, "div");
    check(lt(a, b), [](double x, double y) { return double(x < y); }, "lt");
    check(ge(a, b), [](double x, double y) { return double(x >= y); }, "ge");
  }
}

TEST(Elementwise, NonContiguousOperandsBothSides) {
  Tensor a = arange(12, {DType::f32}).reshape({3, 4}).t();     // (4, 3) transposed
  Tensor b = arange(24, {DType::f32}).reshape({8, 3}).slice(0, 0, 8, 2);  // (4, 3) every other row
  std::vector<float> y = (a * b).to_vector<float>();
  std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], av[i] * bv[i]);
}

TEST(Elementwise, ComparisonsReturnZeroOne) {
  Tensor a = tensor_i64({1, 5, 3}, {3}), b = tensor_i64({2, 5, 1}, {3});
  EXPECT_EQ(eq(a, b).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0}));
  EXPECT_EQ(ne(a, b).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(le(a, b).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(gt(a, b).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ((a + b).to_vector<int64_t>(), (std::vector<int64_t>{3, 10, 4}));
}

TEST(Elementwise, WhereAndMaskedFill) {
  Tensor cond = tensor_i64({1, 0, 1}, {3, 1});
  Tensor a = full({3, 2}, 1.0), b = tensor({7, 8}, {2});
  EXPECT_EQ(where(cond, a, b).to_vector<float>(), (std::vector<float>{1, 1, 7, 8, 1, 1}));
  // Causal mask: j > i is filled.
  TensorOptions i64{DType::i64};
  Tensor i = arange(3, i64).reshape({3, 1}), j = arange(3, i64).reshape({1, 3});
  Tensor m = masked_fill(ones({3, 3}), gt(j, i), -5);
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{1, -5, -5, 1, 1, -5, 1, 1, 1}));
}

TEST(Elementwise, LargeTensorsRunInParallelAndAgree) {
  // Over the parallel grain: the threaded path must give the same as the reference.
  Generator g(9);
  Tensor a = normal({300, 1000}, 0, 1, {DType::f32}, &g), b = normal({1000}, 0, 1, {DType::f32}, &g);
  std::vector<float> y = (a * b + a).to_vector<float>(), av = a.to_vector<float>(), bv = b.to_vector<float>();
  for (size_t k = 0; k < y.size(); k += 997) {
    float ab = av[k] * bv[k % 1000];  // rounded to f32 like the mul op's output
    EXPECT_NEAR(y[k], ab + av[k], 1e-6f * (1 + std::fabs(ab + av[k])));
  }
}

TEST(Elementwise, Errors) {
  expect_error([] { ones({2, 3}) + ones({4}); }, {"add", "(2, 3)", "(4,)", "broadcast"});
  expect_error([] { ones({2}) * ones({2}, {DType::f64}); }, {"mul", "f32", "f64"});
  expect_error([] { exp(tensor_i64({1}, {1})); }, {"exp", "i64"});
  expect_error([] { div(tensor_i64({1}, {1}), tensor_i64({1}, {1})); }, {"div", "i64"});
  expect_error([] { masked_fill(ones({3}), ones({2, 3}), 0); }, {"masked_fill", "(2, 3)", "(3,)"});
}
