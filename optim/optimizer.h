// Optimizer — the base of SGD and AdamW: the parameters, the update, and the accumulation contract.
//
// libtorch-style use (one batch per step):   loss.backward(); opt.step(); opt.zero_grad();
// With accumulation (what MODELS.md's step does), after configuring ACCUM (or items per step), a
// clip norm, a GradScaler and a schedule:
//     for each micro-batch i:
//         opt.scale_loss(loss_i, items_i).backward();
//         StepResult r = opt.micro_step();          // r.stepped at the boundary
//     opt.finish_epoch(RemainderPolicy::Drop);       // or ::Step, at an epoch's end
//
// The accumulation contract. Each micro-batch loss L_i is a mean over its n_i items.
//   by count (accum_steps = A):        scale_loss returns L_i / A         (equal micro-batches)
//   by items (items_per_step = N):     scale_loss returns L_i * n_i / N
// so that after the boundary's backward passes, sum_i grad(scaled L_i) = grad of the mean over the
// effective batch (params +=). With a GradScaler the scaled loss is also multiplied by its scale.
// micro_step() counts micro-batches (or items) and, at the boundary, in this order:
//   1. corrects the normalisation when the batch seen differs from the planned one: grads *= A/k
//      (k micro-batches: finish_epoch's remainder) or N/n_seen (items overshot or fell short);
//   2. unscales the gradients and flags inf/NaN (GradScaler), or, without one, flags a non-finite
//      global norm (an inf/NaN gradient, or finite ones whose squares overflow the norm's dtype);
//      set_skip_nonfinite(false) then reports the flag but updates anyway, as torch would;
//   3. computes the global grad norm (always, for the report) and clips to max_grad_norm if set;
//   4. runs the update (whose kernels skip on the device flag), advances the step count — and with
//      it the LR schedule —, updates the scaler, and zeroes gradients (set to none by default).
// Nothing here reads a device value on the host: the StepResult carries the norm, the flag and the
// scale as 0-dim device tensors, and its *_value() accessors read them only when called.
// The step count (for AdamW's bias correction and the schedule) counts every boundary, skipped or
// not, since the host does not know which were skipped; PyTorch does not count skipped steps, so
// after an fp16 overflow the bias correction differs from torch's by that one step.
#pragma once
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "optim/grad_scaler.h"
#include "optim/schedule.h"
#include "tensor/tensor.h"

namespace reel::optim {

enum class RemainderPolicy { Drop, Step };

struct StepResult {
  bool stepped = false;  // the boundary was reached and the update ran (or was skipped on inf/NaN)
  Tensor grad_norm;      // 0-dim, device: global norm before clipping (undefined when !stepped)
  Tensor found_inf;      // 0-dim f32, device: 1 when the update was skipped
  Tensor scale;          // 0-dim f32, device: the loss scale after the update (undefined: no scaler)
  double lr = 0;         // the learning rate this step used (the current one when !stepped)

  // Host reads, made only when called.
  double grad_norm_value() const;
  bool skipped() const;
  double loss_scale() const;  // 1 without a scaler
};

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr, const char* name);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // ---- libtorch-style ----
  // One update now with the current gradients and lr (no accumulation, scaler or clipping).
  void step();
  void zero_grad(bool set_to_none = true);
  const std::vector<Tensor>& parameters() const { return params_; }
  double base_lr() const { return base_lr_; }
  void set_base_lr(double lr);
  double lr() const;  // the lr of the next update (the schedule at step_count())
  int64_t step_count() const { return step_count_; }

  // ---- configuration of the accumulation contract ----
  Optimizer& set_accum_steps(int64_t accum_steps);        // count micro-batches (default 1)
  Optimizer& set_items_per_step(int64_t items_per_step);  // count items instead
  Optimizer& set_micro_batch(int64_t items);              // for print_setup and effective_batch()
  Optimizer& set_max_grad_norm(double max_norm);          // <= 0: no clipping
  Optimizer& set_grad_scaler(std::shared_ptr<GradScaler> scaler);
  Optimizer& set_schedule(std::shared_ptr<LrSchedule> schedule);
  Optimizer& set_skip_nonfinite(bool skip);  // without a scaler: skip the update on a non-finite norm
  Optimizer& set_zero_grad_to_none(bool to_none);
  // base lr <- scale_lr(base lr, effective_batch(), reference_batch, rule); remembered for print_setup.
  Optimizer& scale_lr_from(int64_t reference_batch, LrScaling rule);

  int64_t accum_steps() const { return accum_steps_; }
  int64_t items_per_step() const { return items_per_step_; }
  // Items per optimizer step: items_per_step, or micro-batch x ACCUM (0 when the micro-batch is unknown).
  int64_t effective_batch() const;
  const std::shared_ptr<GradScaler>& grad_scaler() const { return scaler_; }

  // ---- the accumulation step ----
  Tensor scale_loss(const Tensor& loss, int64_t items = -1);
  StepResult micro_step();
  StepResult finish_epoch(RemainderPolicy policy = RemainderPolicy::Drop);
  int64_t pending_micro_batches() const { return micro_count_; }
  void print_setup(std::ostream& os) const;

 protected:
  // Applies one update to every parameter that has a gradient; `found_inf` (0-dim f32 or undefined)
  // is passed to the kernels, which skip when it is set. `step` is 1-based.
  virtual void update(const Tensor& found_inf, double lr, int64_t step) = 0;
  virtual std::string describe() const = 0;

 private:
  StepResult boundary(double correction);
  Tensor nonfinite_flag(const Tensor& norm) const;
  void reset_counters();

  std::vector<Tensor> params_;
  const char* name_;
  double base_lr_;
  int64_t step_count_ = 0;
  int64_t accum_steps_ = 1, items_per_step_ = 0, micro_batch_ = 0;
  double max_grad_norm_ = 0;
  bool skip_nonfinite_ = true, zero_to_none_ = true;
  std::shared_ptr<GradScaler> scaler_;
  std::shared_ptr<LrSchedule> schedule_;
  std::string lr_scaling_note_;
  // Progress towards the boundary.
  int64_t micro_count_ = 0, items_seen_ = 0, pending_items_ = -1;
};

}  // namespace reel::optim
