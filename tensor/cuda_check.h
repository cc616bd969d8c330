// Status checks for the CUDA runtime, with file:line, raised as reel::Error. Included only by code
// compiled in the CUDA build. cuBLAS/cuDNN/NVRTC checks live in kernels/cuda/cuda_common.cuh.
#pragma once
#include <cuda_runtime.h>

#include "tensor/error.h"

#define REEL_CUDA_CHECK(expr)                                                                        \
  do {                                                                                               \
    cudaError_t reel_status_ = (expr);                                                               \
    if (reel_status_ != cudaSuccess)                                                                 \
      throw ::reel::Error(::reel::detail::cat("CUDA error ", cudaGetErrorName(reel_status_), " (",   \
                                              cudaGetErrorString(reel_status_), ") at ", __FILE__, \
                                              ":", __LINE__, ": ", #expr));                          \
  } while (0)
