// Schemas of the linalg family: matrix multiply and 2-D convolution (forward and the two backward ops).
// Float dtypes only (f32, f64, f16, bf16); all inputs of one op share a dtype (reel does not promote).
//
//   matmul (a, b)
//     a (..., M, K) @ b (..., K, N) -> (..., M, N). Both operands have >= 2 dims; their batch dims
//     (all but the last two) broadcast NumPy-style. 1-D operands are handled by the public matmul()
//     (autograd/functions/linalg.cpp), which unsqueezes and squeezes around this op.
//   conv2d (x, w, bias)       attrs stride [sh, sw], padding [ph, pw], groups G (absent: 1)
//     x (N, C, H, W), w (O, C/G, kH, kW), bias (O) or undefined -> y (N, O, Ho, Wo),
//     Ho = (H + 2 ph - kH) / sh + 1, Wo = (W + 2 pw - kW) / sw + 1 (floor division).
//     Groups (PyTorch's): C and O split into G equal groups, output channel o sees only the input
//     channels of its group, [o / (O/G) * C/G, +C/G); G == C is the depthwise convolution (channel
//     multiplier O/C). Both C and O must be divisible by G.
//   conv2d_backward_input (g, w)   attrs input_shape [N, C, H, W], stride, padding, groups -> dx (N, C, H, W)
//   conv2d_backward_weight (g, x)  attrs weight_shape [O, C/G, kH, kW], stride, padding, groups -> dw
//
// Fused (the compiler writes them; kernels/ops.def). Products accumulate in f32 (f64 for f64) and
// are rounded once, to the result's dtype:
//   matmul_into (a, b[, c])   attrs dtype (the result's: a's or f32; default a's), transpose (0/1),
//                             accumulate (0/1)
//     out = a @ b as matmul computes it (batch dims broadcast), or its transpose (2-D operands only;
//     a Linear's weight gradient is (a @ b)^T), and with accumulate out = c + that, c being out
//     itself (cuBLAS's beta = 1: a weight gradient over micro-batches). A 16-bit product in f32 is
//     autocast's cast back to f32 without the rounding to 16 bits.
//   gemm_epilogue (a (..., K), b (K, N), bias (N))   attrs dtype (y's: a's or f32), gelu (0/1)
//     y = a @ b + bias, the bias added to the accumulator (bias in y's dtype or f32); with gelu,
//     pre = a @ b + bias and y = gelu(pre), GELU of the unrounded value -> y (..., N)[, pre (..., N)]
//
// Stride and padding are stored as two-element lists [h, w] even though the public conv2d() takes
// single ints and repeats them: the kernels already honour separate h/w values, so a future
// conv2d(x, w, b, {sh, sw}, {ph, pw}) overload only needs to fill the attrs differently.
#include <utility>

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
  int64_t sh, sw, ph, pw, groups;
};

// Reads and validates the stride/padding attrs ([h, w] lists) and groups of a convolution of x by w.
ConvParams conv_params(OpKind op, const Attrs& a, const Shape& x, const Shape& w) {
  const auto& s = a.ints("stride");
  const auto& p = a.ints("padding");
  const int64_t groups = a.i("groups", 1);
  REEL_CHECK(s.size() == 2 && p.size() == 2, op_name(op), ": stride and padding must be [h, w] pairs, got ",
             shape_str(s), " and ", shape_str(p));
  REEL_CHECK(s[0] >= 1 && s[1] >= 1, op_name(op), ": stride must be >= 1, got ", shape_str(s), " (input ",
             shape_str(x), ", weight ", shape_str(w), ")");
  REEL_CHECK(p[0] >= 0 && p[1] >= 0, op_name(op), ": padding must be >= 0, got ", shape_str(p), " (input ",
             shape_str(x), ", weight ", shape_str(w), ")");
  REEL_CHECK(groups >= 1, op_name(op), ": groups must be >= 1, got ", groups, " (input ", shape_str(x), ", weight ",
             shape_str(w), ")");
  return {s[0], s[1], p[0], p[1], groups};
}

// Checks that x (N, C, H, W) and w (O, C/G, kH, kW) agree on channels under cp.groups. With one
// group the message is the plain one: the weight's dim 1 is the input's channel count.
void check_conv_channels(OpKind op, const Shape& x, const Shape& w, int64_t G) {
  if (G == 1) {
    REEL_CHECK(x[1] == w[1], op_name(op), ": input of shape ", shape_str(x), " has ", x[1],
               " channels but the weight of shape ", shape_str(w), " expects ", w[1]);
    return;
  }
  REEL_CHECK(x[1] % G == 0, op_name(op), ": input of shape ", shape_str(x), " has ", x[1],
             " channels, which groups ", G, " does not divide (weight ", shape_str(w), ")");
  REEL_CHECK(w[0] % G == 0, op_name(op), ": weight of shape ", shape_str(w), " has ", w[0],
             " output channels, which groups ", G, " does not divide (input ", shape_str(x), ")");
  REEL_CHECK(w[1] == x[1] / G, op_name(op), ": input of shape ", shape_str(x), " has ", x[1],
             " channels, so with groups ", G, " the weight's dim 1 must be ", x[1], " / ", G, " = ", x[1] / G,
             ", but the weight of shape ", shape_str(w), " has ", w[1]);
}

// The output shape of x_shape (N, C, H, W) convolved with w_shape (O, C/G, kH, kW), checking the pair.
Shape conv_output_shape(OpKind op, const Shape& x, const Shape& w, const ConvParams& cp) {
  check_conv_channels(op, x, w, cp.groups);
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

// The dtype of a fused GEMM's result: a's, or f32 (autocast's f32 result of a 16-bit product).
DType product_dtype(OpKind op, const Tensor& a, const Attrs& attrs) {
  const DType d = attrs.has("dtype") ? attrs.dtype("dtype") : a.dtype();
  REEL_CHECK(d == a.dtype() || d == DType::f32, op_name(op), ": result dtype ", dtype_name(d), " must be ",
             dtype_name(a.dtype()), " (the operands') or f32");
  return d;
}

std::vector<TensorMeta> infer_matmul_into(const std::vector<Tensor>& in, const Attrs& attrs) {
  constexpr OpKind op = OpKind::MatmulInto;
  const bool accumulate = attrs.b("accumulate", false), transpose = attrs.b("transpose", false);
  schema::expect_inputs(op, in, accumulate ? 3 : 2);
  TensorMeta out = infer_matmul({in[0], in[1]}, {})[0];
  out.dtype = product_dtype(op, in[0], attrs);
  if (transpose) {
    REEL_CHECK(out.shape.size() == 2, "matmul_into: transpose takes 2-D operands, got ", schema::desc(in[0]), " and ",
               schema::desc(in[1]));
    std::swap(out.shape[0], out.shape[1]);
  }
  if (accumulate)
    REEL_CHECK(in[2].defined() && in[2].shape() == out.shape && in[2].dtype() == out.dtype, "matmul_into: the tensor to add to ",
               in[2].defined() ? schema::desc(in[2]) : "(undefined)", " must be ", shape_str(out.shape), " ",
               dtype_name(out.dtype));
  return {out};
}

std::vector<TensorMeta> infer_gemm_epilogue(const std::vector<Tensor>& in, const Attrs& attrs) {
  constexpr OpKind op = OpKind::GemmEpilogue;
  schema::expect_inputs(op, in, 3);
  for (size_t i = 0; i < 3; ++i) schema::expect_defined(op, in[i], i == 0 ? "a" : i == 1 ? "b" : "bias");
  schema::expect_ndim(op, in[1], 2, "b");
  TensorMeta y = infer_matmul({in[0], in[1]}, {})[0];
  y.dtype = product_dtype(op, in[0], attrs);
  const Tensor& bias = in[2];
  REEL_CHECK(bias.shape() == Shape{in[1].size(1)} && (bias.dtype() == y.dtype || bias.dtype() == DType::f32),
             "gemm_epilogue: bias ", schema::desc(bias), " must be (", in[1].size(1), ") in ", dtype_name(y.dtype),
             " or f32");
  if (!attrs.b("gelu", false)) return {y};
  return {y, y};
}

void register_linalg_schemas() {
  register_schema(OpKind::Matmul, infer_matmul);
  register_schema(OpKind::Conv2d, infer_conv2d);
  register_schema(OpKind::Conv2dBackwardInput, infer_conv2d_backward_input);
  register_schema(OpKind::Conv2dBackwardWeight, infer_conv2d_backward_weight);
  register_schema(OpKind::MatmulInto, infer_matmul_into);
  register_schema(OpKind::GemmEpilogue, infer_gemm_epilogue);
}

}  // namespace reel
