// SGD (see optim/sgd.h).
#include "optim/sgd.h"

#include "autograd/ops.h"
#include "kernels/dispatch.h"
#include "tensor/error.h"

namespace reel::optim {

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer(std::move(params), options.lr_, "SGD"), options_(options) {
  const auto& o = options_;
  REEL_CHECK(o.momentum_ >= 0, "SGD: momentum must be >= 0, got ", o.momentum_);
  REEL_CHECK(o.weight_decay_ >= 0, "SGD: weight_decay must be >= 0, got ", o.weight_decay_);
  REEL_CHECK(!o.nesterov_ || (o.momentum_ > 0 && o.dampening_ == 0),
             "SGD: nesterov needs momentum > 0 and dampening 0, got momentum ", o.momentum_, " and dampening ",
             o.dampening_);
  buffers_.resize(parameters().size());
}

void SGD::update(const Tensor& found_inf, const Tensor& lr, const Tensor&) {
  const auto& o = options_;
  const std::vector<Tensor>& params = parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    bool first = false;
    if (o.momentum_ != 0 && !buffers_[i].defined()) {
      buffers_[i] = zeros_like(p);
      first = true;
    }
    Attrs a;
    a.set("momentum", o.momentum_).set("dampening", o.dampening_)
        .set("weight_decay", o.weight_decay_).set("nesterov", o.nesterov_).set("first_step", first);
    std::vector<Tensor> out{p};
    if (buffers_[i].defined()) out.push_back(buffers_[i]);
    dispatch_out(OpKind::SgdStep, {p, g, buffers_[i], found_inf, lr}, out, a);
  }
}

std::vector<Optimizer::StateSlot> SGD::state_slots() {
  std::vector<StateSlot> out;
  if (options_.momentum_ != 0)
    for (size_t i = 0; i < buffers_.size(); ++i) out.push_back({i, "momentum_buffer", &buffers_[i]});
  return out;
}

// Without momentum there is no state. With it, the first update copies the gradient into the buffer
// (first_step), which later updates do not: a buffer made now would change that update, so only a
// step whose buffers all exist already can be traced without running.
bool SGD::update_state_can_be_made_early() const {
  if (options_.momentum_ == 0) return true;
  for (const Tensor& b : buffers_)
    if (!b.defined()) return false;
  return true;
}

std::string SGD::describe() const {
  const auto& o = options_;
  return detail::cat("SGD (momentum ", o.momentum_, ", dampening ", o.dampening_, ", nesterov ",
                     o.nesterov_ ? "on" : "off", ", weight_decay ", o.weight_decay_, ")");
}

}  // namespace reel::optim
