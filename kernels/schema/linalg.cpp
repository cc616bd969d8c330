// Schemas of the linalg family: matrix multiply and 2-D convolution (forward and the two backward ops).
// Float dtypes only (f32, f64, f16, bf16); all inputs of one op share a dtype (reel does not promote).
//
//   matmul (a, b)
//     a (..., M, K) @ b (..., K, N) -> (..., M, N). Both operands have >= 2 dims; their batch dims
//     (all but the last two) broadcast NumPy-style. 1-D operands are handled by the public matmul()
//     (autograd/functions/linalg.cpp), which unsqueezes and squeezes around this op.
//   conv2d (x, w, bias)       attrs stride [sh, sw], padding [ph, pw]
//     x (N, C, H, W), w (O, C, kH, kW), bias (O) or undefined -> y (N, O, Ho, Wo),
//     Ho = (H + 2 ph - kH) / sh + 1, Wo = (W + 2 pw - kW) / sw + 1 (floor division).
//   conv2d_backward_input (g, w)   attrs input_shape [N, C, H, W], stride, padding -> dx (N, C, H, W)
//   conv2d_backward_weight (g, x)  attrs weight_shape [O, C, kH, kW], stride, padding -> dw (O, C, kH, kW)
//
// Stride and padding are stored as two-element lists [h, w] even though the public conv2d() takes
// single ints and repeats them: the kernels already honour separate h/w values, so a future
// conv2d(x, w, b, {sh, sw}, {ph, pw}) overload only needs to fill the attrs differently.
#include "kernels/schema/schema_util.h"

namespace reel {
namespace {

// ---- matmul ----

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

std::vector<TensorMeta> infer_matmul(const std::vector<Tensor>& in, const Attrs&) {
  constexpr OpKind op = OpKind::Matmul;
  schema::expect_inputs(op, in, 2);
  schema::expect_defined(op, in[0], "first input");
  schema::expect_defined(op, in[1], "second input");
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  REEL_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: the matmul op needs operands with at least 2 dims, got shapes ",
             shape_str(a.shape()), " and ", shape_str(b.shape()), " (the public matmul() handles 1-D operands)");
  schema::expect_same_dtype(op, a, b);
  REEL_CHECK(is_floating(a.dtype()), "matmul: dtype ", dtype_name(a.dtype()), " is not supported (shapes ",
             shape_str(a.shape()), " and ", shape_str(b.shape()), "; expected f32, f64, f16 or bf16)");
  int64_t M = a.shape()[a.dim() - 2], K = a.shape()[a.dim() - 1];
  int64_t Kb = b.shape()[b.dim() - 2], N = b.shape()[b.dim() - 1];
  REEL_CHECK(K == Kb, "matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
             " cannot be multiplied (inner dims ", K, " and ", Kb, " differ)");
  Shape ba = batch_of(a.shape()), bb = batch_of(b.shape());
  size_t n = std::max(ba.size(), bb.size());
  Shape batch(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t sa = i < n - ba.size() ? 1 : ba[i - (n - ba.size())];
    int64_t sb = i < n - bb.size() ? 1 : bb[i - (n - bb.size())];
    REEL_CHECK(sa == sb || sa == 1 || sb == 1, "matmul: batch dims ", shape_str(ba), " and ", shape_str(bb),
               " of shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()), " cannot be broadcast (", sa,
               " vs ", sb, ")");
    batch[i] = sa == 1 ? sb : sa;
  }
  batch.push_back(M);
  batch.push_back(N);
  return {{batch, a.dtype(), a.device()}};
}

// ---- conv2d ----

struct ConvParams {
  int64_t sh, sw, ph, pw;
};

// Reads and validates the stride/padding attrs ([h, w] lists) of a convolution of x by w.
ConvParams conv_params(OpKind op, const Attrs& a, const Shape& x, const Shape& w) {
  const auto& s = a.ints("stride");
  const auto& p = a.ints("padding");
  REEL_CHECK(s.size() == 2 && p.size() == 2, op_name(op), ": stride and padding must be [h, w] pairs, got ",
             shape_str(s), " and ", shape_str(p));
  REEL_CHECK(s[0] >= 1 && s[1] >= 1, op_name(op), ": stride must be >= 1, got ", shape_str(s), " (input ",
             shape_str(x), ", weight ", shape_str(w), ")");
  REEL_CHECK(p[0] >= 0 && p[1] >= 0, op_name(op), ": padding must be >= 0, got ", shape_str(p), " (input ",
             shape_str(x), ", weight ", shape_str(w), ")");
  return {s[0], s[1], p[0], p[1]};
}

// The output shape of x_shape (N, C, H, W) convolved with w_shape (O, C, kH, kW), checking the pair.
Shape conv_output_shape(OpKind op, const Shape& x, const Shape& w, const ConvParams& cp) {
  REEL_CHECK(x[1] == w[1], op_name(op), ": input of shape ", shape_str(x), " has ", x[1],
             " channels but the weight of shape ", shape_str(w), " expects ", w[1]);
  REEL_CHECK(w[0] >= 1 && w[2] >= 1 && w[3] >= 1, op_name(op), ": weight of shape ", shape_str(w),
             " has an empty dim");
  int64_t hp = x[2] + 2 * cp.ph, wp = x[3] + 2 * cp.pw;
  REEL_CHECK(w[2] <= hp && w[3] <= wp, op_name(op), ": kernel ", w[2], "x", w[3], " (weight ", shape_str(w),
             ") is larger than the padded input ", hp, "x", wp, " (input ", shape_str(x), ", padding [", cp.ph,
             ", ", cp.pw, "])");
  return {x[0], w[0], (hp - w[2]) / cp.sh + 1, (wp - w[3]) / cp.sw + 1};
}

std::vector<TensorMeta> infer_conv2d(const std::vector<Tensor>& in, const Attrs& attrs) {
  constexpr OpKind op = OpKind::Conv2d;
  schema::expect_inputs(op, in, 3);
  schema::expect_defined(op, in[0], "input");
  schema::expect_defined(op, in[1], "weight");
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  const Tensor& bias = in[2];
  REEL_CHECK(x.dim() == 4, "conv2d: input must be (N, C, H, W), got shape ", shape_str(x.shape()));
  REEL_CHECK(w.dim() == 4, "conv2d: weight must be (O, C, kH, kW), got shape ", shape_str(w.shape()));
  schema::expect_same_dtype(op, x, w);
  schema::expect_float(op, x);
  if (bias.defined()) {
    schema::expect_same_dtype(op, x, bias);
    REEL_CHECK(bias.dim() == 1 && bias.shape()[0] == w.shape()[0], "conv2d: bias must have shape ",
               shape_str({w.shape()[0]}), " for weight of shape ", shape_str(w.shape()), ", got ",
               shape_str(bias.shape()));
  }
  Shape y = conv_output_shape(op, x.shape(), w.shape(), conv_params(op, attrs, x.shape(), w.shape()));
  return {{y, x.dtype(), x.device()}};
}

// Checks that g has the shape the forward produced for (x_shape, w_shape).
void expect_grad_shape(OpKind op, const Tensor& g, const Shape& x, const Shape& w, const ConvParams& cp) {
  Shape y = conv_output_shape(op, x, w, cp);
  REEL_CHECK(g.shape() == y, op_name(op), ": gradient of shape ", shape_str(g.shape()), " does not match the output ",
             shape_str(y), " of input ", shape_str(x), " and weight ", shape_str(w));
}

std::vector<TensorMeta> infer_conv2d_backward_input(const std::vector<Tensor>& in, const Attrs& attrs) {
  constexpr OpKind op = OpKind::Conv2dBackwardInput;
  schema::expect_inputs(op, in, 2);
  schema::expect_defined(op, in[0], "gradient");
  schema::expect_defined(op, in[1], "weight");
  schema::expect_ndim(op, in[0], 4, "gradient");
  schema::expect_ndim(op, in[1], 4, "weight");
  schema::expect_same_dtype(op, in[0], in[1]);
  schema::expect_float(op, in[0]);
  const Shape& x = attrs.ints("input_shape");
  REEL_CHECK(x.size() == 4, op_name(op), ": input_shape must be (N, C, H, W), got ", shape_str(x));
  expect_grad_shape(op, in[0], x, in[1].shape(), conv_params(op, attrs, x, in[1].shape()));
  return {{x, in[0].dtype(), in[0].device()}};
}

std::vector<TensorMeta> infer_conv2d_backward_weight(const std::vector<Tensor>& in, const Attrs& attrs) {
  constexpr OpKind op = OpKind::Conv2dBackwardWeight;
  schema::expect_inputs(op, in, 2);
  schema::expect_defined(op, in[0], "gradient");
  schema::expect_defined(op, in[1], "input");
  schema::expect_ndim(op, in[0], 4, "gradient");
  schema::expect_ndim(op, in[1], 4, "input");
  schema::expect_same_dtype(op, in[0], in[1]);
  schema::expect_float(op, in[0]);
  const Shape& w = attrs.ints("weight_shape");
  REEL_CHECK(w.size() == 4, op_name(op), ": weight_shape must be (O, C, kH, kW), got ", shape_str(w));
  expect_grad_shape(op, in[0], in[1].shape(), w, conv_params(op, attrs, in[1].shape(), w));
  return {{w, in[0].dtype(), in[0].device()}};
}

}  // namespace

void register_linalg_schemas() {
  register_schema(OpKind::Matmul, infer_matmul);
  register_schema(OpKind::Conv2d, infer_conv2d);
  register_schema(OpKind::Conv2dBackwardInput, infer_conv2d_backward_input);
  register_schema(OpKind::Conv2dBackwardWeight, infer_conv2d_backward_weight);
}

}  // namespace reel
