// GEMM with a bias epilogue on cuBLASLt, for the compiler's epilogue fusion (compile/fuse_gemm_epilogue.h):
//
//   y (M, N) = a (M, K) @ b (K, N) + bias (N)        one kernel: the bias is added to the f32
//                                                    accumulator before the single rounding to y's dtype
//
// a and b are read in place when matrix_layout() allows (row-major or a transposed view), share a
// dtype (f32, f16 or bf16); y is contiguous, in a's dtype or f32 (autocast's f32 result of a 16-bit
// GEMM, which saves the cast); bias is contiguous, in y's dtype or f32 (a 16-bit y from an f32 bias:
// the compiler's 16-bit activations, compile/fuse_gemm_epilogue.h). f32 uses CUBLAS_COMPUTE_32F: no
// TF32, as every reel f32 GEMM. Declared without CUDA types; defined in gemm_epilogue.cu.
#pragma once
#include "tensor/tensor.h"

namespace reel::cuda {

// Whether cuBLASLt has an algorithm for this problem (asks its heuristics once per shape; no device
// work), so that a pass can decide before it rewrites anything.
bool gemm_bias_supported(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y);
void gemm_bias(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y);

}  // namespace reel::cuda
