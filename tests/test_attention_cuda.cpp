// Fused attention on the GPU against the CPU op (kernels/cpu/attention.cpp): forward y and lse,
// backward dqkv, for the tiled tensor-core kernels (16-bit compute, head sizes 32, 64, 128, T a
// multiple of the 64-row tile or not; mma.sync kernels at 32 and 64, in both register builds) and the
// row kernels (f32 compute, and head sizes the tiles do not take), f32 and 16-bit qkv; causal, and
// not causal (ViT's T = 65, 3 heads of 64) without and with additive masks of several broadcast shapes
// (a key padding with a batch of rows whose keys are all ignored, an expanded view read in place);
// and the same bits on a second run (no atomics). These are reel's own kernels: cuDNN's fused attention,
// which takes some of these calls by default, is off here (tests/test_attention_cudnn.cpp holds it to the
// same references). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_runs.h"
#include "test_util.h"

using namespace reel;

namespace {

using testing_util::attention_run;
using testing_util::AttentionRun;

// The additive mask of `shape` in dtype dt: N(0, 1) values with -inf at every fifth entry, or, for a
// (B, 1, 1, T) shape, a key padding: batch b ignores its last b + 1 keys, the last batch all of them.
Tensor test_mask(const Shape& shape, DType dt, Generator& gen) {
  std::vector<double> v = randn(shape, TensorOptions{DType::f64}, &gen).to_vector<double>();
  const bool padding = shape.size() == 4 && shape[1] == 1 && shape[2] == 1;
  const int64_t B = shape[0], T = shape.back();
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t b = int64_t(i) / T, s = int64_t(i) % T;
    if (padding) v[i] = (b == B - 1 || s >= T - 1 - b) ? -INFINITY : 0.0;
    else if (i % 5 == 2) v[i] = -INFINITY;
  }
  return tensor(v, shape, TensorOptions{dt});
}

}  // namespace

TEST(AttentionCuda, MatchesTheCpuForEveryKernelPath) {
  REEL_REQUIRE_GPU();
  testing_util::ScopedCudnnAttention readable_kernels(CudnnAttention::Off);
  const Device gpu = Device::cuda(0);
  struct Case {
    int64_t B, T, H, hd;
    DType storage, compute;
  };
  const Case cases[] = {
      {2, 256, 8, 64, DType::f32, DType::bf16},   // gpt-small's shape (tiled)
      {12, 256, 8, 64, DType::f32, DType::bf16},  // grids of several waves: the register-bounded builds
      {2, 128, 4, 64, DType::f32, DType::f16},    // gpt-tiny's, fp16 (tiled)
      {3, 100, 4, 32, DType::f32, DType::bf16},   // T not a multiple of 64 (tiled)
      {1, 130, 2, 128, DType::f32, DType::bf16},  // head size 128 (tiled)
      {2, 70, 2, 64, DType::bf16, DType::bf16},   // 16-bit qkv (tiled)
      {2, 33, 3, 24, DType::f32, DType::bf16},    // head size the tiles do not take (rows)
      {2, 90, 4, 64, DType::f32, DType::f32},     // f32 compute (rows)
      {1, 17, 2, 5, DType::f64, DType::f64},      // f64 (rows)
  };
  Generator gen(31);
  for (const Case& c : cases) {
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " H " + std::to_string(c.H) + " hd " +
                 std::to_string(c.hd) + " " + dtype_name(c.storage) + " compute " + dtype_name(c.compute));
    const int64_t d = c.H * c.hd;
    Tensor qkv = (randn({c.B, c.T, 3 * d}, {}, &gen) * 1.5).to(c.storage);
    Tensor dy = randn({c.B, c.T, d}, {}, &gen).to(c.storage);
    AttentionRun cpu = attention_run(qkv, dy, c.H, c.compute);
    AttentionRun dev = attention_run(qkv.to(gpu), dy.to(gpu), c.H, c.compute);
    // 16-bit compute rounds P and dS, whose f32 values differ in the last bits between the backends'
    // summation orders: a rounding step apart at most.
    const double tol = c.compute == DType::f64 ? 1e-12 : c.compute == DType::f32 ? 2e-5 : 2e-2;
    EXPECT_LT(testing_util::max_rel_diff(dev.y, cpu.y), tol) << "y";
    EXPECT_LT(testing_util::max_rel_diff(dev.lse, cpu.lse), 1e-5) << "lse";
    EXPECT_LT(testing_util::max_rel_diff(dev.dqkv, cpu.dqkv), tol) << "dqkv";
    testing_util::expect_same_bits(attention_run(qkv.to(gpu), dy.to(gpu), c.H, c.compute), dev);
  }
}

TEST(AttentionCuda, NonCausalAndMaskedMatchTheCpuForEveryKernelPath) {
  REEL_REQUIRE_GPU();
  testing_util::ScopedCudnnAttention readable_kernels(CudnnAttention::Off);
  const Device gpu = Device::cuda(0);
  enum class M { none, square, padding, heads, full };
  struct Case {
    int64_t B, T, H, hd;
    DType storage, compute;
    bool causal;
    M mask;
  };
  const Case cases[] = {
      {2, 65, 3, 64, DType::f32, DType::bf16, false, M::none},     // ViT-Ti's attention (mma.sync, T = 65)
      {12, 65, 3, 64, DType::f32, DType::bf16, false, M::none},    // several waves: the register-bounded builds
      {2, 65, 3, 64, DType::f32, DType::bf16, false, M::padding},  // ViT with padded batches (a batch all padding)
      {2, 128, 4, 64, DType::f32, DType::f16, false, M::square},   // T a multiple of 64, (T, T) mask
      {3, 100, 4, 32, DType::f32, DType::bf16, true, M::full},     // causal with a (B, H, T, T) mask (mma.sync 32)
      {2, 70, 2, 64, DType::bf16, DType::bf16, false, M::heads},   // 16-bit qkv, (1, H, T, T) mask
      {1, 65, 2, 128, DType::f32, DType::bf16, false, M::none},    // head size 128 (WMMA), not causal
      {3, 130, 2, 128, DType::f32, DType::bf16, true, M::padding}, // WMMA, causal with a key padding
      {1, 65, 2, 128, DType::f32, DType::f16, false, M::square},   // WMMA, (T, T) mask
      {2, 33, 3, 24, DType::f32, DType::bf16, false, M::padding},  // head size the tiles do not take (rows)
      {2, 65, 3, 64, DType::f32, DType::f32, false, M::full},      // f32 compute (rows)
      {2, 17, 2, 5, DType::f64, DType::f64, false, M::padding},    // f64 (rows)
  };
  Generator gen(33);
  for (const Case& c : cases) {
    SCOPED_TRACE("B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " H " + std::to_string(c.H) + " hd " +
                 std::to_string(c.hd) + " " + dtype_name(c.storage) + " compute " + dtype_name(c.compute) +
                 (c.causal ? " causal" : " full") + " mask " + std::to_string(int(c.mask)));
    const int64_t d = c.H * c.hd;
    const DType acc = c.storage == DType::f64 ? DType::f64 : DType::f32;
    Tensor qkv = (randn({c.B, c.T, 3 * d}, {}, &gen) * 1.5).to(c.storage);
    Tensor dy = randn({c.B, c.T, d}, {}, &gen).to(c.storage);
    Tensor mask;
    switch (c.mask) {
      case M::none: break;
      case M::square: mask = test_mask({c.T, c.T}, acc, gen); break;
      case M::padding: mask = test_mask({c.B, 1, 1, c.T}, acc, gen); break;
      case M::heads: mask = test_mask({1, c.H, c.T, c.T}, acc, gen); break;
      case M::full: mask = test_mask({c.B, c.H, c.T, c.T}, acc, gen); break;
    }
    AttentionRun cpu = attention_run(qkv, dy, c.H, c.compute, c.causal, mask);
    AttentionRun dev = attention_run(qkv.to(gpu), dy.to(gpu), c.H, c.compute, c.causal, mask.defined() ? mask.to(gpu) : mask);
    const double tol = c.compute == DType::f64 ? 1e-12 : c.compute == DType::f32 ? 2e-5 : 2e-2;
    EXPECT_LT(testing_util::max_rel_diff(dev.y, cpu.y), tol) << "y";
    // lse: +inf on rows without a key on both, else close.
    std::vector<double> lg = dev.lse.to_vector<double>(), lc = cpu.lse.to_vector<double>();
    for (size_t i = 0; i < lc.size(); ++i) {
      if (std::isinf(lc[i])) EXPECT_EQ(lg[i], lc[i]) << "lse " << i;
      else EXPECT_NEAR(lg[i], lc[i], 1e-5 * std::max(1.0, std::abs(lc[i]))) << "lse " << i;
    }
    EXPECT_LT(testing_util::max_rel_diff(dev.dqkv, cpu.dqkv), tol) << "dqkv";
    testing_util::expect_same_bits(
        attention_run(qkv.to(gpu), dy.to(gpu), c.H, c.compute, c.causal, mask.defined() ? mask.to(gpu) : mask), dev);
  }
}

TEST(AttentionCuda, ABroadcastMaskViewIsReadInPlaceAsItsCopyIs) {
  // The kernels read the mask through its strides: an expanded (stride-0) view of a key padding and a
  // transposed (T, T) mask give the bits their contiguous copies give.
  REEL_REQUIRE_GPU();
  testing_util::ScopedCudnnAttention readable_kernels(CudnnAttention::Off);
  const Device gpu = Device::cuda(0);
  Generator gen(34);
  const int64_t B = 2, T = 65, H = 3, hd = 64, d = H * hd;
  Tensor qkv = (randn({B, T, 3 * d}, {}, &gen) * 1.5).to(gpu), dy = randn({B, T, d}, {}, &gen).to(gpu);
  Tensor pad = test_mask({B, 1, 1, T}, DType::f32, gen).to(gpu);
  Tensor square = test_mask({T, T}, DType::f32, gen).to(gpu);
  const std::pair<Tensor, Tensor> views[] = {{pad.expand({B, H, T, T}), pad.expand({B, H, T, T}).contiguous()},
                                             {square.transpose(0, 1), square.transpose(0, 1).contiguous()}};
  for (const auto& [view, copy] : views)
    for (DType c : {DType::bf16, DType::f32}) {
      AttentionRun a = attention_run(qkv, dy, H, c, false, view), b = attention_run(qkv, dy, H, c, false, copy);
      EXPECT_EQ(a.y.to_vector<double>(), b.y.to_vector<double>()) << dtype_name(c);
      EXPECT_EQ(a.dqkv.to_vector<double>(), b.dqkv.to_vector<double>()) << dtype_name(c);
    }
}

TEST(AttentionCuda, SixteenBitOperandsOffTheCopyAlignmentGiveTheSameBits) {
  // The register-resident kernels fetch 16-bit qkv and dO tiles by cp.async, 16 bytes at a time, so
  // such operands must start 16-byte aligned: a misaligned qkv is first copied to aligned scratch, and
  // the backward reads dy as its dO only when it is aligned (else a prepared copy). Operands 8 bytes
  // off that alignment (views at an offset of 4 elements) must give exactly what aligned copies give.
  REEL_REQUIRE_GPU();
  testing_util::ScopedCudnnAttention readable_kernels(CudnnAttention::Off);
  const Device gpu = Device::cuda(0);
  Generator gen(32);
  const int64_t B = 2, T = 150, H = 2, hd = 64, d = H * hd;
  // Random values in a view 4 elements into its storage, and an aligned copy of them (clone).
  auto offset_randn = [&](const Shape& shape, DType c, double scale) {
    const int64_t n = shape[0] * shape[1] * shape[2];
    return (randn({n + 4}, {}, &gen) * scale).to(c).to(gpu).slice(0, 4, n + 4).view(shape);
  };
  for (DType c : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(c));
    Tensor qkv_off = offset_randn({B, T, 3 * d}, c, 1.5), dy_off = offset_randn({B, T, d}, c, 1.0);
    Tensor qkv = qkv_off.clone(), dy = dy_off.clone();
    ASSERT_EQ(reinterpret_cast<uintptr_t>(qkv.data_ptr()) % 16, 0u);
    ASSERT_NE(reinterpret_cast<uintptr_t>(qkv_off.data_ptr()) % 16, 0u);
    AttentionRun aligned = attention_run(qkv, dy, H, c), off = attention_run(qkv_off, dy_off, H, c);
    EXPECT_EQ(off.y.to_vector<double>(), aligned.y.to_vector<double>()) << "y";
    EXPECT_EQ(off.lse.to_vector<double>(), aligned.lse.to_vector<double>()) << "lse";
    EXPECT_EQ(off.dqkv.to_vector<double>(), aligned.dqkv.to_vector<double>()) << "dqkv";
  }
}
