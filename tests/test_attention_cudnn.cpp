// cuDNN's fused attention (kernels/cuda/attention_cudnn.cu) held to the CPU op (kernels/cpu/attention.cpp)
// as reel's own CUDA kernels are (tests/test_attention_cuda.cpp): forward y and lse, backward dqkv,
// at the benchmark models' shapes (gpt-small, gpt-tiny, ViT's T = 65 not causal) and off them (T not a
// multiple of 64, head sizes 32 and 128, 16-bit qkv). Each case checks, through the launch counter,
// that cuDNN ran it (the shapes here are ones cuDNN takes on an H100/H200; a refusal fails with
// cuDNN's reason). Also: the same bits on a second run (its deterministic backward); either kind of
// forward feeds either kind of backward (their lse agree); the switch and a mask send calls to reel's
// kernels; Auto's rule picks cuDNN for large grids only; autotuning keeps one implementation per shape,
// whose bits later calls repeat. Skips
// without a GPU or without the cuDNN frontend in the build.
#include <gtest/gtest.h>

#include "attention_runs.h"
#include "test_util.h"

#ifdef REEL_CUDA
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_cudnn.h"

using namespace reel;

namespace {

using testing_util::attention_backward;
using testing_util::attention_forward;
using testing_util::attention_run;
using testing_util::AttentionRun;
// Skips where cuDNN's attention cannot run at all: no GPU, or a build without the frontend.
#define REQUIRE_CUDNN_ATTENTION()                                                                              \
  REEL_REQUIRE_GPU();                                                                                          \
  if (cuda::cudnn_attention_last_refusal().find("no cuDNN frontend") != std::string::npos)                     \
  GTEST_SKIP() << cuda::cudnn_attention_last_refusal()

struct Case {
  int64_t B, T, H, hd;
  DType storage, compute;
  bool causal;
};

std::string name(const Case& c) {
  return "B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " H " + std::to_string(c.H) + " hd " +
         std::to_string(c.hd) + " " + dtype_name(c.storage) + " compute " + dtype_name(c.compute) +
         (c.causal ? " causal" : " full");
}

// 16-bit compute rounds P, dS and (here) O and dQ, dK, dV, in summation orders that differ from the
// CPU's: a rounding step or two of the compute dtype apart.
constexpr double kTol = 2e-2;

void expect_close(const AttentionRun& dev, const AttentionRun& cpu) {
  EXPECT_LT(testing_util::max_rel_diff(dev.y, cpu.y), kTol) << "y";
  std::vector<double> lg = dev.lse.to_vector<double>(), lc = cpu.lse.to_vector<double>();
  ASSERT_EQ(lg.size(), lc.size());
  double worst = 0;
  for (size_t i = 0; i < lc.size(); ++i) worst = std::max(worst, std::abs(lg[i] - lc[i]) / std::max(1.0, std::abs(lc[i])));
  EXPECT_LT(worst, 1e-5) << "lse";
  EXPECT_LT(testing_util::max_rel_diff(dev.dqkv, cpu.dqkv), kTol) << "dqkv";
}

}  // namespace

TEST(AttentionCudnn, MatchesTheCpuAtTheModelsShapesAndOffThem) {
  REQUIRE_CUDNN_ATTENTION();
  testing_util::ScopedCudnnAttention on(CudnnAttention::On);
  const Device gpu = Device::cuda(0);
  const Case cases[] = {
      {2, 256, 8, 64, DType::f32, DType::bf16, true},    // gpt-small
      {2, 128, 4, 64, DType::f32, DType::f16, true},     // gpt-tiny, fp16
      {2, 65, 3, 64, DType::f32, DType::bf16, false},    // ViT-Ti (T = 65, not causal)
      {3, 100, 4, 32, DType::f32, DType::bf16, true},    // T not a multiple of 64, head size 32
      {1, 130, 2, 128, DType::f32, DType::bf16, true},   // head size 128
      {2, 70, 2, 64, DType::bf16, DType::bf16, true},    // 16-bit qkv (and 16-bit y, dqkv)
      {2, 96, 2, 64, DType::f16, DType::f16, false},     // 16-bit fp16 values, not causal
  };
  Generator gen(41);
  for (const Case& c : cases) {
    SCOPED_TRACE(name(c));
    const int64_t d = c.H * c.hd;
    Tensor qkv = (randn({c.B, c.T, 3 * d}, {}, &gen) * 1.5).to(c.storage);
    Tensor dy = randn({c.B, c.T, d}, {}, &gen).to(c.storage);
    AttentionRun cpu = attention_run(qkv, dy, c.H, c.compute, c.causal);
    const int64_t before = cuda::cudnn_attention_calls();
    AttentionRun dev = attention_run(qkv.to(gpu), dy.to(gpu), c.H, c.compute, c.causal);
    ASSERT_EQ(cuda::cudnn_attention_calls() - before, 2) << "cuDNN did not take the forward and the backward: "
                                                         << cuda::cudnn_attention_last_refusal();
    expect_close(dev, cpu);
    testing_util::expect_same_bits(attention_run(qkv.to(gpu), dy.to(gpu), c.H, c.compute, c.causal), dev);
  }
}

TEST(AttentionCudnn, EveryOutputAskedForIsWritten) {
  // The fused cast's entry (kernels/cuda/attention.h) may ask for y and its 16-bit copy together: cuDNN
  // writes O once and the other output is copied from it, whatever their dtypes (f32 y: widened; a
  // 16-bit y beside the 16-bit copy: the same bits twice). Backward likewise for dqkv and its copy.
  REQUIRE_CUDNN_ATTENTION();
  testing_util::ScopedCudnnAttention on(CudnnAttention::On);
  const Device gpu = Device::cuda(0);
  const int64_t B = 2, T = 64, H = 2, hd = 64, d = H * hd;
  Generator gen(46);
  for (DType value : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(value));
    Tensor qkv = randn({B, T, 3 * d}, {}, &gen).to(DType::bf16).to(gpu), dy = randn({B, T, d}, {}, &gen).to(gpu);
    AttentionRun ref = attention_run(qkv, dy.to(DType::bf16), H, DType::bf16, true);  // dispatch: y, dqkv bf16
    Tensor y = Tensor::empty({B, T, d}, value, gpu), y16 = Tensor::empty({B, T, d}, DType::bf16, gpu);
    Tensor lse = Tensor::empty({B, H, T}, DType::f32, gpu);
    const int64_t before = cuda::cudnn_attention_calls();
    cuda::attention_fwd_into(qkv, H, DType::bf16, y, lse, y16, true);
    Tensor dqkv = Tensor::empty({B, T, 3 * d}, value, gpu), dqkv16 = Tensor::empty({B, T, 3 * d}, DType::bf16, gpu);
    cuda::attention_bwd_into(dy.to(DType::bf16), qkv, y16, lse, H, DType::bf16, dqkv, dqkv16, true);
    ASSERT_EQ(cuda::cudnn_attention_calls() - before, 2);
    EXPECT_EQ(y16.to_vector<double>(), ref.y.to_vector<double>());
    EXPECT_EQ(y.to_vector<double>(), ref.y.to_vector<double>());
    EXPECT_EQ(dqkv16.to_vector<double>(), ref.dqkv.to_vector<double>());
    EXPECT_EQ(dqkv.to_vector<double>(), ref.dqkv.to_vector<double>());
  }
}

TEST(AttentionCudnn, EitherForwardFeedsEitherBackward) {
  // The backward reads the forward's lse: cuDNN's Stats and the readable kernels' lse are the same
  // quantity (natural log of the scaled scores' sum), so the mixed pairs match the CPU too.
  REQUIRE_CUDNN_ATTENTION();
  const Device gpu = Device::cuda(0);
  const int64_t B = 2, T = 128, H = 4, hd = 64, d = H * hd;
  Generator gen(42);
  Tensor qkv = randn({B, T, 3 * d}, {}, &gen) * 1.5, dy = randn({B, T, d}, {}, &gen);
  AttentionRun cpu = attention_run(qkv, dy, H, DType::bf16, true);
  Tensor g_qkv = qkv.to(gpu), g_dy = dy.to(gpu);
  for (bool cudnn_forward : {true, false}) {
    SCOPED_TRACE(cudnn_forward ? "cuDNN forward, reel backward" : "reel forward, cuDNN backward");
    const int64_t before = cuda::cudnn_attention_calls();
    AttentionRun dev;
    {
      testing_util::ScopedCudnnAttention f(cudnn_forward ? CudnnAttention::On : CudnnAttention::Off);
      dev = attention_forward(g_qkv, H, DType::bf16, true);
    }
    {
      testing_util::ScopedCudnnAttention b(cudnn_forward ? CudnnAttention::Off : CudnnAttention::On);
      dev.dqkv = attention_backward(g_dy, g_qkv, dev, H, DType::bf16, true);
    }
    EXPECT_EQ(cuda::cudnn_attention_calls() - before, 1);
    expect_close(dev, cpu);
  }
}

TEST(AttentionCudnn, TheSwitchAndAMaskSendCallsToReelsKernels) {
  REQUIRE_CUDNN_ATTENTION();
  const Device gpu = Device::cuda(0);
  const int64_t B = 2, T = 64, H = 2, hd = 64, d = H * hd;
  Generator gen(43);
  Tensor qkv = (randn({B, T, 3 * d}, {}, &gen)).to(gpu), dy = randn({B, T, d}, {}, &gen).to(gpu);
  {
    testing_util::ScopedCudnnAttention off(CudnnAttention::Off);
    const int64_t before = cuda::cudnn_attention_calls();
    attention_run(qkv, dy, H, DType::bf16, true);
    EXPECT_EQ(cuda::cudnn_attention_calls(), before) << "cuDNN ran in mode Off";
  }
  testing_util::ScopedCudnnAttention on(CudnnAttention::On);
  Tensor mask = zeros({T, T}, TensorOptions{DType::f32}).to(gpu);
  const int64_t before = cuda::cudnn_attention_calls();
  AttentionRun masked = attention_run(qkv, dy, H, DType::bf16, false, mask);
  EXPECT_EQ(cuda::cudnn_attention_calls(), before) << "cuDNN's graph has no mask: a masked call is reel's";
  // ... and gives the readable kernels' bits (an all-zero mask: the unmasked result, by reel's kernels).
  testing_util::ScopedCudnnAttention off(CudnnAttention::Off);
  AttentionRun plain = attention_run(qkv, dy, H, DType::bf16, false);
  EXPECT_LT(testing_util::max_rel_diff(masked.y, plain.y), 1e-6);
  EXPECT_LT(testing_util::max_rel_diff(masked.dqkv, plain.dqkv), 1e-6);
}

TEST(AttentionCudnn, AutoTakesCudnnWhereItsBlocksFillTheGpu) {
  // Auto without autotuning (the default): cuDNN where B H ceil(T / 128) reaches the SM count
  // (attention.cu: cudnn_fills_the_gpu). gpt-tiny's shape gives 64 (reel's kernels on any GPU of more
  // SMs, an H100's or H200's 132), gpt-small's at micro-batch 32 gives 512 (cuDNN).
  REQUIRE_CUDNN_ATTENTION();
  testing_util::ScopedCudnnAttention automatic(CudnnAttention::Auto);
  const Device gpu = Device::cuda(0);
  Generator gen(45);
  struct Shape {
    int64_t B, T, H;
    bool cudnn;
  };
  for (const Shape& c : {Shape{16, 128, 4, false}, Shape{32, 256, 8, true}}) {
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " H " + std::to_string(c.H));
    const int64_t d = c.H * 64;
    Tensor qkv = randn({c.B, c.T, 3 * d}, {}, &gen).to(gpu), dy = randn({c.B, c.T, d}, {}, &gen).to(gpu);
    const int64_t before = cuda::cudnn_attention_calls();
    attention_run(qkv, dy, c.H, DType::bf16, true);
    EXPECT_EQ(cuda::cudnn_attention_calls() - before, c.cudnn ? 2 : 0) << cuda::cudnn_attention_last_refusal();
  }
}

TEST(AttentionCudnn, AutotuningKeepsOneImplementationPerShape) {
  // With autotuning on, the first call of a shape times cuDNN against reel's kernels and keeps the
  // faster; its result is that implementation's, bit for bit, and later calls repeat those bits.
  REQUIRE_CUDNN_ATTENTION();
  const Device gpu = Device::cuda(0);
  const int64_t B = 3, T = 192, H = 4, hd = 64, d = H * hd;  // a shape no other test uses: tuned here first
  Generator gen(44);
  Tensor qkv = (randn({B, T, 3 * d}, {}, &gen) * 1.5).to(gpu), dy = randn({B, T, d}, {}, &gen).to(gpu);
  // One forward's outputs feed every backward here, so the backward's choice is checked on its own.
  AttentionRun f;
  Tensor y_reel, d_cudnn, d_reel;
  {
    testing_util::ScopedCudnnAttention on(CudnnAttention::On);
    f = attention_forward(qkv, H, DType::bf16, true);
    d_cudnn = attention_backward(dy, qkv, f, H, DType::bf16, true);
  }
  {
    testing_util::ScopedCudnnAttention off(CudnnAttention::Off);
    y_reel = attention_forward(qkv, H, DType::bf16, true).y;
    d_reel = attention_backward(dy, qkv, f, H, DType::bf16, true);
  }
  auto bits = [](const Tensor& t) { return t.to_vector<double>(); };
  ASSERT_NE(bits(f.y), bits(y_reel)) << "the two forwards agree to the bit: the test could not tell them apart";
  ASSERT_NE(bits(d_cudnn), bits(d_reel)) << "the two backwards agree to the bit: the test could not tell them apart";
  testing_util::ScopedCudnnAttention on(CudnnAttention::Auto);
  set_autotune(true);
  const Tensor y_tuned = attention_forward(qkv, H, DType::bf16, true).y, y_later = attention_forward(qkv, H, DType::bf16, true).y;
  const Tensor d_tuned = attention_backward(dy, qkv, f, H, DType::bf16, true), d_later = attention_backward(dy, qkv, f, H, DType::bf16, true);
  set_autotune(false);
  EXPECT_TRUE(bits(y_tuned) == bits(f.y) || bits(y_tuned) == bits(y_reel)) << "the tuned forward is neither's";
  EXPECT_TRUE(bits(d_tuned) == bits(d_cudnn) || bits(d_tuned) == bits(d_reel)) << "the tuned backward is neither's";
  EXPECT_EQ(bits(y_later), bits(y_tuned));
  EXPECT_EQ(bits(d_later), bits(d_tuned));
}

#endif  // REEL_CUDA
