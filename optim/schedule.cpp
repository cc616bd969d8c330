// LR schedules and the LR-scaling rule (see optim/schedule.h).
#include "optim/schedule.h"

#include <cmath>

#include "kernels/lr_schedule_math.h"
#include "tensor/error.h"

namespace reel::optim {

LinearWarmupCosine::LinearWarmupCosine(int64_t warmup_steps, int64_t total_steps, double min_lr)
    : warmup_steps_(warmup_steps), total_steps_(total_steps), min_lr_(min_lr) {
  REEL_CHECK(warmup_steps >= 0 && total_steps >= warmup_steps, "LinearWarmupCosine: need 0 <= warmup_steps (",
             warmup_steps, ") <= total_steps (", total_steps, ")");
  REEL_CHECK(min_lr >= 0, "LinearWarmupCosine: min_lr must be >= 0, got ", min_lr);
}

std::optional<Attrs> ConstantLr::device_attrs(double base_lr) const {
  math::LrScheduleParams s;
  s.base_lr = base_lr;
  return math::lr_schedule_attrs(s);
}

namespace {
math::LrScheduleParams warmup_cosine(int64_t warmup_steps, int64_t total_steps, double min_lr, double base_lr) {
  math::LrScheduleParams s;
  s.kind = math::LrScheduleKind::warmup_cosine;
  s.base_lr = base_lr;
  s.warmup_steps = warmup_steps;
  s.total_steps = total_steps;
  s.min_lr = min_lr;
  return s;
}
}  // namespace

// The formula of the header, shared with the lr_schedule op's kernels so host and device agree.
double LinearWarmupCosine::lr(int64_t step, double base_lr) const {
  return math::scheduled_lr(warmup_cosine(warmup_steps_, total_steps_, min_lr_, base_lr), double(step));
}

std::optional<Attrs> LinearWarmupCosine::device_attrs(double base_lr) const {
  return math::lr_schedule_attrs(warmup_cosine(warmup_steps_, total_steps_, min_lr_, base_lr));
}

std::string LinearWarmupCosine::describe() const {
  return detail::cat("linear warm-up ", warmup_steps_, " steps, cosine to ", min_lr_, " at step ", total_steps_);
}

double scale_lr(double base_lr, int64_t effective_batch, int64_t reference_batch, LrScaling rule) {
  REEL_CHECK(effective_batch > 0 && reference_batch > 0, "scale_lr: batches must be positive, got effective ",
             effective_batch, " and reference ", reference_batch);
  double r = double(effective_batch) / double(reference_batch);
  switch (rule) {
    case LrScaling::linear: return base_lr * r;
    case LrScaling::sqrt: return base_lr * std::sqrt(r);
    default: return base_lr;
  }
}

LrScaling parse_lr_scaling(const std::string& name) {
  if (name == "none") return LrScaling::none;
  if (name == "linear") return LrScaling::linear;
  if (name == "sqrt") return LrScaling::sqrt;
  REEL_CHECK(false, "lr scaling: unknown rule '", name, "' (expected none, linear or sqrt)");
  return LrScaling::none;
}

}  // namespace reel::optim
