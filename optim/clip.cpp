// clip_grad_norm_ and clamp_scalar (see optim/clip.h).
#include "optim/clip.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"
#include "tensor/error.h"

namespace reel {

Tensor clamp_scalar(const Tensor& x, double lo, double hi) {
  return dispatch1(OpKind::ClampScalar, {x}, Attrs().set("min", lo).set("max", hi));
}

namespace optim {

std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) grads.push_back(g);
  }
  return grads;
}

void clip_grads_with_norm_(const std::vector<Tensor>& grads, const Tensor& total, double max_norm,
                           const Tensor& found_inf) {
  NoGradGuard no_grad;
  if (grads.empty()) return;
  Tensor coef = clamp_scalar(mul(pow(add(total, 1e-6), -1.0), max_norm), -INFINITY, 1.0);  // 0-dim
  std::vector<Tensor> in = grads, out = grads;
  in.push_back(coef);
  if (found_inf.defined()) {
    in.push_back(found_inf);
    out.push_back(found_inf);
  }
  dispatch_out(OpKind::UnscaleCheck, in, out, Attrs().set("check_finite", found_inf.defined()));
}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, const Tensor& found_inf) {
  REEL_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got ", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> grads = grads_of(params);
  if (grads.empty()) {
    Device d = params.empty() ? Device::cpu() : params[0].device();
    return zeros({}, TensorOptions().with_device(d));
  }
  Tensor total = global_norm(grads);  // 0-dim
  clip_grads_with_norm_(grads, total, max_norm, found_inf);
  return total;
}

}  // namespace optim
}  // namespace reel
