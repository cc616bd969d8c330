// DType — the element types a Tensor can hold, and how C++ types map onto them.
//
//   f32 f64       IEEE binary32 / binary64
//   f16 bf16      16-bit storage; CPU kernels compute in f32 (see half.h)
//   i64           indices, targets, masks built from comparisons of indices
//
// Each float type has an "accumulation type" (AccType<T>): f64 for f64, f32 for the rest. Reductions,
// norms and GEMMs accumulate in it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tensor/error.h"
#include "tensor/half.h"

namespace reel {

enum class DType : uint8_t { f32, f64, f16, bf16, i64 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i64: return 8;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
  }
  return "?";
}

inline bool is_floating(DType t) { return t != DType::i64; }

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::f16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::bf16; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::i64; };

template <typename T> struct AccTypeOf { using type = float; };
template <> struct AccTypeOf<double> { using type = double; };
template <> struct AccTypeOf<int64_t> { using type = int64_t; };
template <typename T> using AccType = typename AccTypeOf<T>::type;

// Loads and stores through the accumulation type: the one place 16-bit values are widened/rounded.
template <typename T> inline AccType<T> load(T v) { return static_cast<AccType<T>>(v); }
template <typename T> inline T store(AccType<T> v) { return static_cast<T>(v); }

// Calls fn.template operator()<T>() with T the C++ type of `t`. The float-only variant refuses i64
// with an error naming `op`.
template <typename Fn>
decltype(auto) visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::f16: return fn.template operator()<Half>();
    case DType::bf16: return fn.template operator()<BFloat16>();
    case DType::i64: return fn.template operator()<int64_t>();
  }
  throw InternalError("visit_dtype: unknown dtype");
}

template <typename Fn>
decltype(auto) visit_float_dtype(DType t, const char* op, Fn&& fn) {
  REEL_CHECK(is_floating(t), op, ": dtype ", dtype_name(t), " is not supported (expected f32, f64, f16 or bf16)");
  return visit_dtype(t, std::forward<Fn>(fn));
}

}  // namespace reel
