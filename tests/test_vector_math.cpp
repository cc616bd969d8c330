// kernels/cpu/vector_math.h: GELU and its backward in f32 through 16-wide packets, in both builds
// (AVX2, and AVX-512 where this CPU has it). Against the f64 formula, within f32's rounding; and a
// value gives the same bits wherever it sits (in a packet's body or the padded tail, in a contiguous
// row or a strided one), which is what lets the eager kernel and the fused kernel agree to the bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <string>
#include <cstring>
#include <vector>

#include "kernels/cpu/vector_math.h"
#include "kernels/dispatch.h"
#include "reel.h"
#include "test_util.h"

namespace reel {
namespace {

// The references in long double, in the logistic form (0.5 (1 + tanh u) = 1 / (1 + e^{-2u})), which
// does not cancel for negative x as 1 + tanh(u) does: the same function, evaluated exactly enough.
double gelu_f64(double xd) {
  const long double x = xd, u = 0.7978845608028654L * (x + 0.044715L * x * x * x);
  return double(x / (1 + std::exp(-2 * u)));
}
double gelu_grad_f64(double xd) {
  const long double x = xd, u = 0.7978845608028654L * (x + 0.044715L * x * x * x);
  const long double s = 1 / (1 + std::exp(-2 * u)), du = 0.7978845608028654L * (1 + 3 * 0.044715L * x * x);
  return double(s + 2 * x * s * (1 - s) * du);
}

std::vector<float> sweep() {
  std::vector<float> x;
  for (int i = -2000; i <= 2000; ++i) x.push_back(float(i) * 0.005f);  // [-10, 10]
  for (float v : {-90.f, -40.f, 40.f, 90.f, 1e-30f, -1e-30f, 0.f}) x.push_back(v);
  return x;
}

using GeluFn = void (*)(const float*, float*, int64_t);
using GeluBackwardFn = void (*)(const float*, const float*, float*, int64_t);
struct Build {
  const char* name;
  GeluFn gelu;
  GeluBackwardFn backward;
};

// The builds this CPU runs: AVX2 always, AVX-512 where present.
std::vector<Build> builds() {
  std::vector<Build> b{{"avx2", cpu::detail::gelu_f32_avx2, cpu::detail::gelu_backward_f32_avx2}};
  if (cpu::detail::cpu_has_avx512())
    b.push_back({"avx512", cpu::detail::gelu_f32_avx512, cpu::detail::gelu_backward_f32_avx512});
  return b;
}

void check_against_f64(const Build& b) {
  SCOPED_TRACE(b.name);
  const std::vector<float> x = sweep();
  std::vector<float> g(x.size()), y(x.size()), dy(x.size());
  for (size_t i = 0; i < x.size(); ++i) g[i] = 1.0f + float(i % 7) * 0.25f;
  b.gelu(x.data(), y.data(), int64_t(x.size()));
  b.backward(g.data(), x.data(), dy.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = gelu_f64(x[i]), dref = g[i] * gelu_grad_f64(x[i]);
    // f32 rounds the exponent -2u itself: u comes from a few roundings each of about |u| eps, and an
    // absolute error d in -2u is a relative error d in exp (about 8 |u| eps in all, with or without
    // fused multiply-adds), on top of a few ulps of the formula.
    const double u = std::abs(0.7978845608028654 * (x[i] + 0.044715 * x[i] * x[i] * x[i]));
    const double rel = 2e-6 + 4.8e-7 * u;
    EXPECT_NEAR(y[i], ref, rel * std::abs(ref) + 1e-37) << "gelu(" << x[i] << ")";
    EXPECT_NEAR(dy[i], dref, 2 * rel * std::abs(dref) + 1e-7) << "gelu'(" << x[i] << ")";
    EXPECT_TRUE(std::isfinite(y[i]) && std::isfinite(dy[i])) << x[i];
  }
}

TEST(VectorMath, GeluAndItsBackwardMatchF64) {
  for (const Build& b : builds()) check_against_f64(b);
}

TEST(VectorMath, TheDispatchedBuildIsTheWidestThisCpuHas) {
  // gelu_f32 runs the AVX-512 build exactly where the CPU has it (REEL_CPU_AVX512=0 aside).
  const char* env = std::getenv("REEL_CPU_AVX512");
  const bool off = env && std::string(env) == "0";
  EXPECT_EQ(cpu::vector_math_avx512(), cpu::detail::cpu_has_avx512() && !off);
  const std::vector<float> x = sweep();
  std::vector<float> y(x.size()), want(x.size());
  cpu::gelu_f32(x.data(), y.data(), int64_t(x.size()));
  (cpu::vector_math_avx512() ? cpu::detail::gelu_f32_avx512 : cpu::detail::gelu_f32_avx2)(x.data(), want.data(),
                                                                                         int64_t(x.size()));
  EXPECT_EQ(std::memcmp(y.data(), want.data(), x.size() * sizeof(float)), 0);
}

TEST(VectorMath, AValueGivesTheSameBitsWhereverItSits) {
  const std::vector<float> x = sweep();
  for (const Build& b : builds()) {
    SCOPED_TRACE(b.name);
    std::vector<float> whole(x.size());
    b.gelu(x.data(), whole.data(), int64_t(x.size()));
    // Each value alone (always the padded tail) and in arrays cut at every offset of a packet.
    for (size_t i = 0; i < x.size(); i += 37) {
      float one;
      b.gelu(&x[i], &one, 1);
      EXPECT_EQ(std::memcmp(&one, &whole[i], sizeof(float)), 0) << x[i];
    }
    for (int64_t cut = 1; cut < 16; ++cut) {
      std::vector<float> part(x.size());
      b.gelu(x.data(), part.data(), cut);
      b.gelu(x.data() + cut, part.data() + cut, int64_t(x.size()) - cut);
      EXPECT_EQ(std::memcmp(part.data(), whole.data(), x.size() * sizeof(float)), 0) << "cut at " << cut;
    }
  }
}

// Softmax's shifted exp, each build: y = exp(x - m) within a few ulps of the f64 value, exactly 0 for
// -inf (a masked logit) and far below the maximum, and the returned sum within f32 summation error of
// the f64 sum of the y it wrote; every length from 1 to past two packets (the padded tail).
TEST(VectorMath, ShiftedExpAndItsSum) {
  using ExpFn = float (*)(const float*, float, float*, int64_t);
  std::vector<std::pair<const char*, ExpFn>> fns{{"avx2", cpu::detail::exp_shifted_f32_avx2}};
  if (cpu::detail::cpu_has_avx512()) fns.push_back({"avx512", cpu::detail::exp_shifted_f32_avx512});
  std::vector<float> x;
  for (int i = 0; i < 70; ++i) x.push_back(float(i % 23) * 0.37f - 4.0f);
  x[5] = -std::numeric_limits<float>::infinity();
  x[17] = -200.0f;  // exp(-200 - m) is far below the normal range: 0
  const float m = *std::max_element(x.begin(), x.end());
  for (const auto& [name, fn] : fns) {
    SCOPED_TRACE(name);
    for (int64_t n = 1; n <= int64_t(x.size()); ++n) {
      std::vector<float> y(size_t(n), -1.0f);
      const float sum = fn(x.data(), m, y.data(), n);
      double want_sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double want = std::exp(double(x[i]) - double(m));
        if (i == 5 || i == 17) {
          EXPECT_EQ(y[i], 0.0f) << "x " << x[i];
        } else {
          EXPECT_NEAR(y[i], want, 4e-7 * want) << "x " << x[i] << ", n " << n;
        }
        want_sum += y[i];
      }
      EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum * double(n)) << "n " << n;
    }
  }
}

TEST(VectorMath, EagerGeluOnStridedAndContiguousTensorsGivesTheSameBits) {
  Tensor x = testing_util::random({64, 48}, 5, DType::f32);
  Tensor t = x.transpose(0, 1);  // strided rows
  std::vector<float> a = gelu(t).contiguous().to_vector<float>(), b = gelu(t.contiguous()).to_vector<float>();
  EXPECT_EQ(a, b);
  Tensor g = testing_util::random({48, 64}, 6, DType::f32);
  std::vector<float> c = dispatch1(OpKind::GeluBackward, {g, t}).to_vector<float>(),
                     d = dispatch1(OpKind::GeluBackward, {g, t.contiguous()}).to_vector<float>();
  EXPECT_EQ(c, d);
}

}  // namespace
}  // namespace reel

namespace reel {
namespace {

// The contiguous loops of kernels/cpu/loops.h run in SIMD lanes (where output and input are the same
// elements or do not overlap): each element's result is the scalar formula's, NaN and -0 included,
// out of place and in place.
TEST(ElementwiseLoops, LanesGiveTheScalarFormulasBits) {
  Tensor x = testing_util::random({1000, 37}, 9, DType::f32);
  std::vector<float> v = x.to_vector<float>();
  v[3] = NAN;
  v[4] = -0.0f;
  x = Tensor::from_vector<float>(v, {1000, 37});
  const std::vector<float> y = relu(x).to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    const float want = v[i] > 0.0f || v[i] != v[i] ? v[i] : 0.0f;
    ASSERT_EQ(std::memcmp(&y[i], &want, sizeof(float)), 0) << "relu(" << v[i] << ")";
  }
  Tensor z = x.clone();
  dispatch_out(OpKind::Add, {z, x}, {z});  // in place: z += x
  const std::vector<float> s = z.to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == v[i]) {
      ASSERT_EQ(s[i], v[i] + v[i]) << i;
    }
}

}  // namespace
}  // namespace reel
