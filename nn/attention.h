// Multi-head self-attention: GPT-2's causal one (MODELS.md) and the encoder's / ViT's, every query
// seeing every key, either with an optional additive mask.
//
//   qkv: (B, T, 3d) split into q, k, v: (B, T, d), each viewed as H heads: (B, H, T, d/H)
//   scores = q k^T / sqrt(d/H) + mask: (B, H, T, T); causal: scores[t, s] = -inf for s > t
//   y = softmax(scores, -1) @ v: (B, H, T, d/H), heads concatenated back to (B, T, d)
// mask: undefined, or a float tensor broadcastable to (B, H, T, T) ((T, T), (B, 1, 1, T), ...), 0 to
// keep a key and -inf to remove it. It is a constant (no gradient; one that requires grad is
// rejected). A row whose keys are all removed gives y = 0 and a zero gradient (FlashAttention's
// convention; the unfused chain's softmax would give NaN there, so its reference sets such rows to 0
// too). key_padding_mask() turns PyTorch's key_padding_mask (nonzero = ignore that key) into the
// additive (B, 1, 1, T) mask.
// attention() runs it as one fused op (scaled_dot_product_attention, autograd/ops.h): q, k, v are read
// from qkv's columns and y is written with the heads merged, and backward recomputes the probabilities
// from each row's log-sum-exp instead of keeping (B, H, T, T) of them. Its products run in the autocast
// policy's compute dtype, as autocast_matmul's do. attention_unfused() is the same math as the
// textbook chain of ops (split, transpose, matmul, mask, softmax, matmul): the reference it is tested
// against. attention() is the core shared by SelfAttention (qkv Linear, core, proj Linear: timm's
// ViT names attn.qkv, attn.proj) and the GPT block of models.h (which owns its qkv/proj directly, to
// match the PyTorch peer's names).
#pragma once
#include "nn/layers.h"

namespace reel::nn {

// qkv: (B, T, 3d) -> (B, T, d), before the output projection.
Tensor attention(const Tensor& qkv, int64_t heads, bool causal, const Tensor& mask = {});
Tensor attention_unfused(const Tensor& qkv, int64_t heads, bool causal, const Tensor& mask = {});
// The causal shorthands (GPT's), unchanged for their callers.
Tensor causal_attention(const Tensor& qkv, int64_t heads);
Tensor causal_attention_unfused(const Tensor& qkv, int64_t heads);

// padding (B, T), any dtype, nonzero = ignore that key -> the additive mask (B, 1, 1, T): 0 where the
// key is kept, -inf where it is ignored, in `dtype`.
Tensor key_padding_mask(const Tensor& padding, DType dtype = DType::f32);

// x (B, T, dim) -> proj(attention(qkv(x), heads, causal, mask)); submodules qkv (dim -> 3 dim) and proj.
class SelfAttention : public Module {
 public:
  SelfAttention(int64_t dim, int64_t heads, bool causal, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (B, T, d) -> (B, T, d)
  Tensor forward(const Tensor& x, const Tensor& mask);
  bool causal() const { return causal_; }

 protected:
  SelfAttention(std::string type_name, int64_t dim, int64_t heads, bool causal, Generator* gen);

 private:
  int64_t dim_, heads_;
  bool causal_;
  std::shared_ptr<Linear> qkv_, proj_;
};

// GPT-2's attention: SelfAttention with causal = true (same parameter names qkv.*, proj.*).
class CausalSelfAttention : public SelfAttention {
 public:
  CausalSelfAttention(int64_t dim, int64_t heads, Generator* gen = nullptr);
};

}  // namespace reel::nn
