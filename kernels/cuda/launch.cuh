// Launching reel's CUDA kernels: programmatic dependent launch (Hopper and later).
//
// Kernels of one stream run one after another: kernel k+1 starts once kernel k has finished and its
// writes are flushed. Between the two the GPU does fixed work (k's completion and memory flush, then
// k+1's launch and block dispatch): a chain of dependent 4096-element adds in a CUDA graph takes
// 1.05 us a kernel on the H200, nearly all of it that fixed work. Programmatic dependent launch
// (compute capability 9.0+) lets k+1's launch be processed while k is still running; k+1's blocks then
// wait in `griddepcontrol.wait` until k has completed and its memory is visible. The same chain
// (bench/gpu_bench.cpp, BM_CudaKernelChain): 1.05 -> 0.82 us a kernel at 4096 elements, 1.77 -> 1.52
// at 524288.
//
// The contract, kept by every reel kernel:
//   - the kernel's first statement is grid_dependency_wait(), before it reads or writes global memory
//     (tools/check_kernel_prologue.sh checks this for every __global__ function), so it runs in
//     exactly the order and with exactly the data of an ordinary launch: the same bits;
//   - it is launched by launch_kernel(), which asks for the early launch when programmatic_launch()
//     is on (programmatic_launch.h; REEL_PROGRAMMATIC_LAUNCH=0 turns it off, for side-by-side runs).
// No kernel triggers its dependents early (griddepcontrol.launch_dependents). Measured on a standalone
// chain of 400 adds with the trigger right after each kernel's wait, the next kernel's blocks,
// resident and waiting, slowed long-running kernels by up to 24% (44 -> 54 us a kernel for 32 blocks
// adding 2M floats), while the trigger saved at most 0.1 us more on tiny ones.
//
// Library kernels (cuBLAS, cuDNN) are launched as they launch themselves; a reel kernel after one still
// gets its launch early, since the attribute belongs to the dependent launch.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/launch_programmatic.h"

namespace reel::cuda {

// Waits until the kernels this one depends on have completed and their writes are visible. Without
// a programmatic launch (or before sm_90) there is nothing to wait for, and it costs nothing.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Raises a failed launch as a reel::Error naming the kernel and its grid.
[[noreturn]] void throw_launch_error(cudaError_t status, const void* kernel, dim3 grid, dim3 block, size_t smem);

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic launch attribute when
// programmatic_launch() is on. Arguments convert to the kernel's parameter types as in <<<>>>.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  [&](Params... converted) {
    void* pointers[] = {&converted..., nullptr};  // the null keeps the array non-empty
    const cudaError_t status =
        launch_programmatic(reinterpret_cast<const void*>(kernel), grid, block, smem, stream, pointers);
    if (status != cudaSuccess) throw_launch_error(status, reinterpret_cast<const void*>(kernel), grid, block, smem);
  }(std::forward<Args>(args)...);
}

}  // namespace reel::cuda
