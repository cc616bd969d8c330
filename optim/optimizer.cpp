// Optimizer base: parameters, zero_grad, and the accumulation contract (see optim/optimizer.h).
#include "optim/optimizer.h"

#include <cmath>
#include <map>
#include <set>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"
#include "optim/accumulation.h"
#include "optim/clip.h"
#include "tensor/error.h"

namespace reel::optim {

double StepResult::grad_norm_value() const { return grad_norm.defined() ? grad_norm.item() : 0.0; }
bool StepResult::skipped() const { return found_inf.defined() && found_inf.item() != 0; }
double StepResult::loss_scale() const { return scale.defined() ? scale.item() : 1.0; }

Optimizer::Optimizer(std::vector<Tensor> params, double lr, const char* name)
    : params_(std::move(params)), name_(name), base_lr_(lr) {
  REEL_CHECK(lr >= 0, name_, ": lr must be >= 0, got ", lr);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    REEL_CHECK(p.defined(), name_, ": parameter ", i, " is undefined");
    REEL_CHECK(p.requires_grad() && p.is_leaf(), name_, ": parameter ", i, " of shape ", shape_str(p.shape()),
               " must be a leaf that requires grad");
    REEL_CHECK(p.is_contiguous(), name_, ": parameter ", i, " of shape ", shape_str(p.shape()),
               " must be contiguous (it is updated in place)");
    REEL_CHECK(p.device() == params_[0].device(), name_, ": parameter ", i, " of shape ", shape_str(p.shape()),
               " is on ", p.device().str(), " but parameter 0 is on ", params_[0].device().str(),
               "; the step counters live on one device, so use one optimizer per device");
  }
  // The step counters (see optim/optimizer.h), on the parameters' device.
  TensorOptions counter = TensorOptions().with_dtype(DType::f64).with_device(
      params_.empty() ? Device::cpu() : params_[0].device());
  boundaries_ = zeros({}, counter);
  updates_ = zeros({}, counter);
}

void Optimizer::set_base_lr(double lr) {
  REEL_CHECK(lr >= 0, name_, ": lr must be >= 0, got ", lr);
  base_lr_ = lr;
}

double Optimizer::lr() const { return schedule_ ? schedule_->lr(step_count(), base_lr_) : base_lr_; }

int64_t Optimizer::step_count() const { return int64_t(boundaries_.item()); }

int64_t Optimizer::update_count() const { return int64_t(updates_.item()); }

double Optimizer::host_lr() const { return schedule_ ? schedule_->lr(host_steps_, base_lr_) : base_lr_; }

Tensor Optimizer::scheduled_lr() const {
  std::optional<Attrs> a = schedule_ ? schedule_->device_attrs(base_lr_) : ConstantLr().device_attrs(base_lr_);
  if (a) return dispatch1(OpKind::LrSchedule, {boundaries_}, *a);
  // No device form: the host's value, filled in (a compiled replay would keep this one value).
  return full({}, host_lr(), TensorOptions().with_dtype(DType::f64).with_device(boundaries_.device()));
}

// The device side of one boundary, in the order of optim/optimizer.h: lr from the steps completed
// before it, then the update count (+1, or +0 when found_inf is set), the update, and the step count.
// Without `run_update` (no gradient reached a parameter) only the schedule advances.
Tensor Optimizer::advance(const Tensor& found_inf, bool run_update) {
  Tensor lr = scheduled_lr();
  if (run_update) {
    dispatch_out(OpKind::AddScalar, {updates_}, {updates_}, Attrs().set("value", 1.0));
    if (found_inf.defined()) dispatch_out(OpKind::Sub, {updates_, to_dtype(found_inf, DType::f64)}, {updates_});
    update(found_inf, lr, updates_);
  }
  dispatch_out(OpKind::AddScalar, {boundaries_}, {boundaries_}, Attrs().set("value", 1.0));
  ++host_steps_;
  return lr;
}

Optimizer::NamedState Optimizer::state_dict() const {
  REEL_CHECK(micro_count_ == 0, name_, ": state_dict at a step boundary only (", micro_count_,
             " micro-batches of this step are pending)");
  NamedState out{{"step", boundaries_}, {"updates", updates_}};
  for (const StateSlot& s : const_cast<Optimizer*>(this)->state_slots())
    if (s.tensor->defined()) out.push_back({detail::cat("state.", s.param, ".", s.name), *s.tensor});
  if (scaler_)
    for (const auto& [name, t] : scaler_->state_dict()) out.push_back({"scaler." + name, t});
  return out;
}

void Optimizer::load_state_dict(const NamedState& state) {
  REEL_CHECK(micro_count_ == 0, name_, ": load_state_dict at a step boundary only (", micro_count_,
             " micro-batches of this step are pending)");
  // What each key must be: its dtype and shape, and where it goes (nullptr: the scaler's).
  struct Expected {
    DType dtype;
    Shape shape;
    Tensor* slot;
  };
  std::map<std::string, Expected> expected{{"step", {DType::f64, {}, &boundaries_}},
                                           {"updates", {DType::f64, {}, &updates_}}};
  for (const StateSlot& s : state_slots()) {
    const Tensor& p = params_[s.param];
    expected[detail::cat("state.", s.param, ".", s.name)] = {p.dtype(), p.shape(), s.tensor};
  }
  if (scaler_) {
    expected["scaler.scale"] = {DType::f32, {}, nullptr};
    expected["scaler.growth_tracker"] = {DType::i64, {}, nullptr};
  }
  // Check every key before anything is copied.
  std::vector<std::string> problems;
  std::set<std::string> seen;
  for (const auto& [key, t] : state) {
    auto it = expected.find(key);
    if (it == expected.end()) {
      problems.push_back("unexpected key '" + key + "'");
      continue;
    }
    if (!seen.insert(key).second) problems.push_back("key '" + key + "' twice");
    if (!t.defined() || t.dtype() != it->second.dtype || t.shape() != it->second.shape)
      problems.push_back(detail::cat("'", key, "' is ", t.defined() ? dtype_name(t.dtype()) : "undefined", " ",
                                     t.defined() ? shape_str(t.shape()) : "", ", expected ",
                                     dtype_name(it->second.dtype), " ", shape_str(it->second.shape)));
  }
  for (const auto& [key, e] : expected) {
    if (seen.count(key)) continue;
    // A parameter's state may be absent from the file (saved before its first update) when this
    // optimizer has not made it either; a scaler's before its first use likewise.
    if (key.rfind("state.", 0) == 0 && !e.slot->defined()) continue;
    if (key.rfind("scaler.", 0) == 0 && !seen.count("scaler.scale") && !seen.count("scaler.growth_tracker") &&
        scaler_->state_dict().empty())
      continue;
    problems.push_back("missing key '" + key + "'");
  }
  if (!problems.empty()) {
    std::string list;
    for (size_t i = 0; i < problems.size() && i < 8; ++i) list += (i ? "; " : "") + problems[i];
    if (problems.size() > 8) list += detail::cat("; and ", problems.size() - 8, " more");
    throw Error(detail::cat(name_, ": load_state_dict: ", list));
  }
  NoGradGuard no_grad;
  const Device device = boundaries_.device();
  Tensor scale, tracker;
  for (const auto& [key, t] : state) {
    const Expected& e = expected.at(key);
    if (key == "scaler.scale") scale = t;
    else if (key == "scaler.growth_tracker") tracker = t;
    else if (e.slot->defined()) copy_(*e.slot, t.to(e.slot->device()));
    else *e.slot = t.to(device).clone();
  }
  if (scale.defined()) scaler_->load_state(scale, tracker, device);
  host_steps_ = int64_t(boundaries_.item());
}

void Optimizer::step() {
  NoGradGuard no_grad;
  if (grad_sync_) grad_sync_->sync(params_, 1.0);
  advance(Tensor(), true);
}

bool Optimizer::can_create_state_now() const { return !grad_sync_ && update_state_can_be_made_early(); }

bool Optimizer::create_state_now() {
  if (!can_create_state_now()) return false;
  make_update_state();
  if (scaler_ && scaler_->enabled() && !scaler_->scale_tensor().defined() && !params_.empty())
    scaler_->init(params_[0].device());
  return true;
}

void Optimizer::zero_grad(bool set_to_none) {
  for (const Tensor& p : params_) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else zero_(g);
  }
}

Optimizer& Optimizer::set_accum_steps(int64_t accum_steps) {
  REEL_CHECK(accum_steps >= 1, name_, ": accum_steps must be >= 1, got ", accum_steps);
  REEL_CHECK(micro_count_ == 0, name_, ": cannot change accumulation with ", micro_count_, " micro-batches pending");
  accum_steps_ = accum_steps;
  items_per_step_ = 0;
  return *this;
}

Optimizer& Optimizer::set_items_per_step(int64_t items_per_step) {
  REEL_CHECK(items_per_step >= 1, name_, ": items_per_step must be >= 1, got ", items_per_step);
  REEL_CHECK(!counts_targets_, name_, ": items_per_step counts given items; set_items_from_targets counts the "
             "targets: use one of them");
  REEL_CHECK(micro_count_ == 0, name_, ": cannot change accumulation with ", micro_count_, " micro-batches pending");
  items_per_step_ = items_per_step;
  accum_steps_ = 1;
  return *this;
}

Optimizer& Optimizer::set_items_from_targets(int64_t ignore_index) {
  REEL_CHECK(micro_count_ == 0, name_, ": cannot change accumulation with ", micro_count_, " micro-batches pending");
  REEL_CHECK(items_per_step_ == 0, name_, ": set_items_from_targets counts the targets; items_per_step (",
             items_per_step_, ") counts given items: use one of them");
  counts_targets_ = true;
  target_ignore_index_ = ignore_index;
  return *this;
}

Optimizer& Optimizer::set_micro_batch(int64_t items) {
  REEL_CHECK(items >= 1, name_, ": micro-batch must be >= 1 items, got ", items);
  micro_batch_ = items;
  return *this;
}

Optimizer& Optimizer::set_effective_batch(int64_t effective_batch, int64_t micro_batch) {
  const AccumulationSplit split = split_accumulation(effective_batch, micro_batch);
  set_accum_steps(split.accum).set_micro_batch(split.micro_batch);
  if (split.uneven()) set_items_per_step(effective_batch);
  return *this;
}

Optimizer& Optimizer::set_max_grad_norm(double max_norm) {
  // <= 0 means no clipping (and +inf clips nothing); NaN would silently mean the same: refused.
  REEL_CHECK(!std::isnan(max_norm), "set_max_grad_norm: max_norm is NaN (use a value <= 0 for no clipping)");
  max_grad_norm_ = max_norm;
  return *this;
}

Optimizer& Optimizer::set_grad_scaler(std::shared_ptr<GradScaler> scaler) {
  scaler_ = std::move(scaler);
  return *this;
}

Optimizer& Optimizer::set_schedule(std::shared_ptr<LrSchedule> schedule) {
  schedule_ = std::move(schedule);
  return *this;
}

Optimizer& Optimizer::set_skip_nonfinite(bool skip) {
  skip_nonfinite_ = skip;
  return *this;
}

Optimizer& Optimizer::set_zero_grad_to_none(bool to_none) {
  zero_to_none_ = to_none;
  return *this;
}

Optimizer& Optimizer::set_grad_sync(std::shared_ptr<GradSync> sync) {
  REEL_CHECK(micro_count_ == 0, name_, ": cannot attach a gradient sync with ", micro_count_,
             " micro-batches pending");
  grad_sync_ = std::move(sync);
  return *this;
}

Optimizer& Optimizer::scale_lr_from(int64_t reference_batch, LrScaling rule) {
  int64_t eff = effective_batch();
  REEL_CHECK(eff > 0, name_, ": scale_lr_from needs the effective batch: set the micro-batch or items_per_step");
  double before = base_lr_;
  base_lr_ = scale_lr(base_lr_, eff, reference_batch, rule);
  if (rule != LrScaling::none)
    lr_scaling_note_ = detail::cat(" (", rule == LrScaling::linear ? "linear" : "sqrt", " rule from lr ", before,
                                   " at reference batch ", reference_batch, ")");
  return *this;
}

int64_t Optimizer::effective_batch() const {
  if (items_per_step_ > 0) return items_per_step_;
  return micro_batch_ * accum_steps_;
}

Tensor Optimizer::scale_loss(const Tensor& loss, int64_t items) {
  REEL_CHECK(loss.defined() && loss.numel() == 1, name_, ": scale_loss expects a one-element loss, got ",
             loss.defined() ? shape_str(loss.shape()) : std::string("an undefined tensor"));
  double factor = 1.0 / double(accum_steps_);
  if (items_per_step_ > 0) {
    REEL_CHECK(items > 0, name_, ": the optimizer counts items (items_per_step ", items_per_step_,
               "); pass the micro-batch's item count to scale_loss, got ", items);
    factor = double(items) / double(items_per_step_);
  }
  pending_items_ = items > 0 ? items : micro_batch_;
  Tensor y = factor == 1.0 ? loss : mul(loss, factor);
  if (scaler_) y = scaler_->scale(y);
  return y;
}

Tensor Optimizer::scale_loss_share(const Tensor& loss, const Tensor& share) {
  REEL_CHECK(counts_targets_, name_, ": scale_loss_share weighs by real targets: call set_items_from_targets first");
  REEL_CHECK(loss.defined() && loss.numel() == 1 && share.defined() && share.numel() == 1, name_,
             ": scale_loss_share expects a one-element loss and share, got ",
             loss.defined() ? shape_str(loss.shape()) : std::string("an undefined loss"), " and ",
             share.defined() ? shape_str(share.shape()) : std::string("an undefined share"));
  pending_items_ = micro_batch_;
  Tensor y = mul(loss, share);
  if (scaler_) y = scaler_->scale(y);
  return y;
}

StepResult Optimizer::micro_step() {
  REEL_CHECK(items_per_step_ == 0 || pending_items_ > 0, name_,
             ": micro_step with items_per_step set needs scale_loss(loss, items) for each micro-batch");
  ++micro_count_;
  items_seen_ += std::max<int64_t>(pending_items_, 0);
  pending_items_ = -1;
  bool boundary_reached = items_per_step_ > 0 ? items_seen_ >= items_per_step_ : micro_count_ == accum_steps_;
  if (!boundary_reached) return StepResult{false, Tensor(), Tensor(), Tensor(), host_lr(), Tensor()};
  return boundary(items_per_step_ > 0 ? double(items_per_step_) / double(items_seen_) : 1.0);
}

StepResult Optimizer::step_accumulated() {
  REEL_CHECK(micro_count_ == 0, name_, ": step_accumulated with ", micro_count_,
             " micro-batches counted by micro_step: use one or the other");
  REEL_CHECK(items_per_step_ == 0, name_, ": step_accumulated weighs nothing itself; with items_per_step (",
             items_per_step_, ") use scale_loss and micro_step");
  micro_count_ = accum_steps_;
  return boundary(1.0);
}

StepResult Optimizer::finish_epoch(RemainderPolicy policy) {
  if (micro_count_ == 0) return StepResult{false, Tensor(), Tensor(), Tensor(), host_lr(), Tensor()};
  if (policy == RemainderPolicy::Drop) {
    zero_grad(zero_to_none_);
    reset_counters();
    return StepResult{false, Tensor(), Tensor(), Tensor(), host_lr(), Tensor()};
  }
  double correction = items_per_step_ > 0 ? double(items_per_step_) / double(items_seen_)
                                          : double(accum_steps_) / double(micro_count_);
  return boundary(correction);
}

void Optimizer::reset_counters() {
  micro_count_ = 0;
  items_seen_ = 0;
  pending_items_ = -1;
}

// 1 (f32, 0-dim) when `norm` is inf or NaN: norm - norm is NaN exactly then, and NaN != NaN.
Tensor Optimizer::nonfinite_flag(const Tensor& norm) const {
  Tensor d = sub(norm, norm);
  Tensor flag = ne(d, d);
  return flag.dtype() == DType::f32 ? flag : to_dtype(flag, DType::f32);
}

double Optimizer::sync_weight() const {
  if (items_per_step_ > 0) return double(items_seen_);
  return double(micro_count_) * double(micro_batch_ > 0 ? micro_batch_ : 1);
}

// `correction` rescales this rank's gradients to the mean over the items it saw (step 1).
StepResult Optimizer::boundary(double correction) {
  NoGradGuard no_grad;
  std::vector<Tensor> grads = grads_of(params_);
  if (correction != 1.0)
    for (const Tensor& g : grads) mul_(g, correction);
  if (grad_sync_) {  // every rank takes part, even one whose gradients are all missing
    grad_sync_->sync(params_, sync_weight());
    grads = grads_of(params_);
  }
  StepResult r{true, Tensor(), Tensor(), Tensor(), host_lr(), Tensor()};
  if (grads.empty()) {  // nothing reached a parameter: nothing to update, but the schedule advances
    r.lr_tensor = advance(Tensor(), false);
    reset_counters();
    return r;
  }
  const bool scaled = scaler_ && scaler_->enabled();
  Tensor found;
  if (scaled) scaler_->unscale_(params_);
  r.grad_norm = global_norm(grads);
  if (scaled) found = scaler_->found_inf();
  else found = nonfinite_flag(r.grad_norm);
  if (max_grad_norm_ > 0) {
    // Unscaled, found is nonfinite_flag(norm) already: a gradient holding inf or NaN makes the norm
    // inf or NaN (its square is, and a sum of squares only grows), so the clip's own check could not
    // raise it, and the clip only scales. Scaled, found is the scaler's, which the clip's check still
    // raises for a finite gradient that unscaling overflowed.
    clip_grads_with_norm_(grads, r.grad_norm, max_grad_norm_, scaled ? found : Tensor());
  }
  r.lr_tensor = advance(scaled || skip_nonfinite_ ? found : Tensor(), true);
  if (scaled) {
    scaler_->update();
    r.scale = clone(scaler_->scale_tensor());
    r.found_inf = clone(found);
  } else {
    r.found_inf = found;
  }
  zero_grad(zero_to_none_);
  reset_counters();
  return r;
}

void Optimizer::print_setup(std::ostream& os) const {
  os << "optimizer: " << describe() << ", lr " << base_lr_ << lr_scaling_note_ << "\n";
  if (items_per_step_ > 0) {
    os << "batch: " << items_per_step_ << " items per optimizer step (accumulation counted by items";
    if (micro_batch_ > 0) os << ", micro-batch " << micro_batch_ << " items";
    os << ")\n";
  } else {
    os << "batch: effective " << (micro_batch_ > 0 ? std::to_string(effective_batch()) : std::string("?"))
       << " = micro-batch " << (micro_batch_ > 0 ? std::to_string(micro_batch_) : std::string("?")) << " x ACCUM "
       << accum_steps_ << "\n";
  }
  os << "schedule: " << (schedule_ ? schedule_->describe() : std::string("constant")) << "\n";
  os << "clip: " << (max_grad_norm_ > 0 ? detail::cat("global grad norm <= ", max_grad_norm_) : std::string("off"))
     << "\n";
  os << "loss scaling: " << (scaler_ ? scaler_->describe() : std::string("off")) << "\n";
  if (grad_sync_) os << grad_sync_->describe() << "\n";
}

}  // namespace reel::optim
