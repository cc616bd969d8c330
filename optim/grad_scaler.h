// GradScaler — dynamic loss scaling for fp16 training, all on the device (PyTorch's GradScaler).
//
// scale, growth_tracker and found_inf are 0-dim device tensors (f32, i64, f32), created on the
// device of the first tensor the scaler sees. Per optimizer step:
//   scale(loss)      loss * scale                      (each micro-batch, before backward)
//   unscale_(params) found_inf = 0; g *= 1/scale; found_inf = 1 if any g is inf/NaN   (unscale_check)
//   ... the optimizer's kernels read found_inf and leave everything unchanged when it is set ...
//   update()         found_inf: scale *= backoff_factor, tracker = 0;
//                    else tracker += 1 and, at growth_interval, scale *= growth_factor, tracker = 0
//                    (scaler_update)
// None of these reads a value on the host, so the step can be captured in a CUDA graph; scale_value()
// and the other *_value() accessors read (synchronise) and are meant for logging.
// A disabled scaler passes the loss through, unscales nothing and never updates.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace reel::optim {

struct GradScalerOptions {
  double init_scale_ = 65536.0;
  double growth_factor_ = 2.0;
  double backoff_factor_ = 0.5;
  int64_t growth_interval_ = 2000;
  bool enabled_ = true;

  GradScalerOptions& init_scale(double v) { init_scale_ = v; return *this; }
  GradScalerOptions& growth_factor(double v) { growth_factor_ = v; return *this; }
  GradScalerOptions& backoff_factor(double v) { backoff_factor_ = v; return *this; }
  GradScalerOptions& growth_interval(int64_t v) { growth_interval_ = v; return *this; }
  GradScalerOptions& enabled(bool v) { enabled_ = v; return *this; }
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  bool enabled() const { return options_.enabled_; }
  const GradScalerOptions& options() const { return options_; }
  // Creates the state on `device` now (otherwise it is created on the first tensor's device).
  void init(Device device);

  Tensor scale(const Tensor& loss);
  void unscale_(const std::vector<Tensor>& params);
  void update();

  // The device state (undefined before the first use).
  const Tensor& scale_tensor() const { return scale_; }
  const Tensor& growth_tracker() const { return tracker_; }
  const Tensor& found_inf() const { return found_inf_; }
  // Host reads, for logging and tests.
  double scale_value() const;
  int64_t growth_tracker_value() const;
  bool found_inf_value() const;
  std::string describe() const;
  // "scale" (f32) and "growth_tracker" (i64), the live tensors; empty before the state exists.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  // Copies `scale` and `growth_tracker` in (making the state on `device` first if it is not made);
  // the caller (Optimizer::load_state_dict) has checked their shapes and dtypes.
  void load_state(const Tensor& scale, const Tensor& growth_tracker, Device device);

 private:
  void ensure(Device device);
  GradScalerOptions options_;
  Tensor scale_, tracker_, found_inf_;
};

}  // namespace reel::optim
