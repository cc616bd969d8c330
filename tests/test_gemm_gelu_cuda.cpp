// GELU in cuBLASLt's GEMM epilogue, on the GPU:
//   - kernels/cuda/gemm_epilogue.h: gemm_bias_gelu (pre = a @ b + bias, y = gelu(pre)) against plain
//     loops in double over the same 16-bit inputs, with b read as stored and through a transposed view
//     (a Linear's W^T); bad operands are refused;
//   - compile/passes/fuse_gemm_gelu.cpp: an MLP traced under autocast runs GELU inside fc's GEMM, and the
//     compiled function stays within tolerance of eager; where cuBLASLt cannot take the layout (a
//     width not divisible by 8) GELU keeps a kernel of its own.
// Skips without a GPU; compiled only with the CUDA backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "compile/runtime/compile.h"
#include "kernels/cuda/gemm_epilogue.h"
#include "reel.h"
#include "test_util.h"

#ifdef REEL_CUDA

using namespace reel;

namespace {

const Device kGpu = Device::cuda(0);

double gelu_ref(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

// (M, N) = a (M, K) @ b (K, N) in double, from the tensors' values as stored (any dtype, any layout).
std::vector<double> matmul_ref(const Tensor& a, const Tensor& b) {
  const int64_t M = a.shape()[0], K = a.shape()[1], N = b.shape()[1];
  const std::vector<double> av = a.contiguous().to_vector<double>(), bv = b.contiguous().to_vector<double>();
  std::vector<double> y(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) y[size_t(i * N + j)] += av[size_t(i * K + k)] * bv[size_t(k * N + j)];
  return y;
}

// max |x - ref| over max |ref|.
double rel_err(const Tensor& x, const std::vector<double>& ref) {
  const std::vector<double> v = x.to_vector<double>();
  double scale = 1e-30, err = 0;
  for (double r : ref) scale = std::max(scale, std::abs(r));
  for (size_t i = 0; i < v.size(); ++i) err = std::max(err, std::abs(v[i] - ref[i]));
  return v.size() == ref.size() ? err / scale : INFINITY;
}

}  // namespace

TEST(GemmGeluEpilogueCuda, MatchesPlainLoops) {
  REEL_REQUIRE_GPU();
  Generator gen(71);
  const int64_t M = 70, K = 48, N = 64;
  for (DType dt : {DType::bf16, DType::f16}) {
    for (bool transposed : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (transposed ? ", b = W^T" : ", b row-major"));
      // A (rows, cols) operand, row-major or as the transposed view of a (cols, rows) matrix.
      auto operand = [&](int64_t rows, int64_t cols) {
        Tensor m = to_dtype(randn({cols, rows}, {}, &gen) * 0.3, dt).to(kGpu);
        return transposed ? m.t() : m.t().contiguous();
      };
      Tensor a = to_dtype(randn({M, K}, {}, &gen), dt).to(kGpu);
      Tensor b = operand(K, N);
      Tensor bias = to_dtype(randn({N}, {}, &gen), dt).to(kGpu);
      Tensor y = Tensor::empty({M, N}, dt, kGpu), pre = Tensor::empty({M, N}, dt, kGpu);
      ASSERT_TRUE(cuda::gemm_bias_gelu_supported(a, b, bias, y, pre)) << "cuBLASLt has no GELU_AUX_BIAS kernel";
      cuda::gemm_bias_gelu(a, b, bias, y, pre);
      std::vector<double> pre_ref = matmul_ref(a, b), y_ref(pre_ref.size());
      const std::vector<double> bv = bias.to_vector<double>();
      for (size_t i = 0; i < pre_ref.size(); ++i) {
        pre_ref[i] += bv[i % size_t(N)];
        y_ref[i] = gelu_ref(pre_ref[i]);
      }
      // One rounding to 16 bits of an f32 result: a few units of the 16-bit format's last place.
      const double tol = dt == DType::bf16 ? 1e-2 : 2e-3;
      EXPECT_LT(rel_err(pre, pre_ref), tol);
      EXPECT_LT(rel_err(y, y_ref), tol);

    }
  }
}

TEST(GemmGeluEpilogueCuda, BadOperandsAreRefusedWithTheirShapes) {
  REEL_REQUIRE_GPU();
  auto bf16 = [](Shape s) { return zeros(s, TensorOptions{DType::bf16, kGpu}); };
  // cuBLASLt wants the pre-activation's leading dimension divisible by 8: a width of 20 is not taken.
  EXPECT_FALSE(cuda::gemm_bias_gelu_supported(bf16({16, 32}), bf16({32, 20}), bf16({20}), bf16({16, 20}), bf16({16, 20})));
  // A pre-activation of another dtype or shape, or mismatched inner dimensions.
  EXPECT_FALSE(cuda::gemm_bias_gelu_supported(bf16({16, 32}), bf16({32, 64}), bf16({64}), bf16({16, 64}),
                                              zeros({16, 64}, TensorOptions{DType::f32, kGpu})));
  EXPECT_FALSE(cuda::gemm_bias_gelu_supported(bf16({16, 32}), bf16({32, 64}), bf16({64}), bf16({16, 64}), bf16({8, 64})));
  EXPECT_FALSE(cuda::gemm_bias_gelu_supported(bf16({16, 32}), bf16({24, 64}), bf16({64}), bf16({16, 64}), bf16({16, 64})));
  testing_util::expect_error(
      [&] { cuda::gemm_bias_gelu(bf16({16, 32}), bf16({24, 64}), bf16({64}), bf16({16, 64}), bf16({16, 64})); },
      {"gemm_bias_gelu", "(16, 32)", "(24, 64)"});
  testing_util::expect_error(
      [&] { cuda::gemm_bias_gelu(bf16({16, 32}), bf16({32, 64}), bf16({64}), bf16({16, 64}), bf16({16, 32})); },
      {"gemm_bias_gelu", "pre-activation (16, 32)"});
}

TEST(FuseGemmGeluCuda, MlpRunsGeluInsideItsGemmsWithinToleranceOfEager) {
  // x -> fc (bias) -> GELU -> fc2 -> sum of squares, under 16-bit autocast. Compiled, fc's GEMM writes
  // GELU's output and keeps the pre-activation, which GELU's backward (an elementwise kernel) reads.
  // With a hidden width cuBLASLt cannot take (36), GELU keeps a kernel of its own.
  REEL_REQUIRE_GPU();
  Generator gen(12);
  for (const char* prec : {"bf16", "fp16"}) {
    for (int64_t hidden : {128, 36}) {
      SCOPED_TRACE(std::string(prec) + ", hidden " + std::to_string(hidden));
      const int64_t d = 32;
      auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
        AutocastGuard amp(PrecisionPolicy::parse(prec));
        std::vector<Tensor> p;  // Wf, bf, Wo as leaves of this call
        for (size_t k = 1; k < in.size(); ++k) {
          p.push_back(in[k].detach());
          p.back().set_requires_grad(true);
        }
        const PrecisionPolicy& pol = autocast_policy();
        Tensor h = autocast_matmul(in[0], p[0].t(), pol) + p[1];  // (B, T, hidden)
        Tensor z = autocast_matmul(gelu(h), p[2].t(), pol);       // (B, T, d)
        Tensor loss = sum(z * z);
        loss.backward();
        return {loss, p[0].grad(), p[1].grad(), p[2].grad()};
      };
      std::vector<Tensor> in = {randn({2, 40, d}, {}, &gen).to(kGpu), (randn({hidden, d}, {}, &gen) * 0.2).to(kGpu),
                                (randn({hidden}, {}, &gen) * 0.1).to(kGpu), (randn({d, hidden}, {}, &gen) * 0.1).to(kGpu)};
      compile::CompiledFunction f = compile::compile(fn, {compile::Mode::ReduceOverhead, 8, true});
      std::vector<Tensor> eager = fn(in), out;
      for (int i = 0; i < 3; ++i) out = f(in);
      ASSERT_NE(f.last_plan(), nullptr);
      int in_gemm = 0, gelu_alone = 0, backward = 0;
      for (const compile::Node& n : f.last_plan()->graph().nodes) {
        in_gemm += n.fused == std::vector<std::string>{"matmul", "copy", "add", "copy", "gelu", "copy"} &&
                   n.outputs.size() == 2;
        gelu_alone += n.op == OpKind::Gelu ||
                      (std::find(n.fused.begin(), n.fused.end(), "gelu") != n.fused.end() && n.fused.front() != "matmul");
        backward += n.op == OpKind::GeluBackward ||
                    std::find(n.fused.begin(), n.fused.end(), "gelu_backward") != n.fused.end();
      }
      const bool fits = hidden % 8 == 0;
      EXPECT_EQ(in_gemm, fits ? 1 : 0) << f.last_plan()->graph().str();
      EXPECT_EQ(gelu_alone, fits ? 0 : 1) << f.last_plan()->graph().str();
      EXPECT_EQ(backward, 1) << f.last_plan()->graph().str();
      ASSERT_EQ(out.size(), eager.size());
      for (size_t k = 0; k < out.size(); ++k)
        EXPECT_LT(testing_util::max_rel_diff(out[k], eager[k]), 5e-2) << "output " << k;
    }
  }
}

TEST(FuseGemmGeluCuda, ExactGeluStaysInItsKernelAndTheLogSaysWhy) {
  // A ViT's MLP: exact (erf) GELU. cuBLASLt's GELU epilogue is the tanh form, so the GEMM keeps its
  // bias epilogue alone, the casts and gelu_erf become one elementwise kernel, and REEL_LOG=fusion
  // says why the epilogue did not take the GELU.
  REEL_REQUIRE_GPU();
  Generator gen(13);
  const int64_t d = 32, hidden = 128;
  auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    AutocastGuard amp(PrecisionPolicy::parse("bf16"));
    const PrecisionPolicy& pol = autocast_policy();
    Tensor h = autocast_matmul(in[0], in[1].t(), pol) + in[2];
    return {autocast_matmul(gelu(h, "none"), in[3].t(), pol)};
  };
  std::vector<Tensor> in = {randn({2, 40, d}, {}, &gen).to(kGpu), (randn({hidden, d}, {}, &gen) * 0.2).to(kGpu),
                            (randn({hidden}, {}, &gen) * 0.1).to(kGpu), (randn({d, hidden}, {}, &gen) * 0.1).to(kGpu)};
  std::string log;
  compile::CompiledFunction f = compile::compile(fn, {compile::Mode::ReduceOverhead, 8, true});
  {
    testing_util::ScopedEnv env("REEL_LOG", "fusion");
    testing::internal::CaptureStderr();
    for (int i = 0; i < 3; ++i) f(in);  // warm-up, trace, replay: the plan exists from the third call
    log = testing::internal::GetCapturedStderr();
  }
  EXPECT_NE(log.find("gemm_gelu: gemm_epilogue k"), std::string::npos) << log.substr(0, 3000);
  EXPECT_NE(log.find("the GELU is the exact (erf) form"), std::string::npos) << log.substr(0, 3000);
  ASSERT_NE(f.last_plan(), nullptr);
  int erf_in_elementwise = 0;
  for (const compile::Node& n : f.last_plan()->graph().nodes)
    erf_in_elementwise += n.op == OpKind::FusedElementwise &&
                          std::find(n.fused.begin(), n.fused.end(), "gelu_erf") != n.fused.end();
  EXPECT_EQ(erf_in_elementwise, 1) << f.last_plan()->graph().str();
  EXPECT_LT(testing_util::max_rel_diff(f(in)[0], fn(in)[0]), 5e-2);
}

#endif  // REEL_CUDA
