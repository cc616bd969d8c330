// The GEMM threading policy shared by matmul.cpp and conv2d.cpp; defined in linalg.cpp, where the
// reasons are written out.
#pragma once
#include <cstdint>

#include "kernels/cpu/dense_outputs.h"

namespace reel::cpu {

// Whether a batch of `count` GEMMs of `flops_each` should be split over threads (one GEMM each).
bool split_gemm_batch(int64_t count, double flops_each);
// Narrows the calling thread's OpenMP team to one when a GEMM of `flops` is too small to split;
// returns the previous setting for restore_gemm_threads.
int narrow_gemm_threads(double flops);
void restore_gemm_threads(int saved);

// Keeps Eigen to the calling thread for this scope when a GEMM of `flops` is too small to split.
struct GemmThreadScope {
  explicit GemmThreadScope(double flops) : saved(narrow_gemm_threads(flops)) {}
  ~GemmThreadScope() { restore_gemm_threads(saved); }
  GemmThreadScope(const GemmThreadScope&) = delete;
  GemmThreadScope& operator=(const GemmThreadScope&) = delete;
  int saved;
};

}  // namespace reel::cpu
