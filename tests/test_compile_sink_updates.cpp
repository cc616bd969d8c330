// compile/passes/sink_state_updates.cpp and BatchNorm's num_batches_tracked in compiled steps:
//   - on hand-made graphs: in-place updates of External state that read only their own buffer move
//     to the end, buffer by buffer, a buffer's integer additions merged; one that a later node reads
//     stays, and so does every update of that buffer before it; other in-place nodes stay;
//   - a compiled training step of a conv + BatchNorm net (ACCUM 2, 3, 4, every pass on) ends with the
//     counts, parameters and running statistics of eager's steps, to the bit; a compiled forward counts
//     each replay in training and nothing in eval;
//   - the plan: a step's k BatchNorms x ACCUM counter updates are one kernel (with the step count and
//     the loss's last scalar op), not k x ACCUM kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>

#include "compile/passes/passes.h"
#include "compile/passes/pipeline.h"
#include "compile/runtime/compile.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/log.h"
#include "test_util.h"

using namespace reel;

namespace {

using compile::BufferKind;
using compile::Graph;
using compile::Node;
using compile::TensorRef;

// ---- hand-made graphs ----

using testing_util::graph_buffer;

TensorRef ref(int buffer, const Shape& shape, DType dtype = DType::f32) {
  return testing_util::graph_ref(buffer, shape, dtype);
}

Node node(OpKind op, std::vector<TensorRef> in, TensorRef out, bool in_place = false, double value = 0) {
  Node n = testing_util::graph_node(op, std::move(in), {std::move(out)}, in_place);
  if (op == OpKind::AddScalar || op == OpKind::MulScalar) n.attrs.set("value", value);
  return n;
}

// b += value, in place, as BatchNorm's count or the optimizer's step count is traced.
Node update(int b, DType dtype, double value = 1, OpKind op = OpKind::AddScalar) {
  return node(op, {ref(b, {}, dtype)}, ref(b, {}, dtype), true, value);
}

// Each node as "op b<written buffer>[=value]", for comparing orders.
std::vector<std::string> listing(const Graph& g) {
  std::vector<std::string> out;
  for (const Node& n : g.nodes) {
    std::string s = std::string(op_name(n.op)) + " b" + std::to_string(n.outputs[0].buffer);
    if (n.op == OpKind::AddScalar) s += "=" + std::to_string(int(n.attrs.f("value")));
    out.push_back(s);
  }
  return out;
}

size_t sink(Graph& g) {
  compile::PassStats st;
  compile::sink_state_updates(g, st);
  return st.fused;
}

TEST(SinkUpdates, CountersMoveToTheEndBufferByBufferAdditionsMerged) {
  Graph g;
  const int x = graph_buffer(g, BufferKind::Input, 16), c1 = graph_buffer(g, BufferKind::External, 8),
            c2 = graph_buffer(g, BufferKind::External, 8), t = graph_buffer(g, BufferKind::Internal, 16),
            u = graph_buffer(g, BufferKind::Internal, 16), w = graph_buffer(g, BufferKind::Internal, 16);
  // Two micro-batches of two BatchNorms: c1, (exp), c2, (neg), c1, (relu), c2.
  g.nodes = {update(c1, DType::i64), node(OpKind::Exp, {ref(x, {4})}, ref(t, {4})), update(c2, DType::i64),
             node(OpKind::Neg, {ref(t, {4})}, ref(u, {4})),  update(c1, DType::i64),
             node(OpKind::Relu, {ref(u, {4})}, ref(w, {4})), update(c2, DType::i64, 3)};
  g.outputs = {ref(w, {4})};
  EXPECT_EQ(sink(g), 2u) << "two additions merged";
  EXPECT_EQ(listing(g), (std::vector<std::string>{"exp b3", "neg b4", "relu b5", "add_scalar b1=2", "add_scalar b2=4"}));
  EXPECT_TRUE(g.nodes[3].in_place);
  EXPECT_EQ(g.nodes[3].fused, (std::vector<std::string>{"add_scalar", "add_scalar"}));
}

TEST(SinkUpdates, AnUpdateReadLaterStaysAndSoDoEarlierOnesOfItsBuffer) {
  // s += 1; exp; s += 1; y = t * s (reads s); neg; s *= 0.5; relu: the last update alone moves.
  Graph g;
  const int x = graph_buffer(g, BufferKind::Input, 16), s = graph_buffer(g, BufferKind::External, 4),
            t = graph_buffer(g, BufferKind::Internal, 16), y = graph_buffer(g, BufferKind::Internal, 16),
            z = graph_buffer(g, BufferKind::Internal, 16), r = graph_buffer(g, BufferKind::Internal, 16);
  g.nodes = {update(s, DType::f32),
             node(OpKind::Exp, {ref(x, {4})}, ref(t, {4})),
             update(s, DType::f32),
             node(OpKind::Mul, {ref(t, {4}), ref(s, {})}, ref(y, {4})),
             node(OpKind::Neg, {ref(y, {4})}, ref(z, {4})),
             update(s, DType::f32, 0.5, OpKind::MulScalar),
             node(OpKind::Relu, {ref(z, {4})}, ref(r, {4}))};
  g.outputs = {ref(r, {4})};
  EXPECT_EQ(sink(g), 0u);
  EXPECT_EQ(listing(g), (std::vector<std::string>{"add_scalar b1=1", "exp b2", "add_scalar b1=1", "mul b3", "neg b4",
                                                  "relu b5", "mul_scalar b1"}));
}

TEST(SinkUpdates, OnlyUpdatesOfExternalStateReadingNothingElseMove) {
  Graph g;
  const int x = graph_buffer(g, BufferKind::Input, 16), tmp = graph_buffer(g, BufferKind::Internal, 8),
            grad = graph_buffer(g, BufferKind::External, 16), f = graph_buffer(g, BufferKind::External, 4),
            t = graph_buffer(g, BufferKind::Internal, 16);
  g.nodes = {update(tmp, DType::i64),                                                        // Internal: stays
             node(OpKind::Add, {ref(grad, {4}), ref(x, {4})}, ref(grad, {4}), true),        // reads x too
             update(f, DType::f32), update(f, DType::f32),                                   // float: not merged
             node(OpKind::Exp, {ref(x, {4})}, ref(t, {4}))};
  g.outputs = {ref(t, {4}), ref(tmp, {}, DType::i64)};
  EXPECT_EQ(sink(g), 0u);
  EXPECT_EQ(listing(g), (std::vector<std::string>{"add_scalar b1=1", "add b2", "exp b4", "add_scalar b3=1",
                                                  "add_scalar b3=1"}));
}

TEST(SinkUpdates, RunsRightBeforeElementwiseFusion) {
  const auto& p = compile::pipeline();
  auto at = [&](const char* name) {
    return std::find_if(p.begin(), p.end(), [&](const compile::Pass& x) { return x.name == std::string(name); }) - p.begin();
  };
  ASSERT_LT(at("sink_updates"), int64_t(p.size()));
  EXPECT_LT(at("sink_updates"), at("elementwise"));
  EXPECT_EQ(p[size_t(at("sink_updates"))].stage, compile::PassStage::Fusion);
}

// ---- compiled steps ----

// conv + BatchNorm twice, then pooling and a Linear: two counters.
std::shared_ptr<nn::Module> conv_bn_net() {
  Generator gen(8);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Conv2d>(3, 4, 3, 1, 1, false, &gen));
  m->push_back(std::make_shared<nn::BatchNorm2d>(4));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Conv2d>(4, 8, 3, 2, 1, false, &gen));
  m->push_back(std::make_shared<nn::BatchNorm2d>(8, 1e-3, 0.03));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::GlobalAvgPool2d>());
  m->push_back(std::make_shared<nn::Linear>(8, 5, true, &gen));
  return m;
}

std::vector<const nn::BatchNorm2d*> batch_norms(const nn::Module& m) {
  std::vector<const nn::BatchNorm2d*> out;
  for (const auto& [name, child] : m.named_modules())
    if (auto* bn = dynamic_cast<const nn::BatchNorm2d*>(child.get())) out.push_back(bn);
  return out;
}

std::vector<optim::MicroBatch> image_batches(int accum) {
  Generator gen(30 + uint64_t(accum));
  std::vector<optim::MicroBatch> micro;
  for (int i = 0; i < accum; ++i) micro.push_back({randn({3, 3, 6, 6}, {}, &gen), tensor_i64({i % 5, 4, 2}, {3})});
  return micro;
}

struct Trained {
  std::shared_ptr<nn::Module> model;
  std::vector<double> losses;
  std::unique_ptr<optim::AdamW> opt;
  std::optional<compile::CompiledFunction> step;  // compiled runs only; it drives opt
};

// `steps` MODELS.md steps (AdamW, clipping), eagerly or compiled with `options`.
Trained train(int accum, int steps, std::optional<compile::CompileOptions> options) {
  Trained t{conv_bn_net(), {}, nullptr, std::nullopt};
  t.opt = std::make_unique<optim::AdamW>(t.model->parameters(), optim::AdamWOptions(3e-3).weight_decay(0.01));
  optim::AdamW* opt = t.opt.get();
  opt->set_accum_steps(accum).set_max_grad_norm(1.0);
  nn::Module* m = t.model.get();
  auto loss_fn = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
  const auto micro = image_batches(accum);
  if (options) t.step.emplace(compile::compile_train_step(*opt, loss_fn, *options));
  for (int s = 0; s < steps; ++s) {
    if (t.step) {
      t.losses.push_back((*t.step)(compile::flatten_micro(micro))[0].item());
    } else {
      Tensor mean_loss;
      optim::train_step(*opt, loss_fn, micro, &mean_loss);
      t.losses.push_back(mean_loss.item());
    }
  }
  return t;
}

TEST(SinkUpdatesTraining, CompiledCountsEqualEagersToTheBit) {
  for (int accum : {2, 3, 4}) {
    SCOPED_TRACE("ACCUM " + std::to_string(accum));
    const int steps = 5;  // warm-up, trace, three replays
    Trained eager = train(accum, steps, std::nullopt), compiled = train(accum, steps, compile::CompileOptions());
    ASSERT_EQ(compiled.step->replays(), steps - 2);
    EXPECT_TRUE(compiled.step->graph_breaks().empty());
    for (const nn::BatchNorm2d* bn : batch_norms(*compiled.model))
      EXPECT_EQ(bn->num_batches_tracked().to_vector<int64_t>(), std::vector<int64_t>{int64_t(steps * accum)});
    EXPECT_EQ(eager.losses, compiled.losses);
    auto se = eager.model->named_state(), sc = compiled.model->named_state();
    ASSERT_EQ(se.size(), sc.size());
    for (size_t i = 0; i < se.size(); ++i) {
      EXPECT_EQ(se[i].second.dtype(), sc[i].second.dtype()) << se[i].first;
      EXPECT_EQ(se[i].second.to_vector<double>(), sc[i].second.to_vector<double>()) << se[i].first;
    }
  }
}

TEST(SinkUpdatesTraining, ACompiledForwardCountsInTrainingOnly) {
  for (bool training : {true, false}) {
    auto model = conv_bn_net();
    model->train(training);
    nn::Module* m = model.get();
    compile::CompiledFunction fwd = compile::compile(
        [m](const std::vector<Tensor>& in) { return std::vector<Tensor>{m->forward(in[0])}; });
    Tensor x = randn({2, 3, 6, 6});
    for (int i = 0; i < 5; ++i) fwd({x});
    EXPECT_EQ(fwd.replays(), 3);
    for (const nn::BatchNorm2d* bn : batch_norms(*model))
      EXPECT_EQ(bn->num_batches_tracked().to_vector<int64_t>(), std::vector<int64_t>{training ? 5 : 0});
  }
}

// Nodes of the plan that write a 0-dim i64 External buffer: the counters' updates.
size_t counter_kernels(const compile::Plan& p) {
  const Graph& g = p.graph();
  return size_t(std::count_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) {
    return std::any_of(n.outputs.begin(), n.outputs.end(), [&](const TensorRef& r) {
      return r.dtype == DType::i64 && r.shape.empty() && g.buffers[r.buffer].kind == BufferKind::External;
    });
  }));
}

TEST(SinkUpdatesTraining, KBatchNormsTimesAccumUpdatesAreOneKernel) {
  const int accum = 4;
  Trained on = train(accum, 3, compile::CompileOptions());
  Trained off = train(accum, 3, compile::CompileOptions(compile::Mode::Default, 8, true, {"sink_updates"}));
  const compile::Plan *p_on = on.step->last_plan(), *p_off = off.step->last_plan();
  ASSERT_NE(p_on, nullptr);
  ASSERT_NE(p_off, nullptr);
  const size_t k = batch_norms(*on.model).size();
  ASSERT_EQ(k, 2u);
  // Without the pass the k x ACCUM updates sit between the convolutions of each micro-batch, where
  // elementwise fusion can gather each counter's ACCUM adds (moving each up to the one before) but
  // not the k counters together: at least k kernels. With the pass, one.
  EXPECT_GE(counter_kernels(*p_off), k);
  EXPECT_LE(counter_kernels(*p_off), k * accum);
  EXPECT_EQ(counter_kernels(*p_on), 1u);
  EXPECT_LT(p_on->kernels(), p_off->kernels())
      << "with the pass " << p_on->kernels() << " kernels, without " << p_off->kernels();
  EXPECT_EQ(on.losses, off.losses);
}

TEST(SinkUpdatesTraining, FusionLogSaysWhatMovedAndWhatStayed) {
  const char* old = std::getenv("REEL_LOG");
  const std::string saved = old ? old : "";
  setenv("REEL_LOG", "fusion", 1);
  reload_log_topics();
  testing::internal::CaptureStderr();
  Trained t = train(2, 3, compile::CompileOptions());
  const std::string log = testing::internal::GetCapturedStderr();
  if (old) setenv("REEL_LOG", saved.c_str(), 1);
  else unsetenv("REEL_LOG");
  reload_log_topics();
  // 2 BatchNorms x 2 micro-batches and the optimizer's step count; its update count stays (read by the update).
  EXPECT_NE(log.find("sink_updates: 5 in-place updates of step state at the end of the step (5 moved there), as 3 "
                     "(2 integer additions merged)"),
            std::string::npos)
      << log.substr(0, 3000);
  EXPECT_NE(log.find("stays: k"), std::string::npos);
}

}  // namespace
