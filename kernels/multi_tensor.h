// The tensors of a fused multi-tensor optimizer update (multi_tensor_adamw, multi_tensor_sgd: one
// kernel for a whole run of adamw_step / sgd_step nodes), read from a kernel call, for the CPU and
// CUDA kernels alike. The call's layout (kernels/schema/optim.cpp), for tensors 0..k-1 (attr tensors):
//   multi_tensor_adamw  in  p0 g0 m0 v0  p1 g1 m1 v1 ...  found_inf? lr step   out  p0 m0 v0  p1 m1 v1 ...
//   multi_tensor_sgd    in  p0 g0 b0?    p1 g1 b1?    ...  found_inf? lr        out  p0 b0?    p1 b1?    ...
// (b: the momentum buffer, given for every tensor or for none). The outputs are the inputs themselves:
// the update is in place. With attr clip one more step-wide input follows, the clip coefficient c
// (0-dim f32 or f64): each g is read as g * c, rounded to its dtype as unscale_check stores it, and
// with attr clip_writes_grad that value is also stored into g, one more output after each tensor's
// (p m v g / p b? g): the step's clip_grad_norm_ folded into the update
// (compile/passes/fuse_clip_into_optimizer.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/dispatch.h"

namespace reel {

// One tensor of a multi-tensor update. AdamW: state0 = exp_avg, state1 = exp_avg_sq. SGD: state0 =
// the momentum buffer (null without momentum), state1 unused. Plain pointers, so that the CUDA kernel
// can carry them in its launch tables.
struct OptimTensor {
  DType dtype = DType::f32;
  int64_t numel = 0;
  void* param = nullptr;
  const void* grad = nullptr;
  void* grad_out = nullptr;  // with clip_writes_grad: where g * c is stored (g's own memory), else null
  void* state0 = nullptr;
  void* state1 = nullptr;
};

// How the inputs divide: per_tensor inputs for each tensor, then the shared step-wide ones.
struct MultiTensorLayout {
  OpKind single;      // the per-tensor op: adamw_step or sgd_step
  size_t per_tensor;  // 4 (p, g, m, v) or 3 (p, g, b?)
  size_t shared;      // 3 (found_inf?, lr, step) or 2 (found_inf?, lr)
};
const MultiTensorLayout& multi_tensor_layout(OpKind op);

// Whether a call with these attrs stores the clipped gradients (attrs clip and clip_writes_grad).
bool clip_stores_grads(const Attrs& a);

// The call's tensors, in order.
std::vector<OptimTensor> multi_tensor_list(const KernelCall& c);

// The step-wide inputs of the call: found_inf (possibly undefined), lr, for AdamW the step count, and
// with attr clip the clip coefficient.
struct MultiTensorShared {
  const Tensor* found_inf;
  const Tensor* lr;
  const Tensor* step;  // null for SGD
  const Tensor* clip;  // null without attr clip
};
MultiTensorShared multi_tensor_shared(const KernelCall& c);

}  // namespace reel
