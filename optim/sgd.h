// SGD with momentum, dampening, Nesterov and (L2) weight decay — torch.optim.SGD's update, run by
// the sgd_step kernel (kernels/schema/optim.cpp) on each parameter:
//   d = g + wd p
//   momentum != 0:  buf = d on the first step, else buf = momentum buf + (1 - dampening) d
//                   d = nesterov ? d + momentum buf : buf
//   p -= lr d
// The momentum buffer is created lazily on the parameter's device, in its dtype. "First step" is
// per parameter and host-side: a first step skipped on inf/NaN still counts as the first (the buffer
// then starts from zero), a documented difference from torch, which would not have stepped at all.
// lr reaches the kernel as a 0-dim device tensor (optim/optimizer.h); first_step stays an attr, which
// is why a step is best recorded after each parameter's first update (compile/'s warm-up call).
#pragma once
#include <vector>

#include "optim/optimizer.h"

namespace reel::optim {

struct SGDOptions {
  explicit SGDOptions(double lr = 0.01) : lr_(lr) {}
  double lr_;
  double momentum_ = 0;
  double dampening_ = 0;
  double weight_decay_ = 0;
  bool nesterov_ = false;

  SGDOptions& lr(double v) { lr_ = v; return *this; }
  SGDOptions& momentum(double v) { momentum_ = v; return *this; }
  SGDOptions& dampening(double v) { dampening_ = v; return *this; }
  SGDOptions& weight_decay(double v) { weight_decay_ = v; return *this; }
  SGDOptions& nesterov(bool v) { nesterov_ = v; return *this; }
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options = SGDOptions());
  const SGDOptions& options() const { return options_; }
  // Parameter i's momentum buffer (undefined before its first update or without momentum).
  const Tensor& momentum_buffer(size_t i) const { return buffers_.at(i); }

 protected:
  void update(const Tensor& found_inf, const Tensor& lr, const Tensor& step) override;
  std::string describe() const override;
  bool update_state_can_be_made_early() const override;
  std::vector<StateSlot> state_slots() override;  // momentum_buffer, with momentum

 private:
  SGDOptions options_;
  std::vector<Tensor> buffers_;
};

}  // namespace reel::optim
