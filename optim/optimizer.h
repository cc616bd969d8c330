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
//   by real targets (set_items_from_targets): scale_loss_share returns L_i * n_i / N, both counted
//                                      on the device from the targets that are not ignore_index
// so that after the boundary's backward passes, sum_i grad(scaled L_i) = grad of the mean over the
// effective batch (params +=). With a GradScaler the scaled loss is also multiplied by its scale.
// micro_step() counts micro-batches (or items) and, at the boundary, in this order:
//   1. corrects the normalisation when the batch seen differs from the planned one: grads *= A/k
//      (k micro-batches: finish_epoch's remainder) or N/n_seen (items overshot or fell short);
//   2. unscales the gradients and flags inf/NaN (GradScaler), or, without one, flags a non-finite
//      global norm (an inf/NaN gradient, or finite ones whose squares overflow the norm's dtype);
//      set_skip_nonfinite(false) then reports the flag but updates anyway, as torch would;
//   3. computes the global grad norm (always, for the report) and clips to max_grad_norm if set;
//   4. runs the update (whose kernels skip on the device flag), advances the step counters — and
//      with them the LR schedule —, updates the scaler, and zeroes gradients (set to none by default).
// Nothing here reads a device value on the host: the StepResult carries the norm, the flag, the
// scale and the lr as 0-dim device tensors, and its *_value() accessors read them only when called.
//
// Per-step quantities live on the device, so that a recorded step (compile/) replays without any
// of this host code. Two 0-dim f64 counters sit on the parameters' device:
//   boundaries_  boundaries completed, skipped or not: the LR schedule's step (like a torch LR
//                scheduler stepped every iteration);
//   updates_     updates applied: + (1 - found_inf) per boundary, so an update skipped on inf/NaN
//                does not count — AdamW's bias-correction t, exactly as PyTorch counts it.
// Each boundary dispatches, in this order: lr = lr_schedule(boundaries_) (the steps completed
// before this one); updates_ += 1 - found_inf (t now includes this update); the update, reading lr
// and t on the device; boundaries_ += 1. A schedule without a device form (LrSchedule::device_attrs)
// gets its lr computed on the host and filled in; a compiled replay would freeze that lr (as it
// freezes base_lr and every other attr: the schedule's shape is fixed when a step is recorded).
// The host keeps a mirror of boundaries_ for the StepResult's `lr` double (its eager view);
// step_count(), update_count() and lr() read the device counters (a host sync, outside the step).
// All parameters must share one device (the counters live there); use one optimizer per device.
//
// Data parallel (set_grad_sync, optim/grad_sync.h): gradients of every micro-batch accumulate
// locally, and the hook runs once at the boundary, after step 1's correction and before step 2, with
// the number of items this rank's step saw as its weight (n_seen, or k x micro-batch); so there is one
// synchronisation per optimizer step whatever ACCUM is (PyTorch's no_sync on all but the last
// micro-batch). step() runs it too, with weight 1.
#pragma once
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "optim/grad_scaler.h"
#include "optim/grad_sync.h"
#include "optim/schedule.h"
#include "tensor/tensor.h"

namespace reel::optim {

enum class RemainderPolicy { Drop, Step };

struct StepResult {
  bool stepped = false;  // the boundary was reached and the update ran (or was skipped on inf/NaN)
  Tensor grad_norm;      // 0-dim, device: global norm before clipping (undefined when !stepped)
  Tensor found_inf;      // 0-dim f32, device: 1 when the update was skipped
  Tensor scale;          // 0-dim f32, device: the loss scale after the update (undefined: no scaler)
  double lr = 0;         // the host's view of the lr this step used (the next one when !stepped)
  Tensor lr_tensor;      // 0-dim f64, device: the lr the update read (undefined when !stepped)

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
  const char* name() const { return name_; }  // "AdamW", "SGD"
  double base_lr() const { return base_lr_; }
  void set_base_lr(double lr);
  // The lr of the next update: the schedule at step_count() (reads the device counter: a host sync).
  double lr() const;
  // Boundaries completed, skipped or not (the schedule's step), read from the device counter: a
  // host sync, correct also after steps replayed without host code. Not for use inside a step.
  int64_t step_count() const;
  // Updates applied (skipped ones not counted): AdamW's bias-correction count. A host sync too.
  int64_t update_count() const;
  // The device counters themselves (0-dim f64 on the parameters' device).
  const Tensor& step_count_tensor() const { return boundaries_; }
  const Tensor& update_count_tensor() const { return updates_; }

  // ---- configuration of the accumulation contract ----
  Optimizer& set_accum_steps(int64_t accum_steps);        // count micro-batches (default 1)
  Optimizer& set_items_per_step(int64_t items_per_step);  // count items instead
  // Count the step's real targets instead, on the device: items are the targets that are not
  // `ignore_index` (padding), each micro-batch's loss a mean over its own; optim::train_step then
  // weighs micro-batch i by n_i / N with n_i and N counted from the targets as tensors, so a
  // compiled step, whose host values are frozen, weighs every call by its own counts. Keeps ACCUM
  // (the number of micro-batches per step) by count.
  Optimizer& set_items_from_targets(int64_t ignore_index = -100);
  bool counts_targets() const { return counts_targets_; }
  int64_t target_ignore_index() const { return target_ignore_index_; }
  Optimizer& set_micro_batch(int64_t items);              // for print_setup and effective_batch()
  // N items per step in micro-batches of m (split_accumulation, optim/accumulation.h): ACCUM by
  // count when m divides N, else by items (N), so that the smaller last micro-batch weighs its share.
  Optimizer& set_effective_batch(int64_t effective_batch, int64_t micro_batch);
  Optimizer& set_max_grad_norm(double max_norm);          // <= 0: no clipping
  Optimizer& set_grad_scaler(std::shared_ptr<GradScaler> scaler);
  Optimizer& set_schedule(std::shared_ptr<LrSchedule> schedule);
  Optimizer& set_skip_nonfinite(bool skip);  // without a scaler: skip the update on a non-finite norm
  Optimizer& set_zero_grad_to_none(bool to_none);
  // Data parallel: the gradients are synchronised across ranks at each boundary (nullptr: none).
  Optimizer& set_grad_sync(std::shared_ptr<GradSync> sync);
  const std::shared_ptr<GradSync>& grad_sync() const { return grad_sync_; }
  // base lr <- scale_lr(base lr, effective_batch(), reference_batch, rule); remembered for print_setup.
  Optimizer& scale_lr_from(int64_t reference_batch, LrScaling rule);

  int64_t accum_steps() const { return accum_steps_; }
  int64_t items_per_step() const { return items_per_step_; }
  // Items per optimizer step: items_per_step, or micro-batch x ACCUM (0 when the micro-batch is unknown).
  int64_t effective_batch() const;
  const std::shared_ptr<GradScaler>& grad_scaler() const { return scaler_; }

  // ---- the accumulation step ----
  Tensor scale_loss(const Tensor& loss, int64_t items = -1);
  // With set_items_from_targets: loss x share (a 0-dim tensor, this micro-batch's n_i / N), x the
  // GradScaler's scale.
  Tensor scale_loss_share(const Tensor& loss, const Tensor& share);
  StepResult micro_step();
  // The boundary of a step whose ACCUM micro-batches ran their backward elsewhere, each already
  // weighed (scale_loss_share: a step compiled in pieces, compile/runtime/bucketed_step.h): the
  // same unscale, check, clip, update and zeroing as micro_step's at the last micro-batch.
  StepResult step_accumulated();
  StepResult finish_epoch(RemainderPolicy policy = RemainderPolicy::Drop);
  int64_t pending_micro_batches() const { return micro_count_; }
  void print_setup(std::ostream& os) const;

  // ---- saving and resuming (libtorch's state_dict / load_state_dict) ----
  // What a run needs to continue bit for bit from a step boundary, as named tensors (the live ones,
  // not copies): "step" and "updates" (the device counters; the LR schedule's position is "step"),
  // the subclass's per-parameter state as "state.<i>.<name>" (parameter i of parameters(), as
  // PyTorch numbers them: AdamW's exp_avg and exp_avg_sq, SGD's momentum_buffer; absent before the
  // state exists), and a GradScaler's as "scaler.scale" and "scaler.growth_tracker". The
  // hyper-parameters are not in it: they come from the code that builds the optimizer.
  using NamedState = std::vector<std::pair<std::string, Tensor>>;
  NamedState state_dict() const;
  // Strict, like Module's: the keys must be state_dict()'s (per-parameter state all present, or none
  // when this optimizer has made none yet), each shape and dtype its slot's; otherwise reel::Error
  // listing them and nothing is changed. Values are copied into the existing tensors in place (a
  // compiled step's plan keeps pointing at them) or, for state not made yet, into new ones on the
  // parameters' device. Both only at a step boundary (no micro-batch pending).
  void load_state_dict(const NamedState& state);

  // ---- tracing a step without running it (CompileOptions::trace_without_running) ----
  // Whether the state the first update would create can be made before it without changing it: not
  // for SGD with momentum (its first update copies the gradient into the buffer), nor where the step
  // talks to other ranks (a GradSync).
  bool can_create_state_now() const;
  // Creates that state now (AdamW's moments, the GradScaler's scale and counters), as the first update
  // would, so that a traced step finds it as it finds the parameters. Returns can_create_state_now();
  // creates nothing when that is false.
  bool create_state_now();

 protected:
  // Applies one update to every parameter that has a gradient; `found_inf` (0-dim f32 or undefined)
  // is passed to the kernels, which skip when it is set. lr and step are 0-dim f64 device tensors
  // read by the kernels: the learning rate and the 1-based count of applied updates, this one included.
  virtual void update(const Tensor& found_inf, const Tensor& lr, const Tensor& step) = 0;
  virtual std::string describe() const = 0;
  // The subclass's part of can_create_state_now and create_state_now.
  virtual bool update_state_can_be_made_early() const { return true; }
  virtual void make_update_state() {}
  // The subclass's per-parameter state for state_dict: (parameter index, name, the slot).
  struct StateSlot {
    size_t param;
    const char* name;
    Tensor* tensor;
  };
  virtual std::vector<StateSlot> state_slots() { return {}; }

 private:
  StepResult boundary(double correction);
  double sync_weight() const;  // this rank's items in the step, for the GradSync
  Tensor nonfinite_flag(const Tensor& norm) const;
  void reset_counters();
  double host_lr() const;      // the schedule at the host's mirror of the step count
  Tensor scheduled_lr() const;  // this boundary's lr on the device
  Tensor advance(const Tensor& found_inf, bool run_update);

  std::vector<Tensor> params_;
  const char* name_;
  double base_lr_;
  Tensor boundaries_, updates_;  // 0-dim f64 on the parameters' device (see the top of this file)
  int64_t host_steps_ = 0;       // the host's mirror of boundaries_, for StepResult::lr
  int64_t accum_steps_ = 1, items_per_step_ = 0, micro_batch_ = 0;
  bool counts_targets_ = false;
  int64_t target_ignore_index_ = -100;
  double max_grad_norm_ = 0;
  bool skip_nonfinite_ = true, zero_to_none_ = true;
  std::shared_ptr<GradScaler> scaler_;
  std::shared_ptr<LrSchedule> schedule_;
  std::shared_ptr<GradSync> grad_sync_;
  std::string lr_scaling_note_;
  // Progress towards the boundary.
  int64_t micro_count_ = 0, items_seen_ = 0, pending_items_ = -1;
};

}  // namespace reel::optim
