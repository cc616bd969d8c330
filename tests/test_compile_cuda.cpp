// compile/ on the GPU: eager vs compiled training steps in every mode and precision, including the
// fp16 GradScaler inside a replayed CUDA graph. The plan runs the same kernels in the same order as
// eager, so the default and reduce-overhead modes must match eager to the bit. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/cuda.h"
#include "test_util.h"
#include "workload_parity.h"
#include "compile_test_util.h"

using namespace reel;
using reel::testing_util::same_bits;

namespace {

const Device kGpu = Device::cuda(0);

std::shared_ptr<nn::Module> small_gpt() {
  Generator gen(3);
  nn::GptConfig cfg{32, 16, 32, 2, 2};
  auto m = nn::gpt(cfg, &gen);
  m->to(kGpu);
  return m;
}

std::shared_ptr<nn::Module> small_cnn() {
  Generator gen(4);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1, false, &gen));
  m->push_back(std::make_shared<nn::BatchNorm2d>(8));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Conv2d>(8, 16, 3, 2, 1, false, &gen));
  m->push_back(std::make_shared<nn::GroupNorm>(4, 16));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::GlobalAvgPool2d>());
  m->push_back(std::make_shared<nn::Linear>(16, 10, true, &gen));
  m->to(kGpu);
  return m;
}

std::vector<optim::MicroBatch> token_batches(int accum) {
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < accum; ++i) {
    std::vector<int64_t> x(4 * 16), y(4 * 16);
    for (size_t k = 0; k < x.size(); ++k) {
      x[k] = int64_t((k * 7 + i * 3) % 32);
      y[k] = int64_t((k * 5 + i * 11 + 1) % 32);
    }
    micro.push_back({tensor_i64(x, {4, 16}, kGpu), tensor_i64(y, {4, 16}, kGpu)});
  }
  return micro;
}

std::vector<optim::MicroBatch> image_batches(int accum) {
  Generator gen(12);
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < accum; ++i)
    micro.push_back({randn({4, 3, 8, 8}, {DType::f32, kGpu}, &gen), tensor_i64({i % 10, 3, 7, (i + 5) % 10}, {4}, kGpu)});
  return micro;
}

struct Outcome {
  std::vector<double> losses, scales;
  std::vector<std::vector<double>> params, buffers;
};

// `steps` steps in `mode` ("eager" or a compile mode) under `precision`; `poison(s)` may replace the
// micro-batches of step s (a planted overflow).
Outcome run(std::shared_ptr<nn::Module> (*make)(), std::vector<optim::MicroBatch> (*data)(int), const std::string& mode,
            const std::string& precision, int steps, int poisoned_step = -1) {
  AutocastGuard amp(PrecisionPolicy::parse(precision));
  auto model = make();
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(3e-3).weight_decay(0.01));
  opt.set_accum_steps(3).set_max_grad_norm(1.0);
  opt.set_schedule(std::make_shared<optim::LinearWarmupCosine>(2, steps));
  if (autocast_policy().needs_grad_scaler()) opt.set_grad_scaler(std::make_shared<optim::GradScaler>());
  nn::Module* m = model.get();
  auto loss_fn = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
  std::optional<compile::CompiledFunction> step;
  // Fusion off: the plan runs eager's own kernels, so results must agree to the bit.
  if (mode != "eager") step.emplace(compile::compile_train_step(opt, loss_fn, {compile::parse_mode(mode), 8, false}));
  std::vector<optim::MicroBatch> clean = data(3);
  Outcome o;
  for (int s = 0; s < steps; ++s) {
    std::vector<optim::MicroBatch> micro = clean;
    if (s == poisoned_step) {
      Tensor x = micro[1].inputs.to(DType::f32);  // images only: a copy, with one value made inf
      std::vector<float> v = x.to_vector<float>();
      v[0] = std::numeric_limits<float>::infinity();
      micro[1].inputs = Tensor::from_vector<float>(v, x.shape()).to(kGpu);
    }
    if (step) {
      std::vector<Tensor> out = (*step)(compile::flatten_micro(micro));
      o.losses.push_back(out[0].item());
      o.scales.push_back(out[3].item());
    } else {
      Tensor mean_loss;
      optim::StepResult r = optim::train_step(opt, loss_fn, micro, &mean_loss);
      o.losses.push_back(mean_loss.item());
      o.scales.push_back(r.scale.defined() ? r.scale.item() : 1.0);
    }
  }
  if (step) {
    EXPECT_EQ(step->replays(), steps - 2) << mode;
    EXPECT_TRUE(step->graph_breaks().empty()) << mode;
  }
  for (const Tensor& p : model->parameters()) o.params.push_back(p.to_vector<double>());
  for (auto& [name, b] : model->named_buffers()) o.buffers.push_back(b.to_vector<double>());
  return o;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_TRUE(same_bits(a.losses, b.losses)) << what << ": losses";
  EXPECT_EQ(a.scales, b.scales) << what;
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) EXPECT_EQ(a.params[i], b.params[i]) << what << ": parameter " << i;
  for (size_t i = 0; i < a.buffers.size(); ++i)
    EXPECT_TRUE(same_bits(a.buffers[i], b.buffers[i])) << what << ": buffer " << i;
}

}  // namespace

TEST(CompileCuda, GptMatchesEagerToTheBitInEveryModeAndPrecision) {
  REEL_REQUIRE_GPU();
  for (const char* prec : {"fp32", "bf16", "fp16"}) {
    Outcome eager = run(small_gpt, token_batches, "eager", prec, 20);
    for (const char* mode : {"default", "reduce-overhead"})
      expect_same(eager, run(small_gpt, token_batches, mode, prec, 20), std::string(prec) + " " + mode);
  }
}

TEST(CompileCuda, CnnWithBatchNormMatchesEagerToTheBit) {
  REEL_REQUIRE_GPU();
  for (const char* prec : {"fp32", "bf16"}) {
    Outcome eager = run(small_cnn, image_batches, "eager", prec, 12);
    for (const char* mode : {"default", "reduce-overhead"})
      expect_same(eager, run(small_cnn, image_batches, mode, prec, 12), std::string(prec) + " " + mode);
  }
}

TEST(CompileCuda, Fp16OverflowInsideTheGraphSkipsTheStepAndHalvesTheScale) {
  REEL_REQUIRE_GPU();
  // Step 5 is a replay of the captured graph; its inputs hold an inf.
  Outcome eager = run(small_cnn, image_batches, "eager", "fp16", 8, 5);
  Outcome graphed = run(small_cnn, image_batches, "reduce-overhead", "fp16", 8, 5);
  ASSERT_EQ(graphed.scales.size(), 8u);
  EXPECT_EQ(graphed.scales[5], graphed.scales[4] / 2) << "the overflow halves the scale";
  EXPECT_EQ(graphed.scales[6], graphed.scales[5]);
  // The skipped step left the parameters as they were after step 4: compare with a run of 5 steps
  // whose graph replays ran the same clean steps. (The loss itself may stay finite: ReLU maps the
  // NaN of the poisoned channel to 0; the gradients are what overflow.)
  expect_same(eager, graphed, "fp16 with a planted overflow");
  Outcome clean = run(small_cnn, image_batches, "reduce-overhead", "fp16", 8);
  EXPECT_NE(clean.params, graphed.params) << "the poisoned step changed nothing?";
}

TEST(CompileCuda, FusedPlansMatchEagerWithinTolerance) {
  REEL_REQUIRE_GPU();
  for (const char* prec : {"fp32", "bf16"}) {
    AutocastGuard amp(PrecisionPolicy::parse(prec));
    auto eager_model = small_gpt(), fused_model = small_gpt();
    optim::AdamW opt_e(eager_model->parameters(), optim::AdamWOptions(1e-3)), opt_f(fused_model->parameters(), optim::AdamWOptions(1e-3));
    opt_e.set_accum_steps(3).set_max_grad_norm(1.0);
    opt_f.set_accum_steps(3).set_max_grad_norm(1.0);
    nn::Module* me = eager_model.get();
    nn::Module* mf = fused_model.get();
    auto loss_e = [me](const Tensor& x, const Tensor& y) { return nn::model_loss(*me, x, y); };
    auto step = compile::compile_train_step(opt_f, [mf](const Tensor& x, const Tensor& y) { return nn::model_loss(*mf, x, y); },
                                            {compile::Mode::ReduceOverhead});
    auto micro = token_batches(3);
    // bf16 rounds every GEMM input; fused and unfused paths round at different points, and 20 AdamW
    // steps amplify that in small parameters (LayerNorm biases start at zero).
    const double tol = std::string(prec) == "fp32" ? 1e-4 : 3e-2;
    const double param_tol = std::string(prec) == "fp32" ? 1e-4 : 0.1;
    for (int s = 0; s < 20; ++s) {
      Tensor mean_loss;
      optim::train_step(opt_e, loss_e, micro, &mean_loss);
      double fused_loss = step(compile::flatten_micro(micro))[0].item();
      EXPECT_NEAR(fused_loss, mean_loss.item(), tol * std::abs(mean_loss.item())) << prec << " step " << s;
    }
    ASSERT_NE(step.last_plan(), nullptr);
    bool epilogue = false;
    for (const compile::Node& n : step.last_plan()->graph().nodes)
      epilogue = epilogue || (!n.fused.empty() && n.fused.front() == "matmul");
    EXPECT_TRUE(epilogue) << prec << ": no GEMM took its bias add as an epilogue";
    int attention = 0, softmaxes = 0;  // attention runs as its one fused op, no softmax around it
    for (const compile::Node& n : step.last_plan()->graph().nodes) {
      attention += n.op == OpKind::Attention || n.op == OpKind::AttentionCast;
      softmaxes += n.op == OpKind::Softmax || (!n.fused.empty() && n.fused.back() == "softmax");
    }
    EXPECT_EQ(attention, 3 * 2) << prec << ": one attention per layer and micro-batch";
    EXPECT_EQ(softmaxes, 0) << prec;
    int norm_bwd_add = 0, attention_cast = 0;  // the fusions around them (compile/passes/fuse_norm_backward_add.cpp,
    for (const compile::Node& n : step.last_plan()->graph().nodes) {  // compile/passes/fuse_attention_cast.cpp)
      norm_bwd_add += n.fused == std::vector<std::string>{"layer_norm_backward", "add"};
      attention_cast += n.fused.size() == 2 && n.fused[1] == "copy" && n.fused[0].starts_with("attention");
    }
    EXPECT_GT(norm_bwd_add, 0) << prec << ": no layer-norm backward took the residual's add";
    EXPECT_EQ(attention_cast, std::string(prec) == "bf16" ? 2 * 3 * 2 : 0) << prec;
    bool grad_by_gemm = false;  // weight gradients accumulated by their GEMM (beta = 1)
    for (const compile::Node& n : step.last_plan()->graph().nodes)
      grad_by_gemm = grad_by_gemm || (n.in_place && !n.fused.empty() && n.fused.front() == "matmul" && n.fused.back() == "add");
    EXPECT_TRUE(grad_by_gemm) << prec << ": no weight gradient accumulated by its GEMM";
    size_t bias_sums_16 = 0;  // bias gradients summed from the bf16 gradient (compile/passes/fuse_bias_grad_cast.cpp)
    for (const compile::Node& n : step.last_plan()->graph().nodes)
      bias_sums_16 += n.op == OpKind::ColumnSums && n.inputs[0] && n.inputs[0]->dtype == DType::bf16;
    EXPECT_EQ(bias_sums_16 > 0, std::string(prec) == "bf16") << prec;
    if (std::string(prec) == "bf16") {  // and write, or add, into the biases' gradients themselves
      int into_grad = 0, added = 0, in_norm = 0;
      for (const compile::Node& n : step.last_plan()->graph().nodes) {
        const bool sums = n.op == OpKind::ColumnSums && n.fused.size() == 2 && n.fused[0] == "sum" &&
                          n.inputs[0]->dtype == DType::bf16;  // the position table's f32 sums: below
        into_grad += sums && (n.fused[1] == "copy" || n.fused[1] == "add");
        added += sums && n.fused[1] == "add" && n.in_place;
        // summed by a layer-norm backward's pass over the rows (compile/passes/fuse_norm_backward_add.cpp):
        // fused as layer_norm_backward[, add], copy, sum, then copy or add into the gradient
        const size_t k = n.fused.size();
        const bool norm = testing_util::is_norm_backward_node(n) && k >= 4 && n.fused[k - 2] == "sum";
        in_norm += norm && (n.fused[k - 1] == "copy" || n.fused[k - 1] == "add");
        added += norm && n.fused[k - 1] == "add";
      }
      EXPECT_EQ(into_grad + in_norm, 8 * 3) << "qkv, proj, fc and fc2 biases of 2 layers x 3 micro-batches";
      // proj of both layers and fc2 of the first: their output gradient is a norm's dx plus the
      // residual's; the last fc2's is the final norm's dx alone, whose kernel sums it all the same
      EXPECT_EQ(in_norm, 4 * 3);
      EXPECT_GE(added, 8 * 2) << "the later micro-batches add to the gradient";
    }
    // The position table (16 rows, T = 16) read in place by the forward (compile/passes/identity_gathers.cpp)
    // and its gradient summed over the batch straight into it (compile/passes/write_sums_into_grads.cpp):
    // one lookup and one scatter a micro-batch, the tokens', and one f32 column-sums over (B, T * d).
    int lookups = 0, scatters = 0, position_sums = 0;
    for (const compile::Node& n : step.last_plan()->graph().nodes) {
      lookups += n.op == OpKind::Embedding;
      scatters += n.op == OpKind::EmbeddingBackward;
      position_sums +=
          n.op == OpKind::ColumnSums && n.inputs[0]->dtype == DType::f32 && n.inputs[0]->shape == Shape{4, 16 * 32};
    }
    EXPECT_EQ(lookups, 3) << prec;
    EXPECT_EQ(scatters, 3) << prec;
    EXPECT_EQ(position_sums, 3) << prec;
    if (std::string(prec) == "bf16") {
      bool cast_in_gemm = false;  // a GEMM writing f32 straight from bf16 operands (attention, backward)
      for (const compile::Node& n : step.last_plan()->graph().nodes)
        cast_in_gemm = cast_in_gemm || (n.fused.size() >= 2 && n.fused[0] == "matmul" && n.fused[1] == "copy");
      EXPECT_TRUE(cast_in_gemm) << "no GEMM took autocast's cast of its result";
      // Activations kept in 16 bits (the passes gemm_16bit and attention_cast): the qkv and fc GEMMs
      // write bf16, attention reads bf16 qkv, and its backward reads the bf16 y and the projection's
      // bf16 input gradient as dy (matmul_cast), and writes dqkv in bf16 only.
      int gemm16 = 0, attention_y16 = 0, attention_bwd16 = 0;
      for (const compile::Node& n : step.last_plan()->graph().nodes) {
        const bool gemm_bias = n.fused.size() >= 3 && std::vector<std::string>(n.fused.begin(), n.fused.begin() + 3) ==
                                                          std::vector<std::string>{"matmul", "copy", "add"};
        gemm16 += gemm_bias && !n.in_place && n.outputs[0].dtype == DType::bf16;
        attention_y16 += n.op == OpKind::AttentionCast && n.outputs.size() == 2 && n.inputs[0]->dtype == DType::bf16 &&
                         n.outputs[1].dtype == DType::bf16;
        attention_bwd16 += n.op == OpKind::AttentionBackwardCast && n.inputs[0]->dtype == DType::bf16 &&
                           n.inputs[1]->dtype == DType::bf16 &&
                           n.inputs[2]->dtype == DType::bf16 && n.outputs.size() == 1 &&
                           n.outputs[0].dtype == DType::bf16;
      }
      // qkv and fc (kept for the backward) and, with layer_norm_16bit, proj and fc2 (the next norm's addend).
      EXPECT_EQ(gemm16, 4 * 2 * 3) << "qkv, fc, proj and fc2 of 2 layers x 3 micro-batches";
      // GELU runs in the fc GEMM's epilogue (compile/passes/fuse_gemm_gelu.cpp), which writes its bf16 output
      // and the bf16 h. fc2's input gradient stays in bf16 for GELU's backward, whose fused kernel
      // takes the cast (compile/passes/fuse_matmul_cast.cpp): it reads that gradient and h, both bf16.
      int gelu_forward16 = 0, gelu_backward16 = 0, gelu_alone = 0;
      for (const compile::Node& n : step.last_plan()->graph().nodes) {
        const bool fwd = std::find(n.fused.begin(), n.fused.end(), "gelu") != n.fused.end();
        gelu_alone += n.op == OpKind::Gelu || (fwd && n.fused[0] != "matmul");
        gelu_forward16 += fwd && n.fused[0] == "matmul" && n.outputs.size() == 2 && n.outputs[0].dtype == DType::bf16 &&
                          n.outputs[1].dtype == DType::bf16;
        if (std::find(n.fused.begin(), n.fused.end(), "gelu_backward") == n.fused.end()) continue;
        int bf16_inputs = 0;
        for (const auto& in : n.inputs) bf16_inputs += in && in->dtype == DType::bf16;
        gelu_backward16 += bf16_inputs == 2;
      }
      EXPECT_EQ(gelu_forward16, 2 * 3) << "GELU of 2 layers x 3 micro-batches";
      EXPECT_EQ(gelu_backward16, 2 * 3) << "GELU's backward of 2 layers x 3 micro-batches";
      EXPECT_EQ(gelu_alone, 0) << "a GELU kernel outside the GEMM";
      EXPECT_EQ(attention_y16, 2 * 3);
      EXPECT_EQ(attention_bwd16, 2 * 3);
    }
    EXPECT_GT(step.last_plan()->stats().fused, 0u);
    // The qkv biases' key part apart (compile_test_util.h: its gradient is rounding noise, which
    // AdamW turns into lr-sized steps of that noise's sign): at most 2 lr x steps apart.
    const testing_util::GptParamDiff diff = testing_util::compare_gpt_params(*eager_model, *fused_model);
    EXPECT_LE(diff.worst_rel, param_tol) << prec << " " << diff.worst_name;
    EXPECT_LE(diff.key_bias_abs, 2 * 1e-3 * 20) << prec;
  }
}

// item() of a device tensor inside the function copies it to the host: a graph break, reported,
// so that each call runs eagerly with its own value instead of replaying the traced one.
TEST(CompileCuda, AHostReadOfADeviceTensorIsAGraphBreak) {
  REEL_REQUIRE_GPU();
  auto f = compile::compile(
      [](const std::vector<Tensor>& in) {
        const double total = in[0].sum().item();
        return std::vector<Tensor>{in[0] * total};
      },
      {compile::Mode::ReduceOverhead});
  for (int call = 0; call < 4; ++call) {
    const Tensor x = full({3}, double(call + 1), {DType::f32, Device::cuda()});
    EXPECT_EQ(f({x})[0].to_vector<double>(), std::vector<double>(3, 3.0 * (call + 1) * (call + 1))) << "call " << call;
  }
  ASSERT_FALSE(f.graph_breaks().empty());
  EXPECT_EQ(f.graph_breaks()[0].op, "item");
  EXPECT_NE(f.graph_breaks()[0].reason.find("reads a cuda:0 tensor's values on the host"), std::string::npos)
      << f.graph_breaks()[0].reason;
  EXPECT_EQ(f.replays(), 0);
  EXPECT_EQ(f.eager_calls(), 4);
}

TEST(CompileCuda, ReduceOverheadCapturesOneGraph) {
  REEL_REQUIRE_GPU();
  auto model = small_gpt();
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3));
  opt.set_accum_steps(3);
  nn::Module* m = model.get();
  auto step = compile::compile_train_step(opt, [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); },
                                          {compile::Mode::ReduceOverhead});
  auto in = compile::flatten_micro(token_batches(3));
  for (int i = 0; i < 4; ++i) step(in);
  ASSERT_NE(step.last_plan(), nullptr);
  EXPECT_EQ(step.last_plan()->graphs(), 1u);
  EXPECT_TRUE(step.last_plan()->host_nodes().empty());
}

// The three benchmark models themselves (MODELS.md's workloads, micro-batch 4 to keep the test short):
// 20 compiled steps against 20 eager ones — to the bit with fusion off, within the dtype's tolerance
// with every pass on.
TEST(CompileCuda, BenchmarkModelsMatchEagerAfterTwentySteps) {
  REEL_REQUIRE_GPU();
  for (const char* model : {"cnn-small", "gpt-tiny", "gpt-small"})
    testing_util::expect_workload_compiled_matches_eager(model, kGpu);
}

// The textbook attention chain (split, q k^T, causal mask, softmax, times v), compiled: the mask and
// the softmax become one kernel, and the plan's results match eager's.
TEST(CompileCuda, UnfusedAttentionsMaskAndSoftmaxBecomeOneKernel) {
  REEL_REQUIRE_GPU();
  AutocastGuard amp(PrecisionPolicy::parse("bf16"));
  Generator gen(17);
  Tensor qkv = randn({2, 32, 3 * 64}, TensorOptions{DType::f32, Device::cuda(0)}, &gen);
  auto attention = [](const std::vector<Tensor>& in) -> std::vector<Tensor> {
    Tensor x = in[0].detach();
    x.set_requires_grad(true);
    Tensor y = nn::causal_attention_unfused(x, 4);
    sum(y * y).backward();
    return {y.detach(), x.grad()};
  };
  std::vector<Tensor> eager = attention({qkv});
  auto step = compile::compile(attention, {compile::Mode::ReduceOverhead});
  std::vector<Tensor> out;
  for (int call = 0; call < 3; ++call) out = step({qkv});
  ASSERT_NE(step.last_plan(), nullptr);
  bool masked_softmax = false;
  for (const compile::Node& n : step.last_plan()->graph().nodes)
    masked_softmax = masked_softmax || (n.fused.size() >= 2 && n.fused[0] == "masked_fill" && n.fused[1] == "softmax");
  EXPECT_TRUE(masked_softmax) << "mask and softmax were not fused";
  for (int k = 0; k < 2; ++k) EXPECT_LT(testing_util::max_rel_diff(out[k], eager[k]), 2e-2) << (k == 0 ? "y" : "dqkv");
}
