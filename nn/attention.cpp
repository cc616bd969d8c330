// Causal self-attention (math in attention.h).
#include "nn/attention.h"

#include <cmath>
#include <limits>

#include "autograd/autocast.h"  // the thread's precision policy

namespace reel::nn {

Tensor causal_attention(const Tensor& qkv, int64_t heads) {
  const PrecisionPolicy& policy = autocast_policy();
  // f64 is never cast (as autocast_matmul leaves it); f32 runs in the policy's compute dtype.
  const DType compute = qkv.dtype() == DType::f32 ? policy.compute_dtype() : qkv.dtype();
  return scaled_causal_attention(qkv, heads, compute);
}

Tensor causal_attention_unfused(const Tensor& qkv, int64_t heads) {
  REEL_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "causal_attention: qkv ", shape_str(qkv.shape()),
             " must be (B, T, 3d)");
  int64_t B = qkv.size(0), T = qkv.size(1), d = qkv.size(2) / 3;
  REEL_CHECK(heads > 0 && d % heads == 0, "causal_attention: heads ", heads, " must divide d ", d);
  int64_t hd = d / heads;
  std::vector<Tensor> parts = split(qkv, d, 2);  // q, k, v: (B, T, d)
  auto to_heads = [&](const Tensor& t) { return t.reshape({B, T, heads, hd}).transpose(1, 2); };  // (B, H, T, hd)
  Tensor q = to_heads(parts[0]), k = to_heads(parts[1]), v = to_heads(parts[2]);
  // The 1/sqrt(hd) scale goes on q (B, H, T, hd) rather than on the scores (B, H, T, T): T/hd times
  // fewer elements, and q comes out contiguous, so the GEMM reads it without a copy.
  Tensor scores = autocast_matmul(q * (1.0 / std::sqrt(double(hd))), k.transpose(-2, -1), autocast_policy());  // (B, H, T, T)
  // future: (T, T), 1 where key s comes after query t
  Tensor pos = arange(T, TensorOptions{}.with_dtype(DType::i64).with_device(qkv.device()));
  Tensor future = gt(pos.unsqueeze(0), pos.unsqueeze(1));
  scores = masked_fill(scores, future, -std::numeric_limits<double>::infinity());
  Tensor y = autocast_matmul(softmax(scores, -1), v, autocast_policy());  // (B, H, T, hd)
  return y.transpose(1, 2).reshape({B, T, d});
}

CausalSelfAttention::CausalSelfAttention(int64_t dim, int64_t heads, Generator* gen)
    : Module("CausalSelfAttention"), dim_(dim), heads_(heads) {
  REEL_CHECK(dim > 0 && heads > 0 && dim % heads == 0, "CausalSelfAttention: heads ", heads,
             " must be positive and divide dim ", dim);
  qkv_ = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim, true, gen));
  proj_ = register_module("proj", std::make_shared<Linear>(dim, dim, true, gen));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  REEL_CHECK(x.dim() == 3 && x.size(2) == dim_, "CausalSelfAttention: input ", shape_str(x.shape()),
             " must be (B, T, ", dim_, ")");
  return proj_->forward(causal_attention(qkv_->forward(x), heads_));
}

}  // namespace reel::nn
