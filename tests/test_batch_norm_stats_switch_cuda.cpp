// Batch norm's tiled training statistics combined by the apply kernel's blocks (the default, the switch
// of kernels/cuda/batch_norm_stats_switch.h off) against the statistics kernel's last block (on).
// Checked on channels-last planes of each kind: at most 64 chunks (cnn-small's second norm, a partial
// channel tile, f64's 64-pixel tiles), which the apply kernel combines, and larger planes (cnn-small's
// first norm, 72 and 306 chunks), which keep the last block either way. Both paths combine the same
// partials with the same device function, so they must give the same bits. Each side's mean and rstd
// against plain loops in double over x, y against its formula from them, running statistics and the
// backward's dx, dw, db between the two sides, and a second run of the default path to the bit.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "batch_norm_cuda_call.h"
#include "kernels/cuda/batch_norm_stats_switch.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;

namespace {

constexpr double kEps = 1e-5;  // batch_norm_cuda_call.h's

using testing_util::BatchNormCall;
using Inputs = testing_util::BatchNormInputs;
using Outputs = testing_util::BatchNormOutputs;

struct Case {
  const char* name;
  BatchNormCall call;  // training, channels-last
};

std::vector<Case> cases() {
  return {
      {"cnn-small's first norm: 256 chunks, the last block", {{32, 32, 32, 32}, DType::bf16, true, true, true, true}},
      {"cnn-small's second norm: 64 chunks, the apply kernel", {{32, 64, 16, 16}, DType::bf16, true, true, true, true}},
      {"a partial channel tile", {{6, 40, 7, 9}, DType::f32, false, false, true, false}},
      {"f64", {{4, 8, 5, 5}, DType::f64, true, true, true, false}},
      {"72 chunks: the last block", {{4, 8, 48, 48}, DType::f32, true, true, true, false}},
      {"306 chunks, a partial channel tile: the last block", {{17, 3, 48, 48}, DType::f32, false, true, true, false}},
  };
}

Outputs run(const Inputs& in, bool last_block) {
  const bool before = cuda::set_batch_norm_stats_last_block(last_block);
  const Outputs o = testing_util::run_batch_norm(in);
  cuda::set_batch_norm_stats_last_block(before);
  return o;
}

// Each channel's mean and 1/sqrt(var + eps) (biased variance, two passes) in double over x.
void reference_stats(const Tensor& x, std::vector<double>& mean, std::vector<double>& rstd) {
  const Shape s = x.shape();
  const int64_t N = s[0], C = s[1], S = s[2] * s[3];
  const std::vector<double> v = x.to_vector<double>();  // (N, C, S) order
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
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = testing_util::make_batch_norm_inputs(c.call, 73);
    const Outputs last = run(in, true), apply = run(in, false);
    std::vector<double> mean, rstd;
    reference_stats(in.x, mean, rstd);
    const double tol = c.call.x_dtype == DType::f64 ? 1e-12 : 1e-5;
    for (const Outputs* o : {&last, &apply}) {
      const std::vector<double> m = o->forward[1].to_vector<double>(), r = o->forward[2].to_vector<double>();
      for (size_t k = 0; k < mean.size(); ++k) {
        EXPECT_NEAR(m[k], mean[k], tol * (1 + std::fabs(mean[k]))) << "mean of channel " << k;
        EXPECT_NEAR(r[k], rstd[k], tol * rstd[k]) << "rstd of channel " << k;
      }
    }
    testing_util::expect_same_batch_norm_bits(apply, last, "the apply kernel's statistics against the last block's");
    // The apply kernel's y from its own mean and rstd: y = x rstd w + (b - mean rstd w) (relu'd).
    const std::vector<double> x = in.x.to_vector<double>(), y = apply.forward[0].to_vector<double>();
    const std::vector<double> m = apply.forward[1].to_vector<double>(), r = apply.forward[2].to_vector<double>();
    const std::vector<double> w = c.call.affine ? in.w.to_vector<double>() : std::vector<double>(m.size(), 1.0);
    const std::vector<double> b = c.call.affine ? in.b.to_vector<double>() : std::vector<double>(m.size(), 0.0);
    const int64_t C = c.call.x[1], S = c.call.x[2] * c.call.x[3];
    double off = 0;
    for (size_t e = 0; e < x.size(); ++e) {
      const size_t k = size_t((int64_t(e) / S) % C);
      double want = (x[e] - m[k]) * r[k] * w[k] + b[k];
      if (c.call.relu) want = std::max(want, 0.0);
      off = std::max(off, std::fabs(y[e] - want) / (1e-5 + 1e-5 * std::fabs(want)));
    }
    EXPECT_LE(off, 1.0) << "y against its formula";
    // Again: no counters or flags are involved, and the sums are in a fixed order.
    testing_util::expect_same_batch_norm_bits(run(in, false), apply, "the apply kernel's statistics, the second run");
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
