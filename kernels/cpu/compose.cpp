// Running CPU kernels from inside another CPU kernel (see compose.h).
#include "kernels/cpu/compose.h"

#include "tensor/error.h"

namespace reel::cpu {

void run_op(OpKind op, const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs& attrs) {
  KernelFn k = find_kernel(op, DeviceType::CPU);
  REEL_ASSERT(k != nullptr, "no CPU kernel for ", op_name(op));
  k(KernelCall{op, in, out, attrs});
}

Tensor scratch(const Shape& shape, DType dtype) { return Tensor::empty(shape, dtype, Device::cpu()); }

Tensor converted(const Tensor& t, DType dtype) {
  if (!t.defined() || t.dtype() == dtype) return t;
  Tensor c = scratch(t.shape(), dtype);
  run_op(OpKind::Copy, {t}, {c});
  return c;
}

}  // namespace reel::cpu
