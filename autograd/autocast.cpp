// PrecisionPolicy and the autocast helpers (see autograd/autocast.h).
#include "autograd/autocast.h"

#include <atomic>

#include "autograd/ops.h"
#include "tensor/error.h"

namespace reel {

PrecisionPolicy PrecisionPolicy::parse(const std::string& name) {
  if (name == "fp32") return PrecisionPolicy(Precision::fp32);
  if (name == "bf16") return PrecisionPolicy(Precision::bf16);
  if (name == "fp16") return PrecisionPolicy(Precision::fp16);
  REEL_CHECK(false, "precision: unknown policy '", name, "' (expected fp32, bf16 or fp16)");
  return {};
}

const char* PrecisionPolicy::name() const {
  switch (precision) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

DType PrecisionPolicy::compute_dtype() const {
  switch (precision) {
    case Precision::bf16: return DType::bf16;
    case Precision::fp16: return DType::f16;
    default: return DType::f32;
  }
}

Tensor PrecisionPolicy::cast_for_compute(const Tensor& t, MemoryFormat format) const {
  if (!t.defined() || !is_mixed() || t.dtype() != DType::f32) return t;
  return to_dtype(t, compute_dtype(), format);
}

namespace {
// The op's output back in f32 when the inputs were cast (a no-op otherwise).
Tensor back_to_f32(const Tensor& y, const PrecisionPolicy& policy) {
  return policy.is_mixed() && y.dtype() == policy.compute_dtype() ? to_dtype(y, DType::f32) : y;
}
}  // namespace

Tensor autocast_matmul(const Tensor& a, const Tensor& b, const PrecisionPolicy& policy) {
  return back_to_f32(matmul(policy.cast_for_compute(a), policy.cast_for_compute(b)), policy);
}

Tensor autocast_conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
                       const PrecisionPolicy& policy, int64_t groups) {
  const MemoryFormat format = policy.is_mixed() && autocast_channels_last() && x.defined() && x.dim() == 4 &&
                                       x.device().is_cuda()
                                   ? MemoryFormat::ChannelsLast
                                   : MemoryFormat::Contiguous;
  Tensor y = conv2d(policy.cast_for_compute(x, format), policy.cast_for_compute(weight, format),
                    policy.cast_for_compute(bias), stride, padding, groups);
  return back_to_f32(y, policy);  // contiguous f32; its gradient comes back channels-last
}

namespace {
std::atomic<bool> channels_last_on{true};
}

void set_autocast_channels_last(bool on) { channels_last_on = on; }
bool autocast_channels_last() { return channels_last_on; }

namespace {
thread_local PrecisionPolicy current_policy;
}

const PrecisionPolicy& autocast_policy() { return current_policy; }

AutocastGuard::AutocastGuard(PrecisionPolicy policy) : prev_(current_policy) { current_policy = policy; }
AutocastGuard::~AutocastGuard() { current_policy = prev_; }

}  // namespace reel
