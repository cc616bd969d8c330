// Batch norm's tiled training statistics combined by the apply kernel's blocks (the switch of
// kernels/cuda/batch_norm_stats_switch.h off) against the statistics kernel's last block (on, the
// default). Checked on channels-last planes of each kind the split takes: chunks of one tile (cnn-small's
// second norm, a partial channel tile, f64's 64-pixel tiles), where the two paths must give the same
// bits; chunks of two and four tiles (cnn-small's first norm), where they agree to rounding; and a plane
// too large for the apply kernel, where the last block combines chunks of four tiles. Each side's mean
// and rstd against plain loops in double over x, y against its formula from them, running statistics
// and the backward's dx, dw, db between the two sides, and a second run of the new path to the bit.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "autograd/ops.h"
#include "kernels/cuda/batch_norm_stats_switch.h"
#include "kernels/dispatch.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;

namespace {

constexpr double kEps = 1e-5, kMomentum = 0.1;

struct Case {
  const char* name;
  Shape x;        // (N, C, H, W), channels-last on the GPU
  DType x_dtype;  // f32/f64 as is; bf16 read as f32 (attr dtype), the compiled step's mixed call
  bool relu, affine;
  bool copies16;     // cast_dtype bf16 (y's copy) and dx_dtype bf16
  bool same_chunks;  // chunks of one tile either way: the same bits
};

std::vector<Case> cases() {
  return {
      {"cnn-small's first norm: 64 chunks of 4 tiles", {32, 32, 32, 32}, DType::bf16, true, true, true, false},
      {"cnn-small's second norm: 64 chunks of 1 tile", {32, 64, 16, 16}, DType::bf16, true, true, true, true},
      {"a partial channel tile", {6, 40, 7, 9}, DType::f32, false, false, false, true},
      {"f64", {4, 8, 5, 5}, DType::f64, true, true, false, true},
      {"36 chunks of 2 tiles", {4, 8, 48, 48}, DType::f32, true, true, false, false},
      {"77 chunks of 4 tiles: the last block combines", {17, 3, 48, 48}, DType::f32, false, true, false, false},
  };
}

struct Inputs {
  Tensor x, w, b, running_mean, running_var, g;
  Attrs forward, backward;
};

Inputs make_inputs(const Case& c) {
  const Device gpu = Device::cuda(0);
  const DType d = c.x_dtype == DType::f64 ? DType::f64 : DType::f32;
  Generator gen(73);
  Inputs in;
  const Shape channels{c.x[1]};
  in.x = to_dtype((randn(c.x, {}, &gen) * 1.5 + 0.25).to(gpu), c.x_dtype, MemoryFormat::ChannelsLast);
  in.g = to_dtype(randn(c.x, {}, &gen).to(gpu), c.copies16 ? DType::bf16 : d, MemoryFormat::ChannelsLast);
  if (c.affine)
    in.w = (randn(channels, {}, &gen) * 0.5 + 1.0).to(d).to(gpu),
    in.b = (randn(channels, {}, &gen) * 0.5).to(d).to(gpu);
  in.running_mean = (randn(channels, {}, &gen) * 0.5).to(d).to(gpu);
  in.running_var = (rand(channels, {}, &gen) + 0.5).to(d).to(gpu);
  in.forward = Attrs().set("eps", kEps).set("training", true).set("momentum", kMomentum).set("relu", c.relu);
  in.backward = Attrs().set("training", true).set("relu", c.relu);
  if (c.x_dtype == DType::bf16) in.forward.set("dtype", DType::f32), in.backward.set("dtype", DType::f32);
  if (c.copies16) in.forward.set("cast_dtype", DType::bf16), in.backward.set("dx_dtype", DType::bf16);
  return in;
}

struct Outputs {
  std::vector<Tensor> forward, backward, running;  // y, mean, rstd[, y16]; dx, dw, db; running mean, var
};

Outputs run(const Inputs& in, bool last_block) {
  const bool before = cuda::set_batch_norm_stats_last_block(last_block);
  Outputs o;
  o.running = {clone(in.running_mean), clone(in.running_var)};
  o.forward = dispatch(OpKind::BatchNorm, {in.x, in.w, in.b, o.running[0], o.running[1]}, in.forward);
  std::vector<Tensor> bwd_in = {in.g, in.x, in.w, o.forward[1], o.forward[2]};
  if (in.backward.b("relu", false)) bwd_in.push_back(o.forward[0]);
  o.backward = dispatch(OpKind::BatchNormBackward, bwd_in, in.backward);
  cuda::set_batch_norm_stats_last_block(before);
  return o;
}

std::vector<double> host_values(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).to(DType::f64).contiguous();
  const double* p = static_cast<const double*>(h.data_ptr());
  return std::vector<double>(p, p + h.numel());
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// Largest |a - b| / (atol + rtol |b|) over the elements: at most 1 is within tolerance.
double worst(const Tensor& a, const Tensor& b, double atol, double rtol) {
  const std::vector<double> x = host_values(a), y = host_values(b);
  EXPECT_EQ(x.size(), y.size());
  double w = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    const double e = std::fabs(x[i] - y[i]) / (atol + rtol * std::fabs(y[i]));
    if (std::isnan(e)) return INFINITY;
    w = std::max(w, e);
  }
  return w;
}

// Each channel's mean and 1/sqrt(var + eps) (biased variance, two passes) in double over x.
void reference_stats(const Tensor& x, std::vector<double>& mean, std::vector<double>& rstd) {
  const Shape s = x.shape();
  const int64_t N = s[0], C = s[1], S = s[2] * s[3];
  const std::vector<double> v = host_values(x.contiguous());  // (N, C, S) order
  mean.assign(size_t(C), 0.0);
  rstd.assign(size_t(C), 0.0);
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0, sq = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t p = 0; p < S; ++p) sum += v[size_t((n * C + c) * S + p)];
    const double mu = sum / double(N * S);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t p = 0; p < S; ++p) sq += std::pow(v[size_t((n * C + c) * S + p)] - mu, 2);
    mean[size_t(c)] = mu;
    rstd[size_t(c)] = 1 / std::sqrt(sq / double(N * S) + kEps);
  }
}

}  // namespace

TEST(BatchNormStatsSwitchCuda, TheApplyKernelsStatisticsMatchPlainLoopsAndTheLastBlocks) {
  REEL_REQUIRE_GPU();
  const char* forward_names[] = {"y", "mean", "rstd", "y16"};
  const char* backward_names[] = {"dx", "dw", "db"};
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c);
    const Outputs last = run(in, true), apply = run(in, false);
    std::vector<double> mean, rstd;
    reference_stats(in.x, mean, rstd);
    const double tol = c.x_dtype == DType::f64 ? 1e-12 : 1e-5;
    for (const Outputs* o : {&last, &apply}) {
      const std::vector<double> m = host_values(o->forward[1]), r = host_values(o->forward[2]);
      for (size_t k = 0; k < mean.size(); ++k) {
        EXPECT_NEAR(m[k], mean[k], tol * (1 + std::fabs(mean[k]))) << "mean of channel " << k;
        EXPECT_NEAR(r[k], rstd[k], tol * rstd[k]) << "rstd of channel " << k;
      }
    }
    ASSERT_EQ(apply.forward.size(), last.forward.size());
    if (c.same_chunks) {
      for (size_t i = 0; i < apply.forward.size(); ++i)
        EXPECT_TRUE(same_bits(apply.forward[i], last.forward[i])) << forward_names[i];
      for (size_t i = 0; i < apply.backward.size(); ++i)
        EXPECT_TRUE(same_bits(apply.backward[i], last.backward[i])) << backward_names[i];
      for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(same_bits(apply.running[i], last.running[i])) << "running " << i;
    } else {
      // Sums grouped otherwise: the f32 results agree to rounding; a 16-bit copy to one of its steps.
      for (size_t i = 0; i < apply.forward.size(); ++i) {
        const bool narrow = apply.forward[i].dtype() == DType::bf16;
        EXPECT_LE(worst(apply.forward[i], last.forward[i], narrow ? 1e-2 : 1e-5, narrow ? 1e-2 : 1e-5), 1.0)
            << forward_names[i];
      }
      for (size_t i = 0; i < apply.backward.size(); ++i) {
        const bool narrow = apply.backward[i].dtype() == DType::bf16;
        EXPECT_LE(worst(apply.backward[i], last.backward[i], narrow ? 1e-2 : 1e-4, narrow ? 1e-2 : 1e-4), 1.0)
            << backward_names[i];
      }
      for (size_t i = 0; i < 2; ++i) EXPECT_LE(worst(apply.running[i], last.running[i], 1e-6, 1e-6), 1.0);
    }
    // The apply kernel's y from its own mean and rstd: y = x rstd w + (b - mean rstd w) (relu'd).
    const std::vector<double> x = host_values(in.x.contiguous()), y = host_values(apply.forward[0].contiguous());
    const std::vector<double> m = host_values(apply.forward[1]), r = host_values(apply.forward[2]);
    const std::vector<double> w = c.affine ? host_values(in.w) : std::vector<double>(m.size(), 1.0);
    const std::vector<double> b = c.affine ? host_values(in.b) : std::vector<double>(m.size(), 0.0);
    const int64_t C = c.x[1], S = c.x[2] * c.x[3];
    double off = 0;
    for (size_t e = 0; e < x.size(); ++e) {
      const size_t k = size_t((int64_t(e) / S) % C);
      double want = (x[e] - m[k]) * r[k] * w[k] + b[k];
      if (c.relu) want = std::max(want, 0.0);
      off = std::max(off, std::fabs(y[e] - want) / (1e-5 + 1e-5 * std::fabs(want)));
    }
    EXPECT_LE(off, 1.0) << "y against its formula";
    // Again: no counters or flags are involved, and the sums are in a fixed order.
    const Outputs again = run(in, false);
    for (size_t i = 0; i < apply.forward.size(); ++i)
      EXPECT_TRUE(same_bits(again.forward[i], apply.forward[i])) << forward_names[i] << " on the second run";
    for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(same_bits(again.running[i], apply.running[i])) << "running " << i;
  }
}

TEST(BatchNormStatsSwitchCuda, TheSwitchSaysWhatWasSet) {
  REEL_REQUIRE_GPU();
  const bool before = cuda::batch_norm_stats_last_block();
  EXPECT_EQ(cuda::set_batch_norm_stats_last_block(false), before);
  EXPECT_FALSE(cuda::batch_norm_stats_last_block());
  EXPECT_FALSE(cuda::set_batch_norm_stats_last_block(true));
  EXPECT_TRUE(cuda::batch_norm_stats_last_block());
  cuda::set_batch_norm_stats_last_block(before);
}
