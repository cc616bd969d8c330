// GEMM epilogue fusion: a Linear layer's
//
//   y = matmul(x, W^T)            x (..., K), W^T (K, N)          (16-bit under autocast)
//  [y = copy(y) to f32]           autocast's cast of the result back to f32
//   z = add(y, bias)              bias (N)
//
// traced as two or three consecutive kernels, becomes one cuBLASLt GEMM with the BIAS epilogue
// (kernels/cuda/gemm_epilogue.h): the bias is added to the f32 accumulator and the result written
// once, in f32 when the cast was there. Only on CUDA tensors, when x's batch folds into the GEMM's
// rows, the intermediates are Internal buffers read by nothing else, and cuBLASLt has an algorithm.
// Results differ from the unfused kernels only by the GEMM's summation order (and, in 16-bit, by
// skipping the rounding of y before the bias: the fused result is the more accurate one).
#pragma once
#include "compile/passes.h"

namespace reel::compile {

void fuse_gemm_epilogue(Graph& g, PassStats& stats);

// Whether n is a GEMM + bias node made by fuse_gemm_epilogue (and possibly kept 16-bit by
// store_gemm_bias_16bit): inputs x, W^T, bias; output z. False without CUDA.
bool is_gemm_bias(const Node& n);

// 16-bit GEMM results: a fused GEMM + bias of 16-bit operands writing f32 z, where every reader of z
// either rounds it to 16 bits anyway or is elementwise, writes z in the operands' dtype instead (the
// bias added to the f32 accumulator, one rounding), which halves what the step keeps of z for the
// backward. Readers it takes, as a GPT's are:
//   causal_attention / its backward reading z as qkv (the qkv projection): the kernels round qkv to
//     the compute dtype before use, so they read the same bits as before (kernels/cuda/attention.h);
//   elementwise ops (the MLP's GELU and its backward reading the fc layer's z): each gets a cast of
//     z back to f32 just before it, which elementwise fusion folds into its kernel. GELU then sees z
//     rounded to 16 bits, as under PyTorch's autocast: within tolerance of eager, not bitwise.
// z must be an Internal buffer written once and read by nothing else, and cuBLASLt must have an
// algorithm for the 16-bit result: with the f32 bias where it takes one (cuBLAS 13 on the H200 does
// not), or else with the bias cast to 16 bits, as PyTorch's autocast rounds it (one cast per bias,
// made before its first GEMM and reused until something writes the bias). Runs after fuse_gemm_epilogue and fuse_attention_cast, before
// elementwise fusion.
void store_gemm_bias_16bit(Graph& g, PassStats& stats);

}  // namespace reel::compile
