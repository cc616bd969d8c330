// cuDNN's fused scaled-dot-product attention (its graph API, through the header-only cuDNN frontend)
// as a second implementation of the CUDA attention op, beside reel's own kernels
// (kernels/cuda/attention.cu), which stay the readable reference and run every case this one does
// not take. attention.cu chooses between the two per call (kernels/autotune.h: set_cudnn_attention,
// and with autotuning on, the faster per shape). Declared without CUDA types; defined in
// attention_cudnn.cu.
//
// The same operands as attention_fwd_into / attention_bwd_into (kernels/cuda/attention.h): qkv
// (B, T, 3d) with the heads' q, k, v as strided views of it (no split or transpose is copied), y
// (B, T, d), lse (B, H, T) f32, dqkv (B, T, 3d). cuDNN reads and writes the 16-bit compute dtype:
//   forward   O = softmax(scale Q K^T [causal]) V into y16 (or y, when y is in the compute dtype);
//             an f32 y is then O widened. Stats = max + log(sum exp) of the scaled scores, natural
//             log, into lse: the readable kernels' lse, so either kind of forward feeds either
//             kind of backward.
//   backward  dQ, dK, dV into dqkv16 (or dqkv in the compute dtype) in qkv's packed layout; an f32
//             dqkv is then widened. f32 operands (qkv, y, dy) are rounded to the compute dtype first,
//             as the readable kernels round them on load.
// So an f32 y or dqkv carries 16-bit precision here: exactly what the next GEMM reads under autocast.
//
// Taken when: the build has the frontend (REEL_CUDNN_FRONTEND), compute f16 or bf16, values f32 or
// the compute dtype, no mask, head size a multiple of 8 up to 128, outputs contiguous and 16-byte
// aligned, and cuDNN builds a plan for the shape (tried once per shape and remembered). Otherwise the
// functions return false having done nothing.
#pragma once
#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace reel::cuda {

bool cudnn_attention_fwd(const Tensor& qkv, int64_t heads, DType compute, const Tensor& y, const Tensor& lse,
                         const Tensor& y16, bool causal);
bool cudnn_attention_bwd(const Tensor& dy, const Tensor& qkv, const Tensor& y, const Tensor& lse, int64_t heads,
                         DType compute, const Tensor& dqkv, const Tensor& dqkv16, bool causal);

// Launches through cuDNN so far in this process (tests check which implementation ran).
int64_t cudnn_attention_calls();
// Why the last plan cuDNN refused was refused ("" when none was): tests and bench logs print it.
std::string cudnn_attention_last_refusal();

}  // namespace reel::cuda
