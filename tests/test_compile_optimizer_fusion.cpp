// compile/fuse_optimizer: a traced optimizer step's adamw_step / sgd_step nodes become one
// multi-tensor kernel, and the results do not change by a single bit.
//   - the pass on hand-made graphs: what forms a run and what splits one (other lr or step tensors,
//     other attrs, overlapping memory, a node in between, another op);
//   - CPU: a small GPT's compiled step has ONE adamw_step node after fusion, and 10 steps of AdamW
//     with weight decay, clipping and a warm-up/cosine schedule (and SGD with momentum) give the
//     parameters of the unfused plan and of eager to the bit; a zoo of parameters in f32, f64, f16
//     and bf16 with sizes that cross the kernels' chunk boundaries, with a step skipped for a
//     non-finite gradient (parameters unchanged);
//   - GPU (skipped without one): the same in the default and reduce-overhead modes, in fp32, bf16
//     and fp16 with a GradScaler, the fp16 overflow planted inside a replayed CUDA graph, and more
//     tensors than one launch's table holds.
// On the GPU other fusion passes (GEMM epilogues, elementwise codegen) round differently from eager,
// so the GPU comparisons build their plans with the optimizer fusion as the only pass
// (OptimizerOnlyStep); on the CPU the whole pipeline is compared as well.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "compile/ir/trace.h"
#include "compile/passes/passes.h"
#include "compile/runtime/compile.h"
#include "compile/runtime/plan.h"
#include "compile/runtime/train_step.h"
#include "compile_test_util.h"
#include "kernels/cuda/multi_tensor_optim.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;
using reel::testing_util::same_bits;
using reel::testing_util::token_batches;

namespace {

const Device kGpu = Device::cuda(0);

// ---- the pass on hand-made graphs ----------------------------------------------------------------

// A graph built by hand: External CPU buffers, adamw_step nodes over 8 floats of them, other ops.
struct HandGraph {
  compile::Graph g;
  int buffer(int64_t floats) {
    compile::Buffer b;
    b.id = int(g.buffers.size());
    b.kind = compile::BufferKind::External;
    b.nbytes = size_t(floats) * 4;
    g.buffers.push_back(b);
    return b.id;
  }
  // adamw_step on (p, g, m, v) of 8 floats at `offset` in buffers p..v, reading lr and step.
  void adamw(int p, int gr, int m, int v, int lr, int step, double wd = 0.01, int64_t offset = 0) {
    Attrs a;
    a.set("beta1", 0.9).set("beta2", 0.999).set("eps", 1e-8).set("weight_decay", wd);
    compile::Node n{OpKind::AdamWStep, a, {}, {}, true, {}};
    n.inputs = {f32(p, offset), f32(gr, offset), f32(m, offset), f32(v, offset), std::nullopt, f64(lr), f64(step)};
    n.outputs = {f32(p, offset), f32(m, offset), f32(v, offset)};
    g.nodes.push_back(n);
  }
  // sgd_step with momentum on (p, g, buf), reading lr.
  void sgd(int p, int gr, int buf, int lr) {
    Attrs a;
    a.set("momentum", 0.9).set("dampening", 0.0).set("weight_decay", 0.0).set("nesterov", false).set("first_step", false);
    compile::Node n{OpKind::SgdStep, a, {}, {}, true, {}};
    n.inputs = {f32(p, 0), f32(gr, 0), f32(buf, 0), std::nullopt, f64(lr)};
    n.outputs = {f32(p, 0), f32(buf, 0)};
    g.nodes.push_back(n);
  }
  void other(int in, int out) {
    compile::Node n{OpKind::Add, Attrs(), {f32(in, 0), f32(in, 0)}, {f32(out, 0)}, false, {}};
    g.nodes.push_back(n);
  }
  static compile::TensorRef f32(int b, int64_t offset) { return {b, {8}, {1}, offset, DType::f32}; }
  static compile::TensorRef f64(int b) { return {b, {}, {}, 0, DType::f64}; }
  std::vector<size_t> run_sizes() const {
    std::vector<size_t> out;
    for (const compile::Node& n : g.nodes) out.push_back(n.fused.empty() ? 1 : n.fused.size());
    return out;
  }
};

// ---- training runs --------------------------------------------------------------------------------

// A model (or bare parameters), its optimizer and its loss, made afresh for each run.
struct Trainee {
  std::shared_ptr<nn::Module> model;  // null for a bare parameter zoo
  std::vector<Tensor> params;
  std::unique_ptr<optim::Optimizer> opt;
  optim::LossFn loss;
  bool plain = false;  // backward + opt.step() (any dtypes) instead of train_step (one dtype: global norm)
};
using MakeTrainee = std::function<Trainee()>;

// The step function: train_step as compile_train_step runs it (mean loss and scale out), or for a
// plain trainee loss.backward(), opt.step(), opt.zero_grad() on the one micro-batch.
compile::StepFn train_fn(Trainee& t) {
  optim::Optimizer& opt = *t.opt;
  optim::LossFn loss = t.loss;
  if (t.plain) {
    return [&opt, loss](const std::vector<Tensor>& in) {
      Tensor l = loss(in[0], in[1]);
      l.backward();
      opt.step();
      opt.zero_grad();
      return std::vector<Tensor>{l, ones({}, TensorOptions().with_device(l.device()))};
    };
  }
  return [&opt, loss](const std::vector<Tensor>& in) {
    std::vector<optim::MicroBatch> micro;
    for (size_t i = 0; i < in.size(); i += 2) micro.push_back({in[i], in[i + 1]});
    Tensor mean_loss;
    optim::StepResult r = optim::train_step(opt, loss, micro, &mean_loss);
    Tensor scale = r.scale.defined() ? r.scale : ones({}, TensorOptions().with_device(mean_loss.device()));
    return std::vector<Tensor>{mean_loss, scale};
  };
}

// compile()'s lifecycle (call 0 eager, call 1 traced, then the plan) with the optimizer fusion as the
// only fusion pass (or none), so that the plan runs eager's kernels everywhere else.
class OptimizerOnlyStep {
 public:
  OptimizerOnlyStep(compile::StepFn fn, compile::Mode mode, bool fuse) : fn_(std::move(fn)), mode_(mode), fuse_(fuse) {}

  std::vector<Tensor> operator()(const std::vector<Tensor>& in) {
    if (calls_++ == 0) return fn_(in);
    if (plan_) return plan_->run(in);
    compile::Tracer tracer(in);
    tracer.start();
    std::vector<Tensor> out;
    try {
      out = fn_(in);
    } catch (...) {
      tracer.stop();
      throw;
    }
    tracer.stop();
    compile::Graph g = tracer.finish(out);
    EXPECT_TRUE(tracer.breaks().empty());
    if (fuse_) compile::fuse_optimizer(g, stats_);
    plan_ = std::make_unique<compile::Plan>(std::move(g), mode_, compile::PassOptions{false});
    return out;
  }
  const compile::Plan* plan() const { return plan_.get(); }
  const compile::PassStats& stats() const { return stats_; }

 private:
  compile::StepFn fn_;
  compile::Mode mode_;
  bool fuse_;
  int calls_ = 0;
  compile::PassStats stats_;
  std::unique_ptr<compile::Plan> plan_;
};

enum class Path { Eager, Unfused, Fused, OptimizerOnly };

struct Outcome {
  std::vector<double> losses, scales;
  std::vector<std::vector<std::vector<double>>> params;  // after each step, per parameter
  size_t params_with_grad = 0;
  size_t optimizer_nodes = 0;  // adamw_step and sgd_step nodes of the plan
  size_t largest_fused = 0;    // the most ops one of them fused
  size_t stats_fused = 0;
  size_t graphs = 0;           // CUDA graphs the plan captured
};

std::vector<std::vector<double>> snapshot(const std::vector<Tensor>& params) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : params) out.push_back(p.to_vector<double>());
  return out;
}

void count_optimizer_nodes(const compile::Graph& g, Outcome& o) {
  for (const compile::Node& n : g.nodes) {
    if (n.op != OpKind::AdamWStep && n.op != OpKind::SgdStep && n.op != OpKind::MultiTensorAdamW &&
        n.op != OpKind::MultiTensorSgd)
      continue;
    o.optimizer_nodes += 1;
    // The per-parameter updates it holds (a clip folded in adds "unscale_check" to the list).
    const size_t updates = size_t(std::count_if(
        n.fused.begin(), n.fused.end(), [](const std::string& f) { return f == "adamw_step" || f == "sgd_step"; }));
    o.largest_fused = std::max(o.largest_fused, updates);
  }
}

// `steps` steps along `path`; step `poisoned` (if any) uses `poison` instead of `clean`.
Outcome run(const MakeTrainee& make, Path path, compile::Mode mode, const std::vector<optim::MicroBatch>& clean,
            int steps, int poisoned = -1, const std::vector<optim::MicroBatch>& poison = {}) {
  Trainee t = make();
  std::optional<compile::CompiledFunction> compiled;
  std::optional<OptimizerOnlyStep> only;
  if (path == Path::Unfused || path == Path::Fused)
    compiled.emplace(compile::compile(train_fn(t), {mode, 8, path == Path::Fused}));
  if (path == Path::OptimizerOnly) only.emplace(train_fn(t), mode, true);
  compile::StepFn eager = train_fn(t);
  Outcome o;
  for (int s = 0; s < steps; ++s) {
    const std::vector<optim::MicroBatch>& micro = s == poisoned ? poison : clean;
    std::vector<Tensor> out;
    if (compiled) out = (*compiled)(compile::flatten_micro(micro));
    else if (only) out = (*only)(compile::flatten_micro(micro));
    else out = eager(compile::flatten_micro(micro));
    o.losses.push_back(out[0].item());
    o.scales.push_back(out[1].item());
    o.params.push_back(snapshot(t.params));
  }
  for (const Tensor& p : t.params) o.params_with_grad += p.requires_grad() ? 1 : 0;
  const compile::Plan* plan = compiled ? compiled->last_plan() : only ? only->plan() : nullptr;
  if (path != Path::Eager) {
    EXPECT_NE(plan, nullptr);
    if (!plan) return o;
    count_optimizer_nodes(plan->graph(), o);
    o.stats_fused = compiled ? plan->stats().fused : only->stats().fused;
    o.graphs = plan->graphs();
  }
  return o;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_TRUE(same_bits(a.losses, b.losses)) << what << ": losses";
  EXPECT_EQ(a.scales, b.scales) << what;
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  for (size_t s = 0; s < a.params.size(); ++s)
    for (size_t i = 0; i < a.params[s].size(); ++i)
      EXPECT_EQ(a.params[s][i], b.params[s][i]) << what << ": parameter " << i << " after step " << s;
}

// One fused optimizer node holding every parameter's update.
void expect_one_optimizer_node(const Outcome& o, const std::string& what) {
  EXPECT_EQ(o.optimizer_nodes, 1u) << what;
  EXPECT_EQ(o.largest_fused, o.params_with_grad) << what;
  EXPECT_GE(o.stats_fused, o.params_with_grad - 1) << what;
}

// A small GPT on `d` with AdamW (weight decay, clipping, warm-up/cosine) or SGD (momentum).
MakeTrainee gpt_trainee(Device d, bool sgd, int steps, bool scaler = false) {
  return [=] {
    Generator gen(3);
    Trainee t;
    t.model = nn::gpt(nn::GptConfig{16, 8, 16, 2, 2}, &gen);
    t.model->to(d);
    t.params = t.model->parameters();
    if (sgd)
      t.opt = std::make_unique<optim::SGD>(t.params,
                                           optim::SGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(1e-3));
    else t.opt = std::make_unique<optim::AdamW>(t.params, optim::AdamWOptions(3e-3).weight_decay(0.01));
    t.opt->set_accum_steps(2).set_max_grad_norm(1.0);
    t.opt->set_schedule(std::make_shared<optim::LinearWarmupCosine>(2, steps));
    if (scaler) t.opt->set_grad_scaler(std::make_shared<optim::GradScaler>());
    nn::Module* m = t.model.get();
    t.loss = [m](const Tensor& x, const Tensor& y) { return nn::model_loss(*m, x, y); };
    return t;
  };
}

// Bare parameters of sizes around the kernels' chunks (CPU 16384 elements, GPU 1024 per block and
// 128 tensors per launch): `f32_tensors` small f32 ones, a 70001-element one (several CPU chunks,
// threaded), with `huge` one of 3000017 (more GPU blocks than the grid), and with `mixed` 12 more in
// f64, f16 and bf16. loss = sum_p sum(p * p * x), in f32. A mixed zoo steps plainly (the
// accumulation boundary's global norm wants one dtype); the others step through train_step and skip
// a step whose gradients are not finite.
MakeTrainee zoo_trainee(Device d, bool sgd, int f32_tensors, bool huge, bool mixed) {
  return [=] {
    Generator gen(7);
    Trainee t;
    const int64_t sizes[] = {1, 7, 256, 1000, 1025, 4099, 16385};
    const DType others[] = {DType::f64, DType::f16, DType::bf16};
    for (int i = 0; i < f32_tensors; ++i)
      t.params.push_back(randn({sizes[i % 7]}, TensorOptions().with_device(d), &gen));
    t.params.push_back(randn({70001}, TensorOptions().with_device(d), &gen));
    if (huge) t.params.push_back(randn({3000017}, TensorOptions().with_device(d), &gen));
    for (int i = 0; mixed && i < 12; ++i)
      t.params.push_back(randn({sizes[i % 7], 2}, TensorOptions().with_dtype(others[i % 3]).with_device(d), &gen));
    for (Tensor& p : t.params) p.set_requires_grad(true);
    if (sgd)
      t.opt = std::make_unique<optim::SGD>(t.params,
                                           optim::SGDOptions(0.01).momentum(0.9).nesterov(true).weight_decay(1e-2));
    else t.opt = std::make_unique<optim::AdamW>(t.params, optim::AdamWOptions(1e-2).weight_decay(0.05));
    t.opt->set_schedule(std::make_shared<optim::LinearWarmupCosine>(3, 12));
    t.opt->set_skip_nonfinite(true);
    t.plain = mixed;
    std::vector<Tensor> ps = t.params;
    t.loss = [ps](const Tensor& x, const Tensor&) {
      Tensor total;
      for (const Tensor& p : ps) {
        Tensor term = to_dtype(sum(mul(mul(p, p), to_dtype(x, p.dtype()))), DType::f32);
        total = total.defined() ? add(total, term) : term;
      }
      return total;
    };
    return t;
  };
}

std::vector<optim::MicroBatch> zoo_batch(double x, Device d) {
  return {{full({1}, x, TensorOptions().with_device(d)), zeros({1}, TensorOptions().with_device(d))}};
}

}  // namespace

TEST(FuseOptimizerPass, ConsecutiveUpdatesSharingTheStepTensorsBecomeOneNode) {
  HandGraph h;
  const int lr = h.buffer(2), step = h.buffer(2), lr2 = h.buffer(2), x = h.buffer(8), y = h.buffer(8);
  std::vector<int> b;
  for (int i = 0; i < 40; ++i) b.push_back(h.buffer(16));
  h.adamw(b[0], b[1], b[2], b[3], lr, step);
  h.adamw(b[4], b[5], b[6], b[7], lr, step);
  h.adamw(b[8], b[9], b[10], b[11], lr, step);         // run of 3
  h.adamw(b[12], b[13], b[14], b[15], lr2, step);      // another lr: a new run
  h.adamw(b[16], b[17], b[18], b[19], lr2, step, 0.0);  // other attrs: alone
  h.other(x, y);                                        // not an optimizer op
  h.adamw(b[20], b[21], b[22], b[23], lr, step);
  h.adamw(b[20], b[25], b[26], b[27], lr, step, 0.01, 8);  // other half of b[20]: disjoint, joins
  h.adamw(b[28], b[20], b[30], b[31], lr, step);           // reads b[20] that the run writes: a new run
  h.adamw(b[32], b[33], b[34], b[35], lr, step);
  h.sgd(b[36], b[37], b[38], lr);  // another op: a run of its own
  h.sgd(b[39], b[1], b[2], lr);
  compile::PassStats stats;
  compile::fuse_optimizer(h.g, stats);
  EXPECT_EQ(h.run_sizes(), (std::vector<size_t>{3, 1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(stats.fused, 5u);
  const compile::Node& first = h.g.nodes[0];
  EXPECT_TRUE(first.in_place);
  EXPECT_EQ(first.op, OpKind::MultiTensorAdamW);
  EXPECT_EQ(first.attrs.i("tensors"), 3);
  ASSERT_EQ(first.inputs.size(), 3u * 4 + 3);  // p g m v of each, then found_inf? lr step
  ASSERT_EQ(first.outputs.size(), 3u * 3);     // p m v of each
  EXPECT_EQ(first.inputs[4]->buffer, b[4]);
  EXPECT_FALSE(first.inputs[12].has_value());
  EXPECT_EQ(first.inputs[13]->buffer, lr);
  EXPECT_EQ(first.outputs[8].buffer, b[11]);
  EXPECT_EQ(h.g.nodes[1].op, OpKind::AdamWStep) << "a single update stays the op's own kernel";
  const compile::Node& sgd = h.g.nodes.back();
  EXPECT_EQ(sgd.op, OpKind::MultiTensorSgd);
  EXPECT_EQ(sgd.attrs.i("tensors"), 2);
  EXPECT_EQ(sgd.inputs.size(), 2u * 3 + 2);  // p g buf of each, then found_inf? lr
  EXPECT_EQ(sgd.outputs.size(), 2u * 2);     // p buf of each
}

TEST(FuseOptimizerCpu, GptAdamWStepIsOneKernelAndMatchesUnfusedAndEagerToTheBit) {
  auto micro = token_batches(2, 2, 8, 16, Device::cpu());
  MakeTrainee make = gpt_trainee(Device::cpu(), false, 10);
  Outcome eager = run(make, Path::Eager, compile::Mode::Default, micro, 10);
  Outcome unfused = run(make, Path::Unfused, compile::Mode::Default, micro, 10);
  Outcome fused = run(make, Path::Fused, compile::Mode::Default, micro, 10);
  EXPECT_EQ(unfused.optimizer_nodes, unfused.params_with_grad);
  expect_one_optimizer_node(fused, "gpt adamw");
  expect_same(eager, unfused, "unfused plan vs eager");
  expect_same(eager, fused, "fused plan vs eager");
}

TEST(FuseOptimizerCpu, GptSgdWithMomentumMatchesUnfusedAndEagerToTheBit) {
  auto micro = token_batches(2, 2, 8, 16, Device::cpu());
  MakeTrainee make = gpt_trainee(Device::cpu(), true, 10);
  Outcome eager = run(make, Path::Eager, compile::Mode::Default, micro, 10);
  Outcome unfused = run(make, Path::Unfused, compile::Mode::Default, micro, 10);
  Outcome fused = run(make, Path::Fused, compile::Mode::Default, micro, 10);
  expect_one_optimizer_node(fused, "gpt sgd");
  expect_same(eager, unfused, "unfused plan vs eager");
  expect_same(eager, fused, "fused plan vs eager");
}

TEST(FuseOptimizerCpu, MixedDtypesAndChunkedTensors) {
  const Device cpu = Device::cpu();
  auto batch = zoo_batch(0.25, cpu);
  for (bool sgd : {false, true}) {
    const std::string what = sgd ? "sgd nesterov" : "adamw";
    MakeTrainee make = zoo_trainee(cpu, sgd, 9, false, true);
    Outcome eager = run(make, Path::Eager, compile::Mode::Default, batch, 10);
    Outcome fused = run(make, Path::Fused, compile::Mode::Default, batch, 10);
    Outcome only = run(make, Path::OptimizerOnly, compile::Mode::Default, batch, 10);
    expect_one_optimizer_node(fused, what);
    expect_one_optimizer_node(only, what);
    expect_same(eager, fused, what + ": fused plan vs eager");
    expect_same(eager, only, what + ": optimizer-only fusion vs eager");
  }
}

TEST(FuseOptimizerCpu, ANonFiniteGradientSkipsTheFusedStep) {
  const Device cpu = Device::cpu();
  auto clean = zoo_batch(0.25, cpu), poison = zoo_batch(std::numeric_limits<double>::infinity(), cpu);
  for (bool sgd : {false, true}) {
    const std::string what = sgd ? "sgd nesterov" : "adamw";
    MakeTrainee make = zoo_trainee(cpu, sgd, 9, false, false);
    Outcome eager = run(make, Path::Eager, compile::Mode::Default, clean, 10, 6, poison);
    Outcome fused = run(make, Path::Fused, compile::Mode::Default, clean, 10, 6, poison);
    expect_one_optimizer_node(fused, what);
    expect_same(eager, fused, what + ": fused plan vs eager");
    EXPECT_EQ(fused.params[6], fused.params[5]) << what << ": the non-finite step changed a parameter";
    EXPECT_NE(fused.params[7], fused.params[6]) << what << ": the step after it did not update";
  }
}

TEST(FuseOptimizerCuda, GptMatchesEagerToTheBitInEveryModeAndPrecision) {
  REEL_REQUIRE_GPU();
  auto micro = token_batches(2, 4, 8, 16, kGpu);
  for (const char* prec : {"fp32", "bf16", "fp16"}) {
    AutocastGuard amp(PrecisionPolicy::parse(prec));
    for (bool sgd : {false, true}) {
      MakeTrainee make = gpt_trainee(kGpu, sgd, 12, autocast_policy().needs_grad_scaler());
      Outcome eager = run(make, Path::Eager, compile::Mode::Default, micro, 12);
      for (compile::Mode mode : {compile::Mode::Default, compile::Mode::ReduceOverhead}) {
        const std::string what = std::string(prec) + (sgd ? " sgd " : " adamw ") + compile::mode_name(mode);
        Outcome fused = run(make, Path::OptimizerOnly, mode, micro, 12);
        expect_one_optimizer_node(fused, what);
        if (mode == compile::Mode::ReduceOverhead) {
          EXPECT_EQ(fused.graphs, 1u) << what;
        }
        expect_same(eager, fused, what);
      }
    }
  }
}

TEST(FuseOptimizerCuda, Fp16OverflowInsideTheGraphSkipsTheStep) {
  REEL_REQUIRE_GPU();
  AutocastGuard amp(PrecisionPolicy::parse("fp16"));
  MakeTrainee make = [] {
    Generator gen(4);
    Trainee t;
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1, false, &gen));
    m->push_back(std::make_shared<nn::BatchNorm2d>(8));
    m->push_back(std::make_shared<nn::ReLU>());
    m->push_back(std::make_shared<nn::GlobalAvgPool2d>());
    m->push_back(std::make_shared<nn::Linear>(8, 10, true, &gen));
    m->to(kGpu);
    t.model = m;
    t.params = m->parameters();
    t.opt = std::make_unique<optim::AdamW>(t.params, optim::AdamWOptions(3e-3).weight_decay(0.01));
    t.opt->set_accum_steps(2).set_max_grad_norm(1.0);
    t.opt->set_grad_scaler(std::make_shared<optim::GradScaler>());
    nn::Module* mp = m.get();
    t.loss = [mp](const Tensor& x, const Tensor& y) { return nn::model_loss(*mp, x, y); };
    return t;
  };
  Generator gen(12);
  std::vector<optim::MicroBatch> clean;
  for (int i = 0; i < 2; ++i)
    clean.push_back(
        {randn({4, 3, 8, 8}, TensorOptions().with_device(kGpu), &gen), tensor_i64({i, 3, 7, 5}, {4}, kGpu)});
  std::vector<optim::MicroBatch> poison = clean;
  std::vector<float> v = clean[1].inputs.to_vector<float>();
  v[0] = std::numeric_limits<float>::infinity();
  poison[1].inputs = Tensor::from_vector<float>(v, clean[1].inputs.shape()).to(kGpu);
  // Step 5 is a replay of the captured graph; its inputs hold an inf.
  Outcome eager = run(make, Path::Eager, compile::Mode::Default, clean, 8, 5, poison);
  Outcome graphed = run(make, Path::OptimizerOnly, compile::Mode::ReduceOverhead, clean, 8, 5, poison);
  expect_one_optimizer_node(graphed, "cnn fp16");
  expect_same(eager, graphed, "fp16 with a planted overflow");
  EXPECT_EQ(graphed.scales[5], graphed.scales[4] / 2) << "the overflow halves the scale";
  EXPECT_EQ(graphed.params[5], graphed.params[4]) << "the skipped step changed a parameter";
  EXPECT_NE(graphed.params[6], graphed.params[5]) << "the step after it did not update";
}

TEST(FuseOptimizerCuda, MixedDtypesAndMoreTensorsThanOneLaunchHolds) {
  REEL_REQUIRE_GPU();
  auto clean = zoo_batch(0.25, kGpu), poison = zoo_batch(std::numeric_limits<double>::infinity(), kGpu);
  for (bool mixed : {true, false}) {
    for (bool sgd : {false, true}) {
      // A mixed zoo steps plainly (no skip); a single-dtype one skips its poisoned step 6.
      const int poisoned = mixed ? -1 : 6;
      MakeTrainee make = zoo_trainee(kGpu, sgd, 2 * cuda::kMaxTensorsPerLaunch + 11, true, mixed);
      Outcome eager = run(make, Path::Eager, compile::Mode::Default, clean, 10, poisoned, poison);
      for (compile::Mode mode : {compile::Mode::Default, compile::Mode::ReduceOverhead}) {
        const std::string what =
            std::string(mixed ? "mixed " : "f32 ") + (sgd ? "sgd " : "adamw ") + compile::mode_name(mode);
        Outcome fused = run(make, Path::OptimizerOnly, mode, clean, 10, poisoned, poison);
        expect_one_optimizer_node(fused, what);
        expect_same(eager, fused, what);
        if (!mixed) {
          EXPECT_EQ(fused.params[6], fused.params[5]) << what << ": the non-finite step changed a parameter";
        }
      }
    }
  }
}

TEST(FuseOptimizerCuda, TheWholePipelineCapturesOneOptimizerKernel) {
  REEL_REQUIRE_GPU();
  auto micro = token_batches(2, 4, 8, 16, kGpu);
  Outcome fused = run(gpt_trainee(kGpu, false, 6), Path::Fused, compile::Mode::ReduceOverhead, micro, 6);
  expect_one_optimizer_node(fused, "gpt adamw, every pass");
  EXPECT_EQ(fused.graphs, 1u);
  for (double loss : fused.losses) EXPECT_TRUE(std::isfinite(loss));
}
