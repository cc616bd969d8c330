// Compile fusions around the fused ops of a transformer block, on the GPU:
//   - compile/passes/fuse_attention_cast.cpp: attention (and its backward) also writes autocast's 16-bit
//     copy of its result, to the bit, and the cast node goes;
//   - compile/passes/fuse_norm_backward_add.cpp: layer_norm_backward writes dx + the residual branch's gradient,
//     and the add node goes (and a later cast of it joins);
//   - compile/passes/fuse_bias_grad_cast.cpp: a bias gradient sums the 16-bit copy of its gradient (f32
//     accumulation), and the f32 gradient is no longer written when nothing else reads it; the column
//     sums it calls (kernels/cuda/column_sums.h) give the f32 Sum op's bits, checked on both routes;
//   - compile/passes/store_gemm_16bit.cpp: GEMM results that attention or GELU read
//     are written in 16 bits, and attention's backward reads the 16-bit y (fuse_attention_cast.h);
//     GELU then joins the GEMM before it (compile/passes/fuse_gemm_gelu.cpp, also in test_gemm_gelu_cuda.cpp).
// Each pass fires on a traced function shaped like the block's use (the norm's not when dx has another
// reader), and the compiled function equals eager: to the bit where only these passes change kernels. Skips without a GPU; compiled only with the CUDA backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "autograd/autocast.h"
#include "compile/runtime/compile.h"
#include "kernels/dispatch.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/gemm_epilogue.h"
#include "kernels/dispatch.h"
#include "reel.h"
#include "test_util.h"

#ifdef REEL_CUDA

using namespace reel;

namespace {

const Device kGpu = Device::cuda(0);

std::string fused_ops(const compile::Node& n) {
  std::string out;
  for (const std::string& op : n.fused) out += op + " ";
  return out;
}

size_t nodes_fused_as(const compile::Plan& p, const std::vector<std::string>& ops) {
  size_t n = 0;
  for (const compile::Node& node : p.graph().nodes) n += node.fused == ops;
  return n;
}

// An uninitialised tensor of t's shape and device in dtype dt (a kernel's output buffer).
Tensor like(const Tensor& t, DType dt) { return Tensor::empty(t.shape(), dt, t.device()); }

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
      std::vector<Tensor> f = dispatch(OpKind::Attention, {qkv}, a);
      Tensor dqkv = dispatch(OpKind::AttentionBackward, {dy, qkv, f[0], f[1]}, a)[0];
      Tensor y = like(f[0], f[0].dtype()), lse = like(f[1], f[1].dtype()), y16 = like(f[0], c);
      Tensor dx = like(dqkv, dqkv.dtype()), dx16 = like(dqkv, c);
      cuda::attention_fwd_into(qkv, H, c, y, lse, y16);
      cuda::attention_bwd_into(dy, qkv, f[0], f[1], H, c, dx, dx16);
      expect_bitwise({y, lse, y16, dx, dx16}, {f[0], f[1], to_dtype(f[0], c), dqkv, to_dtype(dqkv, c)});
    }
  }
}

TEST(FuseAttentionCastCuda, KernelsRead16BitQkvAndYAsTheirRoundedF32) {
  // The compiler hands the kernels qkv (forward, backward), y and dy (backward) in the compute dtype
  // beside an f32 dqkv, or none. They round each to it before use, so 16-bit operands must give exactly
  // what their f32 images give; the forward may leave the f32 y out.
  REEL_REQUIRE_GPU();
  Generator gen(44);
  for (int64_t hd : {64, 24}) {  // the tiled kernels and the row kernels
    for (DType c : {DType::bf16, DType::f16}) {
      SCOPED_TRACE("head size " + std::to_string(hd) + ", " + dtype_name(c));
      const int64_t H = 2, d = H * hd;
      Tensor qkv16 = to_dtype(randn({2, 70, 3 * d}, {}, &gen).to(kGpu), c), dy = randn({2, 70, d}, {}, &gen).to(kGpu);
      Tensor qkv = to_dtype(qkv16, DType::f32);
      Attrs a = Attrs().set("heads", H).set("compute", c);
      std::vector<Tensor> f = dispatch(OpKind::Attention, {qkv}, a);  // f32 reference
      Tensor y = like(f[0], DType::f32), lse = like(f[1], DType::f32), y16 = like(f[0], c);
      cuda::attention_fwd_into(qkv16, H, c, y, lse, y16);
      expect_bitwise({y, lse, y16}, {f[0], f[1], to_dtype(f[0], c)});
      Tensor lse_only = like(f[1], DType::f32), y16_only = like(f[0], c);
      cuda::attention_fwd_into(qkv16, H, c, Tensor(), lse_only, y16_only);  // no f32 y
      expect_bitwise({lse_only, y16_only}, {f[1], y16});
      // Backward: qkv and y in 16 bits against their f32 images, one at a time and together.
      Tensor y16_as_f32 = to_dtype(y16, DType::f32);
      Tensor want = dispatch(OpKind::AttentionBackward, {dy, qkv, y16_as_f32, f[1]}, a)[0];
      for (int variant = 0; variant < 3; ++variant) {
        const Tensor& q_in = variant == 1 ? qkv : qkv16;
        const Tensor& y_in = variant == 0 ? y16_as_f32 : y16;
        Tensor dx = like(want, DType::f32), dx16 = like(want, c);
        cuda::attention_bwd_into(dy, q_in, y_in, f[1], H, c, dx, dx16);
        expect_bitwise({dx, dx16}, {want, to_dtype(want, c)});
      }
      Tensor dx16_only = like(want, c);  // no f32 dqkv asked for
      cuda::attention_bwd_into(dy, qkv16, y16, f[1], H, c, Tensor(), dx16_only);
      expect_bitwise({dx16_only}, {to_dtype(want, c)});
      // dy in 16 bits (a GEMM's result, compile/passes/fuse_matmul_cast.cpp) against its f32 image: with the
      // f32 dqkv (f32 values) and without it (every operand 16-bit).
      Tensor dy16 = to_dtype(dy, c), dy16_as_f32 = to_dtype(dy16, DType::f32);
      Tensor want_dy16 = dispatch(OpKind::AttentionBackward, {dy16_as_f32, qkv, y16_as_f32, f[1]}, a)[0];
      Tensor dx = like(want, DType::f32), dx16 = like(want, c), dx16_alone = like(want, c);
      cuda::attention_bwd_into(dy16, qkv16, y16, f[1], H, c, dx, dx16);
      expect_bitwise({dx, dx16}, {want_dy16, to_dtype(want_dy16, c)});
      cuda::attention_bwd_into(dy16, qkv16, y16, f[1], H, c, Tensor(), dx16_alone);
      expect_bitwise({dx16_alone}, {to_dtype(want_dy16, c)});
    }
  }
  // Other dtypes are refused with the operand's name and shape.
  Tensor qkv = randn({1, 8, 12}, {}, &gen).to(kGpu);
  Tensor y = Tensor::empty({1, 8, 4}, DType::f32, kGpu), lse = Tensor::empty({1, 2, 8}, DType::f32, kGpu);
  testing_util::expect_error(
      [&] { cuda::attention_fwd_into(to_dtype(qkv, DType::f16), 2, DType::bf16, y, lse, Tensor()); },
      {"attention: qkv (1, 8, 12) is f16; expected f32 (the value dtype) or bf16 (the compute dtype)"});
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
    EXPECT_EQ(nodes_fused_as(*f.last_plan(), {"attention", "copy"}), 1u) << f.last_plan()->graph().str();
    EXPECT_EQ(nodes_fused_as(*f.last_plan(), {"attention_backward", "copy"}), 1u);
    // Only the backward reads the f32 y: it reads y16 instead, and the forward writes no f32 y.
    for (const compile::Node& n : f.last_plan()->graph().nodes) {
      if (n.op == OpKind::AttentionCast) {
        ASSERT_EQ(n.outputs.size(), 2u) << "lse and y16 only";
        EXPECT_EQ(n.outputs[1].dtype, DType::bf16);
      }
      if (n.op == OpKind::AttentionBackwardCast) {  // reads y16; writes dqkv16 only (no f32 reader)
        EXPECT_EQ(n.inputs[2]->dtype, DType::bf16);
        ASSERT_EQ(n.outputs.size(), 1u);
        EXPECT_EQ(n.outputs[0].dtype, DType::bf16);
      }
    }
    // Other passes change roundings here (a GEMM writing f32 from its accumulator): near, not equal.
    ASSERT_EQ(out.size(), eager.size());
    for (size_t k = 0; k < out.size(); ++k)
      EXPECT_LT(testing_util::max_rel_diff(out[k], eager[k]), 3e-2) << "output " << k;
  }
}

TEST(StoreGemmBias16BitCuda, QkvAndGeluInputsAreKeptIn16BitsWithinToleranceOfEager) {
  // A transformer block's two GEMMs whose f32 results are kept for the backward, under bf16 autocast:
  // qkv = x Wq^T + bq read by attention, h = y Wf^T + bf read by GELU (and by its backward). Compiled,
  // both GEMMs write bf16 (compile/passes/fuse_gemm_epilogue.cpp): attention reads it as it is, GELU through a
  // cast its kernel folds in.
  REEL_REQUIRE_GPU();
  Generator gen(45);
  for (int64_t hd : {64, 24}) {
    SCOPED_TRACE("head size " + std::to_string(hd));
    const int64_t H = 2, d = H * hd;
    auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
      AutocastGuard amp(PrecisionPolicy::parse("bf16"));
      std::vector<Tensor> p;  // Wq, bq, Wf, bf, Wo as leaves of this call
      for (size_t k = 1; k < in.size(); ++k) {
        p.push_back(in[k].detach());
        p.back().set_requires_grad(true);
      }
      const PrecisionPolicy& pol = autocast_policy();
      Tensor qkv = autocast_matmul(in[0], p[0].t(), pol) + p[1];            // (B, T, 3d) f32
      Tensor y = scaled_causal_attention(qkv, H, DType::bf16);             // (B, T, d)
      Tensor h = autocast_matmul(y, p[2].t(), pol) + p[3];                  // (B, T, 4d)
      Tensor z = autocast_matmul(gelu(h), p[4].t(), pol);                   // (B, T, d)
      Tensor loss = sum(z * z);
      loss.backward();
      return {loss, p[0].grad(), p[1].grad(), p[2].grad(), p[3].grad(), p[4].grad()};
    };
    std::vector<Tensor> in = {randn({2, 70, d}, {}, &gen).to(kGpu), (randn({3 * d, d}, {}, &gen) * 0.2).to(kGpu),
                              (randn({3 * d}, {}, &gen) * 0.1).to(kGpu), (randn({4 * d, d}, {}, &gen) * 0.2).to(kGpu),
                              (randn({4 * d}, {}, &gen) * 0.1).to(kGpu), (randn({d, 4 * d}, {}, &gen) * 0.1).to(kGpu)};
    compile::CompiledFunction f = compile::compile(fn, {compile::Mode::ReduceOverhead, 8, true});
    std::vector<Tensor> eager = fn(in), out;
    for (int i = 0; i < 3; ++i) out = f(in);
    ASSERT_NE(f.last_plan(), nullptr);
    const compile::Graph& g = f.last_plan()->graph();
    int gemm16 = 0, gemm32 = 0;
    std::vector<int> written16;  // the buffers the 16-bit GEMMs write
    for (const compile::Node& n : g.nodes) {
      if (n.fused.size() < 3 || std::vector<std::string>(n.fused.begin(), n.fused.begin() + 3) !=
                                    std::vector<std::string>{"matmul", "copy", "add"} || n.in_place)
        continue;
      (n.outputs[0].dtype == DType::bf16 ? gemm16 : gemm32) += 1;
      for (const compile::TensorRef& r : n.outputs)
        if (r.dtype == DType::bf16) written16.push_back(r.buffer);
    }
    {  // cuBLASLt's support for the 16-bit result, with an f32 bias and with a 16-bit one
      Tensor a = Tensor::empty({140, d}, DType::bf16, kGpu), w = Tensor::empty({d, 3 * d}, DType::bf16, kGpu);
      Tensor y = Tensor::empty({140, 3 * d}, DType::bf16, kGpu);
      const bool f32_bias = cuda::gemm_bias_supported(a, w, Tensor::empty({3 * d}, DType::f32, kGpu), y);
      const bool bf16_bias = cuda::gemm_bias_supported(a, w, Tensor::empty({3 * d}, DType::bf16, kGpu), y);
      std::printf("cuBLASLt bias epilogue, bf16 result: f32 bias %s, bf16 bias %s\n", f32_bias ? "yes" : "no",
                  bf16_bias ? "yes" : "no");
      EXPECT_TRUE(f32_bias || bf16_bias);
    }
    EXPECT_EQ(gemm16, 2) << g.str();
    EXPECT_EQ(gemm32, 0);
    for (const compile::Node& n : g.nodes) {
      if (n.op == OpKind::Attention || n.op == OpKind::AttentionCast) {
        EXPECT_EQ(n.inputs[0]->dtype, DType::bf16);
      }
      if (n.op == OpKind::AttentionBackward || n.op == OpKind::AttentionBackwardCast) {
        EXPECT_EQ(n.inputs[1]->dtype, DType::bf16);
      }
      // GELU runs in the epilogue of the GEMM that writes h (compile/passes/fuse_gemm_gelu.cpp), and its
      // backward reads h in bf16 through a cast its kernel folds in: no node writes an f32 copy of h.
      const bool gelu = std::find(n.fused.begin(), n.fused.end(), "gelu") != n.fused.end();
      const bool gelu_backward = std::find(n.fused.begin(), n.fused.end(), "gelu_backward") != n.fused.end();
      if (gelu) {
        EXPECT_EQ(n.fused.front(), "matmul") << fused_ops(n);
        ASSERT_EQ(n.outputs.size(), 2u) << fused_ops(n);
        EXPECT_EQ(n.outputs[1].dtype, DType::bf16);
        EXPECT_EQ(n.outputs[1].shape.back(), 4 * d);
      }
      if (gelu_backward) {
        EXPECT_EQ(n.fused.front(), "copy") << fused_ops(n);
        bool reads_bf16 = false;
        for (const auto& r : n.inputs) reads_bf16 = reads_bf16 || (r && r->dtype == DType::bf16 && r->shape.back() == 4 * d);
        EXPECT_TRUE(reads_bf16);
      }
      const bool reads16 = n.op == OpKind::Copy && n.inputs[0] &&
                           std::find(written16.begin(), written16.end(), n.inputs[0]->buffer) != written16.end();
      EXPECT_FALSE(reads16 && n.fused.empty()) << "an unfused cast of a 16-bit GEMM result back to f32";
    }
    // Eager rounds the GEMM results to bf16 before the f32 bias; compiled, the bias itself is rounded
    // (cuBLASLt's epilogue takes it in the result's dtype), and GELU sees the f32 accumulator rather
    // than its rounding: near, not equal.
    ASSERT_EQ(out.size(), eager.size());
    for (size_t k = 0; k < out.size(); ++k)
      EXPECT_LT(testing_util::max_rel_diff(out[k], eager[k]), 5e-2) << "output " << k;
  }
}

TEST(FuseNormBackwardAddCuda, NormBackwardAddsTheResidualAndTheStepEqualsEager) {
  REEL_REQUIRE_GPU();
  Generator gen(42);
  for (int64_t C : {96, 1500, 512}) {  // a warp per row, a block per row, a row in registers
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

// The column sums behind the bias-gradient pass: of a 16-bit x, the f32 sum of its values (against a
// double sum on the host); of an f32 x, the Sum op's own result to the bit; the same bits every run;
// added to a gradient, the bits of the sums and then an add.
TEST(FuseBiasGradCastCuda, ColumnSumsOfA16BitGradient) {
  REEL_REQUIRE_GPU();
  Generator gen(43);
  // N = 300: the generic column reduction for 16-bit x (the 16-byte loads for f32); N a multiple of 8:
  // the 16-byte-load kernel for 16-bit x (one tile, several, a partial last tile, few rows and many).
  for (const Shape& shape : {Shape{37, 50, 300}, Shape{4096, 24}, Shape{3, 1000}, Shape{1024, 2048}, Shape{8, 64, 520}}) {
    SCOPED_TRACE(shape_str(shape));
    const int64_t N = shape.back(), rows = numel_of(shape) / N;
    Tensor x = randn(shape, {}, &gen).to(kGpu);
    Tensor x16 = to_dtype(x, DType::bf16);
    Tensor out = Tensor::empty({N}, DType::f32, kGpu), again = Tensor::empty({N}, DType::f32, kGpu);
    cuda::column_sums_into(x16, out);
    cuda::column_sums_into(x16, again);
    std::vector<double> v = to_dtype(x16, DType::f64).to_vector<double>(), want(size_t(N), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < N; ++j) want[size_t(j)] += v[size_t(r * N + j)];
    EXPECT_LT(testing_util::max_rel_diff(out, Tensor::from_vector<double>(want, {N})), 1e-5);
    EXPECT_EQ(out.to_vector<double>(), again.to_vector<double>());
    std::vector<int64_t> dims;
    for (int64_t d = 0; d + 1 < int64_t(shape.size()); ++d) dims.push_back(d);
    Tensor f32 = Tensor::empty({N}, DType::f32, kGpu);
    cuda::column_sums_into(x, f32);
    EXPECT_EQ(f32.to_vector<double>(), sum(x, dims).to_vector<double>());
    // Accumulating (a gradient over micro-batches): the bits of the sums added to it by an f32 add,
    // for 16-bit x (the wide-load kernel's last write, or N = 300: the sums, then an add) and f32 x.
    for (const Tensor& xs : {x16, x}) {
      Tensor grad = randn({N}, {}, &gen).to(kGpu), sums = Tensor::empty({N}, DType::f32, kGpu);
      Tensor want_grad = grad.clone();
      cuda::column_sums_into(xs, sums);
      want_grad = want_grad + sums;
      cuda::column_sums_into(xs, grad, /*accumulate=*/true);
      EXPECT_EQ(grad.to_vector<double>(), want_grad.to_vector<double>()) << dtype_name(xs.dtype()) << " accumulated";
    }
  }
}

// An f32 bias gradient's Sum over all but the last dim (x (R, N) with outer = 1), on the kernel that
// reads 16 bytes a thread (x 16-byte aligned, N a multiple of 4: one column tile or several, 3 rows or
// 70000) and on the generic column kernels (N odd, with and without split rows; x 4 bytes past a
// 16-byte boundary; more column tiles than finish counters): within 1e-5 of a double loop, the same
// bits on a second run, Mean within 1e-5 of the loop / R, and column_sums_into to the Sum op's bits.
TEST(FuseBiasGradCastCuda, F32ColumnSumsOfTheSumOp) {
  REEL_REQUIRE_GPU();
  Generator gen(45);
  struct Case {
    Shape shape;
    bool misaligned;
  };
  for (const Case& c : {Case{{16, 256, 512}, false}, Case{{4096, 128}, false}, Case{{33, 100}, false},
                        Case{{33, 100}, true}, Case{{33, 101}, false}, Case{{5000, 101}, false},
                        Case{{3, 1000}, false}, Case{{70000, 8}, false}, Case{{1, 64}, false},
                        Case{{2, 600000}, false}}) {
    SCOPED_TRACE(shape_str(c.shape) + (c.misaligned ? " misaligned" : ""));
    const int64_t n = numel_of(c.shape), N = c.shape.back(), rows = n / N;
    Tensor flat = randn({n + 1}, {}, &gen).to(kGpu);  // its data starts 16-byte aligned
    Tensor x = flat.slice(0, c.misaligned ? 1 : 0, c.misaligned ? n + 1 : n).view(c.shape);
    ASSERT_TRUE(x.is_contiguous());
    ASSERT_EQ(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0, c.misaligned);
    std::vector<int64_t> dims;
    for (int64_t d = 0; d + 1 < int64_t(c.shape.size()); ++d) dims.push_back(d);
    std::vector<double> v = x.to_vector<double>(), want(size_t(N), 0.0), want_mean(size_t(N), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < N; ++j) want[size_t(j)] += v[size_t(r * N + j)];
    for (int64_t j = 0; j < N; ++j) want_mean[size_t(j)] = want[size_t(j)] / double(rows);
    Tensor s = sum(x, dims), again = sum(x, dims);
    EXPECT_LT(testing_util::max_rel_diff(s, Tensor::from_vector<double>(want, {N})), 1e-5);
    EXPECT_EQ(s.to_vector<double>(), again.to_vector<double>());
    Tensor m = mean(x, dims), m_again = mean(x, dims);
    EXPECT_LT(testing_util::max_rel_diff(m, Tensor::from_vector<double>(want_mean, {N})), 1e-5);
    EXPECT_EQ(m.to_vector<double>(), m_again.to_vector<double>());
    Tensor cols = Tensor::empty({N}, DType::f32, kGpu);
    cuda::column_sums_into(x, cols);
    EXPECT_EQ(cols.to_vector<double>(), s.to_vector<double>());
  }
}

// A Linear's backward as autocast traces it: g (f32) is summed for the bias and cast to bf16 for the
// GEMM. The pass makes the sum read the bf16 copy (moving it after the cast when it came first), and
// the f32 g is no longer written (the elementwise kernel producing g and its copy writes the copy
// only). Not when db is read between the sum and the cast.
TEST(FuseBiasGradCastCuda, BiasGradientSumsTheSixteenBitCopy) {
  REEL_REQUIRE_GPU();
  Generator gen(44);
  Tensor Wh = to_dtype(randn({96, 40}, {}, &gen).to(kGpu), DType::bf16);
  enum Variant { kSumFirst, kCastFirst, kDbReadBetween };
  for (Variant v : {kSumFirst, kCastFirst, kDbReadBetween}) {
    SCOPED_TRACE(v == kSumFirst ? "sum, then cast" : v == kCastFirst ? "cast, then sum" : "db read in between");
    auto fn = [&, v](const std::vector<Tensor>& in) -> std::vector<Tensor> {
      Tensor g = in[0] * 2.0;
      Tensor db, g16, db3;
      if (v != kCastFirst) db = sum(g, {0, 1});
      if (v == kDbReadBetween) db3 = db * 3.0;
      g16 = to_dtype(g, DType::bf16);
      if (v == kCastFirst) db = sum(g, {0, 1});
      std::vector<Tensor> out = {matmul(g16, Wh), db};
      if (v == kDbReadBetween) out.push_back(db3);
      return out;
    };
    compile::CompiledFunction f = compile::compile(fn, {compile::Mode::ReduceOverhead, 8, true});
    std::vector<Tensor> in = {randn({8, 64, 96}, {}, &gen).to(kGpu)};
    std::vector<Tensor> eager = fn(in), out;
    for (int i = 0; i < 3; ++i) out = f(in);
    ASSERT_NE(f.last_plan(), nullptr);
    const compile::Plan& p = *f.last_plan();
    size_t sums_of_16bit = 0, f32_g_writes = 0;
    for (const compile::Node& n : p.graph().nodes) {
      sums_of_16bit += n.op == OpKind::ColumnSums && n.inputs[0]->dtype == DType::bf16;
      for (const compile::TensorRef& r : n.outputs) f32_g_writes += r.dtype == DType::f32 && r.shape == Shape{8, 64, 96};
    }
    const bool fused = v != kDbReadBetween;
    EXPECT_EQ(sums_of_16bit, fused ? 1u : 0u) << p.graph().str();
    EXPECT_EQ(f32_g_writes, fused ? 0u : 1u) << p.graph().str();
    ASSERT_EQ(out.size(), eager.size());
    expect_bitwise({out[0]}, {eager[0]});  // the GEMM: the same bf16 operand
    if (fused) EXPECT_LT(testing_util::max_rel_diff(out[1], eager[1]), 1e-2);  // summands rounded to bf16
    else expect_bitwise({out[1], out[2]}, {eager[1], eager[2]});
  }
}

#endif  // REEL_CUDA
