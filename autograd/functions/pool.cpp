// Pooling and embedding, forward beside backward. Each backward is one dedicated op (the kernels
// live in kernels/cpu/pool.cpp):
//
//   y, idx = max_pool2d(x)      dx = max_pool2d_backward(g, idx): g scatter-added at each window's
//                               argmax (idx holds h*W + w inside the (H, W) plane; ties: first wins)
//   y = avg_pool2d(x)           dx[h, w] = sum over windows containing (h, w) of g / K^2
//                               (padding counts in the mean, PyTorch's count_include_pad=true)
//   y = global_avg_pool2d(x)    mean over H and W; its gradient is mean's
//   y = embedding(weight, idx)  y[i, :] = weight[idx[i], :]
//                               dweight[v, :] = sum of g[i, :] over i with idx[i] == v (rows hit twice
//                               accumulate); indices get no gradient
//
// Pooling's stride -1 means stride = kernel (non-overlapping windows, as PyTorch's default).
#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"

namespace reel {

using autograd::Grads;
using autograd::saved;

namespace {

Attrs pool_attrs(int64_t kernel, int64_t stride, int64_t padding) {
  return Attrs().set("kernel", kernel).set("stride", stride == -1 ? kernel : stride).set("padding", padding);
}

}  // namespace

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  // x: (N, C, H, W) -> y, idx: (N, C, Ho, Wo)
  std::vector<Tensor> out = dispatch(OpKind::MaxPool2d, {x}, pool_attrs(kernel, stride, padding));
  Tensor y = out[0], idx = out[1];
  Attrs back = Attrs().set("input_shape", x.shape());
  autograd::record("max_pool2d", {x}, {y}, [idx, back](const Grads& g) -> Grads {
    return {dispatch1(OpKind::MaxPool2dBackward, {g[0], idx}, back)};
  });
  return y;
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  // x: (N, C, H, W) -> y: (N, C, Ho, Wo)
  Attrs a = pool_attrs(kernel, stride, padding);
  Tensor y = dispatch1(OpKind::AvgPool2d, {x}, a);
  Attrs back = a;
  back.set("input_shape", x.shape());
  autograd::record("avg_pool2d", {x}, {y}, [back](const Grads& g) -> Grads {
    return {dispatch1(OpKind::AvgPool2dBackward, {g[0]}, back)};
  });
  return y;
}

Tensor global_avg_pool2d(const Tensor& x) {
  // x: (N, C, H, W) -> (N, C)
  REEL_CHECK(x.defined(), "global_avg_pool2d: input is undefined");
  REEL_CHECK(x.dim() == 4, "global_avg_pool2d: input must be 4-D (N, C, H, W), got shape ", shape_str(x.shape()));
  return mean(x, {2, 3});
}

Tensor upsample_nearest2d(const Tensor& x, int64_t scale) {
  REEL_CHECK(x.defined(), "upsample_nearest2d: input is undefined");
  REEL_CHECK(x.dim() == 4, "upsample_nearest2d: input must be 4-D (N, C, H, W), got shape ", shape_str(x.shape()));
  REEL_CHECK(scale >= 1, "upsample_nearest2d: scale must be an integer >= 1, got ", scale, " (input ",
             shape_str(x.shape()), ")");
  if (scale == 1) return x;
  const Shape& s = x.shape();
  // (N, C, H, 1, W, 1) broadcast to (N, C, H, s, W, s): each pixel repeated over an s x s block.
  Tensor blocks = expand(reshape(x, {s[0], s[1], s[2], 1, s[3], 1}), {s[0], s[1], s[2], scale, s[3], scale});
  return reshape(contiguous(blocks), {s[0], s[1], s[2] * scale, s[3] * scale});  // (N, C, sH, sW)
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  // weight: (V, D), indices: any shape -> indices.shape + (D)
  Tensor y = dispatch1(OpKind::Embedding, {weight, indices});
  Tensor idx = saved(indices);
  Attrs back = Attrs().set("num_weights", weight.shape()[0]);
  autograd::record("embedding", {weight}, {y}, [idx, back](const Grads& g) -> Grads {
    return {dispatch1(OpKind::EmbeddingBackward, {g[0], idx}, back)};
  });
  return y;
}

}  // namespace reel
