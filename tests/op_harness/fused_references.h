// The unfused references of the fused ops' op-harness cases (cases_fused.cpp, cases_fused_reduce.cpp):
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
inline Expected values_of(const std::vector<Tensor>& ts) {
  Expected out;
  for (const Tensor& t : ts) out.push_back(host_values(t));
  return out;
}

}  // namespace reel::harness
