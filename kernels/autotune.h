// Algorithm-choice switches of the kernels. Autotuning: when on, a kernel that has several algorithms for a shape (cuDNN convolutions;
// GEMMs, kernels/cuda/gemm_autotune.h) times the candidates on the shape's first use and keeps the
// fastest that meets its precision contract, instead of taking the library's heuristic ranking —
// PyTorch's cudnn.benchmark. Choices are cached per shape (and apart from the untuned ones).
// Process-wide; compile's max-autotune mode turns it on for its function's calls. Timing runs work
// on the device and synchronises, so it is skipped (heuristics used) when the first use of a shape
// happens inside a CUDA-graph capture.
#pragma once

namespace reel {

void set_autotune(bool on);
bool autotune_enabled();

// Deterministic algorithms only (the default): kernels with a choice (cuDNN's backward-filter
// convolutions) skip those that accumulate with atomics, so the same inputs give the same bits on
// every run — what eager-vs-compiled parity and reproducible training rely on. Off, f32 cnn-small's
// step on an H200 is about 1.7 ms faster (4.4 -> 2.7 ms compiled), as in PyTorch's default
// (torch.backends.cudnn.deterministic = False).
void set_deterministic_algorithms(bool on);
bool deterministic_algorithms();

// Which implementation the CUDA attention op runs where cuDNN's fused attention (its scaled-dot-product
// graph, through the cuDNN frontend) takes the call (kernels/cuda/attention_cudnn.h: 16-bit compute, no
// mask, head sizes up to 128); reel's own kernels (kernels/cuda/attention.cu), the readable reference,
// run every other call.
//   Off   reel's kernels always.
//   Auto  (the default) with autotuning on, each shape's first forward and first backward time both
//         and keep the faster; otherwise cuDNN where the shape gives it at least a wave of blocks
//         (attention.cu: cudnn_fills_the_gpu, fitted to the H200's measurements).
//   On    cuDNN wherever it takes the call.
// The environment variable REEL_CUDNN_ATTENTION=0|auto|1 sets the mode a process starts with. The
// backward honours deterministic_algorithms() (cuDNN's deterministic dQ, no float atomics, when on).
enum class CudnnAttention { Off, Auto, On };
void set_cudnn_attention(CudnnAttention mode);
CudnnAttention cudnn_attention_mode();

// Split-K for the CUDA weight gradients whose output cannot fill the GPU (kernels/cuda/gemm_autotune.h:
// gemm_split_k; 16-bit operands into f32, the in-place reduction in a fixed order: deterministic).
// A GEMM it takes is not timed by autotuning. Off by default until it is timed inside the step on
// the H200; the environment variable
// REEL_SPLIT_K=0|1 sets the mode a process starts with.
void set_split_k(bool on);
bool split_k_enabled();

}  // namespace reel
