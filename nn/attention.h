// Causal multi-head self-attention (GPT-2's, as MODELS.md writes it).
//
//   qkv: (B, T, 3d) split into q, k, v: (B, T, d), each viewed as H heads: (B, H, T, d/H)
//   scores = q k^T / sqrt(d/H): (B, H, T, T); scores[t, s] = -inf for s > t (causal mask)
//   y = softmax(scores, -1) @ v: (B, H, T, d/H), heads concatenated back to (B, T, d)
// The row of every query keeps at least its own position, so no softmax row is all -inf.
// causal_attention() runs it as one fused op (scaled_causal_attention, autograd/ops.h): q, k, v are read
// from qkv's columns and y is written with the heads merged, and backward recomputes the probabilities
// from each row's log-sum-exp instead of keeping (B, H, T, T) of them. Its products run in the autocast
// policy's compute dtype, as autocast_matmul's do. causal_attention_unfused() is the same math as the
// textbook chain of ops (split, transpose, matmul, mask, softmax, matmul): the reference it is tested
// against. causal_attention() is the core shared by CausalSelfAttention (qkv Linear, core, proj Linear) and
// the GPT block of models.h (which owns its qkv/proj directly, to match the PyTorch peer's names).
#pragma once
#include "nn/layers.h"

namespace reel::nn {

// qkv: (B, T, 3d) -> (B, T, d), before the output projection.
Tensor causal_attention(const Tensor& qkv, int64_t heads);
Tensor causal_attention_unfused(const Tensor& qkv, int64_t heads);

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t dim, int64_t heads, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x: (B, T, d) -> (B, T, d)

 private:
  int64_t dim_, heads_;
  std::shared_ptr<Linear> qkv_, proj_;
};

}  // namespace reel::nn
