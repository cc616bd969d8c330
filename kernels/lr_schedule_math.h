// Learning-rate schedules as one scalar formula, shared by the host (optim/schedule.cpp), the
// lr_schedule op's CPU kernel (kernels/cpu/optim.cpp) and its CUDA kernel (kernels/cuda/optim.cu),
// so that all three compute the same double from the same attrs.
//
//   s = optimizer steps completed before this update (0 for the first), W = warmup_steps, S = total_steps
//   constant:        lr = base_lr
//   warmup_cosine:   s < W:  lr = base_lr (s + 1) / W                               (linear warm-up)
//                    else    p = min(1, (s - W) / max(1, S - W))
//                            lr = min_lr + (base_lr - min_lr) (1 + cos(pi p)) / 2   (min_lr after S)
//
// Attrs hold numbers only, so the schedule's kind travels as an integer code (LrScheduleKind);
// lr_schedule_attrs / lr_schedule_params convert between the attrs and this struct.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/attrs.h"
#include "tensor/rng.h"  // REEL_HOST_DEVICE

namespace reel::math {

enum class LrScheduleKind : int64_t { constant = 0, warmup_cosine = 1 };

inline const char* lr_schedule_kind_name(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::constant: return "constant";
    case LrScheduleKind::warmup_cosine: return "warmup_cosine";
  }
  return "?";
}

struct LrScheduleParams {
  LrScheduleKind kind = LrScheduleKind::constant;
  double base_lr = 0;
  int64_t warmup_steps = 0, total_steps = 0;  // warmup_cosine only
  double min_lr = 0;                          // warmup_cosine only
};

constexpr double kPi = 3.14159265358979323846;

// `step` holds a whole number (the f64 step tensor's value); the arithmetic mirrors the integer
// form of optim/schedule.h exactly, since every integer involved is exact in a double.
REEL_HOST_DEVICE double scheduled_lr(const LrScheduleParams& s, double step) {
  using std::cos;
  if (s.kind != LrScheduleKind::warmup_cosine) return s.base_lr;
  const double w = double(s.warmup_steps);
  if (step < w) return s.base_lr * (step + 1) / w;
  const int64_t span_steps = s.total_steps - s.warmup_steps;
  const double span = double(span_steps > 1 ? span_steps : 1);
  double p = (step - w) / span;
  p = p < 1.0 ? p : 1.0;
  return s.min_lr + (s.base_lr - s.min_lr) * 0.5 * (1.0 + cos(kPi * p));
}

// The lr_schedule op's attrs: kind base_lr, and for warmup_cosine warmup_steps total_steps min_lr.
inline Attrs lr_schedule_attrs(const LrScheduleParams& s) {
  Attrs a;
  a.set("kind", int64_t(s.kind)).set("base_lr", s.base_lr);
  if (s.kind == LrScheduleKind::warmup_cosine)
    a.set("warmup_steps", s.warmup_steps).set("total_steps", s.total_steps).set("min_lr", s.min_lr);
  return a;
}

// The inverse of lr_schedule_attrs (the schema has validated them).
inline LrScheduleParams lr_schedule_params(const Attrs& a) {
  LrScheduleParams s;
  s.kind = static_cast<LrScheduleKind>(a.i("kind"));
  s.base_lr = a.f("base_lr");
  if (s.kind == LrScheduleKind::warmup_cosine) {
    s.warmup_steps = a.i("warmup_steps");
    s.total_steps = a.i("total_steps");
    s.min_lr = a.f("min_lr");
  }
  return s;
}

}  // namespace reel::math
