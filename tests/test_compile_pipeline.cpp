// The pass pipeline as a user studies it (compile/passes/pipeline.h): the list and its order, passes
// turned off by name (CompileOptions::disabled_passes, REEL_PASSES), the reasons REEL_LOG=fusion
// gives for what a pass declined, and the door a pass asks before it fuses (supports_call). Runs on
// the CPU: every fused op has a CPU kernel, so a CPU plan is fused as a CUDA plan is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>

#include "compile/passes/pipeline.h"
#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/log.h"
#include "compile_test_util.h"
#include "test_util.h"

using namespace reel;

namespace {

using testing_util::ScopedEnv;

// Three compiled steps of a two-layer GPT (f32, ACCUM 2) under `options`: the plan of the last.
struct GptPlan {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::AdamW> opt;
  std::optional<compile::CompiledFunction> step;
  const compile::Plan* plan = nullptr;
};

GptPlan gpt_plan(compile::CompileOptions options) {
  GptPlan p;
  Generator gen(3);
  p.model = nn::gpt(nn::GptConfig{16, 8, 16, 2, 2}, &gen);
  p.opt = std::make_unique<optim::AdamW>(p.model->parameters(), optim::AdamWOptions(3e-3).weight_decay(0.01));
  p.opt->set_accum_steps(2).set_max_grad_norm(1.0);
  nn::Module* m = p.model.get();
  p.step.emplace(compile::compile_train_step(*p.opt, [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); },
                                             options));
  auto micro = testing_util::token_batches(2, 2, 8, 16, Device::cpu(), 17);
  for (int s = 0; s < 3; ++s) (*p.step)(compile::flatten_micro(micro));
  p.plan = p.step->last_plan();
  return p;
}

using testing_util::count_op;

}  // namespace

TEST(PassPipeline, ListsEveryPassOnceCleanupFirstScheduleLast) {
  const std::vector<compile::Pass>& p = compile::pipeline();
  std::set<std::string> names;
  bool fusion_seen = false, schedule_seen = false;
  for (const compile::Pass& pass : p) {
    EXPECT_TRUE(names.insert(pass.name).second) << pass.name << " listed twice";
    EXPECT_NE(pass.run, nullptr) << pass.name;
    EXPECT_FALSE(fusion_seen && pass.stage == compile::PassStage::Cleanup) << pass.name << " after a fusion pass";
    EXPECT_FALSE(schedule_seen && pass.stage != compile::PassStage::Schedule) << pass.name << " after a schedule pass";
    fusion_seen = fusion_seen || pass.stage == compile::PassStage::Fusion;
    schedule_seen = schedule_seen || pass.stage == compile::PassStage::Schedule;
  }
  // identity_gathers leaves arange nodes without readers for dead code to take.
  EXPECT_EQ(p.front().name, std::string("identity_gathers"));
  EXPECT_EQ(p[1].name, std::string("dead_code"));
  // The orders the passes' own comments depend on.
  auto at = [&](const char* name) {
    return std::find_if(p.begin(), p.end(), [&](const compile::Pass& x) { return x.name == std::string(name); }) - p.begin();
  };
  EXPECT_LT(at("bias_grad_cast"), at("gemm_epilogue"));
  // The sums bias_grad_cast writes go into the gradients before norm_backward_add folds them.
  EXPECT_LT(at("bias_grad_cast"), at("sums_into_grads"));
  EXPECT_LT(at("sums_into_grads"), at("norm_backward_add"));
  EXPECT_LT(at("attention_cast"), at("gemm_16bit"));
  EXPECT_LT(at("gemm_16bit"), at("gemm_gelu"));
  EXPECT_LT(at("gemm_gelu"), at("elementwise"));
  // weight_casts takes the casts every other pass left (the GEMM epilogues' 16-bit biases among them).
  EXPECT_LT(at("elementwise"), at("optimizer"));
  // The schedule stage (streams) last: input_casts_early after side_stream (whose peak it keeps),
  // side_stream_late moves what both marked.
  EXPECT_LT(at("weight_casts"), at("side_stream"));
  EXPECT_EQ(at("side_stream") + 1, at("input_casts_early"));
  EXPECT_EQ(at("input_casts_early") + 1, at("side_stream_late"));
  // The classifier head's fusion takes the nodes the GEMM-epilogue and cross-entropy passes wrote.
  EXPECT_LT(at("gemm_epilogue"), at("linear_cross_entropy"));
  EXPECT_LT(at("cross_entropy"), at("linear_cross_entropy"));
  // overlap_micro_batches last: the side-stream nodes it passes keep the places the others chose.
  EXPECT_EQ(at("side_stream_late") + 1, at("overlap_micro_batches"));
  EXPECT_EQ(p.back().name, std::string("overlap_micro_batches"));
}

TEST(PassPipeline, APassTurnedOffByNameLeavesItsPatternAlone) {
  GptPlan all = gpt_plan({compile::Mode::Default});
  ASSERT_NE(all.plan, nullptr);
  EXPECT_GT(count_op(*all.plan, OpKind::GemmEpilogue), 0u) << "the Linear layers' bias adds go into their GEMMs";
  EXPECT_EQ(count_op(*all.plan, OpKind::MultiTensorAdamW), 1u);
  GptPlan off = gpt_plan({compile::Mode::Default, 8, true, {"gemm_epilogue", "optimizer"}});
  ASSERT_NE(off.plan, nullptr);
  EXPECT_EQ(count_op(*off.plan, OpKind::GemmEpilogue), 0u);
  EXPECT_EQ(count_op(*off.plan, OpKind::MultiTensorAdamW), 0u);
  EXPECT_GT(count_op(*off.plan, OpKind::AdamWStep), 1u) << "one update per parameter again";
  EXPECT_GT(count_op(*off.plan, OpKind::FusedElementwise), 0u) << "the other fusions still ran";
  // The stats list the passes that ran, in order, without the ones turned off.
  std::vector<std::string> ran;
  for (const auto& [name, nodes] : off.plan->stats().after) ran.push_back(name);
  EXPECT_EQ(std::count(ran.begin(), ran.end(), "gemm_epilogue"), 0);
  const auto& p = compile::pipeline();
  const size_t on_by_default =
      size_t(std::count_if(p.begin(), p.end(), [](const compile::Pass& x) { return x.on_by_default; }));
  EXPECT_EQ(ran.size(), on_by_default - 2);
}

TEST(PassPipeline, APassOffByDefaultRunsOnlyWhenNamed) {
  const auto& p = compile::pipeline();
  const auto off = std::find_if(p.begin(), p.end(), [](const compile::Pass& x) { return !x.on_by_default; });
  ASSERT_NE(off, p.end()) << "no pass is off by default: this test has nothing to check";
  const std::string name = off->name;
  auto ran = [&](const compile::Plan& plan) {
    for (const auto& [pass, nodes] : plan.stats().after)
      if (pass == name) return true;
    return false;
  };
  GptPlan plain = gpt_plan({compile::Mode::Default});
  ASSERT_NE(plain.plan, nullptr);
  EXPECT_FALSE(ran(*plain.plan));
  compile::CompileOptions o(compile::Mode::Default);
  o.enabled_passes = {name};
  GptPlan on = gpt_plan(o);
  ASSERT_NE(on.plan, nullptr);
  EXPECT_TRUE(ran(*on.plan));
  {
    ScopedEnv env("REEL_PASSES", ("+" + name).c_str());
    GptPlan by_env = gpt_plan({compile::Mode::Default});
    ASSERT_NE(by_env.plan, nullptr);
    EXPECT_TRUE(ran(*by_env.plan));
  }
  {
    ScopedEnv env("REEL_PASSES", ("+" + name + ",-" + name).c_str());  // off wins
    GptPlan both = gpt_plan({compile::Mode::Default});
    ASSERT_NE(both.plan, nullptr);
    EXPECT_FALSE(ran(*both.plan));
  }
  ScopedEnv env("REEL_PASSES", "gemm_epilogue");
  EXPECT_THROW(compile::passes_enabled_by_env(), Error) << "an item needs its sign";
}

TEST(PassPipeline, ReelPassesTurnsPassesOffAndRefusesUnknownNames) {
  {
    ScopedEnv env("REEL_PASSES", "-gemm_epilogue");
    GptPlan p = gpt_plan({compile::Mode::Default});
    ASSERT_NE(p.plan, nullptr);
    EXPECT_EQ(count_op(*p.plan, OpKind::GemmEpilogue), 0u);
  }
  ScopedEnv env("REEL_PASSES", "-gemm_epilog");
  try {
    compile::passes_disabled_by_env();
    FAIL() << "expected reel::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'gemm_epilog'"), std::string::npos) << what;
    EXPECT_NE(what.find("gemm_epilogue"), std::string::npos) << "the message lists the passes: " << what;
  }
  try {
    compile::Graph g;
    compile::PassStats stats;
    compile::optimize_graph(g, compile::PassOptions(true, {"no_such_pass"}), stats);
    FAIL() << "expected reel::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_pass"), std::string::npos) << e.what();
  }
}

TEST(PassPipeline, FusionLogSaysWhyACandidateWasDeclined) {
  std::string log;
  {
    ScopedEnv env("REEL_LOG", "fusion");
    testing::internal::CaptureStderr();
    GptPlan p = gpt_plan({compile::Mode::Default});
    log = testing::internal::GetCapturedStderr();
    ASSERT_NE(p.plan, nullptr);
  }
  // In f32 nothing casts a layer norm's result to 16 bits: each norm is declined, saying so.
  EXPECT_NE(log.find("norm_cast: layer_norm k"), std::string::npos) << log.substr(0, 2000);
  EXPECT_NE(log.find("not fused with its cast: nothing casts y to 16 bits"), std::string::npos);
  // And what was fused is logged too.
  EXPECT_NE(log.find("[reel:fusion] fused "), std::string::npos);
  // Without the topic, nothing.
  testing::internal::CaptureStderr();
  GptPlan quiet = gpt_plan({compile::Mode::Default});
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("[reel:fusion]"), std::string::npos);
}

// The question a pass asks before it writes a fused node: answered from shapes and dtypes (meta
// tensors will do), false rather than an error for a call the op does not take.
TEST(PassPipeline, SupportsCallAnswersFromMetasAndNeverThrows) {
  auto meta = [](const Shape& s, DType d = DType::f32) {
    auto st = std::make_shared<Storage>(Storage::Meta{}, size_t(numel_of(s)) * dtype_size(d), Device::cpu());
    return Tensor::from_storage(st, s, d);
  };
  const Tensor a = meta({2, 3, 8}), b = meta({8, 16}), bias = meta({16}), y = meta({2, 3, 16});
  const Attrs attrs = Attrs().set("dtype", DType::f32);
  EXPECT_TRUE(supports_call(OpKind::GemmEpilogue, {a, b, bias}, {y}, attrs));
  EXPECT_FALSE(supports_call(OpKind::GemmEpilogue, {a, b, meta({15})}, {y}, attrs)) << "a bias of the wrong size";
  EXPECT_FALSE(supports_call(OpKind::GemmEpilogue, {a, b, bias}, {meta({2, 3, 15})}, attrs)) << "a wrong result shape";
  EXPECT_FALSE(supports_call(OpKind::GemmEpilogue, {a, b, bias}, {meta({2, 3, 16}, DType::bf16)}, attrs))
      << "a result dtype other than the schema's";
  // Nothing to prepare on the CPU; preparing is harmless.
  prepare_kernel(OpKind::GemmEpilogue, {a, b, bias}, {y}, attrs);
}
