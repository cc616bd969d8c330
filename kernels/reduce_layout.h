// ReduceLayout — a reduction over any dims seen as (outer, reduced, inner), shared by the CPU and CUDA
// reduction kernels.
//
// When x is contiguous and its reduced dims (of size > 1) form one run, x is used as it is: outer is
// the product of the kept dims before the run, inner of those after it. Otherwise the kept dims are
// moved first and the reduced dims innermost (inner = 1), and that view is made contiguous by the
// backend's `densify` (a host or a device copy) when its strides require it.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace reel {

struct ReduceLayout {
  Tensor src;  // contiguous, laid out as (outer, reduced, inner)
  int64_t outer = 1, reduced = 1, inner = 1;
};

ReduceLayout reduce_layout(const Tensor& x, const std::vector<int64_t>& dims_attr, Tensor (*densify)(const Tensor&));

}  // namespace reel
