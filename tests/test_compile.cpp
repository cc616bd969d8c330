// compile/: the tracer, the memory planner, plans and the compiled function's lifecycle, on the CPU.
//   - memory planning against hand-made lifetimes (disjoint buffers share bytes, overlapping never);
//   - eager vs compiled parity of whole training steps (a small GPT with AdamW, clipping and a
//     warm-up/cosine schedule; a CNN with BatchNorm and GroupNorm; a non-causal attention with a key
//     padding mask built inside the step): the same kernels run in the same
//     order, so losses, parameters and running statistics must agree to the bit;
//   - the accumulation contract holds through a plan (ACCUM micro-batches == one large batch);
//   - guards (another shape re-traces, logged under REEL_LOG=recompiles), the cache limit's message,
//     graph breaks (random ops) named with their op, outputs that stay valid across calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "compile/runtime/compile.h"
#include "compile/runtime/describe.h"
#include "tensor/log.h"
#include "compile/runtime/train_step.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "test_util.h"
#include "compile_test_util.h"

using namespace reel;
using reel::testing_util::token_batches;

namespace {

compile::Graph graph_with_buffers(const std::vector<size_t>& sizes) {
  compile::Graph g;
  for (size_t i = 0; i < sizes.size(); ++i) {
    compile::Buffer b;
    b.id = int(i);
    b.kind = compile::BufferKind::Internal;
    b.nbytes = sizes[i];
    b.device = Device::cpu();
    g.buffers.push_back(b);
  }
  return g;
}

compile::TensorRef whole(int buffer, int64_t floats) { return {buffer, {floats}, {1}, 0, DType::f32}; }

compile::Node node(std::vector<int> in, std::vector<int> out) {
  compile::Node n{OpKind::Add, Attrs(), {}, {}, false, {}};
  for (int b : in) n.inputs.push_back(whole(b, 256));
  for (int b : out) n.outputs.push_back(whole(b, 256));
  return n;
}

void expect_bitwise_equal(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i].to_vector<double>(), b[i].to_vector<double>()) << what << " " << i;
}

std::vector<Tensor> buffers_of(nn::Module& m) {
  std::vector<Tensor> out;
  for (auto& [name, t] : m.named_buffers()) out.push_back(t);
  return out;
}

struct TrainRun {
  std::vector<double> losses;
  std::shared_ptr<nn::Module> model;
};

// `steps` MODELS.md steps of `model` on fixed micro-batches, eagerly or compiled in `mode`.
template <typename MakeModel>
TrainRun train(MakeModel make_model, const std::vector<optim::MicroBatch>& micro, int steps, bool compiled) {
  TrainRun run{{}, make_model()};
  optim::AdamW opt(run.model->parameters(), optim::AdamWOptions(3e-3).weight_decay(0.01));
  opt.set_accum_steps(int64_t(micro.size())).set_max_grad_norm(1.0);
  opt.set_schedule(std::make_shared<optim::LinearWarmupCosine>(2, steps));
  nn::Module* m = run.model.get();
  auto loss_fn = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
  // Fusion off: the plan runs eager's own kernels, so results must agree to the bit.
  auto step = compile::compile_train_step(opt, loss_fn, {compile::Mode::Default, 8, false});
  for (int s = 0; s < steps; ++s) {
    if (compiled) {
      run.losses.push_back(step(compile::flatten_micro(micro))[0].item());
    } else {
      Tensor mean_loss;
      optim::train_step(opt, loss_fn, micro, &mean_loss);
      run.losses.push_back(mean_loss.item());
    }
  }
  if (compiled) {
    EXPECT_EQ(step.traces(), 1);
    EXPECT_EQ(step.replays(), steps - 2);
    EXPECT_TRUE(step.graph_breaks().empty());
  }
  return run;
}

}  // namespace

TEST(CompileMemoryPlan, DisjointLifetimesShareBytesOverlappingOnesNever) {
  // b0 -> b1 -> b2 -> b3, each 1 KiB: b0 dies when b1 is made and so on, so two slots suffice.
  compile::Graph g = graph_with_buffers({1024, 1024, 1024, 1024});
  g.nodes = {node({0}, {1}), node({1}, {2}), node({2}, {3})};
  g.nodes.insert(g.nodes.begin(), node({}, {0}));
  compile::MemoryPlan plan = compile::plan_memory(g);
  ASSERT_EQ(plan.arenas.size(), 1u);
  const compile::Arena& a = plan.arenas[0];
  EXPECT_EQ(a.unplanned_bytes, 4096u);
  EXPECT_EQ(a.bytes, 2048u);
  for (const auto& p : a.placements) {
    for (const auto& q : a.placements) {
      if (p.buffer != q.buffer && p.first <= q.last && q.first <= p.last) {
        EXPECT_TRUE(p.offset + p.nbytes <= q.offset || q.offset + q.nbytes <= p.offset)
            << "b" << p.buffer << " and b" << q.buffer << " overlap in time and in memory";
      }
    }
  }
  // An output of the graph lives to the end: it may not share with anything after it.
  g.outputs = {whole(1, 256)};
  EXPECT_EQ(compile::plan_memory(g).arenas[0].bytes, 3072u);
}

TEST(CompileMemoryPlan, BusiestMomentIsWhereTheMostBytesAreLive) {
  // b0 (1 KiB) -> b1 (2 KiB) -> b2 (512 B) -> b3 (4 KiB): live sums per node 1K, 3K, 2.5K, 4.5K.
  compile::Graph g = graph_with_buffers({1024, 2048, 512, 4096});
  g.nodes = {node({}, {0}), node({0}, {1}), node({1}, {2}), node({2}, {3})};
  compile::MemoryPlan plan = compile::plan_memory(g);
  ASSERT_EQ(plan.arenas.size(), 1u);
  const compile::Arena& a = plan.arenas[0];
  compile::BusiestMoment m = compile::busiest_moment(a);
  EXPECT_EQ(m.node, 3);
  EXPECT_EQ(m.bytes, 512u + 4096u);
  std::vector<int> live;
  for (size_t i : m.live) live.push_back(a.placements[i].buffer);
  std::sort(live.begin(), live.end());
  EXPECT_EQ(live, (std::vector<int>{2, 3}));
  EXPECT_LE(m.bytes, a.bytes);
  // b1 kept to the end (a graph output) makes the last node hold 2K + 512 + 4K.
  g.outputs = {whole(1, 512)};
  m = compile::busiest_moment(compile::plan_memory(g).arenas[0]);
  EXPECT_EQ(m.bytes, 2048u + 512u + 4096u);
  EXPECT_EQ(m.live.size(), 3u);
}

TEST(CompileParity, GptStepsMatchEagerToTheBit) {
  nn::GptConfig cfg{16, 8, 16, 2, 2};
  auto make = [cfg] {
    Generator gen(3);
    return std::static_pointer_cast<nn::Module>(nn::gpt(cfg, &gen));
  };
  auto micro = token_batches(2, 2, 8, 16);
  TrainRun eager = train(make, micro, 8, false);
  TrainRun compiled = train(make, micro, 8, true);
  EXPECT_EQ(eager.losses, compiled.losses);
  expect_bitwise_equal(eager.model->parameters(), compiled.model->parameters(), "parameter");
}

TEST(CompileParity, CnnWithBatchNormMatchesEagerToTheBit) {
  auto make = [] {
    Generator gen(4);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Conv2d>(3, 4, 3, 1, 1, false, &gen));
    m->push_back(std::make_shared<nn::BatchNorm2d>(4));
    m->push_back(std::make_shared<nn::ReLU>());
    m->push_back(std::make_shared<nn::Conv2d>(4, 8, 3, 2, 1, false, &gen));
    m->push_back(std::make_shared<nn::GroupNorm>(2, 8));
    m->push_back(std::make_shared<nn::ReLU>());
    m->push_back(std::make_shared<nn::GlobalAvgPool2d>());
    m->push_back(std::make_shared<nn::Linear>(8, 5, true, &gen));
    return std::static_pointer_cast<nn::Module>(m);
  };
  Generator gen(12);
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < 3; ++i)
    micro.push_back({randn({2, 3, 6, 6}, {}, &gen), tensor_i64({i % 5, (i + 2) % 5}, {2})});
  TrainRun eager = train(make, micro, 6, false);
  TrainRun compiled = train(make, micro, 6, true);
  EXPECT_EQ(eager.losses, compiled.losses);
  expect_bitwise_equal(eager.model->parameters(), compiled.model->parameters(), "parameter");
  expect_bitwise_equal(buffers_of(*eager.model), buffers_of(*compiled.model), "running statistic");
}

TEST(CompileParity, AccumulatedCompiledStepEqualsOneLargeBatch) {
  // f64, no BatchNorm: ACCUM micro-batches through a plan == one batch of ACCUM times the size.
  auto make = [] { return testing_util::f64_mlp(5); };
  Generator gen(9);
  Tensor x = randn({12, 6}, {DType::f64}, &gen);
  Tensor y = tensor_i64({0, 1, 2, 2, 1, 0, 0, 0, 1, 2, 1, 1}, {12});
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < 3; ++i) micro.push_back({x.slice(0, 4 * i, 4 * i + 4), y.slice(0, 4 * i, 4 * i + 4)});

  auto accumulated = make();
  optim::SGD opt_a(accumulated->parameters(), optim::SGDOptions(0.1));
  opt_a.set_accum_steps(3).set_max_grad_norm(1.0);
  nn::Module* ma = accumulated.get();
  auto step = compile::compile_train_step(opt_a, [ma](const Tensor& a, const Tensor& b) { return nn::model_loss(*ma, a, b); });
  auto whole = make();
  optim::SGD opt_w(whole->parameters(), optim::SGDOptions(0.1));
  opt_w.set_max_grad_norm(1.0);
  nn::Module* mw = whole.get();
  for (int s = 0; s < 4; ++s) {
    step(compile::flatten_micro(micro));
    optim::train_step(opt_w, [mw](const Tensor& a, const Tensor& b) { return nn::model_loss(*mw, a, b); }, {{x, y}});
  }
  EXPECT_EQ(step.replays(), 2);
  auto pa = accumulated->parameters(), pw = whole->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    std::vector<double> a = pa[i].to_vector<double>(), w = pw[i].to_vector<double>();
    for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], w[k], 1e-12) << "parameter " << i;
  }
}

TEST(CompileGuards, AnotherShapeRetracesAndIsLogged) {
  setenv("REEL_LOG", "recompiles", 1);
  reload_log_topics();
  Tensor w = full({4}, 0.5);
  auto f = compile::compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{relu(in[0] * w).sum()}; });
  Tensor a = arange(8).reshape({2, 4}), b = arange(12).reshape({3, 4}) - 5.0;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(f({a})[0].item(), relu(a * w).sum().item());
  testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(f({b})[0].item(), relu(b * w).sum().item());
  std::string err = testing::internal::GetCapturedStderr();
  unsetenv("REEL_LOG");
  reload_log_topics();
  EXPECT_EQ(f.traces(), 2);
  EXPECT_EQ(f.replays(), 2);
  EXPECT_NE(err.find("recompiling: input 0 is (3, 4) f32 cpu, traced as (2, 4) f32 cpu"), std::string::npos) << err;
  EXPECT_EQ(f({a})[0].item(), relu(a * w).sum().item());  // the first plan is still cached
  EXPECT_EQ(f.traces(), 2);
}

TEST(CompileGuards, CacheLimitRunsEagerlyWithAClearMessage) {
  auto f = compile::compile([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2.0}; },
                            {compile::Mode::Default, 1});
  Tensor a = ones({2}), b = ones({3});
  for (int i = 0; i < 3; ++i) f({a});
  testing::internal::CaptureStderr();
  std::vector<Tensor> r = f({b});
  f({b});
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r[0].to_vector<float>(), std::vector<float>({2, 2, 2}));
  EXPECT_NE(err.find("cache limit reached (1 plans"), std::string::npos) << err;
  EXPECT_NE(err.find("input 0 is (3,) f32 cpu, traced as (2,) f32 cpu"), std::string::npos) << err;
  EXPECT_EQ(err.find("cache limit", err.find("cache limit") + 1), std::string::npos) << "warned twice: " << err;
  EXPECT_EQ(f.traces(), 1);
}

// Random numbers host code draws (a Generator used directly, no random op) would be frozen into a
// plan: the draw is a graph break and every call runs eagerly with fresh numbers. (Random ops are
// part of plans: tests/test_compile_random.cpp.)
TEST(CompileGraphBreaks, AHostDrawIsAGraphBreakNotAFrozenNumber) {
  Generator gen(1);
  auto f = compile::compile([&](const std::vector<Tensor>& in) {
    const uint64_t at = gen.advance(1);
    return std::vector<Tensor>{in[0] * double(philox_uniform(gen.seed(), at, 0))};
  });
  Tensor x = ones({4});
  std::vector<double> first = f({x})[0].to_vector<double>();
  f({x});
  std::vector<double> third = f({x})[0].to_vector<double>();
  ASSERT_EQ(f.graph_breaks().size(), 1u);
  EXPECT_EQ(f.graph_breaks()[0].op, "random draw");
  EXPECT_NE(f.graph_breaks()[0].reason.find("that no random op used"), std::string::npos) << f.graph_breaks()[0].reason;
  EXPECT_EQ(f.replays(), 0);
  EXPECT_EQ(f.eager_calls(), 3);
  EXPECT_NE(first, third);  // fresh numbers each call, as eagerly
}

// A value read on the host inside the function (item()) would be frozen into a plan at its traced
// value; the tracer reports the read as a graph break and every call runs eagerly, with its own value.
TEST(CompileGraphBreaks, AHostReadIsAGraphBreakNotAFrozenValue) {
  auto f = compile::compile([](const std::vector<Tensor>& in) {
    const double total = in[0].sum().item();
    return std::vector<Tensor>{in[0] * total};
  });
  for (int call = 0; call < 4; ++call) {
    const Tensor x = full({3}, double(call + 1));
    EXPECT_EQ(f({x})[0].to_vector<double>(), std::vector<double>(3, 3.0 * (call + 1) * (call + 1))) << "call " << call;
  }
  ASSERT_EQ(f.graph_breaks().size(), 1u);
  EXPECT_EQ(f.graph_breaks()[0].op, "item");
  EXPECT_NE(f.graph_breaks()[0].reason.find("reads a cpu tensor's values on the host"), std::string::npos)
      << f.graph_breaks()[0].reason;
  EXPECT_EQ(f.replays(), 0);
  EXPECT_EQ(f.eager_calls(), 4);
}

TEST(CompilePlan, OutputsStayValidAndTheArenaReusesMemory) {
  nn::GptConfig cfg{16, 8, 16, 2, 2};
  Generator gen(3);
  auto model = nn::gpt(cfg, &gen);
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3));
  opt.set_accum_steps(2);
  auto step = compile::compile_train_step(opt, [&](const Tensor& x, const Tensor& y) { return nn::model_loss(*model, x, y); });
  auto in = compile::flatten_micro(token_batches(2, 2, 8, 16));
  step(in);
  step(in);
  Tensor loss2 = step(in)[0];
  double kept = loss2.item();
  step(in);
  EXPECT_EQ(loss2.item(), kept);  // a returned tensor is a copy, not a view of the arena
  const compile::Plan* plan = step.last_plan();
  ASSERT_NE(plan, nullptr);
  const compile::Arena* arena = plan->memory().arena_for(Device::cpu());
  ASSERT_NE(arena, nullptr);
  EXPECT_LT(arena->bytes, arena->unplanned_bytes / 2) << compile::memory_summary(*plan);
  // The busiest node against a sweep over every node: no node holds more, and the arena holds it all.
  const compile::BusiestMoment m = compile::busiest_moment(*arena);
  size_t most = 0;
  for (int n = 0; n <= int(plan->graph().nodes.size()); ++n) {
    size_t live = 0;
    for (const compile::Placement& p : arena->placements) live += p.first <= n && n <= p.last ? p.nbytes : 0;
    most = std::max(most, live);
  }
  EXPECT_EQ(m.bytes, most);
  EXPECT_LE(m.bytes, arena->bytes);
  size_t listed = 0;
  for (size_t i : m.live) listed += arena->placements[i].nbytes;
  EXPECT_EQ(listed, m.bytes);
  EXPECT_NE(compile::memory_summary(*plan).find("busiest at k" + std::to_string(m.node) + ":"), std::string::npos)
      << compile::memory_summary(*plan);
  EXPECT_NE(compile::plan_summary(*plan).find("kernels"), std::string::npos);
  // Views that are not contiguous show their strides (the GEMMs read each Linear's W^T).
  EXPECT_NE(plan->graph().str().find("(16, 48) f32 strides (1, 16)"), std::string::npos) << plan->graph().str();
  EXPECT_NE(compile::plan_dot(*plan).find("digraph plan"), std::string::npos);
}

TEST(CompilePasses, RepeatedPureOpsAreComputedOnceUnlessAnInputChangedBetween) {
  Tensor w = arange(6).reshape({2, 3});
  auto f = compile::compile([&](const std::vector<Tensor>& in) {
    Tensor a = to_dtype(w, DType::f64) * in[0];  // the cast of w ...
    Tensor b = to_dtype(w, DType::f64) + in[0];  // ... repeated: computed once
    return std::vector<Tensor>{a + b};
  });
  Tensor x = full({2, 3}, 2.0, {DType::f64});
  Tensor w64 = to_dtype(w, DType::f64);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(f({x})[0].to_vector<double>(), (w64 * x + (w64 + x)).to_vector<double>());
  ASSERT_NE(f.last_plan(), nullptr);
  EXPECT_EQ(f.last_plan()->stats().deduplicated, 1u);

  Tensor v = ones({3});
  auto g = compile::compile([&](const std::vector<Tensor>& in) {
    Tensor a = v * 2.0;
    {
      NoGradGuard no_grad;
      add_(v, in[0]);  // v changes between the two identical-looking ops
    }
    Tensor b = v * 2.0;
    return std::vector<Tensor>{a, b};
  });
  Tensor one = ones({3});
  for (int i = 0; i < 3; ++i) {
    std::vector<Tensor> r = g({one});
    EXPECT_EQ(r[1].to_vector<float>()[0] - r[0].to_vector<float>()[0], 2.0f) << "call " << i;
  }
  EXPECT_EQ(g.last_plan()->stats().deduplicated, 0u);
}

TEST(CompileParity, ItemCountedStepWithASmallerLastMicroBatchMatchesEager) {
  // 10 items per step as micro-batches of 4, 4 and 2: each weighed by its share, in a plan as eagerly.
  auto make = [] { return testing_util::f64_mlp(6, 5, 7, 3); };
  Generator gen(13);
  Tensor x = randn({10, 5}, {DType::f64}, &gen);
  Tensor y = tensor_i64({0, 1, 2, 2, 1, 0, 0, 2, 1, 1}, {10});
  std::vector<optim::MicroBatch> micro = {{x.slice(0, 0, 4), y.slice(0, 0, 4), 4},
                                          {x.slice(0, 4, 8), y.slice(0, 4, 8), 4},
                                          {x.slice(0, 8, 10), y.slice(0, 8, 10), 2}};
  auto eager = make(), compiled = make();
  optim::SGD opt_e(eager->parameters(), optim::SGDOptions(0.1)), opt_c(compiled->parameters(), optim::SGDOptions(0.1));
  opt_e.set_items_per_step(10);
  opt_c.set_items_per_step(10);
  nn::Module* me = eager.get();
  nn::Module* mc = compiled.get();
  auto step = compile::compile_train_step(opt_c, [mc](const Tensor& a, const Tensor& b) { return nn::model_loss(*mc, a, b); },
                                          {compile::Mode::Default, 8, false});
  for (int s = 0; s < 4; ++s) {
    optim::train_step(opt_e, [me](const Tensor& a, const Tensor& b) { return nn::model_loss(*me, a, b); }, micro);
    step(compile::flatten_micro(micro));
  }
  EXPECT_EQ(step.replays(), 2);
  auto pe = eager->parameters(), pc = compiled->parameters();
  for (size_t i = 0; i < pe.size(); ++i) EXPECT_EQ(pe[i].to_vector<double>(), pc[i].to_vector<double>()) << i;
}

TEST(CompileParity, NonCausalAttentionWithAKeyPaddingMaskMatchesEagerToTheBit) {
  // An encoder's attention (every query sees every key) over padded sequences: the key padding mask is
  // built inside the step from a (B, T) 0/1 tensor and enters the attention op as its second input.
  const int64_t B = 3, T = 6, C = 8, H = 2, classes = 4;
  struct Encoder {
    std::shared_ptr<nn::SelfAttention> attn;
    std::shared_ptr<nn::Linear> head;
    std::vector<Tensor> parameters() const {
      std::vector<Tensor> p = attn->parameters(), q = head->parameters();
      p.insert(p.end(), q.begin(), q.end());
      return p;
    }
  };
  auto make = [&] {
    Generator gen(7);
    return Encoder{std::make_shared<nn::SelfAttention>(C, H, false, &gen),
                   std::make_shared<nn::Linear>(C, classes, true, &gen)};
  };
  // Batch 0 unpadded, batch 1 two keys padded, batch 2 five.
  std::vector<int64_t> pad;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) pad.push_back(t >= T - (b == 0 ? 0 : b == 1 ? 2 : 5) ? 1 : 0);
  const Tensor padding = tensor_i64(pad, {B, T});
  auto loss_of = [&](const Encoder& m) {
    return [&m, &padding](const Tensor& x, const Tensor& y) {
      Tensor h = m.attn->forward(x, nn::key_padding_mask(padding));  // (B, T, C)
      return cross_entropy(m.head->forward(mean(h, {1})), y);
    };
  };
  Generator gen(8);
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < 2; ++i) micro.push_back({randn({B, T, C}, {}, &gen), tensor_i64({i % 4, (i + 1) % 4, 3}, {B})});
  Encoder eager = make(), compiled = make();
  optim::AdamW opt_e(eager.parameters(), optim::AdamWOptions(1e-2)), opt_c(compiled.parameters(), optim::AdamWOptions(1e-2));
  opt_e.set_accum_steps(2);
  opt_c.set_accum_steps(2);
  auto step = compile::compile_train_step(opt_c, loss_of(compiled), {compile::Mode::Default, 8, false});
  std::vector<double> le, lc;
  for (int s = 0; s < 5; ++s) {
    Tensor mean_loss;
    optim::train_step(opt_e, loss_of(eager), micro, &mean_loss);
    le.push_back(mean_loss.item());
    lc.push_back(step(compile::flatten_micro(micro))[0].item());
  }
  EXPECT_EQ(step.traces(), 1);
  EXPECT_EQ(step.replays(), 3);
  EXPECT_EQ(le, lc);
  expect_bitwise_equal(eager.parameters(), compiled.parameters(), "parameter");
  // The plan holds the op with its mask and causal = 0, forward and backward.
  int forward = 0, backward = 0;
  for (const compile::Node& n : step.last_plan()->graph().nodes) {
    const bool masked = !n.attrs.b("causal", true);
    forward += n.op == OpKind::Attention && n.inputs.size() == 2 && masked;
    backward += n.op == OpKind::AttentionBackward && n.inputs.size() == 5 && masked;
  }
  EXPECT_EQ(forward, 2) << "one attention per micro-batch";
  EXPECT_EQ(backward, 2);
}
