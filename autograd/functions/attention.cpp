// Fused causal self-attention, forward beside backward (the math is in kernels/cpu/attention.cpp).
//
// The forward op returns y and the per-row log-sum-exp of the scores; backward saves qkv, y and lse
// (B H T values) and recomputes the probabilities from them, so a layer keeps O(T d) for its backward
// instead of the (B, H, T, T) probabilities the unfused softmax(q k^T) v keeps. The backward op is not
// itself differentiable (no double backward through attention).
#include "autograd/node.h"
#include "autograd/ops.h"
#include "kernels/dispatch.h"

namespace reel {

using autograd::Grads;
using autograd::saved;

Tensor scaled_causal_attention(const Tensor& qkv, int64_t heads, std::optional<DType> compute) {
  REEL_CHECK(qkv.defined(), "causal_attention: qkv is undefined");
  Attrs attrs = Attrs().set("heads", heads).set("compute", compute.value_or(qkv.dtype()));
  std::vector<Tensor> out = dispatch(OpKind::CausalAttention, {qkv}, attrs);  // y (B, T, d), lse (B, H, T)
  Tensor xs = saved(qkv), ys = saved(out[0]), lse = saved(out[1]);
  autograd::record("causal_attention", {qkv}, {out[0]}, [=](const Grads& g) -> Grads {
    return {dispatch(OpKind::CausalAttentionBackward, {g[0], xs, ys, lse}, attrs)[0]};
  });
  return out[0];
}

}  // namespace reel
