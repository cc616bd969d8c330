// Schemas of the optimizer and mixed-precision ops. All but clamp_scalar and lr_schedule update
// their tensors in place: they run through dispatch_out with outputs that alias inputs, and nothing
// reads a device value on the host, so a whole optimizer step can be traced and captured. Updated
// tensors must be contiguous (parameters, gradients and optimizer state always are). A 0-dim flag
// `found_inf` (f32, 0 or 1) lets every kernel skip on the device. The per-step hyper-parameters —
// the learning rate and AdamW's step count — are 0-dim f64 device tensors, not attrs, so that a
// replayed step reads the values its own lr_schedule and counter ops produced instead of frozen ones.
//
//   adamw_step (param, grad, exp_avg, exp_avg_sq, found_inf?, lr, step) -> (param, exp_avg, exp_avg_sq)
//       lr, step: 0-dim f64; step is the 1-based count of applied updates (t, >= 1: a device value,
//       so not checked here); attrs beta1 beta2 eps weight_decay; exactly torch.optim.AdamW:
//       p -= lr wd p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//       p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps);   nothing changes if found_inf != 0
//   sgd_step (param, grad, momentum_buf?, found_inf?, lr) -> (param, momentum_buf if given)
//       lr: 0-dim f64; attrs momentum dampening weight_decay nesterov first_step; torch.optim.SGD:
//       d = g + wd p;  buf = first_step ? d : momentum buf + (1 - dampening) d;
//       d = nesterov ? d + momentum buf : buf (when momentum != 0);  p -= lr d
//   unscale_check (g0, ..., gk, inv_scale, found_inf) -> (g0, ..., gk, found_inf)
//       g_i *= inv_scale; found_inf = 1 if any g_i held inf/NaN, else unchanged
//       (PyTorch's _amp_foreach_non_finite_check_and_unscale_). inv_scale: 0-dim f32 or f64.
//       attr check_finite (default true); false: (g0, ..., gk, inv_scale) -> (g0, ..., gk), the
//       scaling alone (a clip whose caller's flag already covers non-finite gradients).
//   multi_tensor_adamw / multi_tensor_sgd: kernels/multi_tensor.h; with attr clip, the gradients are
//       first scaled as unscale_check (check_finite false) scales them, by one more step-wide input
//       (the clip coefficient), even when found_inf skips the update; attr clip_writes_grad says
//       whether the scaled gradients are also stored (one more output per tensor).
//   scaler_update (scale, growth_tracker, found_inf) -> (scale, growth_tracker)
//       attrs growth_factor backoff_factor growth_interval; PyTorch's _amp_update_scale_:
//       found_inf: scale *= backoff, tracker = 0; else tracker += 1, and at growth_interval
//       scale *= growth (when the result is finite), tracker = 0. scale f32; tracker f32 or i64.
//   clamp_scalar (x) -> y = min(max(x, min), max)      attrs min max (either may be +-inf); NaN stays NaN
//   lr_schedule (step) -> lr          step, lr: 0-dim f64 (step = optimizer steps completed, 0 first)
//       attrs kind (0 constant, 1 warmup_cosine) base_lr, and for warmup_cosine warmup_steps
//       total_steps min_lr; the formulas of optim/schedule.h (kernels/lr_schedule_math.h):
//       constant: lr = base_lr;  warmup_cosine: s < W: base_lr (s + 1) / W, else
//       min_lr + (base_lr - min_lr) (1 + cos(pi min(1, (s - W) / max(1, S - W)))) / 2
#include <cmath>
#include <initializer_list>

#include "kernels/multi_tensor.h"
#include "kernels/lr_schedule_math.h"
#include "kernels/schema/schema_util.h"

namespace reel {
namespace {

// Attrs are set by optim/, never by users: a missing one is an internal error.
void require_attrs(const Attrs& a, std::initializer_list<const char*> names) {
  for (const char* n : names) REEL_ASSERT(a.has(n), "attr '", n, "' missing");
}

// A 0-dim f32 or f64 factor the gradients are multiplied by: unscale_check's inv_scale, a clip's
// coefficient.
void expect_factor(OpKind op, const Tensor& t, const char* what) {
  schema::expect_defined(op, t, what);
  REEL_CHECK(t.dim() == 0 && (t.dtype() == DType::f32 || t.dtype() == DType::f64), op_name(op), ": ", what,
             " must be a 0-dim f32 or f64 tensor, got ", schema::desc(t));
}

// A per-step hyper-parameter held on the device: lr or a step count.
void expect_f64_scalar(OpKind op, const Tensor& t, const char* what) {
  schema::expect_defined(op, t, what);
  REEL_CHECK(t.dim() == 0 && t.dtype() == DType::f64, op_name(op), ": ", what,
             " must be a 0-dim f64 tensor, got ", schema::desc(t));
}

// `t` must match `ref` (the parameter) in shape, dtype and be contiguous: it is updated in place.
void expect_like_param(OpKind op, const Tensor& t, const Tensor& ref, const char* what) {
  schema::expect_defined(op, t, what);
  REEL_CHECK(t.shape() == ref.shape() && t.dtype() == ref.dtype(), op_name(op), ": ", what, " is ",
             schema::desc(t), " but the parameter is ", schema::desc(ref));
  REEL_CHECK(t.is_contiguous(), op_name(op), ": ", what, " of shape ", shape_str(t.shape()),
             " must be contiguous (it is updated in place)");
}

void expect_param(OpKind op, const Tensor& p) {
  schema::expect_defined(op, p, "param");
  schema::expect_float(op, p, "param");
  expect_like_param(op, p, p, "param");
}

std::vector<TensorMeta> infer_adamw(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::AdamWStep;
  schema::expect_inputs(op, in, 7);
  expect_param(op, in[0]);
  expect_like_param(op, in[1], in[0], "grad");
  expect_like_param(op, in[2], in[0], "exp_avg");
  expect_like_param(op, in[3], in[0], "exp_avg_sq");
  if (in[4].defined()) schema::expect_flag(op, in[4], "found_inf");
  expect_f64_scalar(op, in[5], "lr");
  expect_f64_scalar(op, in[6], "step");
  double b1 = a.f("beta1"), b2 = a.f("beta2");
  REEL_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "adamw_step: betas must lie in [0, 1), got (", b1, ", ", b2,
             ")");
  require_attrs(a, {"eps", "weight_decay"});
  return {schema::meta_like(in[0]), schema::meta_like(in[2]), schema::meta_like(in[3])};
}

std::vector<TensorMeta> infer_sgd(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::SgdStep;
  schema::expect_inputs(op, in, 5);
  expect_param(op, in[0]);
  expect_like_param(op, in[1], in[0], "grad");
  if (in[2].defined()) expect_like_param(op, in[2], in[0], "momentum_buf");
  if (in[3].defined()) schema::expect_flag(op, in[3], "found_inf");
  expect_f64_scalar(op, in[4], "lr");
  double momentum = a.f("momentum");
  REEL_CHECK(in[2].defined() || momentum == 0, "sgd_step: momentum ", momentum, " needs a momentum_buf");
  require_attrs(a, {"dampening", "weight_decay", "nesterov", "first_step"});
  std::vector<TensorMeta> out{schema::meta_like(in[0])};
  if (in[2].defined()) out.push_back(schema::meta_like(in[2]));
  return out;
}

// multi_tensor_adamw / multi_tensor_sgd (fused: a run of adamw_step / sgd_step as one kernel)
//   inputs and outputs: kernels/multi_tensor.h; attrs those of the per-tensor op and tensors (k >= 1).
//   Each tensor's slice is checked as its own adamw_step / sgd_step would be; every tensor shares the
//   step-wide inputs. The same formulas, so a fused run gives the per-tensor ops' bits.
std::vector<TensorMeta> infer_multi_tensor(OpKind op, const std::vector<Tensor>& in, const Attrs& a) {
  const MultiTensorLayout& l = multi_tensor_layout(op);
  const int64_t k = a.i("tensors");
  const bool clip = a.b("clip", false), writes_grad = clip_stores_grads(a);
  REEL_CHECK(k >= 1, op_name(op), ": tensors ", k, " must be >= 1");
  const size_t shared_count = l.shared + (clip ? 1 : 0);
  REEL_ASSERT(in.size() == size_t(k) * l.per_tensor + shared_count, op_name(op), " of ", k, " tensors takes ",
              size_t(k) * l.per_tensor + shared_count, " inputs, got ", in.size());
  if (clip) expect_factor(op, in.back(), "the clip coefficient");
  std::vector<TensorMeta> out;
  const std::vector<Tensor> shared(in.end() - long(shared_count), in.end() - long(shared_count - l.shared));
  for (int64_t i = 0; i < k; ++i) {
    std::vector<Tensor> one(in.begin() + long(size_t(i) * l.per_tensor), in.begin() + long(size_t(i + 1) * l.per_tensor));
    one.insert(one.end(), shared.begin(), shared.end());
    REEL_CHECK(op != OpKind::MultiTensorSgd || one[2].defined() == in[2].defined(), op_name(op), ": tensor ", i,
               " has ", one[2].defined() ? "a" : "no", " momentum buffer, unlike tensor 0");
    std::vector<TensorMeta> m = op == OpKind::MultiTensorAdamW ? infer_adamw(one, a) : infer_sgd(one, a);
    out.insert(out.end(), m.begin(), m.end());
    if (writes_grad) out.push_back(schema::meta_like(one[1]));
  }
  return out;
}

// all_reduce: (x) -> (x), in place: x = op over the ranks of communicator attrs "comm" of their x.
// attrs: comm (i64, an id of distributed/communicator.h's registry), op (i64: 0 sum, 1 max, 2 min). x:
// contiguous f32, f64 or i64. The data-parallel gradient sync dispatches it, so that a traced step
// records the collective and a replayed plan (a CUDA graph, with NCCL) runs it. Kernels: registered
// by distributed/ when a communicator is made (kernels/ knows no communicator).
std::vector<TensorMeta> infer_all_reduce(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::AllReduce;
  REEL_CHECK(in.size() == 1, "all_reduce: takes one tensor, got ", in.size(), " inputs");
  schema::expect_defined(op, in[0], "x");
  REEL_CHECK(in[0].is_contiguous() && (in[0].dtype() == DType::f32 || in[0].dtype() == DType::f64 ||
                                       in[0].dtype() == DType::i64),
             "all_reduce: x must be a contiguous f32, f64 or i64 tensor (it is reduced in place), got ",
             schema::desc(in[0]));
  const int64_t r = a.i("op");
  REEL_CHECK(r >= 0 && r <= 2, "all_reduce: op must be 0 (sum), 1 (max) or 2 (min), got ", r);
  a.i("comm");
  return {schema::meta_like(in[0])};
}

// all_gather: (x) -> (out), out = (world, *x.shape): every rank's x of communicator "comm", in rank
// order. attrs: comm, world (i64: the communicator's size, which fixes the output's shape). x:
// contiguous f32, f64 or i64. SyncBatchNorm's statistics.
std::vector<TensorMeta> infer_all_gather(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::AllGather;
  REEL_CHECK(in.size() == 1, "all_gather: takes one tensor, got ", in.size(), " inputs");
  schema::expect_defined(op, in[0], "x");
  REEL_CHECK(in[0].is_contiguous() && (in[0].dtype() == DType::f32 || in[0].dtype() == DType::f64 ||
                                       in[0].dtype() == DType::i64),
             "all_gather: x must be a contiguous f32, f64 or i64 tensor, got ", schema::desc(in[0]));
  const int64_t world = a.i("world");
  REEL_CHECK(world >= 1, "all_gather: world must be at least 1, got ", world);
  a.i("comm");
  Shape shape{world};
  shape.insert(shape.end(), in[0].shape().begin(), in[0].shape().end());
  return {TensorMeta{shape, in[0].dtype(), in[0].device()}};
}

// broadcast: (x) -> (x), in place: x = rank `root`'s x of communicator "comm". attrs: comm, root.
// x: contiguous, any dtype (bytes are sent). Data parallel's per-step copy of rank 0's buffers.
std::vector<TensorMeta> infer_broadcast(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::Broadcast;
  REEL_CHECK(in.size() == 1, "broadcast: takes one tensor, got ", in.size(), " inputs");
  schema::expect_defined(op, in[0], "x");
  REEL_CHECK(in[0].is_contiguous(), "broadcast: x must be contiguous (it is overwritten in place), got ",
             schema::desc(in[0]));
  REEL_CHECK(a.i("root") >= 0, "broadcast: root must be a rank, got ", a.i("root"));
  a.i("comm");
  return {schema::meta_like(in[0])};
}

std::vector<TensorMeta> infer_unscale(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::UnscaleCheck;
  const bool check = a.b("check_finite", true);
  REEL_CHECK(in.size() >= (check ? 3u : 2u), "unscale_check: takes (g0, ..., gk, inv_scale", check ? ", found_inf" : "",
             "), got ", in.size(), " inputs");
  size_t k = in.size() - (check ? 2 : 1);
  expect_factor(op, in[k], "inv_scale");
  if (check) {
    schema::expect_defined(op, in[k + 1], "found_inf");
    schema::expect_flag(op, in[k + 1], "found_inf");
  }
  std::vector<TensorMeta> out;
  for (size_t i = 0; i < k; ++i) {
    REEL_CHECK(in[i].defined(), "unscale_check: gradient ", i, " is undefined");
    schema::expect_float(op, in[i], "gradient");
    REEL_CHECK(in[i].is_contiguous(), "unscale_check: gradient ", i, " of shape ", shape_str(in[i].shape()),
               " must be contiguous (it is updated in place)");
    out.push_back(schema::meta_like(in[i]));
  }
  if (check) out.push_back(schema::meta_like(in[k + 1]));
  return out;
}

std::vector<TensorMeta> infer_scaler_update(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::ScalerUpdate;
  schema::expect_inputs(op, in, 3);
  for (const Tensor& t : in) schema::expect_defined(op, t, "input");
  schema::expect_flag(op, in[0], "scale");
  const Tensor& tr = in[1];
  REEL_CHECK(tr.dim() == 0 && (tr.dtype() == DType::f32 || tr.dtype() == DType::i64),
             "scaler_update: growth_tracker must be a 0-dim f32 or i64 tensor, got ", schema::desc(tr));
  schema::expect_flag(op, in[2], "found_inf");
  REEL_CHECK(a.i("growth_interval") >= 1, "scaler_update: growth_interval must be >= 1, got ",
             a.i("growth_interval"));
  require_attrs(a, {"growth_factor", "backoff_factor"});
  return {schema::meta_like(in[0]), schema::meta_like(in[1])};
}

std::vector<TensorMeta> infer_clamp(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::ClampScalar;
  schema::expect_inputs(op, in, 1);
  schema::expect_defined(op, in[0], "input");
  schema::expect_float(op, in[0]);
  double lo = a.f("min", -INFINITY), hi = a.f("max", INFINITY);
  REEL_CHECK(!(lo > hi), "clamp_scalar: min ", lo, " is greater than max ", hi);
  return {schema::meta_like(in[0])};
}

// Attrs usually come from LrSchedule::device_attrs, but the op is public: bad values are user errors.
void check_lr_schedule_attrs(const Attrs& a) {
  const int64_t kind = a.i("kind");
  REEL_CHECK(kind == int64_t(math::LrScheduleKind::constant) || kind == int64_t(math::LrScheduleKind::warmup_cosine),
             "lr_schedule: kind must be 0 (constant) or 1 (warmup_cosine), got ", kind);
  const double base_lr = a.f("base_lr");
  REEL_CHECK(std::isfinite(base_lr) && base_lr >= 0, "lr_schedule: base_lr must be finite and >= 0, got ", base_lr);
  if (kind == int64_t(math::LrScheduleKind::constant)) return;
  const int64_t w = a.i("warmup_steps"), total = a.i("total_steps");
  REEL_CHECK(w >= 0 && total >= w, "lr_schedule: need 0 <= warmup_steps (", w, ") <= total_steps (", total, ")");
  const double min_lr = a.f("min_lr");
  REEL_CHECK(std::isfinite(min_lr) && min_lr >= 0, "lr_schedule: min_lr must be finite and >= 0, got ", min_lr);
}

std::vector<TensorMeta> infer_lr_schedule(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::LrSchedule;
  schema::expect_inputs(op, in, 1);
  expect_f64_scalar(op, in[0], "step");
  check_lr_schedule_attrs(a);
  return {schema::meta_like(in[0])};
}

}  // namespace

void register_optim_schemas() {
  register_schema(OpKind::AdamWStep, infer_adamw);
  register_schema(OpKind::SgdStep, infer_sgd);
  register_schema(OpKind::UnscaleCheck, infer_unscale);
  register_schema(OpKind::AllReduce, infer_all_reduce);
  register_schema(OpKind::AllGather, infer_all_gather);
  register_schema(OpKind::Broadcast, infer_broadcast);
  register_schema(OpKind::ScalerUpdate, infer_scaler_update);
  register_schema(OpKind::ClampScalar, infer_clamp);
  register_schema(OpKind::LrSchedule, infer_lr_schedule);
  register_schema(OpKind::MultiTensorAdamW,
                  [](const std::vector<Tensor>& in, const Attrs& a) { return infer_multi_tensor(OpKind::MultiTensorAdamW, in, a); });
  register_schema(OpKind::MultiTensorSgd,
                  [](const std::vector<Tensor>& in, const Attrs& a) { return infer_multi_tensor(OpKind::MultiTensorSgd, in, a); });
}

}  // namespace reel
