// GradScaler (see optim/grad_scaler.h).
#include "optim/grad_scaler.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"
#include "optim/clip.h"
#include "tensor/error.h"

namespace reel::optim {

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  const auto& o = options_;
  REEL_CHECK(o.init_scale_ > 0 && std::isfinite(o.init_scale_), "GradScaler: init_scale must be positive and finite, got ",
             o.init_scale_);
  REEL_CHECK(o.growth_factor_ > 1 && std::isfinite(o.growth_factor_), "GradScaler: growth_factor must be > 1 and finite, got ",
             o.growth_factor_);
  REEL_CHECK(o.backoff_factor_ > 0 && o.backoff_factor_ < 1, "GradScaler: backoff_factor must lie in (0, 1), got ",
             o.backoff_factor_);
  REEL_CHECK(o.growth_interval_ >= 1, "GradScaler: growth_interval must be >= 1, got ", o.growth_interval_);
}

void GradScaler::init(Device device) {
  scale_ = full({}, options_.init_scale_, TensorOptions().with_device(device));
  tracker_ = zeros({}, TensorOptions().with_dtype(DType::i64).with_device(device));
  found_inf_ = zeros({}, TensorOptions().with_device(device));
}

std::vector<std::pair<std::string, Tensor>> GradScaler::state_dict() const {
  if (!scale_.defined()) return {};
  return {{"scale", scale_}, {"growth_tracker", tracker_}};
}

void GradScaler::load_state(const Tensor& scale, const Tensor& growth_tracker, Device device) {
  NoGradGuard no_grad;
  ensure(device);
  copy_(scale_, scale.to(device));
  copy_(tracker_, growth_tracker.to(device));
}

void GradScaler::ensure(Device device) {
  if (!scale_.defined()) init(device);
  REEL_CHECK(scale_.device() == device, "GradScaler: its state is on ", scale_.device().str(),
             " but a tensor is on ", device.str(), "; use one scaler per device");
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!enabled()) return loss;
  ensure(loss.device());
  Tensor s = loss.dtype() == DType::f32 ? scale_ : to_dtype(scale_, loss.dtype());
  return mul(loss, s);
}

void GradScaler::unscale_(const std::vector<Tensor>& params) {
  if (!enabled()) return;
  NoGradGuard no_grad;
  std::vector<Tensor> grads = grads_of(params);
  if (grads.empty() && !scale_.defined()) return;
  ensure(grads.empty() ? scale_.device() : grads[0].device());
  fill_(found_inf_, 0.0);
  if (grads.empty()) return;
  Tensor inv = pow(scale_, -1.0);  // 0-dim f32; exact for the powers of two a scaler usually holds
  std::vector<Tensor> in = grads, out = grads;
  in.push_back(inv);
  in.push_back(found_inf_);
  out.push_back(found_inf_);
  dispatch_out(OpKind::UnscaleCheck, in, out);
}

void GradScaler::update() {
  if (!enabled() || !scale_.defined()) return;
  Attrs a;
  a.set("growth_factor", options_.growth_factor_)
      .set("backoff_factor", options_.backoff_factor_)
      .set("growth_interval", options_.growth_interval_);
  dispatch_out(OpKind::ScalerUpdate, {scale_, tracker_, found_inf_}, {scale_, tracker_}, a);
}

double GradScaler::scale_value() const {
  if (!enabled()) return 1.0;
  return scale_.defined() ? scale_.item() : options_.init_scale_;
}

int64_t GradScaler::growth_tracker_value() const { return tracker_.defined() ? int64_t(tracker_.item()) : 0; }

bool GradScaler::found_inf_value() const { return found_inf_.defined() && found_inf_.item() != 0; }

std::string GradScaler::describe() const {
  if (!enabled()) return "off";
  const auto& o = options_;
  return detail::cat("GradScaler init ", o.init_scale_, ", x", o.growth_factor_, " every ", o.growth_interval_,
                     " clean steps, x", o.backoff_factor_, " on inf/NaN");
}

}  // namespace reel::optim
