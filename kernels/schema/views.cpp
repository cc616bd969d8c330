// View ops: their output aliases the input's storage with new (shape, strides, offset); no kernel
// runs and no bytes move. Autograd gives each a backward in ops (autograd/functions/views.cpp).
//
//   reshape  attrs shape (one entry may be -1)       only when the strides allow; reshape() in
//                                                    autograd copies first when they do not
//   permute  attrs dims (a permutation)              strides permuted
//   slice    attrs dim, start, end, step (>0)        Python semantics: negative indices wrap, ends clamp
//   expand   attrs shape (-1 keeps a size)           size-1 dims get stride 0; new leading dims allowed
#include <optional>

#include "kernels/schema/schema_util.h"
#include "kernels/schema/views.h"

namespace reel {

std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& new_shape) {
  if (old_shape.empty() || numel_of(old_shape) == 0) return contiguous_strides(new_shape);
  Shape new_strides(new_shape.size());
  // Walk the old dims from the innermost, grouping runs that are contiguous with each other; each run
  // must be split exactly by a run of new dims.
  int64_t view_d = int64_t(new_shape.size()) - 1;
  int64_t chunk_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    bool run_ends = d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_stride);
    if (!run_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
      new_strides[view_d] = view_numel * chunk_stride;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (d > 0) {
      chunk_stride = old_strides[d - 1];
      tensor_numel = view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

Shape infer_reshape_shape(const Shape& from, const Shape& to) {
  Shape out = to;
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i] == -1) {
      REEL_CHECK(infer_at < 0, "reshape: only one dimension can be -1, got ", shape_str(to));
      infer_at = int64_t(i);
    } else {
      REEL_CHECK(to[i] >= 0, "reshape: invalid size ", to[i], " in ", shape_str(to));
      known *= to[i];
    }
  }
  int64_t n = numel_of(from);
  if (infer_at >= 0) {
    REEL_CHECK(known != 0 && n % known == 0, "reshape: cannot reshape a tensor of shape ", shape_str(from), " (", n,
               " elements) into ", shape_str(to));
    out[infer_at] = n / known;
  }
  REEL_CHECK(numel_of(out) == n, "reshape: cannot reshape a tensor of shape ", shape_str(from), " (", n,
             " elements) into ", shape_str(to), " (", numel_of(out), " elements)");
  return out;
}

namespace {

std::vector<TensorMeta> infer_reshape(const std::vector<Tensor>& in, const Attrs& a) {
  return {{infer_reshape_shape(in[0].shape(), a.ints("shape")), in[0].dtype(), in[0].device()}};
}

Tensor view_reshape(const Tensor& x, const Attrs& a) {
  Shape shape = infer_reshape_shape(x.shape(), a.ints("shape"));
  auto strides = view_strides(x.shape(), x.strides(), shape);
  REEL_CHECK(strides.has_value(), "view: shape ", shape_str(shape), " is not compatible with the strides of a ",
             shape_str(x.shape()), " tensor with strides ", shape_str(x.strides()),
             "; use reshape() (which copies when needed) or contiguous() first");
  return Tensor::make_view(x, shape, *strides, x.offset());
}

std::vector<TensorMeta> infer_permute(const std::vector<Tensor>& in, const Attrs& a) {
  const auto& dims = a.ints("dims");
  const Tensor& x = in[0];
  REEL_CHECK(int64_t(dims.size()) == x.dim(), "permute: ", dims.size(), " dims given for a tensor of shape ",
             shape_str(x.shape()));
  std::vector<bool> seen(dims.size(), false);
  Shape shape(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], x.dim(), "permute");
    REEL_CHECK(!seen[d], "permute: dims ", shape_str(dims), " are not a permutation");
    seen[d] = true;
    shape[i] = x.shape()[d];
  }
  return {{shape, x.dtype(), x.device()}};
}

Tensor view_permute(const Tensor& x, const Attrs& a) {
  const auto& dims = a.ints("dims");
  Shape shape(dims.size()), strides(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], x.dim(), "permute");
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
  }
  return Tensor::make_view(x, shape, strides, x.offset());
}

struct SliceRange {
  int64_t dim, start, len, step;
};

SliceRange slice_range(const Tensor& x, const Attrs& a) {
  REEL_CHECK(x.dim() > 0, "slice: cannot slice a 0-dim tensor");
  int64_t dim = wrap_dim(a.i("dim"), x.dim(), "slice");
  int64_t size = x.shape()[dim];
  int64_t step = a.i("step", 1);
  REEL_CHECK(step > 0, "slice: step must be positive, got ", step);
  auto clamp = [&](int64_t v) {
    if (v < 0) v += size;
    return std::min(std::max<int64_t>(v, 0), size);
  };
  int64_t start = clamp(a.i("start")), end = clamp(a.i("end"));
  int64_t len = end > start ? (end - start + step - 1) / step : 0;
  return {dim, start, len, step};
}

std::vector<TensorMeta> infer_slice(const std::vector<Tensor>& in, const Attrs& a) {
  SliceRange r = slice_range(in[0], a);
  Shape shape = in[0].shape();
  shape[r.dim] = r.len;
  return {{shape, in[0].dtype(), in[0].device()}};
}

Tensor view_slice(const Tensor& x, const Attrs& a) {
  SliceRange r = slice_range(x, a);
  Shape shape = x.shape(), strides = x.strides();
  shape[r.dim] = r.len;
  strides[r.dim] *= r.step;
  return Tensor::make_view(x, shape, strides, x.offset() + r.start * x.strides()[r.dim]);
}

Shape expand_shape(const Tensor& x, const Shape& target) {
  REEL_CHECK(target.size() >= size_t(x.dim()), "expand: cannot expand shape ", shape_str(x.shape()), " to ",
             shape_str(target), " (fewer dims)");
  Shape out = target;
  size_t lead = target.size() - x.dim();
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < lead) {
      REEL_CHECK(target[i] >= 0, "expand: new leading dim ", i, " cannot be ", target[i], " in ", shape_str(target));
      continue;
    }
    int64_t have = x.shape()[i - lead];
    if (target[i] == -1) out[i] = have;
    REEL_CHECK(out[i] == have || have == 1, "expand: cannot expand shape ", shape_str(x.shape()), " to ",
               shape_str(target), " (dim ", i, ": ", have, " is not 1)");
  }
  return out;
}

std::vector<TensorMeta> infer_expand(const std::vector<Tensor>& in, const Attrs& a) {
  return {{expand_shape(in[0], a.ints("shape")), in[0].dtype(), in[0].device()}};
}

Tensor view_expand(const Tensor& x, const Attrs& a) {
  Shape shape = expand_shape(x, a.ints("shape"));
  return Tensor::make_view(x, shape, broadcast_strides(x.shape(), x.strides(), shape), x.offset());
}

}  // namespace

void register_views_schemas() {
  register_schema(OpKind::Reshape, infer_reshape, view_reshape);
  register_schema(OpKind::Permute, infer_permute, view_permute);
  register_schema(OpKind::Slice, infer_slice, view_slice);
  register_schema(OpKind::Expand, infer_expand, view_expand);
}

}  // namespace reel
