// The unfused references of the fused ops' op-harness cases (cases_fused*.cpp):
// the chain a pass replaces, run op by op through dispatch on the CPU.
#pragma once
#include <initializer_list>
#include <vector>

#include "kernels/dispatch.h"
#include "tests/op_harness/inputs.h"
#include "tests/op_harness/op_harness.h"

namespace reel::harness {

using Inputs = std::vector<Tensor>;
inline constexpr std::initializer_list<DType> k16Bit{DType::bf16, DType::f16};

inline Tensor run1(OpKind op, const Inputs& in, const Attrs& a = {}) { return dispatch(op, in, a)[0]; }
inline Tensor cast(const Tensor& t, DType d) { return run1(OpKind::Copy, {t}, Attrs().set("dtype", d)); }
// A contiguous copy, for references of in-place ops: they run before the op, on copies.
inline Tensor copy_of(const Tensor& t) { return cast(t, t.dtype()); }
// A call of op whose last output, its column sums, is added to: that output is `sums` itself, also
// an input (params +=); the other outputs are fresh.
inline OpCall adding_into_sums(const Inputs& in, const Attrs& a, const Tensor& sums,
                               OpKind op = OpKind::LayerNormBackwardAdd) {
  std::vector<TensorMeta> m = infer_outputs(op, in, a);
  std::vector<Tensor> out;
  for (size_t k = 0; k + 1 < m.size(); ++k) out.push_back(Tensor::empty(m[k].shape, m[k].dtype));
  out.push_back(sums);
  return OpCall{in, a, out};
}
inline Expected values_of(const std::vector<Tensor>& ts) {
  Expected out;
  for (const Tensor& t : ts) out.push_back(host_values(t));
  return out;
}

}  // namespace reel::harness
