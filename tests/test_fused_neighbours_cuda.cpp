// Compile fusions around the fused ops of a transformer block, on the GPU:
//   - compile/fuse_attention_cast.h: causal_attention (and its backward) also writes autocast's 16-bit
//     copy of its result, to the bit, and the cast node goes;
//   - compile/fuse_norm_backward_add.h: layer_norm_backward writes dx + the residual branch's gradient,
//     and the add node goes.
// Each pass fires on a traced function shaped like the block's use (the norm's not when dx has another
// reader), and the compiled function equals eager: to the bit where only these passes change kernels. Skips without a GPU; compiled only with the CUDA backend.
#include <gtest/gtest.h>

#include "compile/compile.h"
#include "kernels/dispatch.h"
#include "kernels/cuda/attention.h"
#include "reel.h"
#include "test_util.h"

#ifdef REEL_CUDA

using namespace reel;

namespace {

const Device kGpu = Device::cuda(0);

size_t nodes_fused_as(const compile::Plan& p, const std::vector<std::string>& ops) {
  size_t n = 0;
  for (const compile::Node& node : p.graph().nodes) n += node.fused == ops;
  return n;
}

void expect_bitwise(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].dtype(), b[k].dtype()) << "output " << k;
    EXPECT_EQ(to_dtype(a[k], DType::f64).to_vector<double>(), to_dtype(b[k], DType::f64).to_vector<double>())
        << "output " << k;
  }
}

}  // namespace

TEST(FuseAttentionCastCuda, KernelsWriteTheCastOfTheirResultToTheBit) {
  REEL_REQUIRE_GPU();
  Generator gen(40);
  for (int64_t hd : {64, 24}) {  // the tiled kernels and the row kernels
    for (DType c : {DType::bf16, DType::f16}) {
      SCOPED_TRACE("head size " + std::to_string(hd) + ", " + dtype_name(c));
      const int64_t H = 2, d = H * hd;
      Tensor qkv = randn({2, 70, 3 * d}, {}, &gen).to(kGpu), dy = randn({2, 70, d}, {}, &gen).to(kGpu);
      Attrs a = Attrs().set("heads", H).set("compute", c);
      std::vector<Tensor> f = dispatch(OpKind::CausalAttention, {qkv}, a);
      Tensor dqkv = dispatch(OpKind::CausalAttentionBackward, {dy, qkv, f[0], f[1]}, a)[0];
      auto like = [](const Tensor& t, DType dt) { return Tensor::empty(t.shape(), dt, t.device()); };
      Tensor y = like(f[0], f[0].dtype()), lse = like(f[1], f[1].dtype()), y16 = like(f[0], c);
      Tensor dx = like(dqkv, dqkv.dtype()), dx16 = like(dqkv, c);
      cuda::causal_attention_fwd_into(qkv, H, c, y, lse, y16);
      cuda::causal_attention_bwd_into(dy, qkv, f[0], f[1], H, c, dx, dx16);
      expect_bitwise({y, lse, y16, dx, dx16}, {f[0], f[1], to_dtype(f[0], c), dqkv, to_dtype(dqkv, c)});
    }
  }
}

TEST(FuseAttentionCastCuda, PassFusesTheCastsOfTheResultAndOfTheGradient) {
  REEL_REQUIRE_GPU();
  Generator gen(41);
  for (int64_t hd : {64, 24}) {
    SCOPED_TRACE("head size " + std::to_string(hd));
    const int64_t H = 2, d = H * hd;
    Tensor W = to_dtype(randn({d, 16}, {}, &gen).to(kGpu), DType::bf16);
    // As in a GPT under autocast: qkv arrives in f32 from a 16-bit source (the gradient goes back
    // through a cast to bf16), and y feeds a bf16 GEMM through a cast.
    auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
      Tensor q16 = in[0].detach();
      q16.set_requires_grad(true);
      Tensor y = scaled_causal_attention(to_dtype(q16, DType::f32), H, DType::bf16);
      Tensor z = matmul(to_dtype(y, DType::bf16), W);
      sum(z * z).backward();
      return {z, q16.grad()};
    };
    compile::CompiledFunction f = compile::compile(fn, {compile::Mode::ReduceOverhead, 8, true});
    Tensor x = to_dtype(randn({2, 70, 3 * d}, {}, &gen).to(kGpu), DType::bf16);
    std::vector<Tensor> eager = fn({x}), out;
    for (int i = 0; i < 3; ++i) out = f({x});
    ASSERT_NE(f.last_plan(), nullptr);
    EXPECT_EQ(nodes_fused_as(*f.last_plan(), {"causal_attention", "copy"}), 1u) << f.last_plan()->graph().str();
    EXPECT_EQ(nodes_fused_as(*f.last_plan(), {"causal_attention_backward", "copy"}), 1u);
    // Other passes change roundings here (a GEMM writing f32 from its accumulator): near, not equal.
    ASSERT_EQ(out.size(), eager.size());
    for (size_t k = 0; k < out.size(); ++k)
      EXPECT_LT(testing_util::max_rel_diff(out[k], eager[k]), 3e-2) << "output " << k;
  }
}

TEST(FuseNormBackwardAddCuda, NormBackwardAddsTheResidualAndTheStepEqualsEager) {
  REEL_REQUIRE_GPU();
  Generator gen(42);
  for (int64_t C : {96, 1500}) {  // a warp per row, a block per row
    Tensor w = randn({C}, {}, &gen).to(kGpu), b = randn({C}, {}, &gen).to(kGpu);
    // The residual branch's gradient r is ready before the norm's backward. Variants: the sum also
    // cast to bf16 (the cast joins the kernel); dx read a second time (the pass leaves the add alone).
    enum Variant { kPlain, kCast, kDxTwice };
    for (Variant v : {kPlain, kCast, kDxTwice}) {
      SCOPED_TRACE("C " + std::to_string(C) + (v == kCast ? ", sum cast to bf16" : v == kDxTwice ? ", dx read twice" : ""));
      auto fn = [&, v](const std::vector<Tensor>& in) -> std::vector<Tensor> {
        const Tensor &x = in[0], &g = in[1];
        Tensor r = in[2] * 0.5;
        std::vector<Tensor> f = dispatch(OpKind::LayerNorm, {x, w, b},
                                         Attrs().set("eps", 1e-5).set("normalized_ndim", int64_t(1)));
        std::vector<Tensor> d = dispatch(OpKind::LayerNormBackward, {g, x, w, f[1], f[2]});
        Tensor sum_dx = d[0] + r;
        std::vector<Tensor> out = {sum_dx, d[1], d[2]};
        if (v == kCast) out.push_back(to_dtype(sum_dx, DType::bf16) * 2.0);
        if (v == kDxTwice) out.push_back(d[0] * 2.0);
        return out;
      };
      compile::CompiledFunction f = compile::compile(fn, {compile::Mode::ReduceOverhead, 8, true});
      std::vector<Tensor> in = {randn({3, 50, C}, {}, &gen).to(kGpu), randn({3, 50, C}, {}, &gen).to(kGpu),
                                randn({3, 50, C}, {}, &gen).to(kGpu)};
      std::vector<Tensor> eager = fn(in), out;
      for (int i = 0; i < 3; ++i) out = f(in);
      ASSERT_NE(f.last_plan(), nullptr);
      const compile::Plan& p = *f.last_plan();
      EXPECT_EQ(nodes_fused_as(p, {"layer_norm_backward", "add"}), v == kPlain ? 1u : 0u) << p.graph().str();
      EXPECT_EQ(nodes_fused_as(p, {"layer_norm_backward", "add", "copy"}), v == kCast ? 1u : 0u) << p.graph().str();
      expect_bitwise(out, eager);
    }
  }
}

#endif  // REEL_CUDA
