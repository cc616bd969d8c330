// PrecisionPolicy — which dtype matmul and conv inputs run in (fp32 | bf16 | fp16), and the casts that
// put a model's f32 tensors into it.
//
// Mixed precision in reel follows PyTorch's autocast: master weights, their gradients and optimizer
// state stay f32; only the inputs of matmul and conv2d are cast to the compute dtype (the kernels
// accumulate in f32); their outputs are cast back to f32, so norms, softmax, losses and everything
// elementwise run in f32. The casts are differentiable, so a weight's gradient comes back through the
// cast as f32 into its f32 .grad. fp16 needs a GradScaler (optim/grad_scaler.h) against underflow;
// bf16 has f32's exponent range and does not.
//
// How a model uses it: nn's layers call autocast_matmul / autocast_conv2d with autocast_policy(), the
// thread's current policy, which a training loop sets for its forward pass with an AutocastGuard:
//     { AutocastGuard amp(PrecisionPolicy::parse("bf16")); loss = model_loss(model, x, y); }
// With the fp32 policy both are exactly matmul / conv2d (no casts, no extra ops). f64 tensors are
// never cast (gradcheck runs models in f64).
// It lives in autograd/, beside the ops it wraps, because nn's layers consult it: nn sits below optim
// and compile, which reach it through optim/optim.h. needs_grad_scaler() only answers a question;
// the scaler itself stays in optim/.
#pragma once
#include <string>

#include "tensor/tensor.h"

namespace reel {

enum class Precision { fp32, bf16, fp16 };

struct PrecisionPolicy {
  Precision precision = Precision::fp32;

  PrecisionPolicy() = default;
  explicit PrecisionPolicy(Precision p) : precision(p) {}
  // "fp32" | "bf16" | "fp16"; anything else is an error naming the choices.
  static PrecisionPolicy parse(const std::string& name);
  const char* name() const;

  // The dtype matmul/conv inputs run in: f32, bf16 or f16.
  DType compute_dtype() const;
  bool is_mixed() const { return precision != Precision::fp32; }
  // fp16 needs dynamic loss scaling; bf16 and fp32 do not.
  bool needs_grad_scaler() const { return precision == Precision::fp16; }
  // t cast to compute_dtype() when t is f32 and the policy is mixed; t itself otherwise. The cast is
  // stored in `format` (autocast_conv2d's channels-last operands).
  Tensor cast_for_compute(const Tensor& t, MemoryFormat format = MemoryFormat::Contiguous) const;
};

// matmul(a, b) with both inputs in the policy's compute dtype and the result back in f32.
Tensor autocast_matmul(const Tensor& a, const Tensor& b, const PrecisionPolicy& policy);
// conv2d with x, weight and bias in the compute dtype and the result back in f32. On a GPU the 16-bit
// x and weight are stored channels-last (NHWC, and KRSC for the weight; see MemoryFormat), so the
// convolution, its result and both its gradients stay NHWC and cuDNN runs its tensor-core kernels
// without transposing in and out; the casts in and out of 16 bits do the transposes as they go.
// set_autocast_channels_last(false) keeps everything NCHW (the layout of the CPU and of f32).
Tensor autocast_conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
                       const PrecisionPolicy& policy, int64_t groups = 1);

// Whether autocast_conv2d uses channels-last on CUDA (default true). Process-wide.
void set_autocast_channels_last(bool on);
bool autocast_channels_last();

// The policy in force on this thread (fp32 unless an AutocastGuard says otherwise). nn's Linear,
// Conv2d and attention route their matmuls and convolutions through it, so a training loop switches
// a whole model to mixed precision with one guard around its forward pass, like torch.autocast.
const PrecisionPolicy& autocast_policy();

class AutocastGuard {
 public:
  explicit AutocastGuard(PrecisionPolicy policy);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  PrecisionPolicy prev_;
};

}  // namespace reel
