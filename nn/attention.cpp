// Self-attention, causal or not, with an optional additive mask (math in attention.h).
#include "nn/attention.h"

#include <cmath>
#include <limits>

#include "autograd/autocast.h"  // the thread's precision policy

namespace reel::nn {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The dtype the fused op's products run in: f64 is never cast (as autocast_matmul leaves it); f32 runs
// in the policy's compute dtype.
DType compute_dtype(const Tensor& qkv) {
  return qkv.dtype() == DType::f32 ? autocast_policy().compute_dtype() : qkv.dtype();
}

// A row of scores (B, H, T, T) that is -inf throughout (every key masked) gets probabilities 0 rather
// than softmax's 0/0, as the fused op does: its scores are zeroed before the softmax (so neither the
// softmax nor its backward sees -inf - -inf) and its probabilities after.
Tensor softmax_of_rows_with_keys(const Tensor& scores) {
  Tensor dead = eq(max(scores.detach(), {-1}, true), full({1}, -kInf, TensorOptions{scores.dtype()}.with_device(scores.device())));  // (B, H, T, 1)
  Tensor zero = zeros({1}, TensorOptions{scores.dtype()}.with_device(scores.device()));
  return where(dead, zero, softmax(where(dead, zero, scores), -1));
}

}  // namespace

Tensor attention(const Tensor& qkv, int64_t heads, bool causal, const Tensor& mask) {
  return scaled_dot_product_attention(qkv, heads, causal, mask, compute_dtype(qkv));
}

Tensor attention_unfused(const Tensor& qkv, int64_t heads, bool causal, const Tensor& mask) {
  REEL_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "attention: qkv ", shape_str(qkv.shape()), " must be (B, T, 3d)");
  int64_t B = qkv.size(0), T = qkv.size(1), d = qkv.size(2) / 3;
  REEL_CHECK(heads > 0 && d % heads == 0, "attention: heads ", heads, " must divide d ", d);
  int64_t hd = d / heads;
  std::vector<Tensor> parts = split(qkv, d, 2);  // q, k, v: (B, T, d)
  auto to_heads = [&](const Tensor& t) { return t.reshape({B, T, heads, hd}).transpose(1, 2); };  // (B, H, T, hd)
  Tensor q = to_heads(parts[0]), k = to_heads(parts[1]), v = to_heads(parts[2]);
  // The 1/sqrt(hd) scale goes on q (B, H, T, hd) rather than on the scores (B, H, T, T): T/hd times
  // fewer elements, and q comes out contiguous, so the GEMM reads it without a copy.
  Tensor scores = autocast_matmul(q * (1.0 / std::sqrt(double(hd))), k.transpose(-2, -1), autocast_policy());  // (B, H, T, T)
  if (mask.defined()) scores = scores + mask.detach().to(scores.dtype());  // broadcast to (B, H, T, T)
  if (causal) {
    // future: (T, T), 1 where key s comes after query t
    Tensor pos = arange(T, TensorOptions{}.with_dtype(DType::i64).with_device(qkv.device()));
    Tensor future = gt(pos.unsqueeze(0), pos.unsqueeze(1));
    scores = masked_fill(scores, future, -kInf);
  }
  // Without a mask every row keeps a key (its own position when causal): the plain softmax.
  Tensor p = mask.defined() ? softmax_of_rows_with_keys(scores) : softmax(scores, -1);
  Tensor y = autocast_matmul(p, v, autocast_policy());  // (B, H, T, hd)
  return y.transpose(1, 2).reshape({B, T, d});
}

Tensor causal_attention(const Tensor& qkv, int64_t heads) { return attention(qkv, heads, true); }
Tensor causal_attention_unfused(const Tensor& qkv, int64_t heads) { return attention_unfused(qkv, heads, true); }

Tensor key_padding_mask(const Tensor& padding, DType dtype) {
  REEL_CHECK(padding.defined() && padding.dim() == 2, "key_padding_mask: padding ",
             padding.defined() ? shape_str(padding.shape()) : std::string("(undefined)"),
             " must be (B, T): nonzero where a key is to be ignored");
  REEL_CHECK(is_floating(dtype), "key_padding_mask: dtype ", dtype_name(dtype), " must be a float dtype");
  const int64_t B = padding.size(0), T = padding.size(1);
  Tensor ignore = padding.detach().reshape({B, 1, 1, T}).to(dtype);  // 1 where ignored
  return masked_fill(zeros({B, 1, 1, T}, TensorOptions{dtype}.with_device(padding.device())), ignore, -kInf);
}

SelfAttention::SelfAttention(int64_t dim, int64_t heads, bool causal, Generator* gen)
    : SelfAttention("SelfAttention", dim, heads, causal, gen) {}

SelfAttention::SelfAttention(std::string type_name, int64_t dim, int64_t heads, bool causal, Generator* gen)
    : Module(type_name), dim_(dim), heads_(heads), causal_(causal) {
  REEL_CHECK(dim > 0 && heads > 0 && dim % heads == 0, type_name, ": heads ", heads, " must be positive and divide dim ",
             dim);
  qkv_ = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim, true, gen));
  proj_ = register_module("proj", std::make_shared<Linear>(dim, dim, true, gen));
}

Tensor SelfAttention::forward(const Tensor& x) { return forward(x, Tensor()); }

Tensor SelfAttention::forward(const Tensor& x, const Tensor& mask) {
  REEL_CHECK(x.dim() == 3 && x.size(2) == dim_, type_name(), ": input ", shape_str(x.shape()), " must be (B, T, ", dim_,
             ")");
  return proj_->forward(attention(qkv_->forward(x), heads_, causal_, mask));
}

CausalSelfAttention::CausalSelfAttention(int64_t dim, int64_t heads, Generator* gen)
    : SelfAttention("CausalSelfAttention", dim, heads, true, gen) {}

}  // namespace reel::nn
