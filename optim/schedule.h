// Learning-rate schedules: lr as a function of the number of optimizer steps already taken.
//
// A schedule advances once per optimizer step — never per micro-batch: the Optimizer asks
// lr(step, base_lr) with step = the optimizer steps completed so far (0 for the first update) and
// counts a step only at an accumulation boundary.
//
//   ConstantLr:           lr = base_lr
//   LinearWarmupCosine:   s < W:  lr = base_lr (s + 1) / W                      (linear warm-up)
//                         else    p = min(1, (s - W) / max(1, S - W))
//                                 lr = min_lr + (base_lr - min_lr) (1 + cos(pi p)) / 2
//                         W = warmup_steps, S = total_steps; lr stays at min_lr after S steps.
// The built-in schedules also have a device form, the lr_schedule op (kernels/lr_schedule_math.h
// holds the one formula both use): device_attrs() gives its attrs, and the Optimizer then computes
// each update's lr on the device from its device step counter, so a recorded step replays with the
// lr advancing. A schedule without a device form (the default of device_attrs) still works: the
// Optimizer asks lr() on the host and writes the value into the device lr tensor, which a compiled
// replay would freeze at the recorded value.
//
// The LR-scaling helper follows the effective batch from a reference batch:
//   linear rule: lr = base_lr * B / B_ref       sqrt rule: lr = base_lr * sqrt(B / B_ref)
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/attrs.h"

namespace reel::optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // The lr of the update that follows `step` completed optimizer steps.
  virtual double lr(int64_t step, double base_lr) const = 0;
  virtual std::string describe() const = 0;
  // The attrs of the lr_schedule op that computes lr(step, base_lr) on the device, or nullopt
  // when this schedule has none (the Optimizer then computes lr on the host; see above).
  virtual std::optional<Attrs> device_attrs(double base_lr) const { return std::nullopt; }
};

class ConstantLr : public LrSchedule {
 public:
  double lr(int64_t, double base_lr) const override { return base_lr; }
  std::string describe() const override { return "constant"; }
  std::optional<Attrs> device_attrs(double base_lr) const override;
};

class LinearWarmupCosine : public LrSchedule {
 public:
  LinearWarmupCosine(int64_t warmup_steps, int64_t total_steps, double min_lr = 0.0);
  double lr(int64_t step, double base_lr) const override;
  std::string describe() const override;
  std::optional<Attrs> device_attrs(double base_lr) const override;

 private:
  int64_t warmup_steps_, total_steps_;
  double min_lr_;
};

enum class LrScaling { none, linear, sqrt };
// base_lr scaled from reference_batch to effective_batch by `rule` (see the top of this file).
double scale_lr(double base_lr, int64_t effective_batch, int64_t reference_batch, LrScaling rule);
// "none" | "linear" | "sqrt".
LrScaling parse_lr_scaling(const std::string& name);

}  // namespace reel::optim
