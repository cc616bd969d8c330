// LoopGeometry — an N-operand strided walk over a shape, with dims merged where every operand allows.
//
// Size-1 dims are dropped and neighbouring dims d, d+1 merge when, for every operand,
// stride[d] == stride[d+1] * size[d+1]. A contiguous tensor of any rank becomes one flat row; a
// transposed one stays two dims. Shared by the CPU loops (kernels/cpu/loops.h) and the CUDA
// elementwise launcher, so both backends see the same merged geometry.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "tensor/shape.h"

namespace reel {

template <size_t N>
struct LoopGeometry {
  std::vector<int64_t> sizes;                   // outermost first, after merging
  std::array<std::vector<int64_t>, N> strides;  // per operand, in elements
  int64_t numel = 1;
};

template <size_t N>
LoopGeometry<N> make_geometry(const Shape& shape, const std::array<std::vector<int64_t>, N>& strides) {
  LoopGeometry<N> g;
  g.numel = numel_of(shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !g.sizes.empty();
    for (size_t k = 0; k < N && merge; ++k) merge = g.strides[k].back() == strides[k][d] * shape[d];
    if (merge) {
      g.sizes.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) g.strides[k].back() = strides[k][d];
    } else {
      g.sizes.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) g.strides[k].push_back(strides[k][d]);
    }
  }
  if (g.sizes.empty()) {  // a single element
    g.sizes.push_back(1);
    for (size_t k = 0; k < N; ++k) g.strides[k].push_back(1);
  }
  return g;
}

}  // namespace reel
