// Small checks shared by the op schemas. Each throws reel::Error naming the op.
#pragma once
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "tensor/error.h"

namespace reel::schema {

inline std::string desc(const Tensor& t) { return shape_str(t.shape()) + " " + dtype_name(t.dtype()); }

inline void expect_inputs(OpKind op, const std::vector<Tensor>& in, size_t n) {
  REEL_ASSERT(in.size() == n, op_name(op), " takes ", n, " inputs, got ", in.size());
}

inline void expect_defined(OpKind op, const Tensor& t, const char* what) {
  REEL_CHECK(t.defined(), op_name(op), ": ", what, " is undefined");
}

inline void expect_float(OpKind op, const Tensor& t, const char* what = "input") {
  REEL_CHECK(is_floating(t.dtype()), op_name(op), ": ", what, " must be a float tensor (f32, f64, f16, bf16), got ",
             dtype_name(t.dtype()));
}

inline void expect_dtype(OpKind op, const Tensor& t, DType dt, const char* what) {
  REEL_CHECK(t.dtype() == dt, op_name(op), ": ", what, " must be ", dtype_name(dt), ", got ", dtype_name(t.dtype()));
}

inline void expect_same_dtype(OpKind op, const Tensor& a, const Tensor& b) {
  REEL_CHECK(a.dtype() == b.dtype(), op_name(op), ": dtypes ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()),
             " differ (reel does not promote; cast one with .to(dtype))");
}

inline void expect_ndim(OpKind op, const Tensor& t, int64_t ndim, const char* what) {
  REEL_CHECK(t.dim() == ndim, op_name(op), ": ", what, " must have ", ndim, " dims, got shape ",
             shape_str(t.shape()));
}

// A 0-dim f32 flag or scalar (found_inf, a GradScaler's scale).
inline void expect_flag(OpKind op, const Tensor& t, const char* what) {
  REEL_CHECK(t.numel() == 1 && t.dim() == 0 && t.dtype() == DType::f32, op_name(op), ": ", what,
             " must be a 0-dim f32 tensor, got ", desc(t));
}

inline TensorMeta meta_like(const Tensor& t) { return {t.shape(), t.dtype(), t.device()}; }

// Reads a device stored in attrs "device_type"/"device_index" (creation ops have no input to take it from).
// A random op's optional Philox state (PhiloxArgs, tensor/rng.h), in[index] when present: what a
// compiled plan passes so that each run draws fresh numbers. (2,) i64 on the op's device.
inline void expect_philox_state(OpKind op, const std::vector<Tensor>& in, size_t index, Device device) {
  if (in.size() <= index || !in[index].defined()) return;
  const Tensor& s = in[index];
  REEL_CHECK(s.dim() == 1 && s.size(0) == 2 && s.dtype() == DType::i64 && s.device() == device && s.is_contiguous(),
             op_name(op), ": the Philox state ", shape_str(s.shape()), " ", dtype_name(s.dtype()), " on ",
             s.device().str(), " must be a contiguous (2) i64 {seed, base offset} on ", device.str());
}

inline Device attr_device(const Attrs& a) {
  return Device{static_cast<DeviceType>(a.i("device_type", 0)), int(a.i("device_index", 0))};
}

}  // namespace reel::schema
