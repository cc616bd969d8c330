// One kernel launch with the programmatic-stream-serialization attribute when programmatic_launch()
// is on: the host half of kernels/cuda/launch.cuh, in a header either compiler reads, so that
// launch_kernel() (nvcc) and the fused-elementwise launcher (kernels/jit/nvrtc.cpp, g++) build the
// launch the same way. CUDA builds only.
#pragma once
#include <cuda_runtime.h>

namespace reel::cuda {

// cudaLaunchKernelExC of `kernel` with args[i] pointing at its i-th argument; the status is the
// caller's to raise.
cudaError_t launch_programmatic(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                void** args);

}  // namespace reel::cuda
