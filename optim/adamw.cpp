// AdamW (see optim/adamw.h).
#include "optim/adamw.h"

#include "autograd/ops.h"
#include "kernels/dispatch.h"
#include "tensor/error.h"

namespace reel::optim {

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : Optimizer(std::move(params), options.lr_, "AdamW"), options_(options) {
  const auto& o = options_;
  REEL_CHECK(o.beta1_ >= 0 && o.beta1_ < 1 && o.beta2_ >= 0 && o.beta2_ < 1, "AdamW: betas must lie in [0, 1), got (",
             o.beta1_, ", ", o.beta2_, ")");
  REEL_CHECK(o.eps_ >= 0, "AdamW: eps must be >= 0, got ", o.eps_);
  REEL_CHECK(o.weight_decay_ >= 0, "AdamW: weight_decay must be >= 0, got ", o.weight_decay_);
  exp_avg_.resize(parameters().size());
  exp_avg_sq_.resize(parameters().size());
}

void AdamW::update(const Tensor& found_inf, const Tensor& lr, const Tensor& step) {
  const auto& o = options_;
  Attrs a;
  a.set("beta1", o.beta1_).set("beta2", o.beta2_).set("eps", o.eps_).set("weight_decay", o.weight_decay_);
  const std::vector<Tensor>& params = parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!exp_avg_[i].defined()) {
      exp_avg_[i] = zeros_like(p);
      exp_avg_sq_[i] = zeros_like(p);
    }
    dispatch_out(OpKind::AdamWStep, {p, g, exp_avg_[i], exp_avg_sq_[i], found_inf, lr, step},
                 {p, exp_avg_[i], exp_avg_sq_[i]}, a);
  }
}

// Zero moments, as the first update makes them: they are read before they are written, so zeros
// made now are the same bits as zeros made then.
void AdamW::make_update_state() {
  for (size_t i = 0; i < exp_avg_.size(); ++i)
    if (!exp_avg_[i].defined()) {
      exp_avg_[i] = zeros_like(parameters()[i]);
      exp_avg_sq_[i] = zeros_like(parameters()[i]);
    }
}

std::vector<Optimizer::StateSlot> AdamW::state_slots() {
  std::vector<StateSlot> out;
  for (size_t i = 0; i < exp_avg_.size(); ++i) {
    out.push_back({i, "exp_avg", &exp_avg_[i]});
    out.push_back({i, "exp_avg_sq", &exp_avg_sq_[i]});
  }
  return out;
}

std::string AdamW::describe() const {
  const auto& o = options_;
  return detail::cat("AdamW (betas (", o.beta1_, ", ", o.beta2_, "), eps ", o.eps_, ", weight_decay ",
                     o.weight_decay_, ")");
}

}  // namespace reel::optim
