// The additive mask of the attention op as the kernels read it: element (b, h, t, s) of a float tensor
// broadcastable to (B, H, T, T) lies at data + b sb + h sh + t st + s ss, where a dimension the mask
// lacks (its shape left-padded with 1s to four dims) or has as 1 gets stride 0. One layout serves
// every broadcast shape ((T, T), (B, 1, 1, T), (1, H, T, T), (B, H, T, T), ...) and any view (an
// expanded or sliced mask is read in place, without a copy). The schema (kernels/schema/attention.cpp)
// has checked the shape.
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace reel {

struct AttentionMaskStrides {
  int64_t b = 0, h = 0, t = 0, s = 0;  // elements per step of batch, head, query, key
};

inline AttentionMaskStrides attention_mask_strides(const Tensor& mask) {
  int64_t st[4] = {0, 0, 0, 0};
  const int64_t pad = 4 - mask.dim();
  for (int64_t i = 0; i < mask.dim(); ++i) st[pad + i] = mask.size(i) == 1 ? 0 : mask.strides()[size_t(i)];
  return {st[0], st[1], st[2], st[3]};
}

}  // namespace reel
