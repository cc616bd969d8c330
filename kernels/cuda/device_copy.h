// A strided, casting, broadcasting copy between two tensors on one CUDA device (kernels/cuda/memory.cu).
// Kernels of every family use it to make inputs contiguous or to write into strided outputs.
#pragma once
#include "tensor/tensor.h"

namespace reel::cuda {

void copy_on_device(const Tensor& dst, const Tensor& src);

// A contiguous copy of `t` on its device (t itself when already contiguous).
inline Tensor contiguous_on_device(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  copy_on_device(c, t);
  return c;
}

}  // namespace reel::cuda
