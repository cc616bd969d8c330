// Layer norm, group norm, batch norm and dropout, each forward beside its backward.
//
// The norms run one fused forward op that also returns the statistics (mean, rstd = 1/sqrt(var+eps),
// in f32, or f64 for f64 x); backward passes them to one fused backward op (kernels/cpu/norm.cpp has
// the formulas):
//   xhat = (x - mean) rstd     y = xhat w + b
//   dx = rstd (g w - mean(g w) - xhat mean(g w xhat))     dw = sum(g xhat)     db = sum(g)
// with the means over the normalised set (a row, an (n, group), or a channel over (N, *)). Batch
// norm in eval mode uses the running statistics, which are constants: dx = g w rstd.
// The fused backward ops are not themselves differentiable (no double backward through the norms).
// Gradients of inputs that need none are returned undefined; weight/bias may be absent (undefined).
//
// Dropout draws (seed, offset) from a Generator (the default one unless given) and advances it by
// the counters it uses, so consecutive calls get fresh masks; y = x * mask, dx = g * mask with
// mask = kept ? 1/(1-p) : 0 saved from the forward.
#include <algorithm>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"

namespace reel {

using autograd::Grads;
using autograd::saved;

namespace {

// The gradients a fused norm backward op returns, (dx, dw, db), kept for the inputs that need them.
Grads pick_grads(const std::vector<Tensor>& d, bool need_x, bool need_w, bool need_b) {
  return {need_x ? d[0] : Tensor(), need_w ? d[1] : Tensor(), need_b ? d[2] : Tensor()};
}

// Records the node of a norm whose forward returned (y, mean, rstd) and whose backward op takes
// (g, x, w, mean, rstd) with `attrs`.
void record_norm(const char* name, OpKind backward_op, const Attrs& attrs, const Tensor& x, const Tensor& weight,
                 const Tensor& bias, const std::vector<Tensor>& out) {
  bool need_x = x.requires_grad(), need_w = weight.requires_grad(), need_b = bias.requires_grad();
  Tensor xs = saved(x), ws = saved(weight), mean = saved(out[1]), rstd = saved(out[2]);
  autograd::record(name, {x, weight, bias}, {out[0]}, [=](const Grads& g) -> Grads {
    return pick_grads(dispatch(backward_op, {g[0], xs, ws, mean, rstd}, attrs), need_x, need_w, need_b);
  });
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  REEL_CHECK(x.defined(), "layer_norm: x is undefined");
  int64_t k = int64_t(normalized_shape.size());
  REEL_CHECK(k >= 1, "layer_norm: normalized_shape must have at least one dim, got ()");
  REEL_CHECK(k <= x.dim() && std::equal(normalized_shape.begin(), normalized_shape.end(), x.shape().end() - k),
             "layer_norm: normalized_shape ", shape_str(normalized_shape), " is not the trailing dims of x of shape ",
             shape_str(x.shape()));
  // out: y (x.shape), mean and rstd (x.shape[:-k])
  std::vector<Tensor> out =
      dispatch(OpKind::LayerNorm, {x, weight, bias}, Attrs().set("eps", eps).set("normalized_ndim", k));
  record_norm("layer_norm", OpKind::LayerNormBackward, Attrs(), x, weight, bias, out);
  return out[0];
}

Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, double eps) {
  // out: y (N, C, *), mean and rstd (N, G)
  std::vector<Tensor> out =
      dispatch(OpKind::GroupNorm, {x, weight, bias}, Attrs().set("groups", groups).set("eps", eps));
  record_norm("group_norm", OpKind::GroupNormBackward, Attrs().set("groups", groups), x, weight, bias, out);
  return out[0];
}

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  // out: y (N, C, *), save_mean and save_rstd (C). In training the kernel also updates the running
  // statistics in place; they are buffers, not inputs of the graph.
  Attrs attrs = Attrs().set("training", training).set("momentum", momentum).set("eps", eps);
  std::vector<Tensor> out = dispatch(OpKind::BatchNorm, {x, weight, bias, running_mean, running_var}, attrs);
  record_norm("batch_norm", OpKind::BatchNormBackward, Attrs().set("training", training), x, weight, bias, out);
  return out[0];
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  REEL_CHECK(x.defined(), "dropout: x is undefined");
  REEL_CHECK(p >= 0 && p <= 1, "dropout: probability p must be in [0, 1], got ", p);
  if (!training || p == 0) return x;
  Generator& g = gen ? *gen : default_generator();
  uint64_t offset = g.advance(philox_uniform_counters(uint64_t(x.numel())));
  Attrs attrs = Attrs().set("p", p).set("seed", int64_t(g.seed())).set("offset", int64_t(offset));
  std::vector<Tensor> out = dispatch(OpKind::Dropout, {x}, attrs);  // y, mask: (x.shape)
  Tensor mask = saved(out[1]);
  autograd::record("dropout", {x}, {out[0]}, [mask](const Grads& grads) -> Grads { return {grads[0] * mask}; });
  return out[0];
}

}  // namespace reel
