// The explicit list of op families. Each family registers its schemas (kernels/schema/<family>.cpp)
// and its CPU kernels (kernels/cpu/<family>.cpp); the CUDA backend adds its own kernels when built.
// Called once, from dispatch, on first use — no static initialisers, so static linking keeps them.
#pragma once

namespace reel {

void register_memory_schemas();
void register_views_schemas();
void register_elementwise_schemas();
void register_reduce_schemas();
void register_linalg_schemas();
void register_pool_schemas();
void register_norm_schemas();
void register_attention_schemas();
void register_optim_schemas();
void register_fused_elementwise_schemas();

void register_memory_cpu_kernels();
void register_elementwise_cpu_kernels();
void register_reduce_cpu_kernels();
void register_linalg_cpu_kernels();
void register_pool_cpu_kernels();
void register_norm_cpu_kernels();
void register_attention_cpu_kernels();
void register_optim_cpu_kernels();
void register_fused_elementwise_cpu_kernel();

// Defined by the CUDA backend when it is built (kernels/cuda/), else by a stub that does nothing.
void register_cuda_backend();

void register_builtin_ops();

}  // namespace reel
