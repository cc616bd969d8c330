// Views and their adjoints. A view's backward moves the gradient back to the input's geometry:
//   reshape -> reshape back        permute -> inverse permutation
//   slice   -> zeros, gradient copied into the same slice       expand -> sum_to the input's shape
#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"
#include "kernels/schema/views.h"

namespace reel {

using autograd::Grads;

Tensor view(const Tensor& x, const Shape& shape) {
  Tensor y = dispatch1(OpKind::Reshape, {x}, Attrs().set("shape", shape));
  Shape in_shape = x.shape();
  autograd::record("view", {x}, {y}, [in_shape](const Grads& g) -> Grads { return {reshape(g[0], in_shape)}; });
  return y;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  Shape target = infer_reshape_shape(x.shape(), shape);
  if (view_strides(x.shape(), x.strides(), target)) return view(x, target);
  return view(contiguous(x), target);
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  int64_t s = wrap_dim(start_dim, x.dim(), "flatten"), e = wrap_dim(end_dim, x.dim(), "flatten");
  REEL_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  int64_t n = 1;
  for (int64_t d = s; d <= e; ++d) n *= x.shape()[d];
  shape.push_back(n);
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor y = dispatch1(OpKind::Permute, {x}, Attrs().set("dims", dims));
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[wrap_dim(dims[i], x.dim(), "permute")] = int64_t(i);
  autograd::record("permute", {x}, {y}, [inverse](const Grads& g) -> Grads { return {permute(g[0], inverse)}; });
  return y;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  int64_t a = wrap_dim(d0, x.dim(), "transpose"), b = wrap_dim(d1, x.dim(), "transpose");
  std::vector<int64_t> dims(x.dim());
  for (int64_t i = 0; i < x.dim(); ++i) dims[i] = i;
  std::swap(dims[a], dims[b]);
  return permute(x, dims);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  Attrs a = Attrs().set("dim", dim).set("start", start).set("end", end).set("step", step);
  Tensor y = dispatch1(OpKind::Slice, {x}, a);
  Shape in_shape = x.shape();
  autograd::record("slice", {x}, {y}, [in_shape, a](const Grads& g) -> Grads {
    Tensor dx = zeros(in_shape, TensorOptions{g[0].dtype(), g[0].device()});
    copy_(dispatch1(OpKind::Slice, {dx}, a), g[0]);
    return {dx};
  });
  return y;
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  int64_t d = wrap_dim(dim, x.dim(), "select");
  int64_t n = x.shape()[d];
  REEL_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dim ", d, " of size ", n,
             " (shape ", shape_str(x.shape()), ")");
  if (index < 0) index += n;
  return squeeze(slice(x, d, index, index + 1), d);
}

Tensor expand(const Tensor& x, const Shape& shape) {
  Tensor y = dispatch1(OpKind::Expand, {x}, Attrs().set("shape", shape));
  Shape in_shape = x.shape();
  autograd::record("expand", {x}, {y}, [in_shape](const Grads& g) -> Grads { return {sum_to(g[0], in_shape)}; });
  return y;
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  int64_t d = wrap_dim(dim, x.dim() + 1, "unsqueeze");
  Shape shape = x.shape();
  shape.insert(shape.begin() + d, 1);
  return view(x, shape);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  int64_t d = wrap_dim(dim, x.dim(), "squeeze");
  if (x.shape()[d] != 1) return x;
  Shape shape = x.shape();
  shape.erase(shape.begin() + d);
  return view(x, shape);
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  REEL_ASSERT(g.dim() >= int64_t(shape.size()), "sum_to ", shape_str(g.shape()), " -> ", shape_str(shape));
  size_t lead = g.dim() - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < size_t(g.dim()); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1)) dims.push_back(int64_t(i));
  if (dims.empty()) return reshape(g, shape);
  return reshape(sum(g, dims, true), shape);
}

}  // namespace reel
