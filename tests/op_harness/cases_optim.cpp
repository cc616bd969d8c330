// Op-harness cases of the optimizer, mixed-precision and collective ops (schemas:
// kernels/schema/optim.cpp). The in-place ops run through dispatch_out with outputs that are their
// inputs (param, exp_avg, ...), so the runner compares the updated tensors. AdamW and SGD run with
// and without a found_inf flag (set: nothing may change), weight decay, momentum, Nesterov and the
// first step; unscale_check with finite gradients and with inf/NaN; scaler_update on each branch of
// its state machine, with f32 and i64 trackers; clamp_scalar with an infinite bound and NaN input;
// lr_schedule across warm-up, the cosine and past its end; unscale_check's scaling alone. The
// collectives run in one process with a world-size-1 communicator (distributed/communicator.h), where
// each is the identity (all_gather adds a leading dim of 1).
// Plain-loop references: every op here, the update rules written as torch.optim states them; but the
// multi-tensor updates with the clip folded in, whose reference is the CPU's scaling (unscale_check)
// and then each tensor's own update, the ops those loops check.
#include <cmath>

#include "distributed/communicator.h"
#include "kernels/dispatch.h"
#include "tests/op_harness/fused_references.h"
#include "tests/op_harness/inputs.h"

namespace reel::harness {
namespace {

using Values = std::vector<double>;

Tensor flag(double v) { return scalar_input(v, DType::f32); }
Tensor f64_scalar(double v) { return scalar_input(v, DType::f64); }

// ---- AdamW ----

struct AdamW {
  const char* name;
  Shape shape;
  double weight_decay;
  int64_t step;
  std::optional<double> found_inf;  // none: no flag
};

// (param, exp_avg, exp_avg_sq) after one torch.optim.AdamW update, or unchanged when found_inf is set.
Expected adamw_reference(const OpCall& c) {
  const Attrs& a = c.attrs;
  Values p = host_values(c.inputs[0]), g = host_values(c.inputs[1]), m = host_values(c.inputs[2]), v = host_values(c.inputs[3]);
  if (c.inputs[4].defined() && host_values(c.inputs[4])[0] != 0) return {p, m, v};
  const double lr = host_values(c.inputs[5])[0], t = host_values(c.inputs[6])[0];
  const double b1 = a.f("beta1"), b2 = a.f("beta2");
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] *= 1 - lr * a.f("weight_decay");
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    p[i] -= lr * (m[i] / (1 - std::pow(b1, t))) / (std::sqrt(v[i] / (1 - std::pow(b2, t))) + a.f("eps"));
  }
  return {p, m, v};
}

void add_adamw_cases(std::vector<OpTestCase>& cases) {
  for (const AdamW& s : {AdamW{"adamw_step_4x5", {4, 5}, 0.0, 3, std::nullopt},
                         AdamW{"adamw_step_weight_decay_first_step_7", {7}, 0.01, 1, 0.0},
                         AdamW{"adamw_step_skipped_on_inf_3x2", {3, 2}, 0.01, 2, 1.0}}) {
    cases.push_back({
        .op = OpKind::AdamWStep,
        .name = s.name,
        .dtypes = kFloatTypes,
        .make =
            [s](Device, DType t) {
              Tensor p = randn_input(s.shape, t, 150), m = randn_input(s.shape, t, 152, Layout::contiguous, 0.1);
              Tensor v = uniform_input(s.shape, t, 153, 0.01, 0.1);
              Tensor found = s.found_inf ? flag(*s.found_inf) : Tensor();
              Attrs a = Attrs().set("beta1", 0.9).set("beta2", 0.999).set("eps", 1e-8).set("weight_decay", s.weight_decay);
              return OpCall{{p, randn_input(s.shape, t, 151), m, v, found, f64_scalar(1e-2), f64_scalar(double(s.step))}, a,
                            {p, m, v}};
            },
        .reference = adamw_reference,
    });
  }
}

// ---- SGD ----

struct Sgd {
  const char* name;
  double momentum, dampening, weight_decay;
  bool nesterov, first_step;
  std::optional<double> found_inf;
};

// (param, momentum_buf if given) after one torch.optim.SGD update.
Expected sgd_reference(const OpCall& c) {
  const Attrs& a = c.attrs;
  const bool has_buf = c.inputs[2].defined();
  Values p = host_values(c.inputs[0]), g = host_values(c.inputs[1]), buf = has_buf ? host_values(c.inputs[2]) : Values();
  const bool skip = c.inputs[3].defined() && host_values(c.inputs[3])[0] != 0;
  const double lr = host_values(c.inputs[4])[0], mu = a.f("momentum"), wd = a.f("weight_decay");
  for (size_t i = 0; i < p.size() && !skip; ++i) {
    double d = g[i] + wd * p[i];
    if (has_buf && mu != 0) {
      buf[i] = a.b("first_step") ? d : mu * buf[i] + (1 - a.f("dampening")) * d;
      d = a.b("nesterov") ? d + mu * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
  return has_buf ? Expected{p, buf} : Expected{p};
}

void add_sgd_cases(std::vector<OpTestCase>& cases) {
  for (const Sgd& s : {Sgd{"sgd_step_plain", 0.0, 0.0, 0.0, false, false, std::nullopt},
                       Sgd{"sgd_step_momentum_first_step", 0.9, 0.1, 1e-3, false, true, 0.0},
                       Sgd{"sgd_step_momentum", 0.9, 0.1, 0.0, false, false, std::nullopt},
                       Sgd{"sgd_step_nesterov_weight_decay", 0.8, 0.0, 0.01, true, false, std::nullopt},
                       Sgd{"sgd_step_skipped_on_inf", 0.9, 0.0, 0.0, false, false, 1.0}}) {
    cases.push_back({
        .op = OpKind::SgdStep,
        .name = s.name,
        .dtypes = kFloatTypes,
        .make =
            [s](Device, DType t) {
              const Shape shape{3, 5};
              Tensor p = randn_input(shape, t, 160), buf = s.momentum != 0 ? randn_input(shape, t, 162) : Tensor();
              Attrs a = Attrs().set("momentum", s.momentum).set("dampening", s.dampening);
              a.set("weight_decay", s.weight_decay).set("nesterov", s.nesterov).set("first_step", s.first_step);
              OpCall call{{p, randn_input(shape, t, 161), buf, s.found_inf ? flag(*s.found_inf) : Tensor(), f64_scalar(0.1)}, a, {p}};
              if (buf.defined()) call.outputs.push_back(buf);
              return call;
            },
        .reference = sgd_reference,
    });
  }
}

// ---- unscale_check, scaler_update, clamp_scalar, lr_schedule ----

// (g_0 * inv_scale, ..., found_inf): found_inf becomes 1 when a gradient held inf or NaN.
Expected unscale_reference(const OpCall& c) {
  const size_t k = c.inputs.size() - 2;
  const double inv = host_values(c.inputs[k])[0];
  double found = host_values(c.inputs[k + 1])[0];
  Expected out;
  for (size_t j = 0; j < k; ++j) {
    Values g = host_values(c.inputs[j]);
    for (double& v : g) found = std::isfinite(v) ? found : 1, v *= inv;
    out.push_back(g);
  }
  out.push_back({found});
  return out;
}

void add_unscale_cases(std::vector<OpTestCase>& cases) {
  struct Unscale {
    const char* name;
    DType inv_dtype;
    bool nonfinite;
  };
  for (const Unscale& u : {Unscale{"unscale_check_finite_f32_scale", DType::f32, false},
                           Unscale{"unscale_check_inf_and_nan_f64_scale", DType::f64, true}}) {
    cases.push_back({
        .op = OpKind::UnscaleCheck,
        .name = u.name,
        .dtypes = kFloatTypes,
        .make =
            [u](Device, DType t) {
              Values g1 = host_values(randn_input({6}, t, 171, Layout::contiguous, 1000.0));
              if (u.nonfinite) g1[2] = INFINITY, g1[4] = NAN;
              Tensor g0 = randn_input({3, 4}, t, 170, Layout::contiguous, 1000.0), g1t = values_input(g1, {6}, t);
              Tensor g2 = randn_input({2}, DType::f32, 172), found = flag(0);
              return OpCall{{g0, g1t, g2, scalar_input(1.0 / 1024, u.inv_dtype), found}, {}, {g0, g1t, g2, found}};
            },
        .tol_scale = 0,
        .reference = unscale_reference,
    });
  }
}

// unscale_check without its flag (attr check_finite false): the clip's scaling alone, inf and NaN
// passing through scaled.
void add_scale_only_cases(std::vector<OpTestCase>& cases) {
  cases.push_back({
      .op = OpKind::UnscaleCheck,
      .name = "unscale_check_scale_only_with_inf",
      .dtypes = kFloatTypes,
      .make =
          [](Device, DType t) {
            Values g1 = host_values(randn_input({5}, t, 173));
            g1[3] = INFINITY;
            Tensor g0 = randn_input({2, 3}, t, 174), g1t = values_input(g1, {5}, t);
            return OpCall{{g0, g1t, scalar_input(0.3, DType::f32)}, Attrs().set("check_finite", false), {g0, g1t}};
          },
      .reference =
          [](const OpCall& c) {
            Expected out;
            for (size_t j = 0; j < 2; ++j) {
              Values g = host_values(c.inputs[j]);
              for (double& v : g) v *= double(0.3f);
              out.push_back(g);
            }
            return out;
          },
  });
}

// ---- the clip folded into the multi-tensor updates (attrs clip, clip_writes_grad) ----

const Shape kClipShapes[] = {{4, 5}, {7}, {1030}};  // 1030: a whole 1024-element chunk and a tail

// Each tensor's gradient scaled as unscale_check (check_finite false) scales it, then its own
// adamw_step / sgd_step: the update's outputs, and the scaled gradient where the call stores it.
Expected clipped_update_reference(const OpCall& c, bool sgd) {
  const size_t per = sgd ? 3 : 4, k = 3;
  const bool writes = c.attrs.b("clip_writes_grad");
  const Tensor& coef = c.inputs.back();
  Expected e;
  for (size_t i = 0; i < k; ++i) {
    Tensor g = copy_of(c.inputs[per * i + 1]);
    dispatch_out(OpKind::UnscaleCheck, {g, coef}, {g}, Attrs().set("check_finite", false));
    std::vector<Tensor> out{copy_of(c.inputs[per * i])};
    if (sgd) {
      Tensor b = copy_of(c.inputs[per * i + 2]);
      out.push_back(b);
      dispatch_out(OpKind::SgdStep, {out[0], g, b, c.inputs[per * k], c.inputs[per * k + 1]}, out, c.attrs);
    } else {
      out.push_back(copy_of(c.inputs[per * i + 2]));
      out.push_back(copy_of(c.inputs[per * i + 3]));
      dispatch_out(OpKind::AdamWStep,
                   {out[0], g, out[1], out[2], c.inputs[per * k], c.inputs[per * k + 1], c.inputs[per * k + 2]}, out,
                   c.attrs);
    }
    for (const Tensor& t : out) e.push_back(host_values(t));
    if (writes) e.push_back(host_values(g));
  }
  return e;
}

void add_clipped_update_cases(std::vector<OpTestCase>& cases) {
  struct Clip {
    const char* name;
    bool sgd, writes_grad;
    double found;  // set: no update, but the stored gradients are still scaled
    DType coef;
  };
  for (const Clip& v : {Clip{"multi_tensor_adamw_clip_3_tensors", false, false, 0.0, DType::f32},
                        Clip{"multi_tensor_adamw_clip_writes_grad_3_tensors", false, true, 0.0, DType::f64},
                        Clip{"multi_tensor_adamw_clip_writes_grad_skipped_on_inf", false, true, 1.0, DType::f32},
                        Clip{"multi_tensor_sgd_momentum_clip_writes_grad_3_tensors", true, true, 0.0, DType::f32}}) {
    cases.push_back({
        .op = v.sgd ? OpKind::MultiTensorSgd : OpKind::MultiTensorAdamW,
        .name = v.name,
        .dtypes = kFloatTypes,
        .make =
            [v](Device, DType t) {
              Attrs a = v.sgd ? Attrs()
                                    .set("momentum", 0.9)
                                    .set("dampening", 0.0)
                                    .set("nesterov", false)
                                    .set("first_step", false)
                              : Attrs().set("beta1", 0.9).set("beta2", 0.999).set("eps", 1e-8);
              a.set("weight_decay", 0.01)
                  .set("tensors", int64_t(3))
                  .set("clip", true)
                  .set("clip_writes_grad", v.writes_grad);
              OpCall c{{}, a};
              uint64_t seed = 310;
              for (const Shape& s : kClipShapes) {
                Tensor p = randn_input(s, t, seed++), g = randn_input(s, t, seed++, Layout::contiguous, 3.0);
                Tensor m = randn_input(s, t, seed++, Layout::contiguous, 0.1);
                if (v.sgd) {
                  c.inputs.insert(c.inputs.end(), {p, g, m});
                  c.outputs.insert(c.outputs.end(), {p, m});
                } else {
                  Tensor sq = uniform_input(s, t, seed++, 0.01, 0.1);
                  c.inputs.insert(c.inputs.end(), {p, g, m, sq});
                  c.outputs.insert(c.outputs.end(), {p, m, sq});
                }
                if (v.writes_grad) c.outputs.push_back(g);
              }
              c.inputs.push_back(scalar_input(v.found, DType::f32));
              c.inputs.push_back(scalar_input(1e-2, DType::f64));
              if (!v.sgd) c.inputs.push_back(scalar_input(3.0, DType::f64));
              c.inputs.push_back(scalar_input(0.37, v.coef));
              return c;
            },
        .reference = [v](const OpCall& c) { return clipped_update_reference(c, v.sgd); },
    });
  }
}

void add_scaler_update_cases(std::vector<OpTestCase>& cases) {
  struct Update {
    const char* name;
    double scale, tracker, found;
  };
  // interval 3: tracker 0 -> 1 (no growth), 2 -> grow, found -> back off, growth past f32's range -> kept
  for (const Update& u : {Update{"scaler_update_counts_up", 1024, 0, 0}, Update{"scaler_update_grows_at_interval", 1024, 2, 0},
                          Update{"scaler_update_backs_off_on_inf", 1024, 1, 1},
                          Update{"scaler_update_keeps_a_finite_scale", 3e38, 2, 0}}) {
    cases.push_back({
        .op = OpKind::ScalerUpdate,
        .name = u.name,
        .dtypes = {DType::f32, DType::i64},  // the growth tracker's dtype
        .make =
            [u](Device, DType t) {
              Tensor scale = flag(u.scale), tracker = scalar_input(u.tracker, t);
              Attrs a = Attrs().set("growth_factor", 2.0).set("backoff_factor", 0.5).set("growth_interval", int64_t(3));
              return OpCall{{scale, tracker, flag(u.found)}, a, {scale, tracker}};
            },
        .tol_scale = 0,
        .reference =
            [u](const OpCall&) {
              if (u.found != 0) return Expected{{double(float(u.scale * 0.5))}, {0}};
              if (u.tracker + 1 < 3) return Expected{{u.scale}, {u.tracker + 1}};
              const float grown = float(u.scale * 2.0);
              return Expected{{std::isfinite(grown) ? double(grown) : double(float(u.scale))}, {0}};
            },
    });
  }
}

void add_clamp_cases(std::vector<OpTestCase>& cases) {
  auto reference = [](const OpCall& c) {
    const double lo = c.attrs.f("min", -INFINITY), hi = c.attrs.f("max", INFINITY);
    Values y = host_values(c.inputs[0]);
    for (double& v : y) v = v < lo ? lo : (v > hi ? hi : v);
    return Expected{y};
  };
  cases.push_back({.op = OpKind::ClampScalar,
                   .name = "clamp_scalar_with_nan_4x5",
                   .dtypes = kFloatTypes,
                   .make =
                       [](Device, DType t) {
                         Values x = host_values(randn_input({4, 5}, t, 180));
                         x[3] = NAN, x[11] = INFINITY;
                         return OpCall{{values_input(x, {4, 5}, t)}, Attrs().set("min", -0.5).set("max", 0.75)};
                       },
                   .tol_scale = 0,
                   .reference = reference});
  cases.push_back({.op = OpKind::ClampScalar,
                   .name = "clamp_scalar_min_only_transposed_3x6",
                   .dtypes = kFloatTypes,
                   .make = [](Device, DType t) { return OpCall{{randn_input({3, 6}, t, 181, Layout::transposed)}, Attrs().set("min", 0.25)}; },
                   .tol_scale = 0,
                   .reference = reference});
}

void add_lr_schedule_cases(std::vector<OpTestCase>& cases) {
  struct Schedule {
    const char* name;
    int64_t kind;
    double step;
  };
  for (const Schedule& s : {Schedule{"lr_schedule_constant", 0, 5}, Schedule{"lr_schedule_warmup", 1, 2},
                            Schedule{"lr_schedule_cosine", 1, 7}, Schedule{"lr_schedule_past_the_end", 1, 20}}) {
    cases.push_back({
        .op = OpKind::LrSchedule,
        .name = s.name,
        .dtypes = {DType::f64},
        .make =
            [s](Device, DType) {
              Attrs a = Attrs().set("kind", s.kind).set("base_lr", 0.1);
              if (s.kind == 1) a.set("warmup_steps", int64_t(4)).set("total_steps", int64_t(10)).set("min_lr", 0.01);
              return OpCall{{f64_scalar(s.step)}, a};
            },
        .reference =
            [s](const OpCall&) {
              // warm-up over 4 steps to 0.1, then a half cosine over 6 steps down to 0.01.
              const double pi = std::acos(-1.0);
              if (s.kind == 0) return Expected{{0.1}};
              if (s.step < 4) return Expected{{0.1 * (s.step + 1) / 4}};
              const double progress = std::min(1.0, (s.step - 4) / 6);
              return Expected{{0.01 + 0.09 * (1 + std::cos(pi * progress)) / 2}};
            },
    });
  }
}

// ---- collectives, world size 1 ----

int64_t single_process_comm() {
  static dist::SingleProcessCommunicator comm;
  return comm.id();
}

void add_collective_cases(std::vector<OpTestCase>& cases) {
  auto unchanged = [](const OpCall& c) { return Expected{host_values(c.inputs[0])}; };
  for (auto [name, op] : {std::pair{"all_reduce_sum_3x4", 0}, std::pair{"all_reduce_max_3x4", 1}, std::pair{"all_reduce_min_3x4", 2}}) {
    const int64_t reduce = op;
    cases.push_back({.op = OpKind::AllReduce,
                     .name = name,
                     .dtypes = kWideTypes,
                     .make =
                         [reduce](Device, DType t) {
                           Tensor x = randn_input({3, 4}, t, 190, Layout::contiguous, 5.0);
                           return OpCall{{x}, Attrs().set("comm", single_process_comm()).set("op", reduce), {x}};
                         },
                     .tol_scale = 0,
                     .reference = unchanged});
  }
  cases.push_back({.op = OpKind::AllGather,
                   .name = "all_gather_3x2",
                   .dtypes = kWideTypes,
                   .make =
                       [](Device, DType t) {
                         Attrs a = Attrs().set("comm", single_process_comm()).set("world", int64_t(1));
                         return OpCall{{randn_input({3, 2}, t, 191, Layout::contiguous, 5.0)}, a};
                       },
                   .tol_scale = 0,
                   .reference = unchanged});
  cases.push_back({.op = OpKind::Broadcast,
                   .name = "broadcast_from_root_0_2x5",
                   .dtypes = kAllTypes,
                   .make =
                       [](Device, DType t) {
                         Tensor x = randn_input({2, 5}, t, 192, Layout::contiguous, 5.0);
                         return OpCall{{x}, Attrs().set("comm", single_process_comm()).set("root", int64_t(0)), {x}};
                       },
                   .tol_scale = 0,
                   .reference = unchanged});
}

}  // namespace

std::vector<OpTestCase> optim_cases() {
  // The collectives' kernels are registered by the first communicator made: make it before any
  // case asks supports() about them.
  single_process_comm();
  std::vector<OpTestCase> cases;
  add_adamw_cases(cases);
  add_sgd_cases(cases);
  add_unscale_cases(cases);
  add_scale_only_cases(cases);
  add_clipped_update_cases(cases);
  add_scaler_update_cases(cases);
  add_clamp_cases(cases);
  add_lr_schedule_cases(cases);
  add_collective_cases(cases);
  return cases;
}

}  // namespace reel::harness
