// Shared pieces of the extreme-value suites (tests/test_extreme_values.cpp: softmax, cross-entropy,
// masked softmax, attention; tests/test_extreme_values_norm.cpp: the norms): the dtypes' unit
// roundoffs and tolerances, input draws, and comparisons with the long double references.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <limits>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "test_util.h"

namespace reel::extreme_values {

using LD = long double;
using Vec = std::vector<double>;
using LVec = std::vector<LD>;

using testing_util::test_devices;

inline const std::vector<DType> kAllFloat = {DType::f64, DType::f32, DType::f16, DType::bf16};

inline std::string where(Device dev, DType dt) { return dev.str() + " " + dtype_name(dt); }

// Unit roundoff of a dtype, and of the dtype its reductions accumulate in.
inline double unit(DType dt) {
  switch (dt) {
    case DType::f64: return 0x1p-53;
    case DType::f32: return 0x1p-24;
    case DType::f16: return 0x1p-11;
    default: return 0x1p-8;  // bf16
  }
}
inline double acc_unit(DType dt) { return dt == DType::f64 ? 0x1p-53 : 0x1p-24; }

struct Tol {
  double atol, rtol;
};

// Results of O(1): a few roundings of the dtype (16-bit results are rounded once on the way out).
inline Tol tol_of(DType dt) {
  switch (dt) {
    case DType::f64: return {1e-13, 1e-13};
    case DType::f32: return {2e-6, 2e-6};
    case DType::f16: return {2e-3, 2e-3};
    default: return {1.6e-2, 1.6e-2};
  }
}

// Deterministic standard normal draws (splitmix64 and Box-Muller), independent of reel's generator.
struct Draws {
  uint64_t state;
  explicit Draws(uint64_t seed) : state(seed) {}
  double uniform() {  // (0, 1)
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double(z >> 11) + 0.5) * 0x1p-53;
  }
  double normal() { return std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); }
  Vec normals(size_t n) {
    Vec v(n);
    for (double& x : v) x = normal();
    return v;
  }
};

inline Tensor make(const Vec& v, const Shape& s, DType dt, Device dev, bool requires_grad = false) {
  return tensor(v, s, TensorOptions().with_dtype(dt).with_device(dev).with_requires_grad(requires_grad));
}

// The values of t as the library holds them (rounded to its dtype), read back to the host.
inline Vec host(const Tensor& t) { return t.to_vector<double>(); }

inline LD max_abs(const LVec& v) {
  LD m = 0;
  for (LD x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Every value of `got` finite and within atol + rtol |want| of `want`; reports the first few misses.
inline void expect_close(const Vec& got, const LVec& want, Tol tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = double(want[i]);
    const double err = std::fabs(got[i] - w);
    if (std::isfinite(got[i]) && err <= tol.atol + tol.rtol * std::fabs(w)) continue;
    if (++misses > 4) continue;
    ADD_FAILURE() << what << " [" << i << "]: got " << std::setprecision(17) << got[i] << ", want " << w
                  << " (error " << err << ", allowed " << tol.atol + tol.rtol * std::fabs(w) << ")";
  }
  if (misses > 4) ADD_FAILURE() << what << ": " << misses << " values out of tolerance in all";
}

// The same with the absolute part scaled by the largest reference magnitude (gradients whose scale
// follows 1/std or a sum over a set).
inline void expect_close_scaled(const Vec& got, const LVec& want, Tol tol, const std::string& what) {
  expect_close(got, want, {tol.atol * std::max<double>(1.0, double(max_abs(want))), tol.rtol}, what);
}

// |got - want| <= rel * terms + tiny for every value (terms: the sum of |term| of the reference's
// sum, the magnitude a rounding error of relative size rel in its terms reaches).
inline void expect_close_terms(const Vec& got, const LVec& want, const LVec& terms, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - double(want[i])), allowed = rel * double(terms[i]) + 1e-300;
    if (std::isfinite(got[i]) && err <= allowed) continue;
    if (++misses > 4) continue;
    ADD_FAILURE() << what << " [" << i << "]: got " << std::setprecision(17) << got[i] << ", want "
                  << double(want[i]) << " (error " << err << ", allowed " << allowed << ")";
  }
  if (misses > 4) ADD_FAILURE() << what << ": " << misses << " values out of tolerance in all";
}

inline Vec transpose(const Vec& a, int64_t rows, int64_t cols) {
  Vec t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = a[size_t(r * cols + c)];
  return t;
}

}  // namespace reel::extreme_values
