// GEMMs with a fused epilogue on cuBLASLt: the CUDA kernels of the gemm_epilogue op (which the
// compiler's gemm_epilogue and gemm_gelu passes write):
//
//   gemm_bias       y (M, N) = a (M, K) @ b (K, N) + bias (N)
//   gemm_bias_gelu  pre (M, N) = a @ b + bias,  y (M, N) = gelu(pre)       a Linear layer and its GELU
//
// One kernel each: the bias is added to the f32 accumulator, and GELU (cuBLASLt's, the tanh form
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as reel's Gelu op) is applied to the f32 value,
// before the single rounding to y's dtype. pre is written in y's dtype: the 16-bit pre-activation a
// GPT keeps for GELU's backward.
//
// a and b are read in place when matrix_layout() allows (row-major or a transposed view), share a
// dtype (f32, f16 or bf16); y is contiguous, in a's dtype or f32 (autocast's f32 result of a 16-bit
// GEMM, which saves the cast); bias is contiguous, in y's dtype or f32 (a 16-bit y from an f32 bias:
// the compiler's 16-bit activations, its gemm_16bit pass); pre is contiguous, 256-byte
// aligned (as every allocation), of y's shape and dtype, with N divisible by 8 (cuBLASLt's rule for its leading dimension).
// f32 uses CUBLAS_COMPUTE_32F: no TF32, as every reel f32 GEMM. Declared without CUDA types; defined
// in gemm_epilogue.cu.
#pragma once
#include "tensor/tensor.h"

namespace reel::cuda {

// Whether cuBLASLt has an algorithm for this problem (asks its heuristics once per shape; no device
// work), so that a pass can decide before it rewrites anything. False, not an error, for operands
// that do not fit the rules above.
bool gemm_bias_supported(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y);
void gemm_bias(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y);

bool gemm_bias_gelu_supported(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y, const Tensor& pre);
void gemm_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y, const Tensor& pre);

}  // namespace reel::cuda
