// Schemas of fused causal self-attention (the math is in kernels/cpu/attention.cpp).
//
//   causal_attention (qkv (B, T, 3d))                 attrs heads (H, divides d), compute (a DType)
//       -> y (B, T, d) qkv's dtype, lse (B, H, T) in the accumulation type (f32; f64 for f64 qkv)
//   causal_attention_backward (dy (B, T, d), qkv (B, T, 3d), y (B, T, d), lse (B, H, T))
//       attrs heads, compute                          -> dqkv (B, T, 3d) qkv's dtype
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

std::vector<TensorMeta> infer_causal_attention(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::CausalAttention;
  schema::expect_inputs(op, in, 1);
  const AttentionDims n = expect_qkv(op, in[0], a);
  const Device dev = in[0].device();
  return {{{n.B, n.T, n.d}, in[0].dtype(), dev}, {{n.B, n.H, n.T}, lse_dtype(in[0].dtype()), dev}};
}

std::vector<TensorMeta> infer_causal_attention_backward(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::CausalAttentionBackward;
  schema::expect_inputs(op, in, 4);
  const Tensor &dy = in[0], &qkv = in[1], &y = in[2], &lse = in[3];
  const AttentionDims n = expect_qkv(op, qkv, a);
  const Shape out_shape{n.B, n.T, n.d}, lse_shape{n.B, n.H, n.T};
  for (auto [t, what] : {std::pair{&dy, "gradient dy"}, std::pair{&y, "y"}}) {
    schema::expect_defined(op, *t, what);
    REEL_CHECK(t->shape() == out_shape && t->dtype() == qkv.dtype(), op_name(op), ": ", what, " ", schema::desc(*t),
               " does not match the output ", shape_str(out_shape), " ", dtype_name(qkv.dtype()), " of qkv ",
               schema::desc(qkv));
  }
  schema::expect_defined(op, lse, "lse");
  REEL_CHECK(lse.shape() == lse_shape && lse.dtype() == lse_dtype(qkv.dtype()), op_name(op), ": lse ",
             schema::desc(lse), ", expected ", shape_str(lse_shape), " ", dtype_name(lse_dtype(qkv.dtype())));
  return {schema::meta_like(qkv)};
}

}  // namespace

void register_attention_schemas() {
  register_schema(OpKind::CausalAttention, infer_causal_attention);
  register_schema(OpKind::CausalAttentionBackward, infer_causal_attention_backward);
}

}  // namespace reel
