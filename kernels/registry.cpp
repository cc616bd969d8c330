#include "kernels/registry.h"

namespace reel {

void register_builtin_ops() {
  register_memory_schemas();
  register_views_schemas();
  register_elementwise_schemas();
  register_reduce_schemas();
  register_linalg_schemas();
  register_pool_schemas();
  register_norm_schemas();
  register_attention_schemas();
  register_optim_schemas();
  register_fused_elementwise_schemas();

  register_memory_cpu_kernels();
  register_elementwise_cpu_kernels();
  register_reduce_cpu_kernels();
  register_linalg_cpu_kernels();
  register_pool_cpu_kernels();
  register_norm_cpu_kernels();
  register_attention_cpu_kernels();
  register_optim_cpu_kernels();
  register_fused_elementwise_cpu_kernel();

  register_cuda_backend();
}

}  // namespace reel
