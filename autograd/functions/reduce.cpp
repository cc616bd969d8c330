// Reductions, softmax, cross-entropy and the global norm, with their gradients.
//
//   y = sum(x, dims)       dx = expand(g, x.shape)                 (g with the reduced dims kept as 1)
//   y = mean(x, dims)      dx = expand(g / R, x.shape)             R = number of elements reduced per output
//   y = max(x, dims)       dx = g * [x == y] / count(x == y)       ties share the gradient equally
//   y = softmax(x, d)      dx = y (g - sum_d(g y))                 (softmax_backward op)
//   y = log_softmax(x, d)  dx = g - exp(y) sum_d(g)                (log_softmax_backward op)
//   L = cross_entropy(logits, target)
//                          L = reduce_n (lse_n - logits[n, target_n]),  reduce = mean over non-ignored rows or sum
//                          dlogits = (softmax(logits) - onehot(target)) * g / count   (cross_entropy_backward op)
//   global_norm(xs) = sqrt(sum of x^2 over every element of every x): not differentiable, records nothing.
//
// sum/mean/max backward are written in differentiable ops (so second derivatives work); softmax,
// log-softmax and cross-entropy use their fused backward ops. Reduction dims: an empty list means
// every dim; reducing every dim without keepdim gives a 0-dim tensor.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"

namespace reel {

using autograd::Grads;
using autograd::saved;

namespace {

Attrs reduce_attrs(const std::vector<int64_t>& dims, bool keepdim) {
  return Attrs().set("dims", dims).set("keepdim", keepdim);
}

// x's shape with the reduced dims set to 1: the shape a gradient of y reshapes to before it
// broadcasts back over x. Called after dispatch, so dims are already validated.
Shape keepdim_shape(const Tensor& x, const std::vector<int64_t>& dims) {
  Shape shape = x.shape();
  if (x.dim() == 0) return shape;
  for (int64_t d : wrap_dims(dims, x.dim(), "reduce")) shape[size_t(d)] = 1;
  return shape;
}

// How many elements of x each output of a reduction over `dims` covers.
int64_t reduced_count(const Tensor& x, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  if (x.dim() == 0) return n;
  for (int64_t d : wrap_dims(dims, x.dim(), "reduce")) n *= x.shape()[size_t(d)];
  return n;
}

Tensor softmax_like(OpKind op, OpKind backward_op, const char* name, const Tensor& x, int64_t dim) {
  Attrs a = Attrs().set("dim", dim);
  Tensor y = dispatch1(op, {x}, a);
  Tensor ys = saved(y);
  autograd::record(name, {x}, {y}, [ys, a, backward_op](const Grads& g) -> Grads {
    return {dispatch1(backward_op, {g[0], ys}, a)};
  });
  return y;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor y = dispatch1(OpKind::Sum, {x}, reduce_attrs(dims, keepdim));
  if (!autograd::needs_grad({x})) return y;
  Shape in_shape = x.shape(), kept = keepdim_shape(x, dims);
  autograd::record("sum", {x}, {y}, [in_shape, kept](const Grads& g) -> Grads {
    return {expand(reshape(g[0], kept), in_shape)};
  });
  return y;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor y = dispatch1(OpKind::Mean, {x}, reduce_attrs(dims, keepdim));
  if (!autograd::needs_grad({x})) return y;
  Shape in_shape = x.shape(), kept = keepdim_shape(x, dims);
  // R = 0 only when x is empty: the gradient is then empty too and the infinite scale is never used.
  double scale = 1.0 / double(reduced_count(x, dims));
  autograd::record("mean", {x}, {y}, [in_shape, kept, scale](const Grads& g) -> Grads {
    return {expand(reshape(g[0], kept) * scale, in_shape)};
  });
  return y;
}

Tensor max(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor y = dispatch1(OpKind::Max, {x}, reduce_attrs(dims, keepdim));
  if (!autograd::needs_grad({x})) return y;
  Shape kept = keepdim_shape(x, dims);
  Tensor xs = saved(x), ys = saved(y);
  autograd::record("max", {x}, {y}, [xs, ys, kept, dims](const Grads& g) -> Grads {
    Tensor is_max = eq(xs, reshape(ys, kept));  // x: (...), 1 at each maximum (ties included)
    Tensor ties = sum(is_max, dims, true);      // (kept): how many elements share each maximum
    return {is_max * (reshape(g[0], kept) / ties)};
  });
  return y;
}

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_like(OpKind::Softmax, OpKind::SoftmaxBackward, "softmax", x, dim);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_like(OpKind::LogSoftmax, OpKind::LogSoftmaxBackward, "log_softmax", x, dim);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const std::string& reduction,
                     int64_t ignore_index) {
  REEL_CHECK(reduction == "mean" || reduction == "sum", "cross_entropy: reduction '", reduction,
             "' is not one of 'mean', 'sum'");
  // reduction encoding of the ops: 0 = mean, 1 = sum (kernels/schema/reduce.cpp).
  Attrs a = Attrs().set("ignore_index", ignore_index).set("reduction", int64_t(reduction == "sum" ? 1 : 0));
  std::vector<Tensor> out = dispatch(OpKind::CrossEntropy, {logits, target}, a);  // loss (), lse (N)
  Tensor loss = out[0];
  Tensor logits_s = saved(logits), target_s = saved(target), lse_s = saved(out[1]);
  autograd::record("cross_entropy", {logits, target}, {loss}, [=](const Grads& g) -> Grads {
    return {dispatch1(OpKind::CrossEntropyBackward, {g[0], logits_s, target_s, lse_s}, a), Tensor()};
  });
  return loss;
}

Tensor global_norm(const std::vector<Tensor>& xs) {
  // The norm of nothing is 0 (an optimizer with no gradients yet); dispatch needs an input for the device.
  if (xs.empty()) return zeros({}, TensorOptions{DType::f32, Device::cpu()});
  return dispatch1(OpKind::GlobalNorm, xs);
}

}  // namespace reel
