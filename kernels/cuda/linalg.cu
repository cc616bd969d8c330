// CUDA kernels of the linalg family: registration. The kernels live in matmul.cu (cuBLAS strided-
// batched GEMM over a broadcast batch; f32 exact, f64, and f16/bf16 on tensor cores with f32
// accumulation) and conv2d.cu (cuDNN forward, backward-data and backward-filter convolutions with
// algorithms chosen once per shape, and a bias-add kernel).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_registry.h"

namespace reel {

namespace cuda {
void register_matmul_cuda_kernel();   // kernels/cuda/matmul.cu
void register_conv2d_cuda_kernels();  // kernels/cuda/conv2d.cu
void register_gemm_epilogue_cuda_kernel();  // kernels/cuda/gemm_epilogue.cu
}  // namespace cuda

void register_linalg_cuda_kernels() {
  cuda::register_matmul_cuda_kernel();
  cuda::register_conv2d_cuda_kernels();
  cuda::register_gemm_epilogue_cuda_kernel();
}

}  // namespace reel
