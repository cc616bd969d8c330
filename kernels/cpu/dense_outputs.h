// The CPU's run_into_contiguous (kernels/dense_outputs.h) with the host strided copy.
#pragma once
#include "kernels/dense_outputs.h"

namespace reel::cpu {

void copy_strided(const Tensor& dst, const Tensor& src);  // kernels/cpu/memory.cpp

inline void run_into_contiguous(const KernelCall& call, KernelFn kernel) {
  reel::run_into_contiguous(call, kernel, copy_strided);
}

}  // namespace reel::cpu
