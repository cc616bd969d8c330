// Multi-tensor (horizontally fused) optimizer updates on the GPU: one kernel launch applies AdamW or
// SGD to many tensors, instead of one launch per parameter. The compiler's optimizer-fusion pass
// writes multi_tensor_adamw / multi_tensor_sgd nodes for a traced step's run of adamw_step / sgd_step
// nodes; their CUDA kernels (kernels/cuda/optim.cu) launch through a MultiTensorList.
//
// The math is the per-tensor kernels' (kernels/optim_math.h): every element sees the same formula and
// the same coefficients, so the results are bit-identical to one adamw_step / sgd_step per tensor.
//
// Conventions: plain C++ types only (this header is included by host code built without nvcc).
// Pointers are device pointers of contiguous tensors; found_inf (0-dim f32, may be null), lr and step
// (0-dim f64) are device pointers read inside the kernel, so a launch can be captured in a CUDA graph
// and replayed with the values advancing. A MultiTensorList is built once per set of tensors (the plan
// binds its buffers once): it groups the tensors by dtype and cuts them into launches of at most
// kMaxTensorsPerLaunch tensors, whose tables of pointers, sizes and block offsets travel to the GPU as
// kernel arguments. No device memory is allocated and nothing is copied, so launching is legal while
// a stream is being captured (the table is part of the captured kernel node). Launches go to reel's
// current stream of the list's device; nothing synchronises with the host.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/multi_tensor.h"
#include "tensor/dtype.h"

namespace reel::cuda {

// One tensor of a multi-tensor update (kernels/multi_tensor.h).
using ::reel::OptimTensor;

struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
};

struct SgdHyper {
  double momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, first_step = false;
};

// The clip folded into an update (attr clip, kernels/multi_tensor.h): a device pointer to the 0-dim
// coefficient c, f32 or f64; null: no clip. Each g is read as g * c rounded to its dtype, and stored
// back where the tensor's grad_out is set, even when found_inf skips the update.
struct GradClip {
  const void* coef = nullptr;
  bool f64 = false;
};

class MultiTensorList {
 public:
  // Throws reel::Error naming `op` for a dtype other than f32, f64, f16 or bf16.
  MultiTensorList(int device, const std::vector<OptimTensor>& tensors, const char* op);
  ~MultiTensorList();
  MultiTensorList(const MultiTensorList&) = delete;
  MultiTensorList& operator=(const MultiTensorList&) = delete;

  // p, m, v of every tensor updated in place (torch.optim.AdamW); nothing changes if *found_inf != 0
  // (but a clip's stored gradients).
  void adamw(const float* found_inf, const double* lr, const double* step, const AdamWHyper& h,
             GradClip clip = {}) const;
  // p and the momentum buffers updated in place (torch.optim.SGD); nothing changes if *found_inf != 0
  // (but a clip's stored gradients).
  void sgd(const float* found_inf, const double* lr, const SgdHyper& h, GradClip clip = {}) const;

  size_t launches() const;  // kernels per call: one per dtype and per kMaxTensorsPerLaunch tensors

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Tensors one launch carries in its argument table (the table stays under CUDA's kernel-argument limit).
constexpr int kMaxTensorsPerLaunch = 128;

}  // namespace reel::cuda
