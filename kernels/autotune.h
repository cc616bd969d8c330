// Autotuning switch: when on, a kernel that has several algorithms for a shape (cuDNN convolutions;
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

}  // namespace reel
