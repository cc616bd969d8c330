// The layer_norm_16bit pass (compile/passes/read_layer_norm_16bit.cpp): a GEMM whose f32 result only
// a layer norm reads writes it in 16 bits, and the norm reads it as its exact widening: the
// projection's and fc2's output as the residual's addend in the forward, the input gradient of qkv's
// and fc's GEMM as the norm's g in the backward. On the CPU always, on the GPU where visible:
//   - the backward: a 16-bit GEMM, the cast to f32, the norm's backward + residual + cast gives
//     eager's bits with the pass (the GEMM rounds as eager's does; the pass off skips that rounding);
//   - the forward: GEMM + bias, cast, residual add, norm, cast: the GEMM writes 16 bits, the norm
//     adds their widening; within 16-bit rounding of eager;
//   - gpt-tiny's step (ACCUM 2), bf16 and fp16: every norm whose addend or g a GEMM wrote reads it
//     in 16 bits, the planned arena no larger, training within 16-bit tolerance of the pass off and
//     the same bits run to run; fp32's plan untouched (the same training to the bit).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/ops.h"
#include "compile/runtime/compile.h"
#include "compile_test_util.h"
#include "kernels/dispatch.h"
#include "test_util.h"

namespace reel {
namespace {

constexpr const char* kPass = "layer_norm_16bit";
const Attrs kNorm = Attrs().set("eps", 1e-5).set("normalized_ndim", 1);

compile::CompiledFunction compiled(const compile::StepFn& fn, Device device, bool on) {
  compile::CompileOptions o(device.is_cuda() ? compile::Mode::ReduceOverhead : compile::Mode::Default);
  (on ? o.enabled_passes : o.disabled_passes) = {kPass};
  return compile::compile(fn, o);
}

std::vector<Tensor> run3(compile::CompiledFunction& f, const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  for (int i = 0; i < 3; ++i) out = f(in);  // eager, trace, replay
  return out;
}

bool is_16bit(DType d) { return d == DType::bf16 || d == DType::f16; }

void expect_backward_reads_the_gemm_in_16bits(Device device) {
  Generator gen(53);
  const int64_t C = 128;  // the row-in-registers kernels on CUDA
  Tensor w = randn({C}, {}, &gen).to(device);
  Tensor Wg = to_dtype(randn({64, C}, {}, &gen).to(device), DType::bf16);  // the GEMM giving g
  Tensor Wh = to_dtype(randn({C, 32}, {}, &gen).to(device), DType::bf16);  // the GEMM after the norm
  auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    const Tensor &x = in[0], &dy16 = in[1], &residual = in[2];
    std::vector<Tensor> f = dispatch(OpKind::LayerNorm, {x, w, Tensor()}, kNorm);
    Tensor g = to_dtype(matmul(dy16, Wg), DType::f32);  // autocast's input gradient: 16 bits, cast back
    std::vector<Tensor> d = dispatch(OpKind::LayerNormBackward, {g, x, w, f[1], f[2]});
    Tensor out = d[0] + residual;
    return {out, d[1], d[2], matmul(to_dtype(out, DType::bf16), Wh)};
  };
  const std::vector<Tensor> in = {randn({3, 40, C}, {}, &gen).to(device),
                                  to_dtype(randn({3, 40, 64}, {}, &gen).to(device), DType::bf16),
                                  randn({3, 40, C}, {}, &gen).to(device)};
  const std::vector<Tensor> eager = fn(in);
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "pass on" : "pass off");
    compile::CompiledFunction f = compiled(fn, device, on);
    const std::vector<Tensor> out = run3(f, in);
    ASSERT_NE(f.last_plan(), nullptr);
    size_t norms_16bit_g = 0, matmul_casts = 0;
    for (const compile::Node& n : f.last_plan()->graph().nodes) {
      norms_16bit_g += testing_util::is_norm_backward_node(n) && is_16bit(n.inputs[0]->dtype);
      matmul_casts += n.op == OpKind::MatmulInto;
    }
    EXPECT_EQ(norms_16bit_g, on ? 1u : 0u) << f.last_plan()->graph().str();
    EXPECT_EQ(matmul_casts, on ? 0u : 1u) << f.last_plan()->graph().str();
    ASSERT_EQ(out.size(), eager.size());
    for (size_t k = 0; k < out.size(); ++k) {
      if (on)
        EXPECT_EQ(out[k].to_vector<double>(), eager[k].to_vector<double>()) << "output " << k;
      else
        EXPECT_LT(testing_util::max_rel_diff(out[k], eager[k]), 1e-2) << "output " << k;
    }
  }
}

TEST(LayerNorm16bitPass, TheBackwardReadsItsGemmsGradientInSixteenBitsWithEagersBitsOnTheCpu) {
  expect_backward_reads_the_gemm_in_16bits(Device::cpu());
}
TEST(LayerNorm16bitPass, TheBackwardReadsItsGemmsGradientInSixteenBitsWithEagersBitsOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_backward_reads_the_gemm_in_16bits(Device::cuda(0));
}

void expect_forward_adds_the_gemms_16bit_result(Device device) {
  Generator gen(59);
  const int64_t C = 256;
  Tensor w = randn({C}, {}, &gen).to(device), b = randn({C}, {}, &gen).to(device),
         bias = randn({C}, {}, &gen).to(device);
  Tensor Wt = to_dtype(randn({64, C}, {}, &gen).to(device), DType::bf16);  // the projection, (K, N)
  Tensor Wn = to_dtype(randn({C, 32}, {}, &gen).to(device), DType::bf16);  // the GEMM after the norm
  auto fn = [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    const Tensor &x = in[0], &h16 = in[1];
    Tensor z = to_dtype(matmul(h16, Wt), DType::f32) + bias;  // a Linear under autocast
    Tensor s = x + z;                                         // the residual
    std::vector<Tensor> f = dispatch(OpKind::LayerNorm, {s, w, b}, kNorm);
    return {matmul(to_dtype(f[0], DType::bf16), Wn), f[1], f[2], s * 2.0};
  };
  const std::vector<Tensor> in = {randn({3, 40, C}, {}, &gen).to(device),
                                  to_dtype(randn({3, 40, 64}, {}, &gen).to(device), DType::bf16)};
  const std::vector<Tensor> eager = fn(in);
  std::vector<std::vector<Tensor>> outs;
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "pass on" : "pass off");
    compile::CompiledFunction f = compiled(fn, device, on);
    outs.push_back(run3(f, in));
    ASSERT_NE(f.last_plan(), nullptr);
    size_t norms_16bit_addend = 0, gemms_16bit = 0;
    for (const compile::Node& n : f.last_plan()->graph().nodes) {
      norms_16bit_addend += n.op == OpKind::LayerNormCast && n.inputs.size() == 4 && is_16bit(n.inputs[3]->dtype);
      gemms_16bit += n.op == OpKind::GemmEpilogue && is_16bit(n.outputs[0].dtype);
    }
    EXPECT_EQ(norms_16bit_addend, on ? 1u : 0u) << f.last_plan()->graph().str();
    EXPECT_EQ(gemms_16bit, on ? 1u : 0u) << f.last_plan()->graph().str();
    // Each within the rounding of z to 16 bits of eager (which rounds the GEMM before its bias).
    for (size_t k = 0; k < eager.size(); ++k)
      EXPECT_LT(testing_util::max_rel_diff(outs.back()[k], eager[k]), 1e-2) << "output " << k;
  }
  // The pass moved the residual's sum (z rounded to 16 bits before it is added), within that rounding.
  EXPECT_NE(outs[0][3].to_vector<double>(), outs[1][3].to_vector<double>());
  EXPECT_LT(testing_util::max_rel_diff(outs[0][3], outs[1][3]), 1e-2);
}

TEST(LayerNorm16bitPass, TheForwardAddsTheGemmsSixteenBitResultOnTheCpu) {
  expect_forward_adds_the_gemms_16bit_result(Device::cpu());
}
TEST(LayerNorm16bitPass, TheForwardAddsTheGemmsSixteenBitResultOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_forward_adds_the_gemms_16bit_result(Device::cuda(0));
}

struct Census {
  size_t norms_with_addend = 0, addends_16bit = 0;   // layer_norm_cast with a residual's addend
  size_t norm_grads_from_gemm = 0, grads_16bit = 0;  // layer_norm_backward_add whose g a GEMM wrote
};
Census census(const compile::Plan& p) {
  const compile::Graph& g = p.graph();
  std::vector<int> writer(g.buffers.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const compile::TensorRef& o : g.nodes[i].outputs) writer[size_t(o.buffer)] = int(i);
  auto from_gemm = [&](const compile::TensorRef& r) {
    const int w = writer[size_t(r.buffer)];
    return w >= 0 && (g.nodes[size_t(w)].op == OpKind::GemmEpilogue || g.nodes[size_t(w)].op == OpKind::Matmul ||
                      g.nodes[size_t(w)].op == OpKind::MatmulInto);
  };
  Census c;
  for (const compile::Node& n : g.nodes) {
    if (n.op == OpKind::LayerNormCast && n.inputs.size() == 4 && n.inputs[3] && from_gemm(*n.inputs[3])) {
      c.norms_with_addend += 1;
      c.addends_16bit += is_16bit(n.inputs[3]->dtype);
    }
    if (testing_util::is_norm_backward_node(n) && from_gemm(*n.inputs[0])) {
      c.norm_grads_from_gemm += 1;
      c.grads_16bit += is_16bit(n.inputs[0]->dtype);
    }
  }
  return c;
}

void expect_gpt_tiny_trains_with_the_pass(Device device) {
  for (const char* precision : {"bf16", "fp16", "fp32"}) {
    SCOPED_TRACE(precision);
    const bool autocast = std::string(precision) != "fp32";
    const testing_util::CompiledSteps off = testing_util::compiled_steps("gpt-tiny", device, precision, {kPass}),
                                      on = testing_util::compiled_steps("gpt-tiny", device, precision, {});
    ASSERT_NE(off.plan(), nullptr);
    ASSERT_NE(on.plan(), nullptr);
    EXPECT_EQ(on.plan()->kernels(), off.plan()->kernels());
    if (!autocast) {
      EXPECT_TRUE(testing_util::same_training(on, off)) << "fp32: nothing to rewrite";
      continue;
    }
    const Census c_on = census(*on.plan()), c_off = census(*off.plan());
    // gpt-tiny, ACCUM 2: per micro-batch 7 block norms and the last one add a GEMM's result, and the
    // backward of all 8 block norms and the last one takes a GEMM's gradient.
    EXPECT_EQ(c_off.norms_with_addend, 16u);
    EXPECT_EQ(c_off.norm_grads_from_gemm, 18u);
    EXPECT_EQ(c_off.addends_16bit + c_off.grads_16bit, 0u);
    EXPECT_EQ(c_on.norms_with_addend, c_off.norms_with_addend);
    EXPECT_EQ(c_on.norm_grads_from_gemm, c_off.norm_grads_from_gemm);
    EXPECT_EQ(c_on.addends_16bit, c_on.norms_with_addend);
    EXPECT_EQ(c_on.grads_16bit, c_on.norm_grads_from_gemm);
    const auto arena = [&](const testing_util::CompiledSteps& s) {
      return s.plan()->memory().arena_for(device)->bytes;
    };
    EXPECT_LE(arena(on), arena(off));
    for (size_t s = 0; s < on.losses.size(); ++s)
      EXPECT_NEAR(on.losses[s], off.losses[s], 2e-2 * std::abs(off.losses[s]));
    ASSERT_EQ(on.state.size(), off.state.size());
    double worst = 0;
    for (size_t t = 0; t < on.state.size(); ++t)
      for (size_t e = 0; e < on.state[t].size(); ++e)
        worst = std::max(worst, std::abs(on.state[t][e] - off.state[t][e]));
    EXPECT_LT(worst, 1e-2) << "parameters after 3 AdamW steps of lr 1e-3";
    if (std::string(precision) == "bf16") {
      const testing_util::CompiledSteps again =
          testing_util::compiled_steps("gpt-tiny", device, precision, {});
      EXPECT_TRUE(testing_util::same_training(on, again)) << "the same bits run to run";
    }
  }
}

TEST(LayerNorm16bitPass, GptTinyTrainsWithItOnTheCpu) { expect_gpt_tiny_trains_with_the_pass(Device::cpu()); }
TEST(LayerNorm16bitPass, GptTinyTrainsWithItOnTheGpu) {
  REEL_REQUIRE_GPU();
  expect_gpt_tiny_trains_with_the_pass(Device::cuda(0));
}

}  // namespace
}  // namespace reel
