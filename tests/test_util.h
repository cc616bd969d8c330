// Helpers shared by the test files: error-message checks and reference-loop indexing.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/autotune.h"
#include "nn/nn.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "tensor/log.h"

// Skips the calling test, with the reason, where no GPU is usable.
#define REEL_REQUIRE_GPU() \
  if (!::reel::cuda::is_available()) GTEST_SKIP() << ::reel::cuda::unavailable_reason()

namespace reel::testing_util {

// Runs fn, expects a reel::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected reel::Error containing \"" << (parts.empty() ? "" : parts[0]) << "\"";
  } catch (const InternalError& e) {
    ADD_FAILURE() << "got an internal error instead of a user error: " << e.what();
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

// Row-major multi-index of flat index k in `shape`.
inline std::vector<int64_t> unravel(int64_t k, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = k % shape[d];
    k /= shape[d];
  }
  return idx;
}

// Flat row-major index into `shape` of the element that broadcasting maps `out_idx` (of a larger
// shape) to.
inline int64_t broadcast_flat(const std::vector<int64_t>& out_idx, const Shape& shape) {
  size_t lead = out_idx.size() - shape.size();
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + (shape[d] == 1 ? 0 : out_idx[lead + d]);
  return flat;
}

// Both undefined, or the same shape, dtype and bytes.
inline bool same_tensor_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

// A small f64 MLP, Linear(in, hidden) GELU Linear(hidden, out), initialised from Generator(seed): the
// model of the optimizer, compile and data-parallel step tests (f64, so equalities are tight).
// The devices a test runs on: the CPU always, the GPU too when one is usable.
inline std::vector<Device> test_devices() {
  std::vector<Device> d{Device::cpu()};
  if (::reel::cuda::is_available()) d.push_back(Device::cuda(0));
  return d;
}

inline std::shared_ptr<nn::Sequential> f64_mlp(uint64_t seed, int64_t in = 6, int64_t hidden = 8, int64_t out = 3) {
  Generator gen(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(in, hidden, true, &gen));
  m->push_back(std::make_shared<nn::GELU>());
  m->push_back(std::make_shared<nn::Linear>(hidden, out, true, &gen));
  m->to(DType::f64);
  return m;
}

// max |a - b| over max |b|: a relative error against the reference b (infinite when sizes differ).
inline double max_rel_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double scale = 1e-30, err = 0;
  for (double v : y) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) err = std::max(err, std::abs(x[i] - y[i]));
  return x.size() == y.size() ? err / scale : INFINITY;
}

// The relative L2 distance |a - b| / |b| (|a - b| when b is all zeros); infinite when the sizes
// differ or either holds a NaN.
inline double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Values ~ N(0, 1) from a generator seeded by `seed`, in `dtype`.
inline Tensor random(const Shape& shape, uint64_t seed, DType dtype = DType::f64) {
  Generator gen(seed);
  return randn(shape, TensorOptions{dtype}, &gen);
}

// Sets an environment variable for one scope (and re-reads the log topics, which are read once).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
    reload_log_topics();
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
    reload_log_topics();
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// cuDNN's fused attention mode for one scope (kernels/autotune.h), the setting restored after.
class ScopedCudnnAttention {
 public:
  explicit ScopedCudnnAttention(CudnnAttention mode) : old_(cudnn_attention_mode()) { set_cudnn_attention(mode); }
  ~ScopedCudnnAttention() { set_cudnn_attention(old_); }
  ScopedCudnnAttention(const ScopedCudnnAttention&) = delete;
  ScopedCudnnAttention& operator=(const ScopedCudnnAttention&) = delete;

 private:
  CudnnAttention old_;
};

}  // namespace reel::testing_util
