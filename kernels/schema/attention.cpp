// Schemas of fused scaled-dot-product self-attention (the math is in kernels/cpu/attention.cpp).
//
//   attention (qkv (B, T, 3d) [, mask])        attrs heads (H, divides d), compute (a DType),
//                                              causal (bool, default 1)
//       -> y (B, T, d) qkv's dtype, lse (B, H, T) in the accumulation type (f32; f64 for f64 qkv)
//   attention_backward (dy (B, T, d), qkv (B, T, 3d), y (B, T, d), lse (B, H, T) [, mask])
//       attrs heads, compute, causal                 -> dqkv (B, T, 3d) qkv's dtype
//
// mask, the optional last input: an additive float mask in lse's dtype, broadcastable to (B, H, T, T)
// (its shape left-padded with 1s, each dim 1 or the full size), added to the scaled scores before
// the softmax; any strides (kernels/attention_mask.h). It is a constant: no gradient flows to it. The
// input count says whether there is one (as layer_norm_cast's optional residual), so a plan records
// it as any other input buffer.
//
// Both take attr dtype (optional): the result's dtype, qkv's by default, or f32 from a qkv (and dy, y)
// in the compute dtype: how the compiler keeps a GEMM's qkv in 16 bits for the f32 attention.
//
// Fused (the compiler writes them; kernels/ops.def):
//   attention_cast (qkv [, mask])     attrs heads, compute (bf16 | f16), causal, keep_f32 (default 1)
//       -> [y (B, T, d) f32,] lse, y16 = y.to(compute)          (qkv f32 or in compute)
//   attention_backward_cast (dy, qkv, y, lse [, mask])   same attrs
//       -> [dqkv (B, T, 3d) f32,] dqkv.to(compute)               (dy, qkv, y f32 or in compute)
//
// qkv holds q, k and v side by side in its last dim, as a Linear(d -> 3d) writes them, and y comes out
// with the heads already merged: the op reads and writes the layouts the projections use, so no head
// transposes or copies run around it. `compute` is the dtype the products' inputs are rounded to:
// qkv's own dtype, or f16/bf16 under mixed precision (the products accumulate in f32 either way; f64
// qkv computes in f64).
#include "kernels/schema/schema_util.h"

namespace reel {
namespace {

DType lse_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

struct AttentionDims {
  int64_t B, T, d, H;
};

AttentionDims expect_qkv(OpKind op, const Tensor& qkv, const Attrs& a) {
  schema::expect_defined(op, qkv, "qkv");
  schema::expect_float(op, qkv, "qkv");
  REEL_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, op_name(op), ": qkv ", schema::desc(qkv),
             " must be (B, T, 3d): q, k and v side by side in the last dim");
  const int64_t d = qkv.size(2) / 3, H = a.i("heads");
  REEL_CHECK(H > 0 && d % H == 0, op_name(op), ": heads ", H, " must be positive and divide d ", d,
             " (qkv ", shape_str(qkv.shape()), ")");
  const DType c = static_cast<DType>(a.i("compute"));
  const bool sixteen = (c == DType::f16 || c == DType::bf16) && qkv.dtype() != DType::f64;
  REEL_CHECK(c == qkv.dtype() || sixteen, op_name(op), ": compute dtype ", dtype_name(c), " must be qkv's dtype (",
             dtype_name(qkv.dtype()), ") or, for f32/f16/bf16 qkv, a 16-bit float");
  return {qkv.size(0), qkv.size(1), d, H};
}

// The optional mask (see the file's opening comment) of an op whose required inputs are `required`.
void expect_mask(OpKind op, const std::vector<Tensor>& in, size_t required, const Tensor& qkv, const AttentionDims& n) {
  REEL_ASSERT(in.size() == required || in.size() == required + 1, op_name(op), " takes ", required, " or ",
              required + 1, " inputs (the last one the mask), got ", in.size());
  if (in.size() == required) return;
  const Tensor& mask = in.back();
  schema::expect_defined(op, mask, "mask");
  const Shape full{n.B, n.H, n.T, n.T};
  bool broadcasts = mask.dim() <= 4;
  for (int64_t i = 0; broadcasts && i < mask.dim(); ++i) {
    const int64_t m = mask.size(i), f = full[size_t(4 - mask.dim() + i)];
    broadcasts = m == 1 || m == f;
  }
  REEL_CHECK(broadcasts, op_name(op), ": mask ", schema::desc(mask), " does not broadcast to (B, H, T, T) = ",
             shape_str(full));
  const DType want = lse_dtype(qkv.dtype());
  REEL_CHECK(mask.dtype() == want, op_name(op), ": mask ", schema::desc(mask), " must be ", dtype_name(want),
             " (the accumulation dtype of a ", dtype_name(qkv.dtype()), " qkv): an additive mask, 0 or -inf");
  REEL_CHECK(mask.device() == qkv.device(), op_name(op), ": mask ", schema::desc(mask), " is on ",
             mask.device().str(), ", qkv ", shape_str(qkv.shape()), " on ", qkv.device().str());
}

// The result's dtype: attr dtype, else qkv's. f32 from 16-bit operands is the compiler's 16-bit
// storage of what autocast computes in f32 (the kernels round the operands to compute anyway).
DType result_dtype(OpKind op, const Tensor& qkv, const Attrs& a) {
  const DType d = a.has("dtype") ? a.dtype("dtype") : qkv.dtype();
  REEL_CHECK(d == qkv.dtype() || (d == DType::f32 && qkv.dtype() == static_cast<DType>(a.i("compute"))), op_name(op),
             ": result dtype ", dtype_name(d), " must be qkv's (", dtype_name(qkv.dtype()),
             ") or f32 from a qkv in the compute dtype");
  return d;
}

// An operand that holds a (B, T, d) result or its gradient: the result's dtype, or the compute dtype.
void expect_result_like(OpKind op, const Tensor& t, const char* what, const Shape& shape, DType result, DType compute) {
  schema::expect_defined(op, t, what);
  REEL_CHECK(t.shape() == shape && (t.dtype() == result || t.dtype() == compute), op_name(op), ": ", what, " ",
             schema::desc(t), " does not match the output ", shape_str(shape), " ", dtype_name(result));
}

std::vector<TensorMeta> infer_attention(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::Attention;
  REEL_ASSERT(!in.empty(), "attention takes qkv and an optional mask, got no input");
  const AttentionDims n = expect_qkv(op, in[0], a);
  expect_mask(op, in, 1, in[0], n);
  const Device dev = in[0].device();
  return {{{n.B, n.T, n.d}, result_dtype(op, in[0], a), dev}, {{n.B, n.H, n.T}, lse_dtype(in[0].dtype()), dev}};
}

std::vector<TensorMeta> infer_attention_backward(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::AttentionBackward;
  REEL_ASSERT(in.size() >= 4, "attention_backward takes dy, qkv, y, lse and an optional mask, got ", in.size(),
              " inputs");
  const Tensor &dy = in[0], &qkv = in[1], &y = in[2], &lse = in[3];
  const AttentionDims n = expect_qkv(op, qkv, a);
  expect_mask(op, in, 4, qkv, n);
  const DType result = result_dtype(op, qkv, a), compute = static_cast<DType>(a.i("compute"));
  const Shape out_shape{n.B, n.T, n.d}, lse_shape{n.B, n.H, n.T};
  expect_result_like(op, dy, "gradient dy", out_shape, result, compute);
  expect_result_like(op, y, "y", out_shape, result, compute);
  schema::expect_defined(op, lse, "lse");
  REEL_CHECK(lse.shape() == lse_shape && lse.dtype() == lse_dtype(qkv.dtype()), op_name(op), ": lse ",
             schema::desc(lse), ", expected ", shape_str(lse_shape), " ", dtype_name(lse_dtype(qkv.dtype())));
  return {{qkv.shape(), result, qkv.device()}};
}

// The fused variants: the plain op's results in f32 (the first one dropped without keep_f32), then the
// result's copy in the compute dtype.
std::vector<TensorMeta> with_16bit_copy(OpKind op, std::vector<TensorMeta> out, const Attrs& a) {
  const DType compute = static_cast<DType>(a.i("compute"));
  REEL_CHECK(compute == DType::bf16 || compute == DType::f16, op_name(op), ": compute dtype ", dtype_name(compute),
             " must be bf16 or f16 (the dtype of the copy)");
  TensorMeta copy{out[0].shape, compute, out[0].device};
  if (!a.b("keep_f32", true)) out.erase(out.begin());
  out.push_back(copy);
  return out;
}

Attrs f32_result(const Attrs& a) { return Attrs(a).set("dtype", DType::f32); }

std::vector<TensorMeta> infer_attention_cast(const std::vector<Tensor>& in, const Attrs& a) {
  return with_16bit_copy(OpKind::AttentionCast, infer_attention(in, f32_result(a)), a);
}

std::vector<TensorMeta> infer_attention_backward_cast(const std::vector<Tensor>& in, const Attrs& a) {
  return with_16bit_copy(OpKind::AttentionBackwardCast, infer_attention_backward(in, f32_result(a)), a);
}

}  // namespace

void register_attention_schemas() {
  register_schema(OpKind::Attention, infer_attention);
  register_schema(OpKind::AttentionBackward, infer_attention_backward);
  register_schema(OpKind::AttentionCast, infer_attention_cast);
  register_schema(OpKind::AttentionBackwardCast, infer_attention_backward_cast);
}

}  // namespace reel
