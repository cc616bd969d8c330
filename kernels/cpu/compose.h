// Running CPU kernels from inside another CPU kernel: how a fused op's CPU kernel, the reference of
// what the fused CUDA kernel computes, is written as the composition of the kernels of the ops it
// fuses. The kernels are called straight from the kernel table, not through dispatch: no schema
// check (the fused op's schema checked the call), no tracer and no kernel count (to the rest of reel
// the fused op is one kernel), so a CPU plan of fused ops computes what the unfused ops would, bit
// for bit where the fused op is defined as their composition.
#pragma once
#include <vector>

#include "kernels/dispatch.h"

namespace reel::cpu {

// op's CPU kernel on `in` into `out` (fresh temporaries or the fused op's own outputs).
void run_op(OpKind op, const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs& attrs = {});
// A contiguous host temporary.
Tensor scratch(const Shape& shape, DType dtype);
// t converted to `dtype` (t itself when it already has it), through the copy kernel's conversion.
Tensor converted(const Tensor& t, DType dtype);

}  // namespace reel::cpu
