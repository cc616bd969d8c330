// Tests of the optimizer's per-step hyper-parameters on the device: the lr_schedule op against
// LrSchedule::lr() on the host (CPU, and CUDA parity), adamw_step/sgd_step reading lr and t from
// 0-dim f64 tensors, the two device counters (schedule step: every boundary; bias-correction count:
// applied updates only, as torch counts them), and the property the compiler needs: the ops of one
// boundary, recorded through a DispatchObserver and replayed by themselves, keep advancing the lr
// and t without any optimizer host code, and a boundary on the GPU copies nothing to the host.
// Reference: a plain AdamW loop in f64 (torch.optim.AdamW's formulas).
#include <cmath>
#include <set>

#include "optim/optim.h"
#include "tensor/cuda.h"
#include "tests/test_util.h"

namespace reel {
namespace {

using namespace reel::optim;
using testing_util::expect_error;
using testing_util::max_abs_diff;

const TensorOptions kF64 = TensorOptions().with_dtype(DType::f64);

TensorOptions f64_on(Device device) { return TensorOptions().with_dtype(DType::f64).with_device(device); }

// torch.optim.AdamW on host vectors, t counted by the caller.
struct AdamWRef {
  std::vector<double> p, m, v;
  double b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 1e-2;
  explicit AdamWRef(std::vector<double> p0) : p(std::move(p0)), m(p.size(), 0.0), v(p.size(), 0.0) {}
  void step(const std::vector<double>& g, double lr, int t) {
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] -= lr * wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      p[i] -= lr * (m[i] / (1 - std::pow(b1, t))) / (std::sqrt(v[i] / (1 - std::pow(b2, t))) + eps);
    }
  }
};

// Every dispatch while installed, with the tensors it touched (handles keep them alive for a replay).
// Both forms of on_dispatch (with and without the into_given flag) are declared: the recorder needs
// nothing from the flag, and so fits the observer interface either way.
class Recorder : public DispatchObserver {
 public:
  struct Call {
    OpKind op;
    std::vector<Tensor> in, out;
    Attrs attrs;
  };
  Recorder() { previous_ = set_dispatch_observer(this); }
  ~Recorder() override { set_dispatch_observer(previous_); }
  void on_dispatch(OpKind op, const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs& attrs) {
    calls.push_back({op, in, out, attrs});
  }
  void on_dispatch(OpKind op, const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs& attrs,
                   bool) {
    on_dispatch(op, in, out, attrs);
  }
  std::vector<Call> calls;

 private:
  DispatchObserver* previous_ = nullptr;
};

// Runs the recorded kernels again into the same tensors, as a compiled plan would: no schema for
// the optimizer, no host code of it. View ops run no kernel; their outputs still alias their inputs.
void replay(const std::vector<Recorder::Call>& calls) {
  for (const Recorder::Call& c : calls)
    if (!is_view_op(c.op)) dispatch_out(c.op, c.in, c.out, c.attrs);
}

struct ScheduleCase {
  const char* name;
  std::shared_ptr<LrSchedule> schedule;
};

std::vector<ScheduleCase> schedule_cases() {
  return {{"constant", std::make_shared<ConstantLr>()},
          {"warmup 3, cosine to 10", std::make_shared<LinearWarmupCosine>(3, 10, 0.01)},
          {"no warm-up", std::make_shared<LinearWarmupCosine>(0, 5, 0.0)},
          {"warm-up only", std::make_shared<LinearWarmupCosine>(4, 4, 0.02)}};
}

// lr_schedule on `device` for steps 0..15 against the host's LrSchedule::lr, within abs_tol (the CPU
// runs the host's very formula; CUDA's cos may differ in the last bits, which 1 + cos(pi p) magnifies
// near p = 1).
void expect_schedule_matches_host(Device device, double abs_tol) {
  const double base_lr = 0.1;
  for (const ScheduleCase& c : schedule_cases()) {
    std::optional<Attrs> a = c.schedule->device_attrs(base_lr);
    ASSERT_TRUE(a.has_value()) << c.name;
    for (int64_t s = 0; s <= 15; ++s) {
      Tensor step = full({}, double(s), f64_on(device));
      Tensor lr = dispatch1(OpKind::LrSchedule, {step}, *a);
      EXPECT_EQ(lr.dim(), 0);
      EXPECT_EQ(lr.dtype(), DType::f64);
      EXPECT_TRUE(lr.device() == device);
      double want = c.schedule->lr(s, base_lr);
      EXPECT_NEAR(lr.item(), want, abs_tol) << c.name << ", step " << s;
    }
  }
}

TEST(LrScheduleOp, MatchesHostScheduleOnCpu) { expect_schedule_matches_host(Device::cpu(), 0.0); }

TEST(LrScheduleOp, CudaMatchesHostSchedule) {
  REEL_REQUIRE_GPU();
  expect_schedule_matches_host(Device::cuda(0), 1e-15);
}

TEST(LrScheduleOp, Errors) {
  Attrs a = *LinearWarmupCosine(2, 8).device_attrs(0.1);
  expect_error([&] { dispatch1(OpKind::LrSchedule, {full({2}, 1.0, kF64)}, a); },
               {"lr_schedule", "step must be a 0-dim f64 tensor", "(2,) f64"});
  expect_error([&] { dispatch1(OpKind::LrSchedule, {full({}, 1.0)}, a); },
               {"lr_schedule", "step must be a 0-dim f64 tensor", "() f32"});
  expect_error([&] { dispatch1(OpKind::LrSchedule, {full({1}, 1.0, kF64)}, a); }, {"lr_schedule", "(1,) f64"});
  Tensor s = full({}, 0.0, kF64);
  expect_error([&] { dispatch1(OpKind::LrSchedule, {s}, Attrs(a).set("kind", int64_t(7))); },
               {"lr_schedule", "kind must be 0 (constant) or 1 (warmup_cosine), got 7"});
  expect_error([&] { dispatch1(OpKind::LrSchedule, {s}, Attrs(a).set("warmup_steps", int64_t(9))); },
               {"lr_schedule", "warmup_steps (9) <= total_steps (8)"});
  // adamw_step and sgd_step take lr and t as 0-dim f64 tensors.
  Tensor p = zeros({2}, kF64), m = zeros({2}, kF64);
  Attrs adam = Attrs().set("beta1", 0.9).set("beta2", 0.999).set("eps", 1e-8).set("weight_decay", 0.0);
  expect_error([&] { dispatch_out(OpKind::AdamWStep, {p, p, m, m, Tensor(), full({1}, 0.1, kF64), s}, {p, m, m},
                                  adam); },
               {"adamw_step", "lr must be a 0-dim f64 tensor", "(1,) f64"});
  expect_error([&] { dispatch_out(OpKind::AdamWStep, {p, p, m, m, Tensor(), s, full({}, 1.0)}, {p, m, m}, adam); },
               {"adamw_step", "step must be a 0-dim f64 tensor", "() f32"});
  Attrs sgd = Attrs().set("momentum", 0.0).set("dampening", 0.0).set("weight_decay", 0.0).set("nesterov", false)
                  .set("first_step", true);
  expect_error([&] { dispatch_out(OpKind::SgdStep, {p, p, Tensor(), Tensor(), Tensor()}, {p}, sgd); },
               {"sgd_step", "lr is undefined"});
}

// A user-defined schedule without a device form: the host computes lr and fills it in.
class HalvingLr : public LrSchedule {
 public:
  double lr(int64_t step, double base_lr) const override { return base_lr * std::pow(0.5, double(step / 2)); }
  std::string describe() const override { return "halving every 2 steps"; }
};

// One boundary of `opt` (accumulation 1) with gradient `g` planted on p.
StepResult step_with_grad(Optimizer& opt, const Tensor& p, const std::vector<double>& g) {
  p.set_grad(tensor(g, {int64_t(g.size())}, f64_on(p.device())));
  return opt.micro_step();
}

TEST(OptimDeviceHparams, AdamWWithScheduleMatchesReferenceLoop) {
  for (const ScheduleCase& c : schedule_cases()) {
    std::vector<double> p0 = {0.5, -1, 2};
    Tensor p = tensor(p0, {3}, kF64).set_requires_grad();
    AdamW opt({p}, AdamWOptions(0.1));
    opt.set_schedule(c.schedule);
    AdamWRef ref(p0);
    for (int t = 1; t <= 12; ++t) {
      std::vector<double> g = {0.3 * t, -1.0, 2.0 / t};
      StepResult r = step_with_grad(opt, p, g);
      double lr = c.schedule->lr(t - 1, 0.1);
      ref.step(g, lr, t);
      EXPECT_EQ(r.lr, lr) << c.name << ", step " << t;
      ASSERT_TRUE(r.lr_tensor.defined());
      EXPECT_EQ(r.lr_tensor.item(), lr) << c.name << ", step " << t;
      EXPECT_LT(max_abs_diff(p.to_vector<double>(), ref.p), 1e-13) << c.name << ", step " << t;
    }
    EXPECT_EQ(opt.step_count(), 12);
    EXPECT_EQ(opt.update_count(), 12);
  }
}

TEST(OptimDeviceHparams, ScheduleWithoutDeviceFormIsFilledFromTheHost) {
  Tensor p = zeros({2}, kF64).set_requires_grad();
  SGD opt({p}, SGDOptions(0.8));
  opt.set_schedule(std::make_shared<HalvingLr>());
  std::vector<double> want = {0.8, 0.8, 0.4, 0.4, 0.2};
  std::vector<double> before = p.to_vector<double>();
  for (size_t s = 0; s < want.size(); ++s) {
    StepResult r = step_with_grad(opt, p, {1.0, -2.0});
    EXPECT_EQ(r.lr, want[s]);
    EXPECT_EQ(r.lr_tensor.item(), want[s]);
    std::vector<double> now = p.to_vector<double>();
    EXPECT_NEAR(before[0] - now[0], want[s], 1e-15) << "step " << s;
    before = now;
  }
  EXPECT_EQ(opt.lr(), 0.2);
}

// A planted inf under the GradScaler: the update is skipped and the bias-correction count stays,
// while the schedule step advances; the next clean update uses t = 1 with the schedule at step 1.
TEST(OptimDeviceHparams, SkippedStepDoesNotAdvanceBiasCorrection) {
  std::vector<double> p0 = {0.5, 1, -1};
  Tensor p = tensor(p0, {3}, kF64).set_requires_grad();
  AdamW opt({p}, AdamWOptions(0.1));
  auto sched = std::make_shared<LinearWarmupCosine>(2, 6);
  auto scaler = std::make_shared<GradScaler>(GradScalerOptions().init_scale(1024));
  opt.set_schedule(sched).set_grad_scaler(scaler);
  Tensor x = tensor({1, -2, 3}, {3}, kF64);
  auto scaled_step = [&](bool plant_inf) {
    opt.scale_loss(sum(mul(p, x))).backward();  // grad = 1024 x, unscaled back to x exactly
    if (plant_inf) {
      std::vector<double> g = p.grad().to_vector<double>();
      g[1] = INFINITY;
      p.set_grad(tensor(g, {3}, kF64));
    }
    return opt.micro_step();
  };
  StepResult r = scaled_step(true);
  EXPECT_TRUE(r.skipped());
  EXPECT_EQ(p.to_vector<double>(), p0);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_EQ(opt.update_count(), 0);
  AdamWRef ref(p0);
  const std::vector<double> g = {1, -2, 3};
  for (int t = 1; t <= 3; ++t) {
    r = scaled_step(false);
    EXPECT_FALSE(r.skipped());
    ref.step(g, sched->lr(t, 0.1), t);  // schedule step t (one boundary ahead), bias correction t
    EXPECT_EQ(r.lr_tensor.item(), sched->lr(t, 0.1));
    EXPECT_LT(max_abs_diff(p.to_vector<double>(), ref.p), 1e-13) << "clean update " << t;
    EXPECT_EQ(opt.step_count(), t + 1);
    EXPECT_EQ(opt.update_count(), t);
  }
  // Without a scaler a non-finite norm skips in the same way.
  Tensor q = tensor(p0, {3}, kF64).set_requires_grad();
  AdamW plain({q}, AdamWOptions(0.1));
  EXPECT_TRUE(step_with_grad(plain, q, {1, NAN, 3}).skipped());
  step_with_grad(plain, q, g);
  AdamWRef ref2(p0);
  ref2.step(g, 0.1, 1);
  EXPECT_LT(max_abs_diff(q.to_vector<double>(), ref2.p), 1e-13);
  EXPECT_EQ(plain.step_count(), 2);
  EXPECT_EQ(plain.update_count(), 1);
}

TEST(OptimDeviceHparams, LibtorchStepUsesTheDeviceCounters) {
  Tensor p = tensor({1, 2}, {2}, kF64).set_requires_grad();
  AdamW opt({p}, AdamWOptions(0.05));
  opt.set_schedule(std::make_shared<LinearWarmupCosine>(2, 4));
  AdamWRef ref({1, 2});
  for (int t = 1; t <= 3; ++t) {
    p.set_grad(tensor({0.5, -1.5}, {2}, kF64));
    opt.step();
    ref.step({0.5, -1.5}, LinearWarmupCosine(2, 4).lr(t - 1, 0.05), t);
  }
  EXPECT_LT(max_abs_diff(p.to_vector<double>(), ref.p), 1e-14);
  EXPECT_EQ(opt.step_count(), 3);
  EXPECT_EQ(opt.update_count(), 3);
  EXPECT_TRUE(opt.step_count_tensor().device() == p.device());
  EXPECT_EQ(opt.step_count_tensor().dtype(), DType::f64);
}

TEST(OptimDeviceHparams, RefusesParametersOnTwoDevices) {
  REEL_REQUIRE_GPU();
  Tensor a = zeros({2}).set_requires_grad();
  Tensor b = zeros({3}).to(Device::cuda(0)).set_requires_grad();
  expect_error([&] { AdamW({a, b}); }, {"AdamW", "parameter 1", "(3,)", "cuda:0", "one optimizer per device"});
}

// The inputs of every recorded op come from before the step (parameters, gradients, state) or from
// an earlier op of the step: nothing computed by host code enters mid-step.
void expect_closed_dataflow(const std::vector<Recorder::Call>& calls, const std::vector<Tensor>& before) {
  std::set<const Storage*> known;
  for (const Tensor& t : before) known.insert(t.storage().get());
  for (const Recorder::Call& c : calls) {
    for (const Tensor& t : c.in) {
      if (!t.defined()) continue;
      EXPECT_TRUE(known.count(t.storage().get())) << op_name(c.op) << " reads a tensor made on the host";
    }
    for (const Tensor& t : c.out) known.insert(t.storage().get());
  }
}

// Records one boundary of AdamW with a warm-up/cosine schedule and clipping, then replays only its
// ops: the parameters must follow the reference loop with lr and t still advancing.
void expect_replay_advances(Device device) {
  std::vector<double> p0 = {0.5, -1, 2, 0.25};
  Tensor p = tensor(p0, {4}, f64_on(device)).set_requires_grad();
  auto sched = std::make_shared<LinearWarmupCosine>(2, 7, 0.005);
  AdamW opt({p}, AdamWOptions(0.1));
  opt.set_schedule(sched).set_max_grad_norm(100.0);
  AdamWRef ref(p0);
  auto grad_at = [](int t) { return std::vector<double>{0.1 * t, -0.5, 1.0 / t, 2.0}; };
  step_with_grad(opt, p, grad_at(1));  // warm-up: creates exp_avg / exp_avg_sq
  ref.step(grad_at(1), sched->lr(0, 0.1), 1);
  Tensor g = tensor(grad_at(2), {4}, f64_on(device));
  p.set_grad(g);
  std::vector<Recorder::Call> calls, next;
  {
    Recorder rec;
    opt.micro_step();
    calls = rec.calls;
  }
  ref.step(grad_at(2), sched->lr(1, 0.1), 2);
  expect_closed_dataflow(calls, {p, g, opt.exp_avg(0), opt.exp_avg_sq(0), opt.step_count_tensor(),
                                 opt.update_count_tensor()});
  p.set_grad(tensor(grad_at(3), {4}, f64_on(device)));
  {
    Recorder rec;  // a second boundary records the same ops and attrs: no per-step value is an attr
    opt.micro_step();
    next = rec.calls;
  }
  ref.step(grad_at(3), sched->lr(2, 0.1), 3);
  ASSERT_EQ(next.size(), calls.size());
  for (size_t k = 0; k < calls.size(); ++k) {
    EXPECT_EQ(next[k].op, calls[k].op) << "op " << k;
    EXPECT_EQ(next[k].attrs.str(), calls[k].attrs.str()) << op_name(calls[k].op);
  }
  for (int t = 4; t <= 9; ++t) {
    copy_(g, tensor(grad_at(t), {4}, f64_on(device)));
    replay(calls);
    ref.step(grad_at(t), sched->lr(t - 1, 0.1), t);
    EXPECT_LT(max_abs_diff(p.to_vector<double>(), ref.p), 1e-13) << "replayed update " << t;
  }
  EXPECT_EQ(opt.step_count(), 9);
  EXPECT_EQ(opt.update_count(), 9);
  EXPECT_EQ(opt.lr(), sched->lr(9, 0.1));
}

TEST(OptimDeviceHparams, RecordedBoundaryReplaysWithLrAndStepAdvancingOnCpu) {
  expect_replay_advances(Device::cpu());
}

TEST(OptimDeviceHparams, RecordedBoundaryReplaysWithLrAndStepAdvancingOnCuda) {
  REEL_REQUIRE_GPU();
  expect_replay_advances(Device::cuda(0));
}

// A whole fp16-style step on the GPU (scaler, clipping, schedule, AdamW) moves nothing between the
// device and the host: no Copy crosses devices while the micro-batches and the boundary run.
TEST(OptimDeviceHparams, CudaStepCopiesNothingToOrFromTheHost) {
  REEL_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor p = randn({64}).to(gpu).set_requires_grad();
  Tensor x = randn({64}).to(gpu);
  AdamW opt({p});
  opt.set_schedule(std::make_shared<LinearWarmupCosine>(2, 10)).set_accum_steps(2).set_max_grad_norm(1.0);
  opt.set_grad_scaler(std::make_shared<GradScaler>());
  for (int step = 0; step < 3; ++step) {
    Recorder rec;
    StepResult r;
    for (int i = 0; i < 2; ++i) {
      opt.scale_loss(sum(mul(p, x))).backward();
      r = opt.micro_step();
    }
    EXPECT_TRUE(r.stepped);
    for (const Recorder::Call& c : rec.calls) {
      if (c.op != OpKind::Copy || c.in.empty() || c.out.empty()) continue;
      EXPECT_TRUE(c.in[0].device() == c.out[0].device())
          << "copy from " << c.in[0].device().str() << " to " << c.out[0].device().str() << " in step " << step;
    }
  }
  EXPECT_EQ(opt.step_count(), 3);
  EXPECT_EQ(opt.update_count(), 3);
}

}  // namespace
}  // namespace reel
