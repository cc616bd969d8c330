// State that persists from one optimizer step to the next, against references that do not come
// from the library: the LR schedule's values written out by hand from optim/schedule.h's definition
// (closed forms of the cosines), and gradients and updates computed by long double loops in this
// file (a linear model under cross-entropy, whose gradient is (softmax - onehot) x / n).
//   a) LinearWarmupCosine on the host, the lr_schedule op by itself, and the lr the optimizer's
//      update actually used (an SGD step of gradient 1 moves a parameter by exactly -lr), step by
//      step through warm-up, its last step, the cosine, the schedule's last step and beyond, with
//      accumulation (the schedule advances per optimizer step, not per micro-batch).
//   b) The accumulation contract's correction (optim/optimizer.h): counted by items, a step whose
//      micro-batches overshoot or fall short of items_per_step has its gradient rescaled by
//      N / n_seen, so the update is plain SGD on the mean loss over the n_seen items actually seen;
//      counted by micro-batches, finish_epoch(Step) rescales by ACCUM / k. The next step starts
//      from zero again.
//   c) Several AdamW steps (torch.optim.AdamW: decoupled weight decay, bias corrections at the
//      1-based update count) with accumulation over micro-batches, clipping to a global norm
//      (coef = min(1, max_norm / (norm + 1e-6))) on some steps and not others, and a schedule, so
//      exp_avg, exp_avg_sq, the update count and the schedule step all carry from step to step; and
//      a step skipped on a NaN gradient, which must leave the moments and the bias-correction count
//      alone while the schedule still advances.
// Every case runs on the CPU and, when one is usable, on the GPU (parameters and data there).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "optim/optim.h"
#include "reel.h"
#include "tensor/cuda.h"
#include "test_util.h"

namespace reel {
namespace {

using namespace reel::optim;
using LD = long double;
using Vec = std::vector<double>;
using LVec = std::vector<LD>;

using testing_util::test_devices;

TensorOptions f64_on(Device device) { return TensorOptions().with_dtype(DType::f64).with_device(device); }

// ---------------------------------------------------------------- a) the LR schedule

// optim/schedule.h: with s the optimizer steps completed before an update (0 for the first),
//   s < W:  lr = base (s + 1) / W;   else p = min(1, (s - W) / max(1, S - W)),
//           lr = min + (base - min) (1 + cos(pi p)) / 2.
// So the first update already takes base / W (not 0) and the last warm-up update (s = W - 1) base,
// as in nanoGPT's get_lr; the cosine then starts from base at s = W and reaches min at s = S.
// The cosines of multiples of pi/8 and pi/3 in closed form: cos(pi/8) = sqrt(2 + sqrt 2) / 2,
// cos(pi/4) = sqrt 2 / 2, cos(3 pi/8) = sqrt(2 - sqrt 2) / 2, cos(pi/3) = 1/2.
const double kR2 = std::sqrt(2.0);
const double kC1 = std::sqrt(2 + kR2) / 2, kC2 = kR2 / 2, kC3 = std::sqrt(2 - kR2) / 2;

struct ScheduleTable {
  const char* name;
  int64_t warmup, total;
  double min_lr, base_lr;
  std::vector<double> lr;  // lr[s] for s = 0, 1, ...
};

std::vector<ScheduleTable> schedule_tables() {
  return {
      // W = 4, S = 12, min 0.01, base 0.1: warm-up 0.025 0.05 0.075 and 0.1 at its last step (s = 3);
      // then (base - min) / 2 = 0.045 times 1 + cos(pi (s - 4) / 8) for s = 4 .. 12; min_lr after.
      {"warm-up 4, cosine to step 12",
       4,
       12,
       0.01,
       0.1,
       {0.025, 0.05, 0.075, 0.1,                                                         // s = 0 .. 3
        0.1, 0.01 + 0.045 * (1 + kC1), 0.01 + 0.045 * (1 + kC2), 0.01 + 0.045 * (1 + kC3),  // s = 4 .. 7
        0.055, 0.01 + 0.045 * (1 - kC3), 0.01 + 0.045 * (1 - kC2), 0.01 + 0.045 * (1 - kC1),  // s = 8 .. 11
        0.01, 0.01, 0.01}},                                                              // s = 12 .. 14
      // No warm-up: the cosine from the first update, p = s / 4; min 0.
      {"no warm-up, cosine to step 4", 0, 4, 0.0, 0.1, {0.1, 0.05 * (1 + kC2), 0.05, 0.05 * (1 - kC2), 0.0, 0.0}},
      // Warm-up only (W = S = 3): span max(1, 0) = 1, so s = 3 gives p = 0 (base) and s >= 4 p = 1.
      {"warm-up 3 of 3", 3, 3, 0.02, 0.1, {0.1 / 3, 0.2 / 3, 0.1, 0.1, 0.02, 0.02}},
      // Warm-up 1: the first update already at base.
      {"warm-up 1, cosine to step 5", 1, 5, 0.0, 0.2, {0.2, 0.2, 0.1 * (1 + kC2), 0.1, 0.1 * (1 - kC2), 0.0, 0.0}},
  };
}

// Rounding of cos (std::cos, or the device's) in the last bit, scaled by at most 0.1.
constexpr double kLrTol = 1e-15;

TEST(StatefulSteps, HostScheduleMatchesHandWrittenTable) {
  for (const ScheduleTable& tab : schedule_tables()) {
    LinearWarmupCosine sched(tab.warmup, tab.total, tab.min_lr);
    for (size_t s = 0; s < tab.lr.size(); ++s)
      EXPECT_NEAR(sched.lr(int64_t(s), tab.base_lr), tab.lr[s], kLrTol) << tab.name << ", step " << s;
  }
  ConstantLr constant;
  for (int64_t s : {0, 1, 7, 1000}) EXPECT_EQ(constant.lr(s, 0.3), 0.3);
}

TEST(StatefulSteps, LrScheduleOpMatchesHandWrittenTable) {
  for (Device dev : test_devices())
    for (const ScheduleTable& tab : schedule_tables()) {
      std::optional<Attrs> attrs = LinearWarmupCosine(tab.warmup, tab.total, tab.min_lr).device_attrs(tab.base_lr);
      ASSERT_TRUE(attrs.has_value()) << tab.name;
      for (size_t s = 0; s < tab.lr.size(); ++s) {
        Tensor lr = dispatch1(OpKind::LrSchedule, {full({}, double(s), f64_on(dev))}, *attrs);
        ASSERT_TRUE(lr.device() == dev);
        EXPECT_NEAR(lr.item(), tab.lr[s], kLrTol) << dev.str() << ", " << tab.name << ", step " << s;
      }
    }
}

// SGD (no momentum, no decay) on p = 0 with gradient 1 leaves p = -lr: the lr the update read.
// With ACCUM = accum the gradient is planted before the first micro-batch and the boundary comes
// at the last; the schedule must advance once per boundary.
TEST(StatefulSteps, OptimizerUpdatesUseTheHandWrittenLrEachStep) {
  for (Device dev : test_devices())
    for (int64_t accum : {1, 3})
      for (const ScheduleTable& tab : schedule_tables()) {
        SCOPED_TRACE(dev.str() + ", " + tab.name + ", ACCUM " + std::to_string(accum));
        Tensor p = zeros({2}, f64_on(dev)).set_requires_grad();
        SGD opt({p}, SGDOptions(tab.base_lr));
        opt.set_schedule(std::make_shared<LinearWarmupCosine>(tab.warmup, tab.total, tab.min_lr));
        opt.set_accum_steps(accum);
        for (size_t s = 0; s < tab.lr.size(); ++s) {
          {
            NoGradGuard no_grad;
            zero_(p);
          }
          p.set_grad(ones({2}, f64_on(dev)));
          StepResult r;
          for (int64_t i = 0; i < accum; ++i) {
            r = opt.micro_step();
            EXPECT_EQ(r.stepped, i == accum - 1) << "step " << s << ", micro-batch " << i;
            // Before the boundary the host reports the lr the coming update will use.
            if (!r.stepped) {
              EXPECT_NEAR(r.lr, tab.lr[s], kLrTol) << "step " << s << ", micro-batch " << i;
            }
          }
          ASSERT_TRUE(r.lr_tensor.defined());
          EXPECT_NEAR(r.lr_tensor.item(), tab.lr[s], kLrTol) << "lr read by update " << s;
          EXPECT_NEAR(r.lr, tab.lr[s], kLrTol) << "host lr of update " << s;
          for (double v : p.to_vector<double>()) EXPECT_NEAR(-v, tab.lr[s], kLrTol) << "update " << s << " moved p by";
          EXPECT_EQ(opt.step_count(), int64_t(s) + 1);
          if (s + 1 < tab.lr.size()) {
            EXPECT_NEAR(opt.lr(), tab.lr[s + 1], kLrTol) << "next lr after update " << s;
          }
        }
      }
}

// ---------------------------------------------------------------- the linear model and its reference

// logits = x W^T + b, W (K, D), b (K); loss = mean over the rows of cross-entropy.
constexpr int64_t kD = 4, kK = 3;

struct Data {
  Vec x;                    // (rows, D)
  std::vector<int64_t> y;   // (rows)
};

// Deterministic inputs and labels (x_nd from a sine pattern scaled per row by row_scale(n)).
Data make_data(int64_t rows, const std::function<double(int64_t)>& row_scale = [](int64_t) { return 1.0; }) {
  Data d{Vec(size_t(rows * kD)), std::vector<int64_t>(size_t(rows))};
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t j = 0; j < kD; ++j) d.x[size_t(n * kD + j)] = row_scale(n) * std::sin(0.37 * double(n * kD + j) + 0.5);
    d.y[size_t(n)] = (n * 7 + 2) % kK;
  }
  return d;
}

const Vec kW0 = {0.3, -0.2, 0.5, 0.1, -0.4, 0.25, 0.05, -0.3, 0.15, 0.35, -0.1, 0.2};  // (K, D)
const Vec kB0 = {0.05, -0.1, 0.2};

// The gradient of the mean cross-entropy over rows [lo, hi), in long double:
//   p = softmax(W x_n + b), dlogits_n = (p - onehot(y_n)) / (hi - lo), dW = sum_n dlogits_n x_n^T, db = sum_n dlogits_n.
struct Grad {
  LVec dW, db;
};
Grad ce_grad(const LVec& W, const LVec& b, const Data& d, int64_t lo, int64_t hi) {
  Grad g{LVec(size_t(kK * kD), 0), LVec(size_t(kK), 0)};
  const LD inv_n = 1.0L / LD(hi - lo);
  for (int64_t n = lo; n < hi; ++n) {
    LD z[kK], m = -std::numeric_limits<LD>::infinity(), s = 0;
    for (int64_t k = 0; k < kK; ++k) {
      z[k] = b[size_t(k)];
      for (int64_t j = 0; j < kD; ++j) z[k] += W[size_t(k * kD + j)] * LD(d.x[size_t(n * kD + j)]);
      m = std::max(m, z[k]);
    }
    for (int64_t k = 0; k < kK; ++k) s += std::exp(z[k] - m);
    for (int64_t k = 0; k < kK; ++k) {
      const LD dl = (std::exp(z[k] - m) / s - (k == d.y[size_t(n)] ? 1 : 0)) * inv_n;
      for (int64_t j = 0; j < kD; ++j) g.dW[size_t(k * kD + j)] += dl * LD(d.x[size_t(n * kD + j)]);
      g.db[size_t(k)] += dl;
    }
  }
  return g;
}

LVec widen(const Vec& v) { return LVec(v.begin(), v.end()); }

// The model's parameters on a device, and its mean loss over rows [lo, hi) of the data there.
struct Model {
  Tensor W, b, x, y;
  Model(const Data& d, Device dev) {
    W = tensor(kW0, {kK, kD}, f64_on(dev)).set_requires_grad();
    b = tensor(kB0, {kK}, f64_on(dev)).set_requires_grad();
    x = tensor(d.x, {int64_t(d.y.size()), kD}, f64_on(dev));
    y = tensor_i64(d.y, {int64_t(d.y.size())}, dev);
  }
  Tensor loss(int64_t lo, int64_t hi) const {
    return cross_entropy(add(matmul(slice(x, 0, lo, hi), transpose(W, 0, 1)), b), slice(y, 0, lo, hi));
  }
};

// max |got - want| / max(1, max |want|).
double rel_diff(const Vec& got, const LVec& want) {
  EXPECT_EQ(got.size(), want.size());
  LD err = 0, scale = 1;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const LD e = std::fabs(LD(got[i]) - want[i]);
    err = std::isnan(got[i]) ? std::numeric_limits<LD>::infinity() : std::max(err, e);
    scale = std::max(scale, std::fabs(want[i]));
  }
  return double(err / scale);
}

// f64 results against long double loops: a few roundings of f64 over a handful of operations.
constexpr double kParamTol = 1e-13;

// ---------------------------------------------------------------- b) the items-mode correction

// One optimizer step over consecutive micro-batches of the given sizes, starting at row `row`
// (advanced past them); `finish` ends it with finish_epoch(Step) instead of at a boundary.
StepResult run_step(Optimizer& opt, const Model& m, int64_t& row, const std::vector<int64_t>& sizes, bool items,
                    bool finish) {
  StepResult r;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Tensor loss = m.loss(row, row + sizes[i]);
    (items ? opt.scale_loss(loss, sizes[i]) : opt.scale_loss(loss)).backward();
    row += sizes[i];
    r = opt.micro_step();
    const bool last = i + 1 == sizes.size();
    EXPECT_EQ(r.stepped, last && !finish) << "micro-batch " << i << " of " << sizes.size();
  }
  if (finish) {
    r = opt.finish_epoch(RemainderPolicy::Step);
    EXPECT_TRUE(r.stepped) << "finish_epoch(Step)";
  }
  return r;
}

struct CorrectionCase {
  const char* name;
  bool items;               // count items (set_items_per_step(plan)) or micro-batches (set_accum_steps(plan))
  int64_t plan;             // N items, or ACCUM
  bool effective_batch;     // configure with set_effective_batch(plan, first micro-batch) instead
  std::vector<std::vector<int64_t>> steps;  // micro-batch sizes of each optimizer step
  bool finish_last;         // the last step ends with finish_epoch(Step) (it fell short)
};

// Each step's update is plain SGD on the mean loss over the items the step saw, whatever the plan:
// W <- W - lr grad(mean over those rows), computed from the parameters the previous step left.
TEST(StatefulSteps, ItemsModeCorrectionGivesTheMeanOverTheItemsSeen) {
  const std::vector<CorrectionCase> cases = {
      {"items: 4 + 4 + 5 = 13 overshoot 10", true, 10, false, {{4, 4, 5}}, false},
      {"items: 4 + 6 = 10 exactly", true, 10, false, {{4, 6}}, false},
      {"items: 3 + 4 = 7 short of 10, finish_epoch", true, 10, false, {{3, 4}}, true},
      {"items: 9 + 9 = 18 overshoot 10 (one item short of twice the plan)", true, 10, false, {{9, 9}}, false},
      {"items: 12 then 10 then 12 then 7 short", true, 10, false, {{6, 6}, {5, 5}, {7, 2, 3}, {3, 4}}, true},
      {"effective batch 10 in micro-batches of 4: 4 + 4 + 2, then 4 + 4 + 4 = 12", true, 10, true,
       {{4, 4, 2}, {4, 4, 4}}, false},
      {"count: 3 of ACCUM 4 micro-batches of 3, finish_epoch", false, 4, false, {{3, 3, 3, 3}, {3, 3, 3}}, true},
  };
  const double lr = 0.5;
  const Data data = make_data(64);
  for (Device dev : test_devices())
    for (const CorrectionCase& c : cases) {
      SCOPED_TRACE(dev.str() + ", " + c.name);
      Model m(data, dev);
      SGD opt({m.W, m.b}, SGDOptions(lr));
      if (c.effective_batch) {
        opt.set_effective_batch(c.plan, c.steps[0][0]);
      } else if (c.items) {
        opt.set_items_per_step(c.plan);
      } else {
        opt.set_accum_steps(c.plan);
      }
      ASSERT_EQ(opt.items_per_step(), c.items ? c.plan : 0);
      LVec W = widen(kW0), b = widen(kB0);
      int64_t row = 0;
      for (size_t k = 0; k < c.steps.size(); ++k) {
        const int64_t lo = row;
        const bool finish = c.finish_last && k + 1 == c.steps.size();
        run_step(opt, m, row, c.steps[k], c.items, finish);
        const Grad g = ce_grad(W, b, data, lo, row);
        for (size_t i = 0; i < W.size(); ++i) W[i] -= LD(lr) * g.dW[i];
        for (size_t i = 0; i < b.size(); ++i) b[i] -= LD(lr) * g.db[i];
        EXPECT_LT(rel_diff(m.W.to_vector<double>(), W), kParamTol) << "W after step " << k << " (rows " << lo << " to "
                                                                    << row << ")";
        EXPECT_LT(rel_diff(m.b.to_vector<double>(), b), kParamTol) << "b after step " << k;
        EXPECT_FALSE(m.W.grad().defined()) << "gradients set to none after step " << k;
        EXPECT_EQ(opt.pending_micro_batches(), 0);
      }
      EXPECT_EQ(opt.step_count(), int64_t(c.steps.size()));
    }
}

// ---------------------------------------------------------------- c) AdamW across steps

// torch.optim.AdamW on host values in long double, after clipping the step's gradient to max_norm:
//   norm = sqrt(sum g^2) over every parameter, g *= min(1, max_norm / (norm + 1e-6));
//   p -= lr wd p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps),   t = 1-based count of applied updates.
struct AdamWRef {
  LD b1, b2, eps, wd, max_norm;
  std::vector<LVec> p, m, v;
  int t = 0;
  // Returns the norm before clipping.
  LD step(std::vector<LVec> g, LD lr) {
    LD sq = 0;
    for (const LVec& gi : g)
      for (LD x : gi) sq += x * x;
    const LD norm = std::sqrt(sq), coef = std::min<LD>(1, max_norm / (norm + 1e-6L));
    ++t;
    for (size_t k = 0; k < p.size(); ++k)
      for (size_t i = 0; i < p[k].size(); ++i) {
        const LD gi = g[k][i] * coef;
        p[k][i] -= lr * wd * p[k][i];
        m[k][i] = b1 * m[k][i] + (1 - b1) * gi;
        v[k][i] = b2 * v[k][i] + (1 - b2) * gi * gi;
        p[k][i] -= lr * (m[k][i] / (1 - std::pow(b1, LD(t)))) / (std::sqrt(v[k][i] / (1 - std::pow(b2, LD(t)))) + eps);
      }
    return norm;
  }
};

// LinearWarmupCosine(2, 5, 0.001) at base 0.05, by hand: warm-up 0.025, 0.05; then
// 0.001 + 0.049 (1 + cos(pi (s - 2) / 3)) / 2 = 0.05, 0.001 + 0.049 * 3/4, 0.001 + 0.049 / 4 for s = 2, 3, 4;
// 0.001 from s = 5 on.
const std::vector<double> kAdamLr = {0.025, 0.05, 0.05, 0.001 + 0.049 * 0.75, 0.001 + 0.049 * 0.25, 0.001, 0.001};

// Rows of step k scaled by 4 on even steps and 0.05 on odd ones: large gradients that the clip
// bounds, and small ones it leaves alone.
double adam_row_scale(int64_t n) { return (n / 12) % 2 == 0 ? 4.0 : 0.05; }

constexpr double kMaxNorm = 0.6;

struct AdamSetup {
  AdamWOptions options = AdamWOptions(0.05).betas(0.8, 0.95).eps(1e-6).weight_decay(0.1);
  AdamWRef ref() const {
    return {LD(options.beta1_), LD(options.beta2_), LD(options.eps_), LD(options.weight_decay_), LD(kMaxNorm),
            {widen(kW0), widen(kB0)}, {LVec(kW0.size(), 0), LVec(kB0.size(), 0)},
            {LVec(kW0.size(), 0), LVec(kB0.size(), 0)}};
  }
};

void expect_adam_state(const AdamW& opt, const Model& m, const AdamWRef& ref, const std::string& when) {
  EXPECT_LT(rel_diff(m.W.to_vector<double>(), ref.p[0]), kParamTol) << "W " << when;
  EXPECT_LT(rel_diff(m.b.to_vector<double>(), ref.p[1]), kParamTol) << "b " << when;
  ASSERT_TRUE(opt.exp_avg(0).defined() && opt.exp_avg(1).defined()) << when;
  EXPECT_LT(rel_diff(opt.exp_avg(0).to_vector<double>(), ref.m[0]), kParamTol) << "exp_avg of W " << when;
  EXPECT_LT(rel_diff(opt.exp_avg(1).to_vector<double>(), ref.m[1]), kParamTol) << "exp_avg of b " << when;
  EXPECT_LT(rel_diff(opt.exp_avg_sq(0).to_vector<double>(), ref.v[0]), kParamTol) << "exp_avg_sq of W " << when;
  EXPECT_LT(rel_diff(opt.exp_avg_sq(1).to_vector<double>(), ref.v[1]), kParamTol) << "exp_avg_sq of b " << when;
  EXPECT_EQ(opt.update_count(), ref.t) << "bias-correction count " << when;
}

// Six steps of three micro-batches of four rows each (ACCUM 3: each loss scaled by 1/3, so the
// boundary's gradient is the mean over the step's 12 rows).
TEST(StatefulSteps, AdamWWithAccumulationClippingAndScheduleMatchesLongDoubleOverSteps) {
  const int64_t steps = 6, accum = 3, micro = 4;
  const Data data = make_data(steps * accum * micro, adam_row_scale);
  for (Device dev : test_devices()) {
    SCOPED_TRACE(dev.str());
    Model m(data, dev);
    const AdamSetup setup;
    AdamW opt({m.W, m.b}, setup.options);
    opt.set_accum_steps(accum).set_max_grad_norm(kMaxNorm);
    opt.set_schedule(std::make_shared<LinearWarmupCosine>(2, 5, 0.001));
    AdamWRef ref = setup.ref();
    int clipped = 0;
    int64_t row = 0;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t lo = row;
      StepResult r = run_step(opt, m, row, std::vector<int64_t>(size_t(accum), micro), false, false);
      const Grad g = ce_grad(ref.p[0], ref.p[1], data, lo, row);
      const LD norm = ref.step({g.dW, g.db}, LD(kAdamLr[size_t(s)]));
      clipped += norm > LD(kMaxNorm);
      ASSERT_TRUE(r.stepped);
      EXPECT_FALSE(r.skipped());
      EXPECT_NEAR(r.grad_norm_value(), double(norm), 1e-13 * double(norm)) << "norm before clipping, step " << s;
      EXPECT_NEAR(r.lr_tensor.item(), kAdamLr[size_t(s)], kLrTol) << "lr of step " << s;
      expect_adam_state(opt, m, ref, "after step " + std::to_string(s));
    }
    // The data make the clip act on some steps and not on others.
    EXPECT_GT(clipped, 0);
    EXPECT_LT(clipped, steps);
    EXPECT_EQ(opt.step_count(), steps);
  }
}

// A NaN in one micro-batch's gradient: the step is skipped (no update, moments and the bias-
// correction count unchanged) while the schedule advances; the following steps continue from the
// state the last applied update left, at the schedule's later lr and the un-advanced t.
TEST(StatefulSteps, AdamWSkippedStepKeepsMomentsAndBiasCorrectionWhileTheScheduleAdvances) {
  const int64_t steps = 5, accum = 3, micro = 4, skip = 2;
  const Data data = make_data(steps * accum * micro, adam_row_scale);
  for (Device dev : test_devices()) {
    SCOPED_TRACE(dev.str());
    Model m(data, dev);
    const AdamSetup setup;
    AdamW opt({m.W, m.b}, setup.options);
    opt.set_accum_steps(accum).set_max_grad_norm(kMaxNorm);
    opt.set_schedule(std::make_shared<LinearWarmupCosine>(2, 5, 0.001));
    AdamWRef ref = setup.ref();
    int64_t row = 0;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t lo = row;
      StepResult r;
      for (int64_t i = 0; i < accum; ++i) {
        opt.scale_loss(m.loss(row, row + micro)).backward();
        row += micro;
        if (s == skip && i == 1) {  // plant a NaN in W's accumulated gradient
          Vec gw = m.W.grad().to_vector<double>();
          gw[5] = std::numeric_limits<double>::quiet_NaN();
          m.W.set_grad(tensor(gw, {kK, kD}, f64_on(dev)));
        }
        r = opt.micro_step();
      }
      ASSERT_TRUE(r.stepped) << "step " << s;
      EXPECT_EQ(r.skipped(), s == skip) << "step " << s;
      EXPECT_NEAR(r.lr_tensor.item(), kAdamLr[size_t(s)], kLrTol) << "lr of step " << s;
      if (s != skip) {
        const Grad g = ce_grad(ref.p[0], ref.p[1], data, lo, row);
        ref.step({g.dW, g.db}, LD(kAdamLr[size_t(s)]));
      }
      expect_adam_state(opt, m, ref, "after step " + std::to_string(s));
      EXPECT_EQ(opt.step_count(), s + 1) << "schedule step after step " << s;
      EXPECT_FALSE(m.W.grad().defined()) << "gradients set to none after step " << s;
    }
    EXPECT_EQ(opt.update_count(), steps - 1);
  }
}

}  // namespace
}  // namespace reel
