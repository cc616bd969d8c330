// Fused scaled-dot-product self-attention, forward beside backward (the math is in
// kernels/cpu/attention.cpp).
//
//   y = softmax(q k^T / sqrt(hd) + mask, causal) v per head, from qkv (B, T, 3d), heads merged
//
// The forward op returns y and the per-row log-sum-exp of the scores; backward saves qkv, y and lse
// (B H T values) and recomputes the probabilities from them, so a layer keeps O(T d) for its backward
// instead of the (B, H, T, T) probabilities the unfused softmax(q k^T) v keeps. The backward op is not
// itself differentiable (no double backward through attention). The mask is a constant: the backward
// reads it to recompute P but returns no gradient for it, and a mask that requires grad is rejected
// rather than silently left without one.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"

namespace reel {

using autograd::Grads;
using autograd::saved;

namespace {

// The additive mask as the op takes it: in the accumulation dtype (f32; f64 for f64 qkv).
Tensor additive_mask(const Tensor& mask, const Tensor& qkv) {
  REEL_CHECK(!mask.requires_grad(), "attention: mask ", shape_str(mask.shape()), " ", dtype_name(mask.dtype()),
             " requires grad; attention masks are constants (detach it: no gradient flows to a mask)");
  REEL_CHECK(is_floating(mask.dtype()), "attention: mask ", shape_str(mask.shape()), " is ", dtype_name(mask.dtype()),
             "; expected an additive float mask (0 keeps a key, -inf removes it; nn::key_padding_mask turns a "
             "0/1 key padding into one)");
  const DType acc = qkv.dtype() == DType::f64 ? DType::f64 : DType::f32;
  return mask.dtype() == acc ? mask : mask.to(acc);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& qkv, int64_t heads, bool is_causal, const Tensor& attn_mask,
                                    std::optional<DType> compute) {
  REEL_CHECK(qkv.defined(), "attention: qkv is undefined");
  Attrs attrs = Attrs().set("heads", heads).set("compute", compute.value_or(qkv.dtype())).set("causal", is_causal);
  std::vector<Tensor> in{qkv};
  if (attn_mask.defined()) in.push_back(additive_mask(attn_mask, qkv));
  std::vector<Tensor> out = dispatch(OpKind::Attention, in, attrs);  // y (B, T, d), lse (B, H, T)
  Tensor xs = saved(qkv), ys = saved(out[0]), lse = saved(out[1]);
  Tensor mask = in.size() > 1 ? saved(in[1]) : Tensor();
  autograd::record("attention", {qkv}, {out[0]}, [=](const Grads& g) -> Grads {
    std::vector<Tensor> bin{g[0], xs, ys, lse};
    if (mask.defined()) bin.push_back(mask);
    return {dispatch(OpKind::AttentionBackward, bin, attrs)[0]};
  });
  return out[0];
}

Tensor scaled_causal_attention(const Tensor& qkv, int64_t heads, std::optional<DType> compute) {
  return scaled_dot_product_attention(qkv, heads, true, Tensor(), compute);
}

}  // namespace reel
