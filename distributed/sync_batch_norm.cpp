// sync_batch_norm: forward statistics gathered across ranks, backward sums all-reduced (formulas in
// distributed/sync_batch_norm.h). Written in ops, so it runs on any device the ops run on; the node's
// backward is hand-written (its two sums are what crosses ranks), not derived by autograd.
#include "distributed/sync_batch_norm.h"

#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/error.h"

namespace reel::dist {
namespace {

// (1, C, 1, ..., 1) for x of rank d: per-channel values broadcast against x.
Shape channel_shape(const Tensor& x) {
  Shape s(size_t(x.dim()), 1);
  s[1] = x.size(1);
  return s;
}

std::vector<int64_t> reduce_dims(const Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

// running <- (1 - momentum) running + momentum stat, in running's dtype.
void update_running(const Tensor& running, const Tensor& stat, double momentum) {
  if (!running.defined()) return;
  Tensor s = stat.dtype() == running.dtype() ? stat : to_dtype(stat, running.dtype());
  copy_(running, running * (1.0 - momentum) + s * momentum);
}

}  // namespace

Tensor sync_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps, Communicator& comm) {
  REEL_CHECK(x.defined() && x.dim() >= 2, "sync_batch_norm: x must be (N, C, *), got ",
             x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  if (!training || comm.world_size() == 1)
    return batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps);
  if (x.dtype() == DType::f16 || x.dtype() == DType::bf16)  // statistics in f32, as BatchNorm's kernels
    return to_dtype(sync_batch_norm(to_dtype(x, DType::f32), running_mean, running_var, weight, bias, training,
                                    momentum, eps, comm),
                    x.dtype());
  const int64_t C = x.size(1);
  for (const Tensor* t : {&weight, &bias, &running_mean, &running_var})
    REEL_CHECK(!t->defined() || (t->dim() == 1 && t->size(0) == C), "sync_batch_norm: x ", shape_str(x.shape()),
               " has ", C, " channels but a weight, bias or running statistic has shape ", shape_str(t->shape()));
  const Shape cs = channel_shape(x);
  const std::vector<int64_t> dims = reduce_dims(x);
  Tensor y, xhat, rstd, n;
  {
    NoGradGuard no_grad;
    Tensor xd = x.detach();                                     // (N, C, *)
    const double local_n = double(x.numel() / C);
    Tensor m = mean(xd, dims);                                  // (C) this rank's mean
    Tensor xc = xd - m.reshape(cs);
    Tensor m2 = sum(xc * xc, dims);                             // (C) this rank's sum of squared deviations
    Tensor counts = full({1}, local_n, TensorOptions().with_dtype(x.dtype()).with_device(x.device()));
    // (K, 2C + 1). As an op (f32/f64): a compiled step records the gather and its replays run it.
    Tensor all = comm.all_gather_op(concat({counts, m, m2}, 0));
    Tensor n_k = all.slice(1, 0, 1);                            // (K, 1)
    Tensor m_k = all.slice(1, 1, C + 1);                        // (K, C)
    Tensor m2_k = all.slice(1, C + 1, 2 * C + 1);               // (K, C)
    n = sum(n_k);                                               // () all ranks' count per channel
    Tensor total_mean = sum(n_k * m_k, {0}) / n;                // (C)
    Tensor d = m_k - total_mean;
    Tensor total_m2 = sum(m2_k + n_k * d * d, {0});             // (C)
    rstd = rsqrt(total_m2 / n + eps);                           // (C)
    xhat = (xd - total_mean.reshape(cs)) * rstd.reshape(cs);    // (N, C, *)
    y = xhat;
    if (weight.defined()) y = y * weight.detach().reshape(cs);
    if (bias.defined()) y = y + bias.detach().reshape(cs);
    update_running(running_mean, total_mean, momentum);
    update_running(running_var, total_m2 / (n - 1.0), momentum);
  }
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad(), need_b = bias.requires_grad();
  Tensor w = autograd::saved(weight);
  Communicator* c = &comm;  // the communicator outlives the step's graph
  autograd::record("sync_batch_norm", {x, weight, bias}, {y}, [=](const autograd::Grads& grads) -> autograd::Grads {
    // Every rank joins the all-reduce, even one whose loss did not reach y (its g is zero).
    Tensor g = grads[0].defined() ? grads[0] : zeros_like(xhat);   // (N, C, *)
    Tensor sum_g = sum(g, dims), sum_gx = sum(g * xhat, dims);     // (C) this rank's
    Tensor both = concat({sum_g, sum_gx}, 0);                      // (2C)
    c->all_reduce_op(both, ReduceOp::sum);                         // all ranks' sums
    Tensor mean_g = both.slice(0, 0, C) / n, mean_gx = both.slice(0, C, 2 * C) / n;
    Tensor scale = w.defined() ? w * rstd : rstd;                  // (C)
    Tensor dx;
    if (need_x) dx = (g - mean_g.reshape(cs) - xhat * mean_gx.reshape(cs)) * scale.reshape(cs);
    return {dx, need_w ? sum_gx : Tensor(), need_b ? sum_g : Tensor()};
  });
  return y;
}

}  // namespace reel::dist
