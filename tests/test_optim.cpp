// Tests of optim/: the accumulation contract (gradient equivalence with one large batch, by count,
// by items, for the remainder), SGD and AdamW against plain reference loops, schedules advancing per
// optimizer step, clipping, and the GradScaler state machine with planted inf/NaN gradients.
// CPU, f64 wherever exactness matters. Model for accumulation: x (N, 4) @ W1 (4, 8) -> tanh
// -> @ W2 (8, 3) -> cross-entropy (mean) — no BatchNorm, so micro-batches are independent.
#include <cmath>
#include <sstream>

#include "optim/optim.h"
#include "tensor/cuda.h"
#include "tests/test_util.h"

namespace reel {
namespace {

using namespace reel::optim;
using testing_util::expect_error;

const TensorOptions kF64 = TensorOptions().with_dtype(DType::f64);

struct TinyModel {
  Tensor w1, w2, x, y;  // w1 (4, 8), w2 (8, 3), x (N, 4), y (N) i64
  explicit TinyModel(int64_t n) {
    Generator gen(7);
    w1 = randn({4, 8}, kF64, &gen).set_requires_grad();
    w2 = randn({8, 3}, kF64, &gen).set_requires_grad();
    x = randn({n, 4}, kF64, &gen);
    std::vector<int64_t> labels(n);
    for (int64_t i = 0; i < n; ++i) labels[i] = (i * 5 + 1) % 3;
    y = tensor_i64(labels, {n});
  }
  std::vector<Tensor> params() const { return {w1, w2}; }
  // Mean loss over rows [lo, hi).
  Tensor loss(int64_t lo, int64_t hi) const {
    Tensor h = tanh(matmul(slice(x, 0, lo, hi), w1));
    return cross_entropy(matmul(h, w2), slice(y, 0, lo, hi));
  }
  // Gradients of the mean loss over rows [lo, hi), computed in one batch; grads are cleared after.
  std::vector<std::vector<double>> batch_grads(int64_t lo, int64_t hi) const {
    loss(lo, hi).backward();
    std::vector<std::vector<double>> g{w1.grad().to_vector<double>(), w2.grad().to_vector<double>()};
    w1.set_grad(Tensor());
    w2.set_grad(Tensor());
    return g;
  }
  std::vector<std::vector<double>> values() const { return {w1.to_vector<double>(), w2.to_vector<double>()}; }
};

double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return num / den;
}

// (before - after) / lr of each parameter: the gradient an SGD(lr) step applied.
std::vector<std::vector<double>> applied(const std::vector<std::vector<double>>& before,
                                         const std::vector<std::vector<double>>& after, double lr) {
  auto d = before;
  for (size_t k = 0; k < d.size(); ++k)
    for (size_t i = 0; i < d[k].size(); ++i) d[k][i] = (before[k][i] - after[k][i]) / lr;
  return d;
}

TEST(OptimAccumulation, CountEquivalentToOneLargeBatch) {
  TinyModel m(12);
  auto ref = m.batch_grads(0, 12);
  SGD opt(m.params(), SGDOptions(0.5));
  opt.set_accum_steps(3).set_micro_batch(4);
  for (int i = 0; i < 3; ++i) {
    opt.scale_loss(m.loss(4 * i, 4 * i + 4)).backward();
    if (i < 2) {
      StepResult r = opt.micro_step();
      EXPECT_FALSE(r.stepped);
      EXPECT_TRUE(m.w1.grad().defined());  // not zeroed before the boundary
    }
  }
  EXPECT_LT(rel_err(m.w1.grad().to_vector<double>(), ref[0]), 1e-10);
  EXPECT_LT(rel_err(m.w2.grad().to_vector<double>(), ref[1]), 1e-10);
  auto before = m.values();
  StepResult r = opt.micro_step();
  EXPECT_TRUE(r.stepped);
  EXPECT_FALSE(r.skipped());
  EXPECT_FALSE(m.w1.grad().defined());  // set to none at the boundary
  auto g = applied(before, m.values(), 0.5);
  EXPECT_LT(rel_err(g[0], ref[0]), 1e-10);
  EXPECT_LT(rel_err(g[1], ref[1]), 1e-10);
  EXPECT_EQ(opt.step_count(), 1);
}

TEST(OptimAccumulation, UnequalMicroBatchesCountedByItems) {
  TinyModel m(12);
  auto ref = m.batch_grads(0, 12);
  SGD opt(m.params(), SGDOptions(0.25));
  opt.set_items_per_step(12);
  const int64_t bounds[] = {0, 5, 8, 12};  // micro-batches of 5, 3 and 4 items
  for (int i = 0; i < 3; ++i) {
    opt.scale_loss(m.loss(bounds[i], bounds[i + 1]), bounds[i + 1] - bounds[i]).backward();
    if (i < 2) {
      EXPECT_FALSE(opt.micro_step().stepped);
    }
  }
  EXPECT_LT(rel_err(m.w1.grad().to_vector<double>(), ref[0]), 1e-10);
  EXPECT_LT(rel_err(m.w2.grad().to_vector<double>(), ref[1]), 1e-10);
  auto before = m.values();
  EXPECT_TRUE(opt.micro_step().stepped);
  auto g = applied(before, m.values(), 0.25);
  EXPECT_LT(rel_err(g[0], ref[0]), 1e-10);
  EXPECT_LT(rel_err(g[1], ref[1]), 1e-10);
}

TEST(OptimAccumulation, RemainderStepIsRenormalisedByCount) {
  TinyModel m(12);
  auto ref = m.batch_grads(0, 12);  // the 3 micro-batches that remain at the epoch's end
  SGD opt(m.params(), SGDOptions(0.5));
  opt.set_accum_steps(4).set_micro_batch(4);
  for (int i = 0; i < 3; ++i) {
    opt.scale_loss(m.loss(4 * i, 4 * i + 4)).backward();
    EXPECT_FALSE(opt.micro_step().stepped);
  }
  auto before = m.values();
  StepResult r = opt.finish_epoch(RemainderPolicy::Step);
  EXPECT_TRUE(r.stepped);
  auto g = applied(before, m.values(), 0.5);
  EXPECT_LT(rel_err(g[0], ref[0]), 1e-10);
  EXPECT_LT(rel_err(g[1], ref[1]), 1e-10);
  EXPECT_EQ(opt.pending_micro_batches(), 0);
}

TEST(OptimAccumulation, RemainderStepIsRenormalisedByItems) {
  TinyModel m(12);
  auto ref = m.batch_grads(0, 9);
  SGD opt(m.params(), SGDOptions(0.5));
  opt.set_items_per_step(20);
  opt.scale_loss(m.loss(0, 2), 2).backward();
  EXPECT_FALSE(opt.micro_step().stepped);
  opt.scale_loss(m.loss(2, 9), 7).backward();
  EXPECT_FALSE(opt.micro_step().stepped);
  auto before = m.values();
  EXPECT_TRUE(opt.finish_epoch(RemainderPolicy::Step).stepped);
  auto g = applied(before, m.values(), 0.5);
  EXPECT_LT(rel_err(g[0], ref[0]), 1e-10);
  EXPECT_LT(rel_err(g[1], ref[1]), 1e-10);
}

TEST(OptimAccumulation, RemainderDropLeavesParametersAndClearsGrads) {
  TinyModel m(12);
  SGD opt(m.params(), SGDOptions(0.5));
  opt.set_accum_steps(4);
  opt.scale_loss(m.loss(0, 4)).backward();
  opt.micro_step();
  auto before = m.values();
  StepResult r = opt.finish_epoch();  // Drop is the default
  EXPECT_FALSE(r.stepped);
  EXPECT_EQ(m.values(), before);
  EXPECT_FALSE(m.w1.grad().defined());
  EXPECT_EQ(opt.step_count(), 0);
  EXPECT_EQ(opt.pending_micro_batches(), 0);
}

TEST(OptimAccumulation, ItemsModeNeedsItemCounts) {
  TinyModel m(4);
  SGD opt(m.params());
  opt.set_items_per_step(8);
  expect_error([&] { opt.scale_loss(m.loss(0, 4)); }, {"SGD", "items_per_step 8", "item count"});
  expect_error([&] { opt.micro_step(); }, {"micro_step", "scale_loss(loss, items)"});
  expect_error([&] { opt.set_accum_steps(0); }, {"accum_steps must be >= 1"});
}

TEST(OptimAccumulation, PrintSetupAndLrScaling) {
  TinyModel m(4);
  AdamW opt(m.params());
  opt.set_accum_steps(4).set_micro_batch(32);
  opt.scale_lr_from(32, LrScaling::linear);
  EXPECT_NEAR(opt.base_lr(), 4e-3, 1e-15);
  EXPECT_NEAR(scale_lr(1e-3, 128, 32, LrScaling::sqrt), 2e-3, 1e-15);
  std::ostringstream os;
  opt.print_setup(os);
  EXPECT_NE(os.str().find("effective 128 = micro-batch 32 x ACCUM 4"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("linear rule"), std::string::npos) << os.str();
}

// ---------------------------------------------------------------- update rules vs plain loops

std::vector<double> random_values(int64_t n, uint64_t seed) {
  Generator gen(seed);
  return randn({n}, kF64, &gen).to_vector<double>();
}

TEST(OptimAdamW, MatchesReferenceLoop) {
  const int64_t n = 10;
  std::vector<double> p = random_values(n, 1), m(n, 0.0), v(n, 0.0);
  Tensor param = tensor(p, {n}, kF64).set_requires_grad();
  AdamW opt({param}, AdamWOptions(0.01).betas(0.8, 0.95).eps(1e-6).weight_decay(0.1));
  for (int t = 1; t <= 5; ++t) {
    std::vector<double> g = random_values(n, 100 + t);
    param.set_grad(tensor(g, {n}, kF64));
    opt.step();
    for (int64_t i = 0; i < n; ++i) {
      p[i] -= 0.01 * 0.1 * p[i];
      m[i] = 0.8 * m[i] + 0.2 * g[i];
      v[i] = 0.95 * v[i] + 0.05 * g[i] * g[i];
      p[i] -= 0.01 * (m[i] / (1 - std::pow(0.8, t))) / (std::sqrt(v[i] / (1 - std::pow(0.95, t))) + 1e-6);
    }
    EXPECT_LT(testing_util::max_abs_diff(param.to_vector<double>(), p), 1e-13) << "step " << t;
    EXPECT_LT(testing_util::max_abs_diff(opt.exp_avg_sq(0).to_vector<double>(), v), 1e-15);
  }
}

struct SgdCase {
  double momentum, dampening, weight_decay;
  bool nesterov;
};

TEST(OptimSGD, EachOptionMatchesReferenceLoop) {
  const SgdCase cases[] = {{0, 0, 0, false}, {0.9, 0, 0, false}, {0.9, 0.3, 0, false},
                           {0.9, 0, 0, true}, {0, 0, 0.05, false}, {0.8, 0.1, 0.05, false}};
  const int64_t n = 7;
  const double lr = 0.1;
  for (const SgdCase& c : cases) {
    std::vector<double> p = random_values(n, 3), buf(n, 0.0);
    Tensor param = tensor(p, {n}, kF64).set_requires_grad();
    SGD opt({param}, SGDOptions(lr).momentum(c.momentum).dampening(c.dampening).weight_decay(c.weight_decay)
                         .nesterov(c.nesterov));
    for (int t = 1; t <= 4; ++t) {
      std::vector<double> g = random_values(n, 200 + t);
      param.set_grad(tensor(g, {n}, kF64));
      opt.step();
      for (int64_t i = 0; i < n; ++i) {
        double d = g[i] + c.weight_decay * p[i];
        if (c.momentum != 0) {
          buf[i] = t == 1 ? d : c.momentum * buf[i] + (1 - c.dampening) * d;
          d = c.nesterov ? d + c.momentum * buf[i] : buf[i];
        }
        p[i] -= lr * d;
      }
      EXPECT_LT(testing_util::max_abs_diff(param.to_vector<double>(), p), 1e-14)
          << "momentum " << c.momentum << " dampening " << c.dampening << " wd " << c.weight_decay << " nesterov "
          << c.nesterov << " step " << t;
    }
  }
}

TEST(OptimSGD, RejectsBadOptions) {
  Tensor p = zeros({2}, kF64).set_requires_grad();
  expect_error([&] { SGD({p}, SGDOptions().nesterov(true)); }, {"SGD", "nesterov needs momentum"});
  Tensor q = zeros({2}, kF64);
  expect_error([&] { AdamW({q}); }, {"AdamW", "parameter 0", "(2,)", "requires grad"});
  Tensor g = zeros({3}, kF64), m = zeros({2}, kF64), lr = full({}, 1e-3, kF64), t = full({}, 1.0, kF64);
  Attrs a = Attrs().set("beta1", 0.9).set("beta2", 0.999).set("eps", 1e-8).set("weight_decay", 0.0);
  expect_error([&] { dispatch_out(OpKind::AdamWStep, {p, g, m, m, Tensor(), lr, t}, {p, m, m}, a); },
               {"adamw_step", "grad is (3,) f64", "parameter is (2,) f64"});
}

// ---------------------------------------------------------------- schedules

TEST(OptimSchedule, AdvancesPerOptimizerStepNotPerMicroBatch) {
  Tensor p = zeros({3}, kF64).set_requires_grad();
  Tensor x = tensor({1, 2, 3}, {3}, kF64);
  SGD opt({p}, SGDOptions(0.1));
  auto sched = std::make_shared<LinearWarmupCosine>(2, 6, 0.01);
  opt.set_schedule(sched).set_accum_steps(3);
  std::vector<double> step_lrs;
  for (int mb = 0; mb < 8 * 3; ++mb) {
    double lr_before = opt.lr();
    opt.scale_loss(sum(mul(p, x))).backward();
    StepResult r = opt.micro_step();
    EXPECT_EQ(r.stepped, mb % 3 == 2) << "micro-batch " << mb;
    EXPECT_EQ(r.lr, lr_before);
    if (r.stepped) step_lrs.push_back(r.lr);
  }
  const double pi = M_PI;
  std::vector<double> want = {0.05, 0.1};  // warm-up: 0.1 * 1/2, 0.1 * 2/2
  for (int s = 2; s < 8; ++s)
    want.push_back(0.01 + 0.09 * 0.5 * (1 + std::cos(pi * std::min(1.0, (s - 2) / 4.0))));
  ASSERT_EQ(step_lrs.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) EXPECT_NEAR(step_lrs[s], want[s], 1e-15) << "step " << s;
  EXPECT_EQ(opt.step_count(), 8);
}

// ---------------------------------------------------------------- clipping

TEST(OptimClip, ClipsToGlobalNormAndReportsNormBeforeClipping) {
  Tensor a = zeros({2}, kF64).set_requires_grad(), b = zeros({1}, kF64).set_requires_grad();
  a.set_grad(tensor({3, 4}, {2}, kF64));
  b.set_grad(tensor({12}, {1}, kF64));  // norm 13
  Tensor total = clip_grad_norm_({a, b}, 6.5);
  EXPECT_DOUBLE_EQ(total.item(), 13.0);
  double c = 6.5 / (13.0 + 1e-6);
  EXPECT_LT(testing_util::max_abs_diff(a.grad().to_vector<double>(), {3 * c, 4 * c}), 1e-15);
  EXPECT_LT(testing_util::max_abs_diff(b.grad().to_vector<double>(), {12 * c}), 1e-15);
  // Below the bound nothing changes (coefficient clamped to 1).
  clip_grad_norm_({a, b}, 100.0);
  EXPECT_LT(testing_util::max_abs_diff(b.grad().to_vector<double>(), {12 * c}), 1e-15);
  Tensor y = clamp_scalar(tensor({-2, 0.5, 7, NAN}, {4}, kF64), 0.0, 1.0);
  std::vector<double> yv = y.to_vector<double>();
  EXPECT_EQ(yv[0], 0.0);
  EXPECT_EQ(yv[1], 0.5);
  EXPECT_EQ(yv[2], 1.0);
  EXPECT_TRUE(std::isnan(yv[3]));
}

TEST(OptimClip, OptimizerClipsAfterTheLastMicroBatch) {
  Tensor p = zeros({2}, kF64).set_requires_grad();
  SGD opt({p}, SGDOptions(1.0));
  opt.set_accum_steps(2).set_max_grad_norm(1.0);
  Tensor x = tensor({6, 8}, {2}, kF64);  // each micro-batch: grad x / 2; accumulated: x, norm 10
  for (int i = 0; i < 2; ++i) {
    opt.scale_loss(sum(mul(p, x))).backward();
    StepResult r = opt.micro_step();
    if (i == 1) {
      EXPECT_DOUBLE_EQ(r.grad_norm_value(), 10.0);
    }
  }
  double c = 1.0 / (10.0 + 1e-6);
  EXPECT_LT(testing_util::max_abs_diff(p.to_vector<double>(), {-6 * c, -8 * c}), 1e-15);
}

TEST(OptimSkip, NonFiniteNormSkipsWithoutAScaler) {
  Tensor p = tensor({1, 2}, {2}, kF64).set_requires_grad();
  SGD opt({p}, SGDOptions(0.1).momentum(0.9));
  p.set_grad(tensor({1, NAN}, {2}, kF64));
  StepResult r = opt.micro_step();
  EXPECT_TRUE(r.stepped);
  EXPECT_TRUE(r.skipped());
  EXPECT_TRUE(std::isnan(r.grad_norm_value()));
  EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{1, 2}));
  EXPECT_EQ(opt.momentum_buffer(0).to_vector<double>(), (std::vector<double>{0, 0}));
  // With skipping off the update runs, as torch's would.
  opt.set_skip_nonfinite(false);
  p.set_grad(tensor({1, INFINITY}, {2}, kF64));
  r = opt.micro_step();
  EXPECT_TRUE(r.skipped());  // still reported
  EXPECT_TRUE(std::isinf(p.to_vector<double>()[1]));
}

// ---------------------------------------------------------------- GradScaler

// One optimizer step of AdamW on p with gradient `g` planted after a scaled backward.
StepResult scaled_step(AdamW& opt, const Tensor& p, double planted) {
  Tensor x = tensor({1, -2, 3}, {3});
  opt.scale_loss(sum(mul(p, x))).backward();
  if (planted != 0) {
    std::vector<double> g = p.grad().to_vector<double>();
    g[1] = planted;
    p.set_grad(tensor(g, {3}));
  }
  return opt.micro_step();
}

TEST(OptimGradScaler, SkipBackoffAndGrowth) {
  Tensor p = tensor({0.5, 1, -1}, {3}).set_requires_grad();
  AdamW opt({p});
  auto scaler = std::make_shared<GradScaler>(GradScalerOptions().init_scale(1024).growth_interval(3));
  opt.set_grad_scaler(scaler);
  // A clean step: unscaled gradients reach AdamW (first step moves every element by ~lr).
  StepResult r = scaled_step(opt, p, 0);
  EXPECT_TRUE(r.stepped);
  EXPECT_FALSE(r.skipped());
  EXPECT_EQ(r.loss_scale(), 1024);
  EXPECT_EQ(scaler->growth_tracker_value(), 1);
  EXPECT_NEAR(r.grad_norm_value(), std::sqrt(14.0), 1e-5);
  for (double planted : {double(INFINITY), double(NAN), -double(INFINITY)}) {
    std::vector<float> p0 = p.to_vector<float>(), m0 = opt.exp_avg(0).to_vector<float>(),
                       v0 = opt.exp_avg_sq(0).to_vector<float>();
    double scale0 = scaler->scale_value();
    r = scaled_step(opt, p, planted);
    EXPECT_TRUE(r.stepped);
    EXPECT_TRUE(r.skipped()) << planted;
    EXPECT_EQ(p.to_vector<float>(), p0) << "parameter changed on a skipped step";
    EXPECT_EQ(opt.exp_avg(0).to_vector<float>(), m0) << "exp_avg changed on a skipped step";
    EXPECT_EQ(opt.exp_avg_sq(0).to_vector<float>(), v0) << "exp_avg_sq changed on a skipped step";
    EXPECT_EQ(scaler->scale_value(), scale0 * 0.5) << "backoff";
    EXPECT_EQ(scaler->growth_tracker_value(), 0);
  }
  EXPECT_EQ(scaler->scale_value(), 128);
  for (int i = 1; i <= 3; ++i) {
    std::vector<float> p0 = p.to_vector<float>();
    r = scaled_step(opt, p, 0);
    EXPECT_FALSE(r.skipped());
    EXPECT_NE(p.to_vector<float>(), p0);
    EXPECT_EQ(scaler->growth_tracker_value(), i % 3);
    EXPECT_EQ(scaler->scale_value(), i < 3 ? 128 : 256) << "growth after 3 clean steps, clean step " << i;
  }
}

TEST(OptimGradScaler, UnscaleCheckAndScalerUpdateOps) {
  Tensor g0 = tensor({2, 4}, {2}), g1 = tensor({8}, {1}, TensorOptions().with_dtype(DType::bf16));
  Tensor inv = full({}, 0.5), found = zeros({});
  dispatch_out(OpKind::UnscaleCheck, {g0, g1, inv, found}, {g0, g1, found});
  EXPECT_EQ(g0.to_vector<double>(), (std::vector<double>{1, 2}));
  EXPECT_EQ(g1.to_vector<double>(), (std::vector<double>{4}));
  EXPECT_EQ(found.item(), 0);
  Tensor g2 = tensor({1, NAN}, {2});
  dispatch_out(OpKind::UnscaleCheck, {g2, inv, found}, {g2, found});
  EXPECT_EQ(found.item(), 1);
  // scaler_update with an f32 tracker: interval 2.
  Tensor scale = full({}, 8.0), tracker = zeros({}), clean = zeros({});
  Attrs a = Attrs().set("growth_factor", 2.0).set("backoff_factor", 0.25).set("growth_interval", int64_t(2));
  dispatch_out(OpKind::ScalerUpdate, {scale, tracker, clean}, {scale, tracker}, a);
  EXPECT_EQ(scale.item(), 8);
  EXPECT_EQ(tracker.item(), 1);
  dispatch_out(OpKind::ScalerUpdate, {scale, tracker, clean}, {scale, tracker}, a);
  EXPECT_EQ(scale.item(), 16);
  EXPECT_EQ(tracker.item(), 0);
  dispatch_out(OpKind::ScalerUpdate, {scale, tracker, found}, {scale, tracker}, a);
  EXPECT_EQ(scale.item(), 4);
  expect_error([&] { dispatch_out(OpKind::ScalerUpdate, {scale, tracker, tensor({1, 0}, {2})}, {scale, tracker}, a); },
               {"scaler_update", "found_inf must be a 0-dim f32 tensor", "(2,) f32"});
}

TEST(OptimGradScaler, StateLivesOnTheLossDevice) {
  GradScaler cpu_scaler;
  Tensor loss = full({}, 2.0);
  EXPECT_EQ(cpu_scaler.scale(loss).item(), 2.0 * 65536);
  EXPECT_TRUE(cpu_scaler.scale_tensor().device() == Device::cpu());
  EXPECT_TRUE(cpu_scaler.found_inf().device() == Device::cpu());
  GradScaler off(GradScalerOptions().enabled(false));
  EXPECT_TRUE(off.scale(loss).is_same(loss));
}

TEST(OptimGradScaler, StateLivesOnTheCudaLossDevice) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  GradScaler gpu_scaler;
  Tensor gl = full({}, 2.0).to(Device::cuda(0));
  gpu_scaler.scale(gl);
  EXPECT_TRUE(gpu_scaler.scale_tensor().device() == gl.device());
  EXPECT_TRUE(gpu_scaler.growth_tracker().device() == gl.device());
}

// ---------------------------------------------------------------- CPU vs CUDA parity of the ops

// Runs op in place on CPU copies and CUDA copies of `state` and compares every tensor afterwards.
void expect_inplace_parity(OpKind op, const std::vector<Tensor>& in_cpu, const std::vector<size_t>& out_idx,
                           const Attrs& a, double tol) {
  std::vector<Tensor> in_gpu, out_cpu, out_gpu;
  for (const Tensor& t : in_cpu) in_gpu.push_back(t.defined() ? t.to(Device::cuda(0)) : Tensor());
  for (size_t i : out_idx) {
    out_cpu.push_back(in_cpu[i]);
    out_gpu.push_back(in_gpu[i]);
  }
  dispatch_out(op, in_cpu, out_cpu, a);
  dispatch_out(op, in_gpu, out_gpu, a);
  for (size_t k = 0; k < out_cpu.size(); ++k) {
    std::vector<double> c = out_cpu[k].to_vector<double>(), g = out_gpu[k].to_vector<double>();
    ASSERT_EQ(c.size(), g.size());
    for (size_t i = 0; i < c.size(); ++i)
      EXPECT_NEAR(g[i], c[i], tol * (1 + std::fabs(c[i]))) << op_name(op) << " output " << k << " element " << i;
  }
}

TEST(OptimCuda, OpsMatchCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const std::pair<DType, double> dtypes[] = {
      {DType::f64, 1e-12}, {DType::f32, 1e-5}, {DType::f16, 2e-3}, {DType::bf16, 1e-2}};
  for (auto [dt, tol] : dtypes) {
    Generator gen(11);
    auto rnd = [&](const Shape& s) { return randn(s, TensorOptions(), &gen).to(dt); };
    Tensor p = rnd({1000}), g = rnd({1000}), m = rnd({1000}), v = mul(rnd({1000}), rnd({1000}));
    v = abs(v);
    for (double flag : {0.0, 1.0}) {
      Tensor found = full({}, flag);
      Tensor lr = full({}, 1e-2, kF64), t = full({}, 3.0, kF64);
      expect_inplace_parity(OpKind::AdamWStep, {clone(p), g, clone(m), clone(v), found, lr, t}, {0, 2, 3},
                            Attrs().set("beta1", 0.9).set("beta2", 0.999).set("eps", 1e-8)
                                .set("weight_decay", 0.01), tol);
      expect_inplace_parity(OpKind::SgdStep, {clone(p), g, clone(m), found, full({}, 0.1, kF64)}, {0, 2},
                            Attrs().set("momentum", 0.9).set("dampening", 0.0)
                                .set("weight_decay", 0.01).set("nesterov", true).set("first_step", false), tol);
    }
    Tensor bad = clone(g);
    expect_inplace_parity(OpKind::UnscaleCheck, {bad, full({}, 0.25), zeros({})}, {0, 2}, Attrs(), tol);
    Tensor y_cpu = clamp_scalar(transpose(reshape(p, {20, 50}), 0, 1), -0.5, INFINITY);
    Tensor y_gpu = clamp_scalar(transpose(reshape(p.to(Device::cuda(0)), {20, 50}), 0, 1), -0.5, INFINITY);
    EXPECT_EQ(y_gpu.to_vector<double>(), y_cpu.to_vector<double>());
  }
  Tensor planted = tensor({1, NAN, 3}, {3});
  Tensor found = zeros({}).to(Device::cuda(0));
  Tensor pg = planted.to(Device::cuda(0));
  dispatch_out(OpKind::UnscaleCheck, {pg, full({}, 0.5).to(Device::cuda(0)), found}, {pg, found});
  EXPECT_EQ(found.item(), 1);
  Tensor scale = full({}, 4.0).to(Device::cuda(0));
  Tensor tracker = zeros({}, TensorOptions().with_dtype(DType::i64)).to(Device::cuda(0));
  Attrs a = Attrs().set("growth_factor", 2.0).set("backoff_factor", 0.5).set("growth_interval", int64_t(1));
  dispatch_out(OpKind::ScalerUpdate, {scale, tracker, found}, {scale, tracker}, a);
  EXPECT_EQ(scale.item(), 2);
  fill_(found, 0.0);
  dispatch_out(OpKind::ScalerUpdate, {scale, tracker, found}, {scale, tracker}, a);
  EXPECT_EQ(scale.item(), 4);
  EXPECT_EQ(tracker.item(), 0);
}

TEST(OptimCuda, UnscaleCheckOverManyTensorsOfMixedDtypesMatchesTheCpu) {
  // 300 gradients of four dtypes and sizes from 1 to 5000: more than one launch's table per dtype
  // (256 tensors), chunks cut inside tensors; the values equal the CPU's to the bit, and a NaN in the
  // very last gradient sets found_inf.
  if (!cuda::is_available()) GTEST_SKIP() << cuda::unavailable_reason();
  const Device gpu = Device::cuda(0);
  const DType dts[] = {DType::f32, DType::f16, DType::bf16, DType::f64};
  Generator gen(17);
  for (bool plant : {false, true}) {
    std::vector<Tensor> cpu, dev;
    for (int j = 0; j < 300; ++j) {
      const int64_t n = 1 + (int64_t(j) * 997) % 5000;
      cpu.push_back(randn({n}, TensorOptions(), &gen).to(dts[j % 4]));
    }
    if (plant) cpu.back() = tensor({1, 2, NAN}, {3}).to(cpu.back().dtype());
    for (const Tensor& t : cpu) dev.push_back(t.to(gpu));
    Tensor found_cpu = zeros({}), found_dev = zeros({}).to(gpu);
    std::vector<Tensor> in_cpu = cpu, in_dev = dev, out_cpu = cpu, out_dev = dev;
    in_cpu.insert(in_cpu.end(), {full({}, 0.125), found_cpu});
    in_dev.insert(in_dev.end(), {full({}, 0.125).to(gpu), found_dev});
    out_cpu.push_back(found_cpu);
    out_dev.push_back(found_dev);
    dispatch_out(OpKind::UnscaleCheck, in_cpu, out_cpu);
    dispatch_out(OpKind::UnscaleCheck, in_dev, out_dev);
    EXPECT_EQ(found_dev.item(), plant ? 1.0 : 0.0);
    EXPECT_EQ(found_dev.item(), found_cpu.item());
    for (size_t j = 0; j < cpu.size(); ++j) {
      std::vector<double> a = cpu[j].to_vector<double>(), b = dev[j].to_vector<double>();
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        if (!(std::isnan(a[i]) && std::isnan(b[i]))) {
          ASSERT_EQ(a[i], b[i]) << "tensor " << j << " element " << i;
        }
      }
    }
  }
}

// ---------------------------------------------------------------- precision policy

TEST(OptimPrecision, AutocastMatmulRunsInComputeDtypeAndReturnsF32) {
  Tensor a = tensor({1, 2, 3, 4}, {2, 2}), b = tensor({0.5, 0.25, -1, 2}, {2, 2});
  PrecisionPolicy bf16 = PrecisionPolicy::parse("bf16");
  EXPECT_EQ(bf16.compute_dtype(), DType::bf16);
  EXPECT_EQ(bf16.cast_for_compute(a).dtype(), DType::bf16);
  EXPECT_EQ(bf16.cast_for_compute(a.to(DType::f64)).dtype(), DType::f64);
  Tensor y = autocast_matmul(a, b, bf16);
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(y.to_vector<double>(), matmul(a, b).to_vector<double>());  // exact in bf16 for these values
  EXPECT_TRUE(PrecisionPolicy::parse("fp16").needs_grad_scaler());
  expect_error([] { PrecisionPolicy::parse("fp8"); }, {"precision", "fp8", "fp32, bf16 or fp16"});
}

}  // namespace
}  // namespace reel
