// Schemas of the pooling and embedding ops. Pooling follows PyTorch's 2-D pooling with square
// windows, floor output sizes and symmetric padding no wider than half the window:
//
//   Ho = floor((H + 2 padding - kernel) / stride) + 1        (Wo likewise)
//
//   max_pool2d (x)                 x (N, C, H, W) float; attrs kernel, stride, padding
//                                  -> y (N, C, Ho, Wo), indices (N, C, Ho, Wo) i64: the flat h*W + w
//                                     position of each window's maximum inside its (H, W) plane
//   max_pool2d_backward (g, indices)   g, indices (N, C, Ho, Wo); attr input_shape [N, C, H, W]
//                                  -> dx (N, C, H, W): g scatter-added at indices
//   avg_pool2d (x)                 attrs kernel, stride, padding; padding counts as zeros in the
//                                  mean (count_include_pad) -> y (N, C, Ho, Wo)
//   avg_pool2d_backward (g)        attrs input_shape, kernel, stride, padding -> dx (N, C, H, W)
//   embedding (weight, indices)    weight (V, D), indices i64 of any shape -> indices.shape + (D)
//                                  (index values are range-checked by the kernel: they live on the
//                                  device, and a schema never reads tensor data)
//   embedding_backward (g, indices[, c])    g indices.shape + (D); attrs num_weights V, accumulate
//                                  (0/1) -> dweight (V, D), g's dtype; with accumulate, dweight = c +
//                                  the sums, c (V, D) being dweight itself (a gradient over micro-batches)
//
// The public functions (autograd/ops.h) turn stride -1 into stride = kernel before dispatch; the
// schemas take explicit values only.
#include "kernels/schema/schema_util.h"

namespace reel {
namespace {

struct PoolGeometry {
  int64_t kernel, stride, padding;
};

// Reads and range-checks kernel/stride/padding; `shape` is the input's, for the messages.
PoolGeometry pool_geometry(OpKind op, const Attrs& a, const Shape& shape) {
  PoolGeometry p{a.i("kernel"), a.i("stride"), a.i("padding")};
  REEL_CHECK(p.kernel >= 1, op_name(op), ": kernel must be >= 1, got ", p.kernel, " (input ", shape_str(shape), ")");
  REEL_CHECK(p.stride >= 1, op_name(op), ": stride must be >= 1, got ", p.stride, " (input ", shape_str(shape), ")");
  // As in PyTorch: a wider padding would make windows of padding only.
  REEL_CHECK(p.padding >= 0 && p.padding <= p.kernel / 2, op_name(op), ": padding must be in [0, kernel/2] = [0, ",
             p.kernel / 2, "] for kernel ", p.kernel, ", got ", p.padding, " (input ", shape_str(shape), ")");
  return p;
}

int64_t pooled_size(int64_t size, const PoolGeometry& p) { return (size + 2 * p.padding - p.kernel) / p.stride + 1; }

// (N, C, Ho, Wo) for an input of shape (N, C, H, W); both output sizes must be >= 1.
Shape pooled_shape(OpKind op, const Shape& in, const PoolGeometry& p) {
  int64_t h_out = in[2] + 2 * p.padding >= p.kernel ? pooled_size(in[2], p) : 0;
  int64_t w_out = in[3] + 2 * p.padding >= p.kernel ? pooled_size(in[3], p) : 0;
  REEL_CHECK(h_out >= 1 && w_out >= 1, op_name(op), ": input ", shape_str(in), " is too small for kernel ", p.kernel,
             " with padding ", p.padding, " and stride ", p.stride, " (output would be ", h_out, "x", w_out, ")");
  return {in[0], in[1], h_out, w_out};
}

// The input_shape attr of a pooling backward: 4 non-negative sizes whose N and C match g's.
Shape backward_input_shape(OpKind op, const Attrs& a, const Tensor& g) {
  Shape in = a.ints("input_shape");
  REEL_CHECK(in.size() == 4, op_name(op), ": input_shape must have 4 sizes (N, C, H, W), got ", shape_str(in));
  for (int64_t s : in) REEL_CHECK(s >= 0, op_name(op), ": input_shape ", shape_str(in), " has a negative size");
  REEL_CHECK(in[0] == g.shape()[0] && in[1] == g.shape()[1], op_name(op), ": gradient ", shape_str(g.shape()),
             " and input_shape ", shape_str(in), " differ in N or C");
  return in;
}

void expect_pool_input(OpKind op, const Tensor& x, const char* what) {
  schema::expect_defined(op, x, what);
  schema::expect_float(op, x, what);
  REEL_CHECK(x.dim() == 4, op_name(op), ": ", what, " must be 4-D (N, C, H, W), got shape ", shape_str(x.shape()));
}

std::vector<TensorMeta> infer_max_pool2d(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::MaxPool2d;
  schema::expect_inputs(op, in, 1);
  expect_pool_input(op, in[0], "input");
  Shape out = pooled_shape(op, in[0].shape(), pool_geometry(op, a, in[0].shape()));
  return {{out, in[0].dtype(), in[0].device()}, {out, DType::i64, in[0].device()}};
}

std::vector<TensorMeta> infer_max_pool2d_backward(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::MaxPool2dBackward;
  schema::expect_inputs(op, in, 2);
  expect_pool_input(op, in[0], "gradient");
  schema::expect_defined(op, in[1], "indices");
  schema::expect_dtype(op, in[1], DType::i64, "indices");
  REEL_CHECK(in[1].shape() == in[0].shape(), op_name(op), ": indices ", shape_str(in[1].shape()),
             " must have the gradient's shape ", shape_str(in[0].shape()));
  Shape x_shape = backward_input_shape(op, a, in[0]);
  return {{x_shape, in[0].dtype(), in[0].device()}};
}

std::vector<TensorMeta> infer_avg_pool2d(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::AvgPool2d;
  schema::expect_inputs(op, in, 1);
  expect_pool_input(op, in[0], "input");
  Shape out = pooled_shape(op, in[0].shape(), pool_geometry(op, a, in[0].shape()));
  return {{out, in[0].dtype(), in[0].device()}};
}

std::vector<TensorMeta> infer_avg_pool2d_backward(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::AvgPool2dBackward;
  schema::expect_inputs(op, in, 1);
  expect_pool_input(op, in[0], "gradient");
  Shape x_shape = backward_input_shape(op, a, in[0]);
  Shape y_shape = pooled_shape(op, x_shape, pool_geometry(op, a, x_shape));
  REEL_CHECK(y_shape == in[0].shape(), op_name(op), ": gradient ", shape_str(in[0].shape()),
             " does not match the pooled shape ", shape_str(y_shape), " of input_shape ", shape_str(x_shape));
  return {{x_shape, in[0].dtype(), in[0].device()}};
}

std::vector<TensorMeta> infer_embedding(const std::vector<Tensor>& in, const Attrs&) {
  constexpr OpKind op = OpKind::Embedding;
  schema::expect_inputs(op, in, 2);
  schema::expect_defined(op, in[0], "weight");
  schema::expect_defined(op, in[1], "indices");
  REEL_CHECK(in[0].dim() == 2, "embedding: weight must be 2-D (V, D), got shape ", shape_str(in[0].shape()));
  REEL_CHECK(in[1].dtype() == DType::i64, "embedding: indices must be i64, got ", dtype_name(in[1].dtype()),
             " (shape ", shape_str(in[1].shape()), "); cast them with .to(DType::i64)");
  Shape out = in[1].shape();
  out.push_back(in[0].shape()[1]);
  return {{out, in[0].dtype(), in[0].device()}};
}

std::vector<TensorMeta> infer_embedding_backward(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::EmbeddingBackward;
  const bool accumulate = a.b("accumulate", false);
  REEL_CHECK(!accumulate || in.size() == 3, "embedding_backward: accumulate adds to the gradient given as a third ",
             "input (g, indices, dweight); got ", in.size(), " inputs");
  schema::expect_inputs(op, in, accumulate ? 3 : 2);
  schema::expect_defined(op, in[0], "gradient");
  schema::expect_defined(op, in[1], "indices");
  schema::expect_float(op, in[0], "gradient");
  schema::expect_dtype(op, in[1], DType::i64, "indices");
  int64_t v = a.i("num_weights");
  REEL_CHECK(v >= 0, "embedding_backward: num_weights must be >= 0, got ", v);
  const Shape& g = in[0].shape();
  Shape lead(g.begin(), g.end() - (g.empty() ? 0 : 1));
  REEL_CHECK(!g.empty() && lead == in[1].shape(), "embedding_backward: gradient ", shape_str(g),
             " must be indices.shape + (D) for indices ", shape_str(in[1].shape()));
  const Shape dweight{v, g.back()};
  if (accumulate)
    REEL_CHECK(in[2].defined() && in[2].shape() == dweight && in[2].dtype() == in[0].dtype(),
               "embedding_backward: the gradient to add to ", in[2].defined() ? schema::desc(in[2]) : "(undefined)",
               " must be ", dtype_name(in[0].dtype()), " of shape ", shape_str(dweight));
  return {{dweight, in[0].dtype(), in[0].device()}};
}

}  // namespace

void register_pool_schemas() {
  register_schema(OpKind::MaxPool2d, infer_max_pool2d);
  register_schema(OpKind::MaxPool2dBackward, infer_max_pool2d_backward);
  register_schema(OpKind::AvgPool2d, infer_avg_pool2d);
  register_schema(OpKind::AvgPool2dBackward, infer_avg_pool2d_backward);
  register_schema(OpKind::Embedding, infer_embedding);
  register_schema(OpKind::EmbeddingBackward, infer_embedding_backward);
}

}  // namespace reel
