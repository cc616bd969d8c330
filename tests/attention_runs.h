// The attention op through the dispatch door, forward and backward, as the attention test files run it
// (CPU reference, reel's CUDA kernels, cuDNN's): one place for the attributes and the inputs' order
// (kernels/schema/attention.cpp).
#pragma once
#include <gtest/gtest.h>

#include <vector>

#include "kernels/dispatch.h"

namespace reel::testing_util {

struct AttentionRun {
  Tensor y, lse, dqkv;
};

inline Attrs attention_attrs(int64_t heads, DType compute, bool causal) {
  return Attrs().set("heads", heads).set("compute", compute).set("causal", causal);
}

// y, lse of qkv (B, T, 3d); dqkv left undefined.
inline AttentionRun attention_forward(const Tensor& qkv, int64_t heads, DType compute, bool causal = true,
                                      const Tensor& mask = Tensor()) {
  std::vector<Tensor> in{qkv};
  if (mask.defined()) in.push_back(mask);
  std::vector<Tensor> f = dispatch(OpKind::Attention, in, attention_attrs(heads, compute, causal));
  return {f[0], f[1], Tensor()};
}

// dqkv from dy and a forward's y, lse.
inline Tensor attention_backward(const Tensor& dy, const Tensor& qkv, const AttentionRun& f, int64_t heads,
                                 DType compute, bool causal = true, const Tensor& mask = Tensor()) {
  std::vector<Tensor> in{dy, qkv, f.y, f.lse};
  if (mask.defined()) in.push_back(mask);
  return dispatch(OpKind::AttentionBackward, in, attention_attrs(heads, compute, causal))[0];
}

// Forward, then backward on its outputs.
inline AttentionRun attention_run(const Tensor& qkv, const Tensor& dy, int64_t heads, DType compute,
                                  bool causal = true, const Tensor& mask = Tensor()) {
  AttentionRun r = attention_forward(qkv, heads, compute, causal, mask);
  r.dqkv = attention_backward(dy, qkv, r, heads, compute, causal, mask);
  return r;
}

// A second run gave the first's bits (no float atomics; the same kernels chosen).
inline void expect_same_bits(const AttentionRun& again, const AttentionRun& first) {
  EXPECT_EQ(again.y.to_vector<double>(), first.y.to_vector<double>()) << "y changed between runs";
  EXPECT_EQ(again.dqkv.to_vector<double>(), first.dqkv.to_vector<double>()) << "dqkv changed between runs";
}

}  // namespace reel::testing_util
