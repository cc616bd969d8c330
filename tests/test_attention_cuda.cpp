// Fused causal self-attention on the GPU against the CPU op (kernels/cpu/attention.cpp): forward y and
// lse, backward dqkv, for the tiled tensor-core kernels (16-bit compute, head sizes 32, 64, 128, T a
// multiple of the 64-row tile or not; mma.sync kernels at 32 and 64, in both register builds) and the row kernels (f32 compute, and head sizes the tiles do not
// take), f32 and 16-bit qkv; and the same bits on a second run (no atomics). Skips without a GPU.
#include <gtest/gtest.h>

#include "kernels/dispatch.h"
#include "test_util.h"

using namespace reel;

namespace {

struct AttentionRun {
  Tensor y, lse, dqkv;
};

AttentionRun run(const Tensor& qkv, const Tensor& dy, int64_t heads, DType compute) {
  Attrs a = Attrs().set("heads", heads).set("compute", compute);
  std::vector<Tensor> f = dispatch(OpKind::CausalAttention, {qkv}, a);
  Tensor dqkv = dispatch(OpKind::CausalAttentionBackward, {dy, qkv, f[0], f[1]}, a)[0];
  return {f[0], f[1], dqkv};
}

}  // namespace

TEST(CausalAttentionCuda, MatchesTheCpuForEveryKernelPath) {
  REEL_REQUIRE_GPU();
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
    AttentionRun cpu = run(qkv, dy, c.H, c.compute);
    AttentionRun dev = run(qkv.to(gpu), dy.to(gpu), c.H, c.compute);
    // 16-bit compute rounds P and dS, whose f32 values differ in the last bits between the backends'
    // summation orders: a rounding step apart at most.
    const double tol = c.compute == DType::f64 ? 1e-12 : c.compute == DType::f32 ? 2e-5 : 2e-2;
    EXPECT_LT(testing_util::max_rel_diff(dev.y, cpu.y), tol) << "y";
    EXPECT_LT(testing_util::max_rel_diff(dev.lse, cpu.lse), 1e-5) << "lse";
    EXPECT_LT(testing_util::max_rel_diff(dev.dqkv, cpu.dqkv), tol) << "dqkv";
    AttentionRun again = run(qkv.to(gpu), dy.to(gpu), c.H, c.compute);
    EXPECT_EQ(again.dqkv.to_vector<double>(), dev.dqkv.to_vector<double>()) << "dqkv changed between runs";
    EXPECT_EQ(again.y.to_vector<double>(), dev.y.to_vector<double>()) << "y changed between runs";
  }
}

TEST(CausalAttentionCuda, SixteenBitOperandsOffTheCopyAlignmentGiveTheSameBits) {
  // The register-resident kernels fetch 16-bit qkv and dO tiles by cp.async, 16 bytes at a time, so
  // such operands must start 16-byte aligned: a misaligned qkv is first copied to aligned scratch, and
  // the backward reads dy as its dO only when it is aligned (else a prepared copy). Operands 8 bytes
  // off that alignment (views at an offset of 4 elements) must give exactly what aligned copies give.
  REEL_REQUIRE_GPU();
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
    AttentionRun aligned = run(qkv, dy, H, c), off = run(qkv_off, dy_off, H, c);
    EXPECT_EQ(off.y.to_vector<double>(), aligned.y.to_vector<double>()) << "y";
    EXPECT_EQ(off.lse.to_vector<double>(), aligned.lse.to_vector<double>()) << "lse";
    EXPECT_EQ(off.dqkv.to_vector<double>(), aligned.dqkv.to_vector<double>()) << "dqkv";
  }
}
