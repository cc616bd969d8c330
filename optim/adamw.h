// AdamW — Adam with decoupled weight decay and bias correction, exactly torch.optim.AdamW, run by
// the adamw_step kernel (kernels/schema/optim.cpp) on each parameter at 1-based step t:
//   p -= lr wd p
//   m = b1 m + (1 - b1) g            v = b2 v + (1 - b2) g^2
//   p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// exp_avg (m) and exp_avg_sq (v) are created lazily, zero, on the parameter's device in its dtype
// (the precision policy keeps master parameters in f32). lr and t reach the kernel as 0-dim device
// tensors: t is the optimizer's count of applied updates (optim/optimizer.h), so an update skipped on
// inf/NaN does not advance it, as in torch. It is one count for all parameters, where torch keeps
// one per parameter; the two agree whenever every parameter has a gradient at every update.
#pragma once
#include <vector>

#include "optim/optimizer.h"

namespace reel::optim {

struct AdamWOptions {
  explicit AdamWOptions(double lr = 1e-3) : lr_(lr) {}
  double lr_;
  double beta1_ = 0.9, beta2_ = 0.999;
  double eps_ = 1e-8;
  double weight_decay_ = 1e-2;

  AdamWOptions& lr(double v) { lr_ = v; return *this; }
  AdamWOptions& betas(double b1, double b2) { beta1_ = b1; beta2_ = b2; return *this; }
  AdamWOptions& eps(double v) { eps_ = v; return *this; }
  AdamWOptions& weight_decay(double v) { weight_decay_ = v; return *this; }
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = AdamWOptions());
  const AdamWOptions& options() const { return options_; }
  // Parameter i's state (undefined before its first update).
  const Tensor& exp_avg(size_t i) const { return exp_avg_.at(i); }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_.at(i); }

 protected:
  void update(const Tensor& found_inf, const Tensor& lr, const Tensor& step) override;
  std::string describe() const override;
  void make_update_state() override;
  std::vector<StateSlot> state_slots() override;

 private:
  AdamWOptions options_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

}  // namespace reel::optim
