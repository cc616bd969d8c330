// Gradient clipping by global norm, and clamp_scalar (the op that bounds the clip coefficient).
//
//   total = sqrt(sum over every gradient element of g^2)         (global_norm: f32, f64 for f64)
//   coef  = min(1, max_norm / (total + eps))     eps = 1e-6 as in torch.nn.utils.clip_grad_norm_
//   g    *= coef   for every gradient, in place
// Everything stays on the device: the norm is a 0-dim tensor and the multiply takes the coefficient
// as a device scalar (through unscale_check, which also flags inf/NaN gradients in `found_inf`), so
// clipping needs no host read and can be captured. Parameters without a gradient are skipped.
#pragma once
#include <vector>

#include "tensor/tensor.h"

namespace reel::optim {

// The defined .grad of each parameter, in order (parameters without one are left out).
std::vector<Tensor> grads_of(const std::vector<Tensor>& params);

// Clips the gradients of `params` in place to a global norm of at most max_norm and returns the norm
// before clipping (0-dim, on the parameters' device). When `found_inf` (0-dim f32) is given it is set
// to 1 if a gradient holds inf/NaN after clipping. Gradients must share one dtype.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, const Tensor& found_inf = Tensor());

// The clipping half alone, given the norm `total` already computed from `grads` (the optimizer
// computes it once for its report). found_inf (0-dim f32), when given, is set as clip_grad_norm_ sets
// it; without it the gradients are only scaled (unscale_check with check_finite false).
void clip_grads_with_norm_(const std::vector<Tensor>& grads, const Tensor& total, double max_norm,
                           const Tensor& found_inf = Tensor());

}  // namespace reel::optim

namespace reel {
// y = min(max(x, lo), hi) elementwise (either bound may be +-inf; NaN stays NaN); not differentiable.
Tensor clamp_scalar(const Tensor& x, double lo, double hi);
}  // namespace reel
