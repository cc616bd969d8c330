// Elementwise fusion on the GPU: NVRTC kernels against the CPU, inside captured CUDA graphs, in a
// training step, and the kernel caches across "starts". Every test skips without a GPU.
//   - every fusable op in f32/f64/f16/bf16 (test_compile_fusion.cpp's chain) against CPU eager and
//     the CPU's fused executor, within tolerances set by dtype (the device's libm differs by ulps);
//   - strided, broadcast and many-dimensional loops (the generated index math);
//   - reduce-overhead replays the same kernels as default, to the bit;
//   - a GPT trained 20 steps under reduce-overhead with fusion follows eager;
//   - a second build after dropping the in-memory kernels compiles nothing: the disk serves it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "kernels/jit/kernel_cache.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;
using reel::testing_util::TempCacheDir;

namespace reel::fusion_test {  // defined in test_compile_fusion.cpp
std::vector<Tensor> chain_inputs(DType dt, Device device);
std::vector<Tensor> elementwise_chain(const std::vector<Tensor>& in);
}  // namespace reel::fusion_test

namespace {

const Device kGpu = Device::cuda(0);

double rel_l2(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  if (x.size() != y.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    if (std::isnan(x[k]) || std::isnan(y[k])) return INFINITY;
    num += (x[k] - y[k]) * (x[k] - y[k]);
    den += y[k] * y[k];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

compile::CompiledFunction compiled(compile::StepFn fn, compile::Mode mode = compile::Mode::Default, bool fuse = true) {
  return compile::compile(std::move(fn), {mode, 8, fuse});
}

std::vector<Tensor> run3(compile::CompiledFunction& f, const std::vector<Tensor>& in) {
  f(in);
  f(in);
  return f(in);
}

size_t nvrtc_kernels(const compile::Plan& p) {
  size_t n = 0;
  for (const compile::Node& node : p.graph().nodes)
    n += node.op == OpKind::FusedElementwise && !node.outputs.empty() && p.graph().buffers[node.outputs[0].buffer].device.is_cuda();
  return n;
}

TEST(FusionCuda, EveryOpInEveryDtypeMatchesTheCpu) {
  REEL_REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<Tensor> in_gpu = fusion_test::chain_inputs(dt, kGpu), in_cpu = fusion_test::chain_inputs(dt, Device::cpu());
    auto gpu = compiled(fusion_test::elementwise_chain), cpu = compiled(fusion_test::elementwise_chain);
    std::vector<Tensor> out = run3(gpu, in_gpu), cpu_fused = run3(cpu, in_cpu);
    std::vector<Tensor> eager = fusion_test::elementwise_chain(in_cpu);
    ASSERT_NE(gpu.last_plan(), nullptr);
    EXPECT_GT(gpu.last_plan()->stats().fused, 30u);
    EXPECT_GE(nvrtc_kernels(*gpu.last_plan()), 2u) << gpu.last_plan()->graph().str();
    // Against the CPU's fused executor (both keep 16-bit intermediates in float): only the libm
    // differs. Against eager (16-bit: every intermediate rounded): the rounding differs too.
    const double same_math = dt == DType::f64 ? 1e-7 : dt == DType::f32 ? 1e-5 : dt == DType::f16 ? 2e-3 : 1.5e-2;
    const double vs_eager = dt == DType::f16 ? 1e-2 : dt == DType::bf16 ? 5e-2 : same_math;
    ASSERT_EQ(out.size(), eager.size());
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_TRUE(out[i].device().is_cuda());
      EXPECT_LT(rel_l2(out[i], cpu_fused[i]), same_math) << "output " << i;
      EXPECT_LT(rel_l2(out[i], eager[i]), vs_eager) << "output " << i;
    }
  }
}

TEST(FusionCuda, StridedBroadcastAndManyDimensionalLoops) {
  REEL_REQUIRE_GPU();
  Generator gen(31);
  Tensor x = randn({5, 6, 7, 8}, {}, &gen), b = randn({6, 1, 8}, {}, &gen), w = randn({8, 6, 5, 7}, {}, &gen);
  Tensor big = randn({64, 33, 17}, {}, &gen), bias = randn({17}, {}, &gen);
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor wt = in[2].permute({2, 1, 3, 0});  // (5, 6, 7, 8) read through strides no dim merges
    Tensor a = tanh(sigmoid(in[0] + in[1]) * wt) + 1.0;  // b broadcast over dims 0 and 2
    Tensor c = (gelu(in[3] + in[4]) - in[3]) * 0.5;      // odd sizes: every division by a constant
    return std::vector<Tensor>{a, c};
  };
  std::vector<Tensor> cpu_in{x, b, w, big, bias}, gpu_in;
  for (const Tensor& t : cpu_in) gpu_in.push_back(t.to(kGpu));
  auto f = compiled(fn);
  std::vector<Tensor> out = run3(f, gpu_in), ref = fn(cpu_in);
  ASSERT_NE(f.last_plan(), nullptr);
  EXPECT_EQ(nvrtc_kernels(*f.last_plan()), 2u) << f.last_plan()->graph().str();
  for (size_t i = 0; i < out.size(); ++i) EXPECT_LT(rel_l2(out[i], ref[i]), 1e-5) << "output " << i;
}

TEST(FusionCuda, VectorLoopEqualsTheScalarLoopToTheBit) {
  // A contiguous chain over 8 * 1000 + 5 elements takes the vector loop (16-byte loads, 8 elements a
  // thread) and the scalar loop for the last 5; the same inputs one element past a 16-byte boundary
  // take the scalar loop alone (kernels/jit/codegen_cuda.h). Both give the same bits, within tolerance of
  // the CPU's eager ops.
  REEL_REQUIRE_GPU();
  Generator gen(8);
  const int64_t n = 8 * 1000 + 5;
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor h = gelu(in[0] * in[1] + in[0]);
    return std::vector<Tensor>{h, to_dtype(h, DType::f32) * 0.5};
  };
  for (DType dt : {DType::bf16, DType::f32, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = to_dtype(randn({n + 1}, {}, &gen), dt), b = to_dtype(randn({n + 1}, {}, &gen), dt);
    std::vector<Tensor> cpu{a.slice(0, 1, n + 1).contiguous(), b.slice(0, 1, n + 1).contiguous()};
    std::vector<Tensor> aligned{cpu[0].to(kGpu), cpu[1].to(kGpu)};
    Tensor ga = a.to(kGpu), gb = b.to(kGpu);
    std::vector<Tensor> shifted{ga.slice(0, 1, n + 1), gb.slice(0, 1, n + 1)};  // 2 or 4 bytes past the allocation
    auto f = compiled(fn);
    std::vector<Tensor> vec = run3(f, aligned), scalar = run3(f, shifted), ref = fn(cpu);
    ASSERT_NE(f.last_plan(), nullptr);
    EXPECT_GE(nvrtc_kernels(*f.last_plan()), 1u) << f.last_plan()->graph().str();
    for (size_t i = 0; i < vec.size(); ++i) {
      EXPECT_EQ(vec[i].to_vector<double>(), scalar[i].to_vector<double>()) << "output " << i;
      EXPECT_LT(rel_l2(vec[i], ref[i]), dt == DType::f32 ? 1e-5 : 2e-2) << "output " << i;
    }
  }
}

TEST(FusionCuda, SixteenBitStoresRoundAsTheHostDoesToTheBit) {
  // A fused kernel stores a cast's register by rounding the cast's source once (codegen_cuda.cpp's
  // stored_text), bf16 through cvt.rn.bf16.f32 for numbers and the host's bit arithmetic for NaNs
  // (its reel_store_bf16, which keeps a NaN a NaN). Every top half of an f32 with low halves at and around the rounding tie:
  // zeros, subnormals, the largest finite values that round to infinity, infinities, NaNs with
  // payloads. neg keeps every bit but the sign, so the kernel rounds exactly the host's values.
  REEL_REQUIRE_GPU();
  std::vector<float> v;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x4000u ^ (hi * 2654435761u >> 16)}) {
      const uint32_t bits = hi << 16 | (lo & 0xffffu);
      float f;
      std::memcpy(&f, &bits, sizeof f);
      v.push_back(f);
    }
  const Tensor x = Tensor::from_vector(v, {int64_t(v.size())});
  auto fn = [](const std::vector<Tensor>& in) {
    const Tensor b = to_dtype(-in[0], DType::bf16);
    // b's register is also widened: the cast's value stays in the program beside its store.
    return std::vector<Tensor>{b, to_dtype(-in[0], DType::f16), to_dtype(b, DType::f32)};
  };
  auto f = compiled(fn);
  const std::vector<Tensor> got = run3(f, {x.to(kGpu)}), want = fn({x});
  ASSERT_NE(f.last_plan(), nullptr);
  EXPECT_GE(nvrtc_kernels(*f.last_plan()), 1u) << f.last_plan()->graph().str();
  const Tensor gb = got[0].to(Device::cpu()), wb = want[0];
  const uint16_t* pg = static_cast<const uint16_t*>(gb.data_ptr());
  const uint16_t* pw = static_cast<const uint16_t*>(wb.data_ptr());
  // bf16: the same bits for numbers, infinities and zeros; a NaN stays a NaN. The kernel's cast goes
  // through double, which may make a NaN's payload canonical where the host keeps it: NaNs matched
  // to the bit on an H100 and not on an H200 in the next call (bench/RESULTS.md, tenth step).
  auto bf16_nan = [](uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; };
  size_t bf16_mismatches = 0, first = v.size();
  for (size_t i = 0; i < v.size(); ++i) {
    const bool bad = bf16_nan(pw[i]) ? !bf16_nan(pg[i]) : pg[i] != pw[i];
    if (bad && first == v.size()) first = i;
    bf16_mismatches += bad;
  }
  EXPECT_EQ(bf16_mismatches, 0u) << "first at " << first << ": 0x" << std::hex << (first < v.size() ? pg[first] : 0)
                                 << " vs 0x" << (first < v.size() ? pw[first] : 0);
  // f16: the same bits for numbers; NaN stays NaN (the device's cvt makes its payload canonical).
  const std::vector<double> gh = got[1].to_vector<double>(), wh = want[1].to_vector<double>();
  size_t f16_mismatches = 0;
  for (size_t i = 0; i < v.size(); ++i)
    f16_mismatches += std::isnan(wh[i]) ? !std::isnan(gh[i]) : std::memcmp(&gh[i], &wh[i], sizeof(double)) != 0;
  EXPECT_EQ(f16_mismatches, 0u);
  // The widened copy: the same bits for numbers; a NaN stays a NaN (a conversion through double on the
  // device may make its payload canonical).
  const Tensor gw = got[2].to(Device::cpu());
  const float* fg = static_cast<const float*>(gw.data_ptr());
  const float* fw = static_cast<const float*>(want[2].data_ptr());
  size_t f32_mismatches = 0, first_f32 = v.size();
  for (size_t i = 0; i < v.size(); ++i) {
    const bool bad = std::isnan(fw[i]) ? !std::isnan(fg[i]) : std::memcmp(&fg[i], &fw[i], sizeof(float)) != 0;
    if (bad && first_f32 == v.size()) first_f32 = i;
    f32_mismatches += bad;
  }
  EXPECT_EQ(f32_mismatches, 0u) << "first at " << first_f32 << ": " << (first_f32 < v.size() ? fg[first_f32] : 0.0f)
                                << " vs " << (first_f32 < v.size() ? fw[first_f32] : 0.0f);
}

TEST(FusionCuda, CapturedGraphsReplayTheSameKernels) {
  REEL_REQUIRE_GPU();
  std::vector<Tensor> in = fusion_test::chain_inputs(DType::f32, kGpu);
  auto eager_launch = compiled(fusion_test::elementwise_chain, compile::Mode::Default);
  auto graphed = compiled(fusion_test::elementwise_chain, compile::Mode::ReduceOverhead);
  std::vector<Tensor> a = run3(eager_launch, in), b = run3(graphed, in);
  std::vector<Tensor> c = graphed(in);  // a replay of the captured graph
  ASSERT_NE(graphed.last_plan(), nullptr);
  EXPECT_EQ(graphed.last_plan()->graphs(), 1u);
  EXPECT_TRUE(graphed.last_plan()->host_nodes().empty());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].to_vector<double>(), b[i].to_vector<double>()) << "output " << i;
    EXPECT_EQ(a[i].to_vector<double>(), c[i].to_vector<double>()) << "output " << i;
  }
}

std::vector<optim::MicroBatch> token_batches(int accum) {
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < accum; ++i) {
    std::vector<int64_t> x(4 * 16), y(4 * 16);
    for (size_t k = 0; k < x.size(); ++k) {
      x[k] = int64_t((k * 7 + size_t(i) * 3) % 32);
      y[k] = int64_t((k * 5 + size_t(i) * 11 + 1) % 32);
    }
    micro.push_back({tensor_i64(x, {4, 16}, kGpu), tensor_i64(y, {4, 16}, kGpu)});
  }
  return micro;
}

TEST(FusionCuda, ReduceOverheadGptWithFusionFollowsEager) {
  REEL_REQUIRE_GPU();
  auto make = [] {
    Generator gen(3);
    auto m = nn::gpt(nn::GptConfig{32, 16, 32, 2, 2}, &gen);
    m->to(kGpu);
    return m;
  };
  auto eager_model = make(), fused_model = make();
  optim::AdamW opt_e(eager_model->parameters(), optim::AdamWOptions(1e-3));
  optim::AdamW opt_f(fused_model->parameters(), optim::AdamWOptions(1e-3));
  opt_e.set_accum_steps(3).set_max_grad_norm(1.0);
  opt_f.set_accum_steps(3).set_max_grad_norm(1.0);
  nn::Module* me = eager_model.get();
  nn::Module* mf = fused_model.get();
  auto loss_e = [me](const Tensor& x, const Tensor& y) { return nn::model_loss(*me, x, y); };
  auto step = compile::compile_train_step(opt_f, [mf](const Tensor& x, const Tensor& y) { return nn::model_loss(*mf, x, y); },
                                          {compile::Mode::ReduceOverhead, 8, true});
  auto micro = token_batches(3);
  for (int s = 0; s < 20; ++s) {
    Tensor mean_loss;
    optim::train_step(opt_e, loss_e, micro, &mean_loss);
    const double fused_loss = step(compile::flatten_micro(micro))[0].item();
    EXPECT_NEAR(fused_loss, mean_loss.item(), 1e-4 * std::abs(mean_loss.item())) << "step " << s;
  }
  const compile::Plan* plan = step.last_plan();
  ASSERT_NE(plan, nullptr);
  EXPECT_GE(plan->graphs(), 1u);
  EXPECT_GE(nvrtc_kernels(*plan), 5u) << "elementwise chains of the step were not fused";
  // The key part of each qkv bias apart (compile_test_util.h: its gradient is rounding noise, which
  // AdamW turns into lr-sized steps of that noise's sign); everything else follows eager to 1e-4.
  const testing_util::GptParamDiff diff = testing_util::compare_gpt_params(*eager_model, *fused_model);
  const double key_bias_bound = 2 * 1e-3 * 20;  // 2 lr x steps
  EXPECT_LT(diff.worst_rel, 1e-4) << diff.worst_name;
  EXPECT_LE(diff.key_bias_abs, key_bias_bound);
  std::printf("gpt (f32) compiled with fusion against eager after 20 steps: parameters' largest relative L2 "
              "difference %.3g (key biases apart: largest difference %.3g, bound %.3g)\n",
              diff.worst_rel, diff.key_bias_abs, key_bias_bound);
}

TEST(FusionCuda, ASecondStartCompilesNothing) {
  REEL_REQUIRE_GPU();
  TempCacheDir cache;
  jit::clear_kernel_memory_cache();
  std::vector<Tensor> in = fusion_test::chain_inputs(DType::f32, kGpu);
  auto build_and_run = [&] {
    auto f = compiled(fusion_test::elementwise_chain);
    std::vector<Tensor> out = run3(f, in);
    EXPECT_NE(f.last_plan(), nullptr);
    return out[0].to_vector<double>();
  };
  const jit::KernelCacheStats s0 = jit::kernel_cache_stats();
  const std::vector<double> first = build_and_run();
  const jit::KernelCacheStats s1 = jit::kernel_cache_stats();
  EXPECT_GE(s1.compilations, s0.compilations + 2) << "a fresh cache directory: every kernel compiles";
  jit::clear_kernel_memory_cache();  // as a new process would start
  EXPECT_EQ(build_and_run(), first);
  const jit::KernelCacheStats s2 = jit::kernel_cache_stats();
  EXPECT_EQ(s2.compilations, s1.compilations) << "the second start compiled again";
  EXPECT_GE(s2.disk_hits, s1.disk_hits + 2);
  EXPECT_EQ(build_and_run(), first);  // same process: loaded kernels are reused
  const jit::KernelCacheStats s3 = jit::kernel_cache_stats();
  EXPECT_EQ(s3.compilations, s2.compilations);
  EXPECT_EQ(s3.disk_hits, s2.disk_hits);
  EXPECT_GE(s3.memory_hits, s2.memory_hits + 2);
}

}  // namespace
