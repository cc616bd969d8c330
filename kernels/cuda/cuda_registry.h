// The CUDA backend's op families; register_cuda_backend() (kernels/cuda/register.cu) installs the
// caching allocator and calls each of these once.
#pragma once

namespace reel {

void register_memory_cuda_kernels();
void register_elementwise_cuda_kernels();
void register_reduce_cuda_kernels();
void register_linalg_cuda_kernels();
void register_pool_cuda_kernels();
void register_norm_cuda_kernels();
void register_attention_cuda_kernels();
void register_optim_cuda_kernels();

namespace cuda {
void install_allocator();  // tensor/cuda_runtime.cpp
}
namespace jit {
void register_fused_elementwise_cuda_kernel();  // kernels/jit/nvrtc.cpp (NVRTC-generated kernels)
}

}  // namespace reel
