// The Philox arguments of a random op's call (PhiloxArgs, tensor/rng.h): the seed and offset attrs,
// and, when the call has its optional state input (as a compiled plan's calls do), that tensor's
// two values, which the kernel reads where it runs (on the host for the CPU, on the device for CUDA).
//   state: (2,) i64 on the op's device: {seed, base offset}, the offset attr then relative to the base
// Also the dropout a fused op may apply to one of its operands (a pass folded dropout_mask * v into
// it): attrs dropout_p, dropout_seed, dropout_offset and, with dropout_state, its state as the op's
// last input; the mask is dropout's, element e of the operand's row-major order.
#pragma once
#include "kernels/dispatch.h"
#include "tensor/rng.h"

namespace reel {

inline PhiloxArgs philox_args(const KernelCall& c, size_t state_input) {
  PhiloxArgs a;
  a.seed = uint64_t(c.attrs.i("seed"));
  a.offset = uint64_t(c.attrs.i("offset"));
  if (c.in.size() > state_input && c.in[state_input].defined())
    a.state = static_cast<const uint64_t*>(c.in[state_input].data_ptr());
  return a;
}

// Dropout's kept mask value 1/(1-p) (0 when p == 1) rounded to dtype `t` as every dropout kernel
// rounds it (double -> accumulation type -> t), returned as a double: exact, it is a value of `t`.
// y = x * mask then holds exactly, which dropout's backward (grad * mask) relies on.
inline double dropout_kept_value(DType t, double p) {
  return visit_dtype(t, [&]<typename T>() -> double {
    using A = AccType<T>;
    return double(load(store<T>(p < 1 ? A(1.0 / (1.0 - p)) : A(0))));
  });
}

// A fused op's dropout (see above): whether it has one, its Philox arguments, and the attrs of the
// dropout_mask op that draws the same mask (for the CPU kernels, which compose the unfused ops).
inline bool has_fused_dropout(const Attrs& a) { return a.has("dropout_p"); }

inline PhiloxArgs fused_dropout_args(const KernelCall& c) {
  PhiloxArgs a;
  a.seed = uint64_t(c.attrs.i("dropout_seed"));
  a.offset = uint64_t(c.attrs.i("dropout_offset"));
  if (c.attrs.b("dropout_state", false)) a.state = static_cast<const uint64_t*>(c.in.back().data_ptr());
  return a;
}

// The attrs that give a fused op the dropout of a dropout_mask node with attrs `mask` (p, seed,
// offset) and, when `state`, its Philox state as the op's last input.
inline Attrs with_fused_dropout(Attrs a, const Attrs& mask, bool state) {
  return a.set("dropout_p", mask.f("p"))
      .set("dropout_seed", mask.i("seed"))
      .set("dropout_offset", mask.i("offset"))
      .set("dropout_state", state);
}

// The attrs of a dropout_mask op drawing a mask of `shape` and `dtype` on `device`.
inline Attrs dropout_mask_attrs(const Shape& shape, DType dtype, Device device, double p, int64_t seed,
                                int64_t offset) {
  return Attrs()
      .set("shape", std::vector<int64_t>(shape.begin(), shape.end()))
      .set("dtype", dtype)
      .set("device_type", int64_t(device.type))
      .set("device_index", int64_t(device.index))
      .set("p", p)
      .set("seed", seed)
      .set("offset", offset);
}

inline Attrs dropout_mask_attrs_of(const Attrs& fused, const Tensor& like) {
  return dropout_mask_attrs(like.shape(), like.dtype(), like.device(), fused.f("dropout_p"), fused.i("dropout_seed"),
                            fused.i("dropout_offset"));
}

}  // namespace reel
