// Layer norm + cast fusion on the GPU (the layer_norm_cast op, compile/passes/fuse_norm_cast.cpp):
//   - the kernel writes what layer_norm followed by a cast to bf16 or f16 writes, to the bit (y16,
//     mean, rstd), for short rows (a warp each), long ones (a block each), with and without w, b,
//     and from a strided x;
//   - the pass fires on a traced norm whose only reader is the cast (and not when y has another
//     reader), and the compiled function equals eager to the bit under reduce-overhead;
//   - a residual add feeding the norm joins its kernel, also to the bit.
// Skips without a GPU; compiled only with the CUDA backend.
#include <gtest/gtest.h>

#include "compile/runtime/compile.h"
#include "kernels/dispatch.h"
#include "reel.h"
#include "tensor/cuda.h"

#ifdef REEL_CUDA

using namespace reel;

namespace {

const Device kGpu = Device::cuda(0);

size_t norm_cast_nodes(const compile::Plan& p) {
  size_t n = 0;
  for (const compile::Node& node : p.graph().nodes)
    n += node.fused == std::vector<std::string>{"layer_norm", "copy"};
  return n;
}

}  // namespace

TEST(LayerNormCastCuda, KernelEqualsNormThenCastToTheBit) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  Generator gen(11);
  for (int64_t C : {96, 1500}) {
    for (DType dt : {DType::bf16, DType::f16}) {
      for (bool affine : {true, false}) {
        SCOPED_TRACE("C = " + std::to_string(C) + ", " + dtype_name(dt) + (affine ? ", w and b" : ", no w, b"));
        // x as a transposed view: the kernel takes any strides.
        Tensor x = (randn({C, 5, 7}, {}, &gen) * 3.0 + 1.5).to(kGpu).permute({1, 2, 0});
        Tensor w = affine ? randn({C}, {}, &gen).to(kGpu) : Tensor();
        Tensor b = affine ? randn({C}, {}, &gen).to(kGpu) : Tensor();
        // The unfused op, through the dispatch door for its mean and rstd too.
        std::vector<Tensor> unfused =
            dispatch(OpKind::LayerNorm, {x, w, b}, Attrs().set("eps", 1e-5).set("normalized_ndim", int64_t(1)));
        Tensor ref = to_dtype(unfused[0], dt);
        Tensor y16 = Tensor::empty({5, 7, C}, dt, kGpu);
        Tensor mean = Tensor::empty({5, 7}, DType::f32, kGpu), rstd = Tensor::empty({5, 7}, DType::f32, kGpu);
        dispatch_out(OpKind::LayerNormCast, {x, w, b}, {y16, mean, rstd},
                     Attrs().set("eps", 1e-5).set("normalized_ndim", int64_t(1)).set("dtype", dt));
        EXPECT_EQ(to_dtype(y16, DType::f32).to_vector<float>(), to_dtype(ref, DType::f32).to_vector<float>());
        // mean and rstd as the unfused norm's backward reads them.
        EXPECT_EQ(mean.to_vector<float>(), unfused[1].to_vector<float>());
        EXPECT_EQ(rstd.to_vector<float>(), unfused[2].to_vector<float>());
      }
    }
  }
}

TEST(LayerNormCastCuda, PassFusesTheCastAndTheCompiledStepEqualsEager) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  Generator gen(12);
  const int64_t C = 64;
  Tensor w = randn({C}, {}, &gen).to(kGpu), b = randn({C}, {}, &gen).to(kGpu);
  Tensor W = randn({C, 32}, {}, &gen).to(kGpu);
  Tensor Wh = to_dtype(W, DType::bf16);
  // The norm's result feeds a bf16 GEMM, as under autocast; `also_f32` gives y a second reader. The
  // GEMM's bf16 result is returned as it is (cast to f32, the compiler would fuse that cast into the
  // GEMM, which then skips the rounding to bf16: equal within tolerance, not to the bit).
  for (bool also_f32 : {false, true}) {
    SCOPED_TRACE(also_f32 ? "y also read in f32: not fused" : "y read by the cast only");
    auto fn = [&, also_f32](const std::vector<Tensor>& in) -> std::vector<Tensor> {
      Tensor y = layer_norm(in[0], {C}, w, b, 1e-5);
      Tensor z = matmul(to_dtype(y, DType::bf16), Wh);
      if (also_f32) return {z, sum(y)};
      return {z};
    };
    compile::CompiledFunction f = compile::compile(fn, {compile::Mode::ReduceOverhead, 8, true});
    Tensor x = randn({4, 9, C}, {}, &gen).to(kGpu);
    std::vector<Tensor> eager = fn({x});
    std::vector<Tensor> out;
    for (int i = 0; i < 3; ++i) out = f({x});
    ASSERT_NE(f.last_plan(), nullptr);
    EXPECT_EQ(norm_cast_nodes(*f.last_plan()), also_f32 ? 0u : 1u) << f.last_plan()->graph().str();
    ASSERT_EQ(out.size(), eager.size());
    for (size_t k = 0; k < out.size(); ++k) {
      EXPECT_EQ(out[k].dtype(), eager[k].dtype());
      EXPECT_EQ(to_dtype(out[k], DType::f32).to_vector<float>(), to_dtype(eager[k], DType::f32).to_vector<float>());
    }
  }
}

// A pre-norm block's residual add (x = r + h) feeding the norm joins the norm's kernel, which also
// writes x (the residual stream goes on): the compiled function equals eager to the bit.
TEST(LayerNormCastCuda, ResidualAddJoinsTheNormAndTheStepEqualsEager) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  Generator gen(13);
  for (int64_t C : {64, 1500}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    Tensor w = randn({C}, {}, &gen).to(kGpu), b = randn({C}, {}, &gen).to(kGpu);
    Tensor Wh = to_dtype(randn({C, 32}, {}, &gen).to(kGpu), DType::bf16);
    auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
      Tensor h = in[1] * 0.5;
      Tensor x = in[0] + h;
      Tensor y = layer_norm(x, {C}, w, b, 1e-5);
      Tensor z = matmul(to_dtype(y, DType::bf16), Wh);
      return {z, x * 3.0};
    };
    compile::CompiledFunction f = compile::compile(fn, {compile::Mode::ReduceOverhead, 8, true});
    std::vector<Tensor> in = {randn({4, 9, C}, {}, &gen).to(kGpu), randn({4, 9, C}, {}, &gen).to(kGpu)};
    std::vector<Tensor> eager = fn(in), out;
    for (int i = 0; i < 3; ++i) out = f(in);
    ASSERT_NE(f.last_plan(), nullptr);
    size_t fused = 0;
    for (const compile::Node& node : f.last_plan()->graph().nodes)
      fused += node.fused == std::vector<std::string>{"add", "layer_norm", "copy"};
    EXPECT_EQ(fused, 1u) << f.last_plan()->graph().str();
    ASSERT_EQ(out.size(), eager.size());
    for (size_t k = 0; k < out.size(); ++k)
      EXPECT_EQ(to_dtype(out[k], DType::f32).to_vector<float>(), to_dtype(eager[k], DType::f32).to_vector<float>());
  }
}

#endif  // REEL_CUDA
